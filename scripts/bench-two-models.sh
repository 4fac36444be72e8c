#!/usr/bin/env bash
# Two models on one stack, one with tight deadlines: does ordering the
# dense workers' batches across models (serve dense --across-models)
# help the tight one? One prism up serves dlrm-kaggle and a copy of it
# under another name (model B) from one store; two load generators run
# at once for DURATION: model A at RATE req/s with TIGHT deadlines (the
# SLO counted at that), model B at RATE with LOOSE ones. Admission by
# predicted time is off (--fixed-admission), so only the dense tier's
# ordering differs between runs. Prints each model's requests, latency
# and SLO lines.
#
#   scripts/bench-two-models.sh [WORK]
#   env: PRISM (binary, default bin/prism) BENCH_DIR (default out/demo, as
#        make demo builds it) RATE (40) DURATION (20s) TIGHT (60ms)
#        LOOSE (1s) UP_FLAGS (more prism up flags, e.g.
#        --dense-across-models off)
# WORK gets model B's partition and a copy of the store (about 2.1 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
WORK=${1:-/tmp/prism-two-models}
prism=${PRISM:-bin/prism}
bench=${BENCH_DIR:-out/demo}
rate=${RATE:-40}; duration=${DURATION:-20s}; tight=${TIGHT:-60ms}; loose=${LOOSE:-1s}
partA=$bench/dlrm-kaggle-part
[ -f "$partA/plan.json" ] && [ -d "$bench/db" ] || { echo "bench-two-models: run make demo first (no $partA or $bench/db)"; exit 1; }
mkdir -p "$WORK"
if [ ! -f "$WORK/part-b/plan.json" ]; then
	rm -rf "$WORK/part-b" "$WORK/db" "$WORK/db-router-log"
	cp -r "$partA" "$WORK/part-b"
	python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["model"]["name"]+="-b"; json.dump(d, open(p,"w"), indent=2)' "$WORK/part-b/plan.json"
	cp -r "$bench/db" "$WORK/db"
	"$prism" ingest "$WORK/part-b" --db "$WORK/db" >/dev/null # the same tables: shared, nothing copied
fi
nameA=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["name"])' "$partA/plan.json")
nameB=$nameA-b
log=$(mktemp)
"$prism" up --model "$partA" --model "$WORK/part-b" --db "$WORK/db" --insecure --fixed-admission --addr 127.0.0.1:0 ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
a=
# Every step may fail (a is empty or has exited, up may have died): under
# set -e the first failing kill ended the trap, leaving prism up running.
trap 'kill $a 2>/dev/null || true; kill -INT $up 2>/dev/null || true; wait $up 2>/dev/null || true; rm -f "$log"' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg() { "$prism" loadgen --target "$addr" --insecure --quiet "$@"; }
lg --model "$nameA" --plan "$partA" --rate 20 --duration 3s >/dev/null 2>&1 &
w=$!
lg --model "$nameB" --plan "$WORK/part-b" --rate 20 --duration 3s >/dev/null 2>&1 || true
wait $w || true
lg --model "$nameA" --plan "$partA" --rate "$rate" --duration "$duration" --timeout "$tight" --slo "$tight" >"$WORK/a.txt" 2>&1 &
a=$!
lg --model "$nameB" --plan "$WORK/part-b" --rate "$rate" --duration "$duration" --timeout "$loose" --slo "$loose" >"$WORK/b.txt" 2>&1 || true
wait $a || true
echo "bench-two-models: $prism ${UP_FLAGS:-}, $rate req/s each"
echo "model A, deadlines $tight:"; grep -E "^(requests|latency|SLO)" "$WORK/a.txt" || tail -3 "$WORK/a.txt"
echo "model B, deadlines $loose:"; grep -E "^(requests|latency|SLO)" "$WORK/b.txt" || tail -3 "$WORK/b.txt"
