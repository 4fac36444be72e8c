#!/usr/bin/env bash
# CPU per request of each tier under a closed loop: starts `prism up` on
# make demo's artifacts (BENCH_DIR, default out/demo) with UP_FLAGS,
# warms up, runs CLIENTS (default 16) clients of 270 candidates for DUR
# seconds (default 15), and prints the throughput and each process's CPU
# seconds over the run from /proc (divide by the requests for CPU per
# request), with the machine's idle share. Run it once per setting,
# alternating, to compare settings.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
bin=${PRISM:-bin/prism}
out=${BENCH_DIR:-out/demo}
log=$(mktemp)
$bin up --model "$out/dlrm-kaggle-part" --db "$out/db" --addr 127.0.0.1:0 --certs "$out/certs" ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; rm -f $log' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg() { $bin loadgen --target "$addr" --certs "$out/certs" --model dlrm-kaggle --plan "$out/dlrm-kaggle-part" --candidates 270 --pool 512 --quiet "$@" 2>/dev/null; }
# The tiers' processes: prism up's children.
snap() { for p in $(pgrep -P $up); do echo "$p $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null) $(tr '\0' ' ' </proc/$p/cmdline | awk '{print $2,$3}')"; done | sort; }
idle() { awk '/^cpu /{print $5, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
lg --clients "${CLIENTS:-16}" --duration 8s >/dev/null
a=$(snap); read -r i0 s0 < <(idle)
res=$(lg --clients "${CLIENTS:-16}" --duration "${DUR:-15}s")
b=$(snap); read -r i1 s1 < <(idle)
grep -E '^(requests|throughput)' <<<"$res" | tr -s ' '
echo "machine idle share $(awk -v a="$i0" -v b="$i1" -v c="$s0" -v d="$s1" 'BEGIN{printf "%.2f", (b-a)/(d-c)}')"
join <(echo "$a") <(echo "$b") | awk '{printf "%-16s %6.2f CPU-s\n", $3" "$4, ($5-$2)/100}'
