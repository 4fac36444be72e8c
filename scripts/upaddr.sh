# Sourced by the demo and the bench scripts (from the repository's root).
#
# up_addr LOG PID [PATTERN [SECONDS]] waits for a starting process's
# address: the first word after PATTERN in LOG (default "Prism is up:
# Recommend at", the line prism up prints once every tier serves; a lone
# tier's is "router listening on"), and prints it. It gives up when PID
# exits or after SECONDS (default 600: a dlrm-kaggle store's first
# opening on a slow disk takes minutes), printing the log's last 40
# lines to stderr, and returns 1: callers write
# `addr=$(up_addr "$log" $pid) || exit 1`.
up_addr() {
	local log=$1 pid=$2 pat=${3:-Prism is up: Recommend at} secs=${4:-600} a="" i
	for i in $(seq 1 $((secs * 2))); do
		a=$(sed -n "s/.*$pat \([^ ]*\).*/\1/p" "$log" 2>/dev/null | head -1)
		if [ -n "$a" ]; then
			echo "$a"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "${0##*/}: no \"$pat\" line in $log after $secs s; its end:" >&2
	else
		echo "${0##*/}: the process (pid $pid) exited before printing \"$pat\"; $log ends:" >&2
	fi
	tail -40 "$log" >&2
	return 1
}
