#!/usr/bin/env bash
# Disaggregated serving against the monolith, in one run on this machine
# (run via `make bench-serve`; needs `make demo` first, or set PLAN/DB):
#  1. the monolithic baseline: prism score, batch 256, 1 and 2 threads;
#  2. prism up on the same cores, closed loop at 270 candidates per
#     request: the maximum samples/s and the per-stage breakdown (the
#     router's stage histograms);
#  3. open loop at 50% and 80% of that maximum, 270 candidates per
#     request: p50/p99 against the 60 ms target (LOADS="50 80 90 100 120"
#     for more points; UP_FLAGS are passed to prism up, e.g.
#     "--batch-order fifo --fixed-admission" for the FIFO baseline;
#     OPEN_FLAGS go to the open-loop runs, e.g. "--timeout 100ms" to give
#     requests a deadline near the SLO).
# CLIENTS closed-loop clients (default 16) for DURATION (default 15s) a
# run; POOL requests pre-built per client (default 512).
# Mutual TLS by default (certificates in CERTS, default certs beside DB,
# made by prism up when missing); TLS=0 runs every tier and the load
# generator on plaintext (--insecure), for the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=${PRISM:-bin/prism}
out=${BENCH_DIR:-out/demo}
model=${BENCH_MODEL:-dlrm-kaggle}
plan=${PLAN:-$out/$model-part}
db=${DB:-$out/db}
clients=${CLIENTS:-16}
dur=${DURATION:-15s}
certs=${CERTS:-$(dirname "$db")/certs}
if [ "${TLS:-1}" = 0 ]; then tls=(--insecure); else tls=(--certs "$certs"); fi
. scripts/scrape.sh
[ -f "$plan/plan.json" ] || { echo "bench-serve: no partition at $plan (run make demo first)"; exit 1; }

mono() { $prism score "$out/$model/model.onnx" --samples 131072 --batch 256 --threads "$1" --show 0 | sed -E 's/.*: ([0-9]+) samples\/s.*/\1/'; }
median() { tr ' ' '\n' | sort -n | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }

log=$(mktemp)
$prism up --model "$plan" --db "$db" --addr 127.0.0.1:0 "${tls[@]}" ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null || true; wait $up 2>/dev/null || true; rm -f "$log"' EXIT
addr=$(up_addr "$log" $up) || exit 1
metrics=$(sed -n 's/.*router listening on [^ ]* (metrics \([^)]*\)).*/\1/p' "$log" | head -1)

lg() { $prism loadgen --target "$addr" "${tls[@]}" --model "$model" --plan "$plan" --candidates 270 --pool ${POOL:-512} --quiet "$@"; }
# Warm-up (hot tier, ONNX Runtime arenas), then the measured closed loop.
lg --clients "$clients" --duration 10s >/dev/null
# The machine is shared and its speed drifts: the monolith and the
# disaggregated system are measured in alternation, ROUNDS rounds (default 5), and the
# medians compared.
before=$(scrape "$metrics/metrics" | grep -E '^prism_router_stage_seconds_(sum|count)')
m1s=""; m2s=""; ds=""
for round in $(seq 1 "${ROUNDS:-5}"); do
	m1s="$m1s $(mono 1)"
	m2s="$m2s $(mono 2)"
	maxrun=$(lg --clients "$clients" --duration "$dur")
	echo "round $round: $maxrun" >&2
	ds="$ds $(sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p' <<<"$maxrun")"
	gencpu=$(sed -n 's/^generator .*, \(.*\)$/\1/p' <<<"$maxrun")
done
after=$(scrape "$metrics/metrics" | grep -E '^prism_router_stage_seconds_(sum|count)')
mono1=$(median <<<"${m1s# }"); mono2=$(median <<<"${m2s# }"); max=$(median <<<"${ds# }")
reqs=$(awk -v m="$max" 'BEGIN{printf "%.1f", m/270}')
echo
echo "| measure | value |"
echo "|---|---:|"
echo "| monolithic, batch 256, 1 thread (samples/s; median of${m1s}) | $mono1 |"
echo "| monolithic, batch 256, 2 threads (samples/s; median of${m2s}) | $mono2 |"
echo "| disaggregated max, $clients clients x 270 candidates (samples/s; median of${ds}) | $max |"
echo "| ratio to monolithic 2 threads | $(awk -v a="$max" -v b="$mono2" 'BEGIN{printf "%.2f", a/b}') |"
echo "| ratio to monolithic 1 thread | $(awk -v a="$max" -v b="$mono1" 'BEGIN{printf "%.2f", a/b}') |"
echo "| load generator's own CPU during the last max run | $gencpu |"
echo
echo "Per micro-batch stage means during the closed loop (router's view, embedding tier's clocks):"
echo
echo "| stage | mean |"
echo "|---|---:|"
for st in decode lookup cpu_model encode transfer dense; do
	s0=$(grep "sum{stage=\"$st\"}" <<<"$before" | awk '{print $2}'); s1=$(grep "sum{stage=\"$st\"}" <<<"$after" | awk '{print $2}')
	c0=$(grep "count{stage=\"$st\"}" <<<"$before" | awk '{print $2}'); c1=$(grep "count{stage=\"$st\"}" <<<"$after" | awk '{print $2}')
	awk -v st="$st" -v s0="${s0:-0}" -v s1="${s1:-0}" -v c0="${c0:-0}" -v c1="${c1:-0}" 'BEGIN{ if (c1>c0) printf "| %s | %.3f ms |\n", st, 1000*(s1-s0)/(c1-c0) }'
done
echo
echo "| offered load | req/s | p50 | p99 | within 60 ms | generator CPU |"
echo "|---|---:|---:|---:|---:|---:|"
for pct in ${LOADS:-50 80}; do
	rate=$(awk -v r="$reqs" -v p="$pct" 'BEGIN{printf "%.1f", r*p/100}')
	res=$(lg --rate "$rate" --duration "$dur" ${OPEN_FLAGS:-})
	p50=$(sed -n 's/^latency *p50 \([^ ]*\) .*/\1/p' <<<"$res")
	p99=$(sed -n 's/.*p99 \([^ ]*\)  p99.9.*/\1/p' <<<"$res")
	slo=$(sed -n 's/^SLO *\([0-9.]*%\).*/\1/p' <<<"$res")
	cpu=$(sed -n 's/^generator .*, \(.*\)$/\1/p' <<<"$res")
	echo "| ${pct}% of max | $rate | $p50 | $p99 | $slo | $cpu |"
done
