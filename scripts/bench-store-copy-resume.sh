#!/usr/bin/env bash
# prism store copy cut short, then run again: the demo's dlrm-kaggle
# store (make demo builds it) copied over mutual TLS on loopback, the
# first copy stopped (SIGINT) after CUT seconds (default 2), the second
# timed; it prints the bytes the first left staged, the second's time,
# and the files and bytes the sender kept (its log's reused_*). One copy
# before both warms the sender's page cache.
#
#   scripts/bench-store-copy-resume.sh     env: CUT
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/prism ] || go build -o bin/prism ./cmd/prism
. scripts/upaddr.sh
W=/tmp/prism-resume; rm -rf $W; mkdir -p $W
bin/prism serve embedding --certs out/demo/certs --plan out/demo/dlrm-kaggle-part --db out/demo/db --addr 127.0.0.1:0 --metrics-addr off >$W/emb.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf $W/dst' EXIT
addr=$(up_addr $W/emb.log $pid "embedding tier listening on")
# warm the sender's page cache as the bench rounds do
bin/prism store copy --from $addr --db $W/warm --certs out/demo/certs >/dev/null 2>&1; rm -rf $W/warm
s=$(date +%s.%N); timeout -s INT ${CUT:-2} bin/prism store copy --from $addr --db $W/dst --certs out/demo/certs >$W/c1.out 2>&1 || true; e=$(date +%s.%N)
echo "cut after $(python3 -c "print(round($e-$s,2))") s: $(du -sb $W/dst/copy-in | cut -f1) bytes staged"
sleep 1
s=$(date +%s.%N); bin/prism store copy --from $addr --db $W/dst --certs out/demo/certs >$W/c2.out 2>$W/c2.err; e=$(date +%s.%N)
echo "resumed in $(python3 -c "print(round($e-$s,2))") s"; grep "received\|swapped" $W/c2.out
grep "sent a copy" $W/emb.log | tail -1 | grep -o "reused_files=[0-9]* reused_bytes=[0-9]*"
