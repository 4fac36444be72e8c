#!/usr/bin/env bash
# Larger than memory on one worker: the embedding store's miss path with
# the reader in a memory cgroup (v1) so the page cache cannot hold the
# tables. Builds dlrm-kaggle-shaped tables (dim 16: 26 tables, 33.8M rows,
# 2,061 MiB of float32) and ingests them outside the cgroup, then runs
# `prism store bench --scenario misses` inside a cgroup of LIMIT bytes
# (default 512 MiB: the tables are 4.0x), which drops the store files'
# page cache and compares point Gets with the sorted pass per Zipf
# exponent. Needs root and cgroup v1 (/sys/fs/cgroup/memory); removes the
# group after. Disk: about 5 GB under WORK.
#
#   scripts/bench-ltm.sh [WORK]   env: LIMIT HOT CACHE ZIPF BATCHES WARMUP PAR DIM
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/prism-ltm}
LIMIT=${LIMIT:-512M}
HOT=${HOT:-192MiB}
CACHE=${CACHE:-32MiB}
ZIPF=${ZIPF:-1.05}
BATCHES=${BATCHES:-500}
WARMUP=${WARMUP:-1000}
PAR=${PAR:-4}
DIM=${DIM:-16}
# Before the setup (minutes, gigabytes), which a missing or read-only
# cgroup v1 memory hierarchy would otherwise fail after.
[ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ] || {
	echo "bench-ltm: needs root and cgroup v1 memory (/sys/fs/cgroup/memory); on cgroup v2, run the misses scenario under systemd-run --scope -p MemoryMax=$LIMIT instead" >&2
	exit 1
}
mkdir -p "$WORK"
# Without PRISM, this checkout's binary, built into WORK on every run (go
# build is incremental), never one an earlier checkout left there.
if [ -z "${PRISM:-}" ]; then
	PRISM=$WORK/prism
	go build -o "$PRISM" ./cmd/prism
fi
common=(--work "$WORK" --dim "$DIM" --hot-bytes "$HOT" --cache-bytes "$CACHE" --batches "$BATCHES" --warmup "$WARMUP")

echo "== setup (outside the cgroup)"
"$PRISM" store bench "${common[@]}" --scenario setup

CG=/sys/fs/cgroup/memory/prism-ltm-$$
mkdir "$CG"
cleanup() {
	# The group can go once its process is gone; its page cache moves to the parent.
	for _ in 1 2 3 4 5; do rmdir "$CG" 2>/dev/null && return; sleep 1; done
	echo "could not remove $CG" >&2
}
trap cleanup EXIT
echo "$LIMIT" > "$CG/memory.limit_in_bytes"
echo "== misses (in cgroup $CG, limit $(cat "$CG/memory.limit_in_bytes") bytes)"
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" \
	"$PRISM" store bench "${common[@]}" --scenario misses --zipf "$ZIPF" --miss-parallel "$PAR"
echo "cgroup peak: $(cat "$CG/memory.max_usage_in_bytes") bytes, limit hits: $(cat "$CG/memory.failcnt")"
