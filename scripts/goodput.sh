#!/usr/bin/env bash
# Goodput under overload with deadlines at the SLO (issue 18).
# usage: scripts/goodput.sh BIN "80 120" [extra loadgen flags]
# Needs make demo's artifacts in out/demo (or BENCH_DIR). Starts prism up, measures
# the closed-loop maximum (CLIENTS clients, default 16; the median of MAX_RUNS
# runs, default 3), then offers each share of it
# (Poisson, 15 s, 60 ms deadlines) and prints goodput: requests answered
# OK within 60 ms per second, and that over the maximum. UP_FLAGS go to
# prism up (e.g. "--admit-share 0.7"). SERVER_CPUS and CLIENT_CPUS
# (taskset lists, e.g. 0 and 1) pin the serving processes and the load
# generator to cores of their own, so the client's work (and the cost of
# the requests refused) does not take the servers' cores: on one host,
# the closest to a load generator on another machine.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
if [ $# -lt 2 ]; then echo "usage: scripts/goodput.sh BIN \"80 120\" [extra loadgen flags]" >&2; exit 2; fi
bin=$1; loads=$2; shift 2
out=${BENCH_DIR:-out/demo}
log=$(mktemp)
# SERVER_CPUS and CLIENT_CPUS pin the stacks and the load generator apart (scripts/pin.sh).
. scripts/pin.sh
"${srv[@]}" $bin up --model $out/dlrm-kaggle-part --db $out/db --addr 127.0.0.1:0 --certs $out/certs ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; rm -f $log' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg() { "${cli[@]}" $bin loadgen --target "$addr" --certs $out/certs --model dlrm-kaggle --plan $out/dlrm-kaggle-part --candidates 270 --pool 512 --quiet "$@" 2>/dev/null; }
lg --clients "${CLIENTS:-16}" --duration 5s >/dev/null
# The maximum is the median of MAX_RUNS (default 3) closed-loop runs of
# 10 s: one run's rate moved by a fifth between runs of one binary on a
# 16-core host, and each share offered, and the goodput ratio, is of it.
maxes=()
for _ in $(seq 1 "${MAX_RUNS:-3}"); do
  m=$(lg --clients "${CLIENTS:-16}" --duration 10s | sed -n 's/^throughput *\([0-9.]*\) req\/s.*/\1/p')
  [ -n "$m" ] || { echo "goodput: no closed-loop maximum (loadgen failed)"; exit 1; }
  maxes+=("$m")
done
max=$(printf '%s\n' "${maxes[@]}" | sort -g | awk '{v[NR]=$1} END{if (NR%2) print v[(NR+1)/2]; else printf "%.1f\n", (v[NR/2]+v[NR/2+1])/2}')
echo "$bin max $max req/s (median of ${maxes[*]})"
for pct in $loads; do
  rate=$(awk -v r="$max" -v p="$pct" 'BEGIN{printf "%.1f", r*p/100}')
  res=$(lg --rate "$rate" --duration 15s --timeout 60ms "$@")
  sent=$(sed -n 's/^requests *sent \([0-9]*\).*/\1/p' <<<"$res")
  slo=$(sed -n 's/^SLO *\([0-9.]*\)%.*/\1/p' <<<"$res")
  p99=$(sed -n 's/.*p99 \([^ ]*\)  p99.9.*/\1/p' <<<"$res")
  errs=$(sed -n 's/^errors by *//p' <<<"$res")
  # A run that printed no summary (loadgen failed) is no figure: its
  # empty fields read as goodput 0.0 = 0.00 of max.
  [ -n "$sent" ] && [ -n "$slo" ] || { echo "goodput: the run at $pct% offered failed (loadgen printed no summary)"; exit 1; }
  awk -v b="$bin" -v p="$pct" -v r="$rate" -v s="$sent" -v slo="$slo" -v m="$max" -v p99="$p99" -v e="$errs" 'BEGIN{g=s*slo/100/15; printf "%s %s%% offered %.0f req/s: within 60ms %s%%, goodput %.1f req/s = %.2f of max, p99 %s, errors %s\n", b, p, r, slo, g, g/m, p99, e}'
done
