#!/usr/bin/env bash
# Prism's main job end to end, on embedded defaults (run via `make demo`):
# build dlrm-kaggle (the Criteo Kaggle table sizes, 2 GiB of weights),
# score it whole as the baseline, partition it, ingest its tables into the
# embedding store, start the three tiers with `prism up` on loopback, send
# load for 30 seconds, print throughput and latency percentiles, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=bin/prism
out=${DEMO_DIR:-out/demo}
model=${DEMO_MODEL:-dlrm-kaggle}
duration=${DEMO_DURATION:-30s}
rate=${DEMO_RATE:-40}
# DEMO_DIR (default out/demo) holds the model, plan, store and logs;
# DEMO_MODEL (default dlrm-kaggle) another preset of `prism models list`;
# DEMO_DURATION (default 30s) and DEMO_RATE (default 40 requests/s) the
# load.
# Mutual TLS between the tiers and for the load generator, by default
# (prism up makes the certificates in $out/certs, beside the store);
# DEMO_INSECURE=1 runs plaintext.
if [ "${DEMO_INSECURE:-0}" = 1 ]; then tls=(--insecure); wire="plaintext"; else tls=(--certs "$out/certs"); wire="mutual TLS, certificates in $out/certs"; fi
mkdir -p "$out"

echo "== 1. build $model with seeded weights"
# The last run's build goes first: a build into a folder holding one
# keeps the old whole until the new is written, and would need the disk
# for both (4 GiB for dlrm-kaggle).
rm -rf "${out:?}/$model"
$prism models build "$model" -o "$out/$model"
echo
echo "== 2. the monolithic baseline: the whole model in one ONNX Runtime session"
$prism score "$out/$model/model.onnx" --samples 65536 --batch 256 --threads 1 --show 2
echo
echo "== 3. partition: embedding side and dense side, by an exact min-cut"
$prism partition "$out/$model/model.onnx" -o "$out/$model-part" --overwrite --verify 512
echo
echo "== 4. ingest the tables into the embedding store"
# A fresh store, and no update log from an earlier run (prism up keeps
# it beside the store: its updates would be replayed onto the new one;
# router-log is where earlier versions kept it).
rm -rf "$out/db" "$out/db-router-log" "$out/router-log"
$prism ingest "$out/$model-part" --db "$out/db"
echo
echo "== 5. prism up: router, dense tier and embedding tier on loopback ($wire)"
log="$out/up.log"
# Emptied here, not only by the child's >"$log": the first sed below may
# run first, and would read an earlier run's address.
: >"$log"
$prism up --model "$out/$model-part" --db "$out/db" --addr 127.0.0.1:0 "${tls[@]}" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
addr=$(up_addr "$log" $up) || { echo "demo: prism up did not come up (its log's end above)"; exit 1; }
grep "Prism is up" "$log"
echo
echo "== 6. prism status: the workers the router knows and what it does with each"
$prism status --router "$addr" "${tls[@]}"
echo
echo "== 7. load: $duration of Poisson arrivals at $rate requests/s, 100-700 candidates each (MLPerf DLRMv2's mix)"
$prism loadgen --target "$addr" "${tls[@]}" --model "$model" --plan "$out/$model-part" --rate "$rate" --duration "$duration" --out "$out/load"
echo
echo "report: $out/load/summary.json, $out/load/plot.png; tier logs: $log"
