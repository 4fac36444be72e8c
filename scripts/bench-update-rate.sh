#!/usr/bin/env bash
# How many embedding updates a second does one model take, by clients
# and rows an update? One prism up serves dlrm-kaggle built with
# --max-rows MAX_ROWS (one embedding worker, two dense workers, the
# router's update log on disk: prism up's default); for each number of
# clients in CLIENTS and of rows in ROWS, prism loadgen --update-only
# sends updates of TABLE closed loop (each client sends its next update
# when its last is acknowledged) for DURATION. Prints, per run, the
# updates' throughput and latency lines. With BASE, a second binary,
# runs ROUNDS pairs, the two binaries alternated (a fresh stack each),
# to compare them on the same host in one run: concurrent clients'
# updates are merged by the router (group commit) since the binary of
# this script's commit, not before.
#
#   scripts/bench-update-rate.sh [WORK]
#   env: PRISM (binary, default bin/prism) BASE (a binary to compare
#        with) ROUNDS (2) CLIENTS ("1 4 16") ROWS ("1 64") DURATION (10s)
#        MAX_ROWS (200000) TABLE (emb_l.3.weight; all: the plan's 26
#        tables in turn, as a trainer writing every table it touched)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
WORK=${1:-/tmp/prism-update-rate}
prism=$(realpath "${PRISM:-bin/prism}")
rounds=${ROUNDS:-2}; clients=${CLIENTS:-1 4 16}; rowsList=${ROWS:-1 64}; duration=${DURATION:-10s}
maxrows=${MAX_ROWS:-200000}; table=${TABLE:-emb_l.3.weight}
mkdir -p "$WORK"
if [ ! -f "$WORK/part/plan.json" ]; then
	"$prism" models build dlrm-kaggle --max-rows "$maxrows" -o "$WORK/src" >/dev/null
	"$prism" partition "$WORK/src/model.onnx" -o "$WORK/part" --overwrite >/dev/null
fi
up=
stop() { [ -n "$up" ] && { kill -INT "$up" 2>/dev/null; wait "$up" 2>/dev/null || true; }; up=; }
trap stop EXIT
# round BIN TAG: one stack of BIN, every clients x rows run against it.
round() {
	local bin=$1 tag=$2 log addr=
	rm -rf "$WORK/db" "$WORK/db-router-log" "$WORK/certs"
	log=$WORK/up-$tag.log
	"$bin" up --model "$WORK/part" --db "$WORK/db" --insecure --addr 127.0.0.1:0 >"$log" 2>&1 &
	up=$!
	addr=$(up_addr "$log" "$up") || return 1
	local lg=("$bin" loadgen --target "$addr" --insecure --quiet --model dlrm-kaggle --plan "$WORK/part" --update-only)
	[ "$table" = all ] || lg+=(--update-tables "$table")
	"${lg[@]}" --update-clients 4 --update-rows 64 --duration 3s >/dev/null 2>&1 || true # warm-up
	local n r out
	for r in $rowsList; do
		for n in $clients; do
			out=$WORK/$tag-c$n-r$r.txt
			"${lg[@]}" --update-clients "$n" --update-rows "$r" --duration "$duration" >"$out" 2>&1 || true
			echo "$tag clients=$n rows=$r: $(grep -E '^(updates|throughput|latency)' "$out" | sed 's/  */ /g' | tr '\n' ';')"
		done
	done
	stop
}
if [ -z "${BASE:-}" ]; then
	round "$prism" run
	exit
fi
base=$(realpath "$BASE")
for i in $(seq "$rounds"); do
	round "$base" "base-$i"
	round "$prism" "new-$i"
done
