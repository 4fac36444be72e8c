#!/usr/bin/env bash
# Goodput A/B under overload (issue 18): two `prism up` stacks up at once
# on the same cores, A on make demo's store and B on a copy of it (Pebble
# locks its folder), each with its own flags (A_FLAGS, B_FLAGS) and
# environment (A_ENV, B_ENV: VAR=value words; A_BIN, B_BIN: binaries,
# default bin/prism). After a closed-loop maximum of each (16 clients),
# ROUNDS rounds of DUR seconds of Poisson arrivals at RATE req/s with
# 60 ms deadlines alternate between them (order swapped every round), and
# each prints goodput: requests answered OK within 60 ms per second.
# Both stacks get the same arrivals and requests in a round (loadgen
# --stream ROUND), a new schedule each round.
# Comparing two stacks within one run, side by side, is what makes the
# figure readable on a shared machine whose speed drifts between runs.
# CLOSED=1 runs closed loops of CLIENTS (default 16) instead and prints
# each stack's samples/s: an A/B of throughput.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
out=${BENCH_DIR:-out/demo}
rate=${RATE:-300}; rounds=${ROUNDS:-4}; dur=${DUR:-15}
certs=$out/certs
copy=${COPY_DIR:-/tmp/prism-goodput-ab}
[ -f "$out/dlrm-kaggle-part/plan.json" ] || { echo "goodput-ab: no partition in $out (run make demo first)"; exit 1; }
# The copy is of this BENCH_DIR's store: one left by another BENCH_DIR is replaced.
src=$(cd "$out/db" && pwd)
if [ ! -d "$copy/db" ] || [ "$(cat "$copy/source" 2>/dev/null)" != "$src" ]; then
	rm -rf "$copy/db" "$copy/db-router-log"; mkdir -p "$copy" && cp -a "$out/db" "$copy/db" && echo "$src" >"$copy/source" || exit 1
fi
la=$(mktemp); lb=$(mktemp)
env ${A_ENV:-} "${A_BIN:-bin/prism}" up --model "$out/dlrm-kaggle-part" --db "$out/db" --addr 127.0.0.1:0 --certs "$certs" ${A_FLAGS:-} >"$la" 2>&1 &
pa=$!
env ${B_ENV:-} "${B_BIN:-bin/prism}" up --model "$out/dlrm-kaggle-part" --db "$copy/db" --addr 127.0.0.1:0 --certs "$certs" ${B_FLAGS:-} >"$lb" 2>&1 &
pb=$!
trap 'kill -TERM $pa $pb 2>/dev/null; wait $pa $pb 2>/dev/null; rm -f $la $lb' EXIT
A=$(up_addr "$la" $pa) && B=$(up_addr "$lb" $pb) || exit 1
lg() { "${A_BIN:-bin/prism}" loadgen --target "$1" --certs "$certs" --model dlrm-kaggle --plan "$out/dlrm-kaggle-part" --candidates 270 --pool 512 --quiet "${@:2}" 2>/dev/null; }
one() {
	if [ "${CLOSED:-0}" = 1 ]; then
		echo "$1 $(lg "$2" --clients "${CLIENTS:-16}" --duration "${dur}s" --stream "$r" | grep -E '^throughput|^latency' | tr -s ' ' | tr '\n' ' ')"
		return
	fi
	res=$(lg "$2" --rate "$rate" --duration "${dur}s" --timeout 60ms --stream "$r")
	sent=$(sed -n 's/^requests *sent \([0-9]*\).*/\1/p' <<<"$res")
	slo=$(sed -n 's/^SLO *\([0-9.]*\)%.*/\1/p' <<<"$res")
	# No summary (loadgen failed) is no figure, not goodput 0.0.
	[ -n "$sent" ] && [ -n "$slo" ] || { echo "$1 round $r: the run failed (loadgen printed no summary)"; exit 1; }
	echo "$1 goodput $(awk -v s="$sent" -v slo="$slo" -v d="$dur" 'BEGIN{printf "%.1f", s*slo/100/d}') req/s (within 60 ms: $slo%) $(grep -E '^errors' <<<"$res" | tr -s ' ')"
}
for x in A B; do lg "${!x}" --clients 16 --duration 8s >/dev/null; done
for x in A B; do echo "max $x: $(lg "${!x}" --clients 16 --duration 8s | grep ^throughput | tr -s ' ')"; done
for r in $(seq 1 "$rounds"); do
	echo "round $r (load average $(cut -d' ' -f1 /proc/loadavg))"
	if [ $((r % 2)) = 1 ]; then one A "$A"; one B "$B"; else one B "$B"; one A "$A"; fi
done
