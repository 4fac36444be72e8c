#!/usr/bin/env bash
# Monolithic scoring throughput (the baseline every later figure is a ratio
# against): dlrm-kaggle at full size and dcnv2-mlperf with tables at 1%,
# batch 1/64/256/1024, one and two ONNX Runtime threads. Prints a Markdown
# table for BENCHMARKS.md. Run via `make bench-score`; the models are
# built once into BENCH_DIR (default out/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
prism=bin/prism
out=${BENCH_DIR:-out/bench}
[ -f "$out/dlrm-kaggle/model.onnx" ] || $prism models build dlrm-kaggle -o "$out/dlrm-kaggle" >/dev/null
[ -f "$out/dcnv2-mlperf/model.onnx" ] || $prism models build dcnv2-mlperf --rows-scale 0.01 -o "$out/dcnv2-mlperf" >/dev/null
echo "| model | batch | threads | samples/s | batch p50 | batch p99 |"
echo "|---|---:|---:|---:|---:|---:|"
for model in dlrm-kaggle dcnv2-mlperf; do
	for batch in 1 64 256 1024; do
		for threads in 1 2; do
			if [ $model = dlrm-kaggle ]; then n=$((batch >= 64 ? 131072 : 8192)); else n=$((batch >= 64 ? 8192 : 512)); fi
			line=$($prism score "$out/$model/model.onnx" --samples $n --batch $batch --threads $threads --show 0 --warmup 5)
			sps=$(sed -E 's/.*: ([0-9]+) samples\/s.*/\1/' <<<"$line")
			p50=$(sed -E 's/.*p50 ([^ ]+) p99.*/\1/' <<<"$line")
			p99=$(sed -E 's/.*p99 ([^ ]+)$/\1/' <<<"$line")
			echo "| $model | $batch | $threads | $sps | $p50 | $p99 |"
		done
	done
done
