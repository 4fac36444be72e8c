#!/usr/bin/env bash
# The user context against every feature per candidate (issue 18), in one
# run on this machine (needs `make demo` first, or set PLAN/DB): one
# `prism up` stack on dlrm-kaggle and closed-loop runs at 270 candidates
# per request, alternating (the order swapped every round, ROUNDS rounds,
# default 5) between
#  - context: 13 of the 26 sparse features (CONTEXT, default cat_0 to
#    cat_12: the user's) sent once per request, looked up once per
#    micro-batch and sent to the dense worker as one row;
#  - per candidate: the same requests (loadgen --expand-context: each
#    candidate repeats the request's context values) with every feature
#    per candidate;
# and, between the rounds, the monolith (prism score, batch 256,
# MONO_THREADS threads, default "1 2") on the same cores. Prints each
# round, then the medians: samples/s and p99 of each, their ratio, the
# monolith's samples/s, the bytes per sample the embedding tier sent in
# its frames (prism_embedding_frame_bytes_total over
# prism_embedding_frame_samples_total, every embedding worker), and
# where the cores went: each tier's CPU ms per 1000 samples
# (process_cpu_seconds_total of every child), the router's mean dense
# stage per micro-batch, and the dense workers' mean batch.
# Mutual TLS by default (certificates in CERTS, default certs beside DB,
# made by prism up when missing); TLS=0 runs plaintext. UP_FLAGS go to
# prism up, LG_FLAGS to every loadgen run.
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
warm=${WARMUP:-10s}
rounds=${ROUNDS:-5}
cands=${CANDIDATES:-270}
context=${CONTEXT:-$(seq -s, -f 'cat_%g' 0 12)}
certs=${CERTS:-$(dirname "$db")/certs}
if [ "${TLS:-1}" = 0 ]; then tls=(--insecure); else tls=(--certs "$certs"); fi
. scripts/scrape.sh
[ -f "$plan/plan.json" ] || { echo "bench-context: no partition at $plan (run make demo first)"; exit 1; }

tmp=$(mktemp -d)
up=""
cleanup() {
	[ -n "$up" ] && { kill -TERM "$up" 2>/dev/null || true; wait "$up" 2>/dev/null || true; }
	rm -rf "$tmp"
}
trap cleanup EXIT
log="$tmp/up.log"
: >"$log" # before the first sed (set -e: a missing log ended the script)
$prism up --model "$plan" --db "$db" --addr 127.0.0.1:0 "${tls[@]}" ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
addr=$(up_addr "$log" "$up") || exit 1
# Every child's tier and metrics address, from its "serving" log line.
sed -n 's/.*msg=serving tier=\([a-z]*\) .*metrics=\([0-9.:]*\).*/\1 \2/p' "$log" | sort -u >"$tmp/metrics"
grep -q '^embedding ' "$tmp/metrics" || { echo "bench-context: no embedding worker's metrics address in the log" >&2; exit 1; }

