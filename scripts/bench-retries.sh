#!/usr/bin/env bash
# Goodput under retrying clients: a stack of UP_BIN (default bin/prism),
# its maximum found by loadgen --find-max (60 ms SLO), then each share of
# it in LOADS (default "120 200") offered for DURATION (default 15s),
# Poisson, with --timeout TIMEOUT (default 60ms, the SLO) and each of
# RETRIES (default "0 3") retries; prints goodput (answered OK within 60 ms
# per second) over the maximum, p99 and attempts/s per run.
# LG_BIN (default bin/prism) is the load generator: give an older router
# as UP_BIN with this tree's loadgen to measure it under the same clients.
# LG_FLAGS go to every open-loop run (e.g. "--retry-mode grpc"). MAX
# skips the search (req/s).
# MODEL (default dlrm-kaggle) names the model.
# usage: scripts/bench-retries.sh PLAN_DIR DB
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
if [ $# -lt 2 ]; then echo "usage: scripts/bench-retries.sh PLAN_DIR DB" >&2; exit 2; fi
plan=$1; db=$2
up_bin=${UP_BIN:-bin/prism}; lg_bin=${LG_BIN:-bin/prism}
model=${MODEL:-dlrm-kaggle}
log=$(mktemp)
$up_bin up --model "$plan" --db "$db" --addr 127.0.0.1:0 --insecure ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; rm -f $log' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg() { $lg_bin loadgen --target "$addr" --insecure --model "$model" --plan "$plan" --candidates 270 --pool 512 --quiet "$@" 2>/dev/null; }
max=${MAX:-}
if [ -z "$max" ]; then
	lg --clients 16 --duration 5s >/dev/null # warm up
	max=$(lg --find-max --rate 150 --find-max-trial ${TRIAL:-5s} --find-max-warmup 0 --slo 60ms | sed -n 's/^find-max: \(at least \)*\([0-9.]*\) req\/s.*/\2/p' | head -1)
	[ -n "$max" ] || { echo "bench-retries: find-max found no rate"; exit 1; }
fi
echo "$up_bin max $max req/s (${MAX:+given, }find-max: p99 within 60 ms)"
dur=${DURATION:-15s}; secs=${dur%s}
for pct in ${LOADS:-120 200}; do
	rate=$(awk -v r="$max" -v p="$pct" 'BEGIN{printf "%.1f", r*p/100}')
	for n in ${RETRIES:-0 3}; do
		flags=()
		[ "$n" -gt 0 ] && flags=(--retries "$n" ${LG_FLAGS:-})
		res=$(lg --rate "$rate" --duration "$dur" --timeout "${TIMEOUT:-60ms}" "${flags[@]}")
		sent=$(sed -n 's/^requests *sent \([0-9]*\).*/\1/p' <<<"$res")
		slo=$(sed -n 's/^SLO *\([0-9.]*\)%.*/\1/p' <<<"$res")
		p99=$(sed -n 's/.*p99 \([^ ]*\)  p99.9.*/\1/p' <<<"$res")
		errs=$(sed -n 's/^errors by *//p' <<<"$res")
		att=$(sed -n 's/^retries .*; \([0-9.]*\) attempts\/s.*/\1/p' <<<"$res")
		pb=$(sed -n 's/^ *pushback: \([0-9]*\) retries timed by it, \([0-9]*\) requests told not to retry; \([0-9]*\).*/pushback waits \1, told not to retry \2, deadline stops \3/p' <<<"$res")
		[ -n "$sent" ] && [ -n "$slo" ] || { echo "bench-retries: the run at $pct% retries $n printed no summary"; continue; }
		awk -v b="$up_bin" -v p="$pct" -v r="$rate" -v s="$sent" -v slo="$slo" -v m="$max" -v p99="$p99" -v e="$errs" -v n="$n" -v a="${att:-}" -v pb="${pb:-}" -v d="$secs" 'BEGIN{g=s*slo/100/d; if (a=="") a=s/d; printf "%s %s%% offered %.0f req/s, retries %s: goodput %.1f req/s = %.2f of max, p99 %s, attempts %.1f/s (%.2fx offered), errors %s %s\n", b, p, r, n, g, g/m, p99, a, a/(s/d), e, pb}'
	done
done
