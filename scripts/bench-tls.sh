#!/usr/bin/env bash
# Mutual TLS against plaintext, in one run on this machine (run via
# `make bench-tls`; needs `make demo` first, or set PLAN/DB): `prism up`
# stacks on the same partition, one with mTLS (the default) and one with
# --insecure on a copy of the store, both up at once, and closed-loop
# runs at 270 candidates per request alternating between them (the
# order rotated every round), so the machine's drift falls on both alike.
# Prints each round, the medians and their ratios. UP_FLAGS go to both
# stacks' prism up. The mTLS stack serves DB itself (and keeps its
# router's update log beside it, DB-router-log): give it a store it may
# write, not one shared with a running stack.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=${PRISM:-bin/prism}
# SERVER_CPUS and CLIENT_CPUS pin the stacks and the load generator apart (scripts/pin.sh).
. scripts/pin.sh
out=${BENCH_DIR:-out/demo}
model=${BENCH_MODEL:-dlrm-kaggle}
plan=${PLAN:-$out/$model-part}
db=${DB:-$out/db}
clients=${CLIENTS:-16}
dur=${DURATION:-15s}
rounds=${ROUNDS:-5}
certs=${CERTS:-$(dirname "$db")/certs}
[ -f "$plan/plan.json" ] || { echo "bench-tls: no partition at $plan (run make demo first)"; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
echo "bench-tls: copying the store for the plaintext stack" >&2
cp -r "$db" "$tmp/db-plain"

# up NAME ARGS...: starts a stack and sets addr to its Recommend address.
# Not called in a $(...) subshell: the stack's pid must reach pids, or the
# cleanup would leave the stack running.
up() {
	local name=$1 log="$tmp/$1.log"
	addr=""
	shift
	: >"$log" # before the first sed (set -e: a missing log ended the script)
	"${srv[@]}" $prism up --model "$plan" --addr 127.0.0.1:0 "$@" ${UP_FLAGS:-} >"$log" 2>&1 &
	pids+=($!)
	addr=$(up_addr "$log" "${pids[-1]}") || exit 1
}
up tls --db "$db" --certs "$certs"
tls_addr=$addr
up plain --db "$tmp/db-plain" --insecure
plain_addr=$addr

lg() { "${cli[@]}" $prism loadgen --model "$model" --plan "$plan" --candidates 270 --pool ${POOL:-512} --quiet --clients "$clients" "$@"; }
tls() { lg --target "$tls_addr" --certs "$certs" "$@"; }
plain() { lg --target "$plain_addr" --insecure "$@"; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
median() { tr ' ' '\n' | sort -n | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }

# Warm-up: hot tiers, ONNX Runtime arenas, TLS sessions.
stacks=(tls plain)
for st in "${stacks[@]}"; do $st --duration 10s >/dev/null; done
declare -A tput p99s
for r in $(seq 1 "$rounds"); do
	line="round $r:"
	n=${#stacks[@]}
	for i in $(seq 0 $((n - 1))); do
		st=${stacks[$(((i + r) % n))]}
		res=$($st --duration "$dur")
		tput[$st]="${tput[$st]:-} $(samples <<<"$res")"
		p99s[$st]="${p99s[$st]:-} $(p99 <<<"$res")"
		line="$line $st $(samples <<<"$res") samples/s (p99 $(p99 <<<"$res"));"
	done
	echo "$line" >&2
done
ms() { sed 's/ms$//' | median; }
pm=$(median <<<"${tput[plain]# }"); tm=$(median <<<"${tput[tls]# }")
echo
echo "| measure | value |"
echo "|---|---:|"
echo "| plaintext, $clients clients x 270 candidates (samples/s; median of${tput[plain]}) | $pm |"
echo "| mutual TLS, same (samples/s; median of${tput[tls]}) | $tm |"
echo "| mTLS / plaintext | $(awk -v a="$tm" -v b="$pm" 'BEGIN{printf "%.3f", a/b}') |"
echo "| p99, plaintext / mTLS (median of each) | $(tr ' ' '\n' <<<"${p99s[plain]# }" | ms)ms / $(tr ' ' '\n' <<<"${p99s[tls]# }" | ms)ms |"
