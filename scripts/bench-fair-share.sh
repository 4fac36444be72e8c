#!/usr/bin/env bash
# One model overloaded beside a lightly loaded one on one stack: does the
# light one keep its SLO? One prism up serves dlrm-tiny under two names,
# hot and cold (one embedding worker, a dense worker each); two load
# generators run at once for DURATION: hot at HOT_RATE req/s (past the
# stack's capacity) and cold at COLD_RATE, both with DEADLINE deadlines
# (the SLO counted at that), 270 candidates a request, requests drawn
# from a pool of 256. Prints each model's requests, throughput, latency
# and SLO lines. With BASE, a second binary, runs ROUNDS pairs, the two
# binaries alternated, to compare them on the same host in one run.
#
#   scripts/bench-fair-share.sh [WORK]
#   env: PRISM (binary, default bin/prism) BASE (a binary to compare
#        with) ROUNDS (3) HOT_RATE (700) COLD_RATE (10) DEADLINE (100ms)
#        DURATION (30s)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
WORK=${1:-/tmp/prism-fair-share}
prism=$(realpath "${PRISM:-bin/prism}")
rounds=${ROUNDS:-3}; hot=${HOT_RATE:-700}; cold=${COLD_RATE:-10}; deadline=${DEADLINE:-100ms}; duration=${DURATION:-30s}
mkdir -p "$WORK"
if [ ! -f "$WORK/cold/plan.json" ]; then
	"$prism" models build dlrm-tiny -o "$WORK/src" >/dev/null
	for m in hot cold; do
		"$prism" partition "$WORK/src/model.onnx" -o "$WORK/$m" --overwrite >/dev/null
		python3 -c 'import json,sys; p=sys.argv[1]+"/plan.json"; d=json.load(open(p)); d["model"]["name"]=sys.argv[2]; json.dump(d, open(p,"w"), indent=2)' "$WORK/$m" "$m"
	done
fi
# round BIN TAG: one run of BIN; prints its two models' lines.
round() {
	local bin=$1 tag=$2 log up
	rm -rf "$WORK/db" "$WORK/db-router-log" "$WORK/certs"
	log=$WORK/up-$tag.log
	"$bin" up --model "$WORK/hot" --model "$WORK/cold" --db "$WORK/db" --insecure --addr 127.0.0.1:0 >"$log" 2>&1 &
	up=$!
	local addr
	addr=$(up_addr "$log" "$up") || { kill $up 2>/dev/null; return 1; }
	local lg=("$bin" loadgen --target "$addr" --insecure --quiet --model-preset dlrm-tiny --timeout "$deadline" --slo "$deadline" --candidates 270 --pool 256)
	"${lg[@]}" --model hot --rate 100 --duration 5s >/dev/null 2>&1 || true # warm-up
	"${lg[@]}" --model hot --rate "$hot" --duration "$duration" >"$WORK/hot-$tag.txt" 2>&1 &
	local h=$!
	sleep 2
	"${lg[@]}" --model cold --rate "$cold" --duration "$duration" >"$WORK/cold-$tag.txt" 2>&1 || true
	wait $h || true
	kill -INT $up; wait $up || true
	for m in hot cold; do
		echo "$tag $m: $(grep -E '^(requests|throughput|latency|SLO)' "$WORK/$m-$tag.txt" | sed 's/  */ /g' | tr '\n' ';')"
	done
}
if [ -z "${BASE:-}" ]; then
	round "$prism" run
	exit
fi
base=$(realpath "$BASE")
for r in $(seq "$rounds"); do
	round "$base" "base-$r"
	round "$prism" "new-$r"
done