lg() { $prism loadgen --target "$addr" "${tls[@]}" --model "$model" --plan "$plan" --candidates "$cands" --pool ${POOL:-512} --quiet --clients "$clients" --context-inputs "$context" ${LG_FLAGS:-} "$@"; }
ctxrun() { lg "$@"; }
fullrun() { lg --expand-context "$@"; }
mono() { $prism score "$out/$model/model.onnx" --samples ${MONO_SAMPLES:-131072} --batch 256 --threads "$1" --show 0 | sed -E 's/.*: ([0-9]+) samples\/s.*/\1/'; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
median() { tr ' ' '\n' | sort -g | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }

# snap prints the counters summed over the children, one "key value" a line.
snap() {
	while read -r tier maddr; do
		scrape "$maddr/metrics" | awk -v t="$tier" '
			/^prism_embedding_frame_bytes_total / {print "frame_bytes", $2}
			/^prism_embedding_frame_samples_total / {print "frame_samples", $2}
			/^process_cpu_seconds_total / {print "cpu_" t, $2}
			/^prism_router_stage_seconds_sum\{stage="dense"\}/ {print "dense_stage_sum", $2}
			/^prism_router_stage_seconds_count\{stage="dense"\}/ {print "dense_stage_count", $2}
			/^prism_dense_samples_total/ {print "dense_samples", $2}
			/^prism_dense_batches_total/ {print "dense_batches", $2}'
	done <"$tmp/metrics" | awk '{s[$1]+=$2} END{for (k in s) printf "%s %.6f\n", k, s[k]}' | sort
}
# delta BEFORE AFTER: the counters' increase.
delta() { join <(echo "$1") <(echo "$2") | awk '{printf "%s %.6f\n", $1, $3-$2}'; }
get() { awk -v k="$2" '$1==k{print $2}' <<<"$1"; }

# measure NAME RUN: one measured closed loop; appends its figures to
# $tmp/NAME (samples/s, p99 ms, bytes/sample, CPU ms per 1000 samples
# per tier, dense stage ms, mean dense batch).
measure() {
	local name=$1 res before after d n
	shift
	before=$(snap)
	res=$("$@" --duration "$dur")
	after=$(snap)
	d=$(delta "$before" "$after")
	n=$(get "$d" frame_samples)
	local sps p bps
	sps=$(samples <<<"$res"); p=$(p99 <<<"$res")
	bps=$(awk -v b="$(get "$d" frame_bytes)" -v n="$n" 'BEGIN{ if (n>0) printf "%.0f", b/n; else print "-" }')
	local cpu=""
	for tier in router embedding dense; do
		cpu="$cpu $(awk -v c="$(get "$d" "cpu_$tier")" -v n="$n" 'BEGIN{ if (n>0) printf "%.3f", 1e6*c/n; else print "-" }')"
	done
	local stage batch
	stage=$(awk -v s="$(get "$d" dense_stage_sum)" -v c="$(get "$d" dense_stage_count)" 'BEGIN{ if (c>0) printf "%.2f", 1000*s/c; else print "-" }')
	batch=$(awk -v s="$(get "$d" dense_samples)" -v c="$(get "$d" dense_batches)" 'BEGIN{ if (c>0) printf "%.0f", s/c; else print "-" }')
	echo "$sps $p $bps$cpu $stage $batch" >>"$tmp/$name"
	echo "  $name: $sps samples/s, p99 $p, $bps B/sample, CPU ms/1000 samples router/embedding/dense:$cpu, dense stage $stage ms, dense batch $batch" >&2
}

echo "bench-context: $clients clients x $cands candidates, context inputs $context" >&2
# Warm-up: hot tiers, ONNX Runtime arenas, connections.
ctxrun --duration "$warm" >/dev/null
fullrun --duration "$warm" >/dev/null
m1s=""; m2s=""
for r in $(seq 1 "$rounds"); do
	echo "round $r:" >&2
	if [ $((r % 2)) = 1 ]; then
		measure context ctxrun; measure full fullrun
	else
		measure full fullrun; measure context ctxrun
	fi
	ms=""
	for th in ${MONO_THREADS:-1 2}; do
		m=$(mono "$th"); ms="$ms ${th}t $m"
		echo "$m" >>"$tmp/mono$th"
	done
	echo "  monolith:$ms samples/s" >&2
done

# col NAME K: the median of column K of NAME's runs.
col() { awk -v k="$2" '{printf "%s ", $k}' "$tmp/$1" | sed 's/ $//' | sed 's/ms//g' | median; }
cs=$(col context 1); fs=$(col full 1)
echo
echo "| measure | context ($context) | every feature per candidate |"
echo "|---|---:|---:|"
echo "| samples/s, $clients clients x $cands candidates (median of $rounds) | $cs | $fs |"
echo "| p99 (ms, median) | $(col context 2) | $(col full 2) |"
echo "| frame bytes per sample (embedding -> dense) | $(col context 3) | $(col full 3) |"
echo "| CPU ms per 1000 samples: router | $(col context 4) | $(col full 4) |"
echo "| CPU ms per 1000 samples: embedding | $(col context 5) | $(col full 5) |"
echo "| CPU ms per 1000 samples: dense | $(col context 6) | $(col full 6) |"
echo "| router's dense stage per micro-batch (ms) | $(col context 7) | $(col full 7) |"
echo "| dense worker's mean batch (samples) | $(col context 8) | $(col full 8) |"
echo
echo "| ratio | value |"
echo "|---|---:|"
echo "| context / per candidate (samples/s) | $(awk -v a="$cs" -v b="$fs" 'BEGIN{printf "%.2f", a/b}') |"
for th in ${MONO_THREADS:-1 2}; do
	m=$(median <"$tmp/mono$th")
	echo "| monolith, batch 256, $th thread(s) (samples/s, median) | $m |"
	echo "| context / monolith $th thread(s) | $(awk -v a="$cs" -v b="$m" 'BEGIN{printf "%.2f", a/b}') |"
done
