#!/usr/bin/env bash
# prism store copy's rate: an embedding worker serves the store in DB
# (a plan folder PLAN, default the demo's dlrm-kaggle, which make demo
# builds), and prism store copy takes ROUNDS copies of its whole store
# over mutual TLS on loopback into WORK, the first into a folder no
# process holds (swapped in at once), timed end to end (the worker's
# checkpoint, the stream, the checks, opening the copy, the swap).
# Prints bytes, seconds and MB/s per round; the worker's page cache is
# whatever the rounds before left (the first round may read from disk).
#
#   scripts/bench-store-copy.sh [WORK]
#   env: DB (default out/demo/db) PLAN (default out/demo/dlrm-kaggle-part)
#        CERTS (default out/demo/certs; made when absent) ROUNDS (3) PRISM
#        RATE (prism store copy --rate, e.g. 200MiB/s; default unbounded)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh
WORK=${1:-/tmp/prism-store-copy}
DB=${DB:-out/demo/db}
PLAN=${PLAN:-out/demo/dlrm-kaggle-part}
CERTS=${CERTS:-out/demo/certs}
ROUNDS=${ROUNDS:-3}
PRISM=${PRISM:-bin/prism}
[ -x "$PRISM" ] || go build -o "$PRISM" ./cmd/prism
if [ ! -d "$DB" ] || [ ! -f "$PLAN/plan.json" ]; then
	echo "bench-store-copy: no store $DB or plan $PLAN (make demo builds them; or set DB and PLAN)" >&2
	exit 1
fi
[ -d "$CERTS" ] || "$PRISM" certs init "$CERTS" >/dev/null
rm -rf "$WORK"
mkdir -p "$WORK"
log=$WORK/embedding.log
"$PRISM" serve embedding --certs "$CERTS" --plan "$PLAN" --db "$DB" --addr 127.0.0.1:0 --metrics-addr off >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$WORK"/copy-*' EXIT
addr=$(up_addr "$log" $pid "embedding tier listening on") || exit 1
echo "store $DB ($(du -sh "$DB" | cut -f1)), worker $addr, $(nproc) cores"
for r in $(seq 1 "$ROUNDS"); do
	dst=$WORK/copy-$r
	start=$(date +%s.%N)
	"$PRISM" store copy --from "$addr" --db "$dst" --certs "$CERTS" ${RATE:+--rate "$RATE"} >"$WORK/copy-$r.out" 2>"$WORK/copy-$r.err"
	end=$(date +%s.%N)
	bytes=$(du -sb "$dst" | cut -f1)
	python3 -c "import sys; b,s=int(sys.argv[1]),float(sys.argv[2]); print(f'round {sys.argv[3]}: {b} bytes in {s:.2f} s, {b/s/1e6:.0f} MB/s')" "$bytes" "$(python3 -c "print($end - $start)")" "$r"
	grep -q "swapped in" "$WORK/copy-$r.out" || { echo "round $r: not swapped in:" >&2; cat "$WORK/copy-$r.out" >&2; exit 1; }
	rm -rf "$dst"
done
