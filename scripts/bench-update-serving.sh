#!/usr/bin/env bash
# Serving beside a stream of online embedding updates: how much does the
# stream cost the Recommend traffic's latency, and how fast are the
# updates acknowledged meanwhile? One prism up serves dlrm-kaggle built
# with --max-rows MAX_ROWS (one embedding worker, two dense workers, as
# prism up starts by default); for each stream below, prism loadgen
# sends Recommend requests at RATE req/s (270 candidates, a pool of 256)
# for DURATION with the update stream beside it (prism loadgen
# --update-*, updates of TABLE):
#   none                          no updates (the baseline)
#   64 rows at 70/s               a trainer's steady trickle
#   64 rows at 500/s              a busy one
#   4096 rows, 1 client           as fast as one client goes (closed loop)
# Prints, per stream, the requests' throughput, latency and SLO lines and
# the updates' throughput and latency lines.
#
#   scripts/bench-update-serving.sh [WORK]
#   env: PRISM (binary, default bin/prism) RATE (50) DURATION (30s)
#        MAX_ROWS (200000) TABLE (emb_l.3.weight)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
WORK=${1:-/tmp/prism-update-serving}
prism=$(realpath "${PRISM:-bin/prism}")
rate=${RATE:-50}; duration=${DURATION:-30s}; maxrows=${MAX_ROWS:-200000}; table=${TABLE:-emb_l.3.weight}
mkdir -p "$WORK"
if [ ! -f "$WORK/part/plan.json" ]; then
	"$prism" models build dlrm-kaggle --max-rows "$maxrows" -o "$WORK/src" >/dev/null
	"$prism" partition "$WORK/src/model.onnx" -o "$WORK/part" --overwrite >/dev/null
fi
rm -rf "$WORK/db" "$WORK/db-router-log" "$WORK/certs"
log=$WORK/up.log
"$prism" up --model "$WORK/part" --db "$WORK/db" --insecure --addr 127.0.0.1:0 >"$log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg=("$prism" loadgen --target "$addr" --insecure --quiet --model dlrm-kaggle --plan "$WORK/part" --candidates 270 --pool 256)
"${lg[@]}" --rate "$rate" --duration 5s >/dev/null 2>&1 || true # warm-up
run() {
	local name=$1; shift
	local out=$WORK/$(echo "$name" | tr -c 'a-z0-9\n' '-').txt
	"${lg[@]}" --rate "$rate" --duration "$duration" "$@" >"$out" 2>&1 || true
	echo "$name: $(grep -E '^(requests|throughput|latency|SLO|updates)' "$out" | sed 's/  */ /g' | tr '\n' ';')"
}
run "none"
run "64 rows at 70/s" --update-rate 70 --update-rows 64 --update-tables "$table"
run "64 rows at 500/s" --update-rate 500 --update-rows 64 --update-tables "$table"
run "4096 rows, 1 client" --update-clients 1 --update-rows 4096 --update-tables "$table"
