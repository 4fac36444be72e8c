#!/usr/bin/env bash
# Prism's main job end to end, on embedded defaults: build zoo models with
# seeded weights and score samples with them through ONNX Runtime.
# (Later stages make this the full disaggregated demo.) Run via `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
prism=bin/prism
out=${DEMO_DIR:-out/demo}
criteo=${CRITEO:-../shared/data/criteo/criteo_sample.txt}

echo "== the model zoo"
$prism models list
echo
echo "== dlrm-kaggle: Criteo Kaggle table sizes, 2 GiB of weights in external data"
$prism models build dlrm-kaggle -o "$out/dlrm-kaggle"
$prism score "$out/dlrm-kaggle/model.onnx" --samples 65536 --batch 256 --threads 1
if [ -f "$criteo" ]; then
	echo
	echo "== dlrm-kaggle on real Criteo rows ($criteo)"
	$prism score "$out/dlrm-kaggle/model.onnx" --criteo "$criteo" --show 3
fi
echo
echo "== dcnv2-mlperf: MLPerf DLRMv2 shape (multi-hot, cross network), tables at 1% of their rows"
$prism models build dcnv2-mlperf --rows-scale 0.01 -o "$out/dcnv2-mlperf"
$prism score "$out/dcnv2-mlperf/model.onnx" --samples 4096 --batch 256 --threads 0
