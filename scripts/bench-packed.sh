#!/usr/bin/env bash
# Packed id input against separate id inputs, in one run on this machine
# (issue 11's benchmark; needs `make demo` first for the separate-input
# dlrm-kaggle, or set PLAN/DB): builds dlrm-kaggle-packed (the same
# weights, its 26 ids in one [batch, 26] input picked by Gather(axis=1)
# as TorchScript exports x[:, k]) into PACKED_DIR, partitions and
# ingests it, starts both stacks at once and runs closed loops at 270
# candidates per request alternating between them (the order swapped
# every round). Then, during one more packed run, takes a CPU profile of
# the packed stack's embedding worker and reports the share of its CPU
# spent in the pre-lookup ops (any frame of internal/prelookup).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=${PRISM:-bin/prism}
out=${BENCH_DIR:-out/demo}
plan=${PLAN:-$out/dlrm-kaggle-part}
db=${DB:-$out/db}
pdir=${PACKED_DIR:-out/packed}
clients=${CLIENTS:-16}
dur=${DURATION:-15s}
rounds=${ROUNDS:-5}
certs=${CERTS:-$(dirname "$db")/certs}
. scripts/scrape.sh
[ -f "$plan/plan.json" ] || { echo "bench-packed: no partition at $plan (run make demo first)"; exit 1; }

mkdir -p "$pdir"
if [ ! -f "$pdir/dlrm-kaggle-packed-part/plan.json" ] || [ ! -d "$pdir/db" ]; then
	echo "bench-packed: building, partitioning and ingesting dlrm-kaggle-packed into $pdir" >&2
	$prism models build dlrm-kaggle-packed -o "$pdir/dlrm-kaggle-packed" >&2
	$prism partition "$pdir/dlrm-kaggle-packed/model.onnx" -o "$pdir/dlrm-kaggle-packed-part" --overwrite --verify 512 >&2
	rm -rf "$pdir/db" "$pdir/db-router-log"
	$prism ingest "$pdir/dlrm-kaggle-packed-part" --db "$pdir/db" >&2
fi
pplan=$pdir/dlrm-kaggle-packed-part

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

# up NAME ARGS...: starts a stack and sets addr to its Recommend address
# (not in a subshell, so its pid reaches pids).
up() {
	local name=$1 log="$tmp/$1.log"
	addr=""
	shift
	: >"$log" # before the first sed (set -e: a missing log ended the script)
	PRISM_PPROF=1 $prism up --addr 127.0.0.1:0 --certs "$certs" "$@" >"$log" 2>&1 &
	pids+=($!)
	addr=$(up_addr "$log" "${pids[-1]}") || exit 1
}
up separate --model "$plan" --db "$db"
sep_addr=$addr
up packed --model "$pplan" --db "$pdir/db"
packed_addr=$addr
emb_metrics=$(sed -n 's/^\[embedding0\].*msg=serving tier=embedding .*metrics=\([^ ]*\).*/\1/p' "$tmp/packed.log" | head -1)

lg() { $prism loadgen --certs "$certs" --candidates 270 --pool ${POOL:-512} --quiet --clients "$clients" "$@"; }
sep() { lg --target "$sep_addr" --model dlrm-kaggle --plan "$plan" "$@"; }
packed() { lg --target "$packed_addr" --model dlrm-kaggle-packed --plan "$pplan" "$@"; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
median() { tr ' ' '\n' | sort -n | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }

# Warm-up: hot tiers, ONNX Runtime arenas, TLS sessions.
sep --duration 10s >/dev/null
packed --duration 10s >/dev/null
ss=""; ps=""
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then
		a=$(sep --duration "$dur"); b=$(packed --duration "$dur")
	else
		b=$(packed --duration "$dur"); a=$(sep --duration "$dur")
	fi
	s=$(samples <<<"$a"); p=$(samples <<<"$b")
	echo "round $r: separate inputs $s samples/s (p99 $(p99 <<<"$a")), packed input $p samples/s (p99 $(p99 <<<"$b"))" >&2
	ss="$ss $s"; ps="$ps $p"
done
sm=$(median <<<"${ss# }"); pm=$(median <<<"${ps# }")

share="not measured (no embedding worker metrics address in the log)"
if [ -n "$emb_metrics" ]; then
	packed --duration 14s >/dev/null &
	lgpid=$!
	sleep 2
	if scrape "$emb_metrics/debug/pprof/profile?seconds=10" -f -o "$tmp/emb.prof"; then
		# Every sample with a frame of package internal/prelookup on its
		# stack (Program.Run, Columns, RunColumn ...).
		cum=$(go tool pprof -top -focus 'internal/prelookup\.' "$tmp/emb.prof" 2>/dev/null | sed -n 's/^Showing nodes accounting for [^,]*, \([0-9.]*%\) of .*/\1/p')
		cp "$tmp/emb.prof" "$pdir/embedding-worker.prof"
		share="${cum:-0%} of the embedding worker's CPU samples (go tool pprof -top -focus 'internal/prelookup\.'; profile kept in $pdir/embedding-worker.prof)"
	fi
	wait $lgpid || true
fi
echo
echo "| measure | value |"
echo "|---|---:|"
echo "| separate id inputs, $clients clients x 270 candidates (samples/s; median of${ss}) | $sm |"
echo "| packed [batch, 26] input, same (samples/s; median of${ps}) | $pm |"
echo "| packed / separate | $(awk -v a="$pm" -v b="$sm" 'BEGIN{printf "%.3f", a/b}') |"
echo "| pre-lookup ops' share of the packed stack's embedding worker CPU | $share |"
