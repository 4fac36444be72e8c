#!/usr/bin/env bash
# Larger than memory, end to end (issue 16): a model whose tables are
# RATIO x (default 4x) the embedding worker's memory cgroup, served by a
# router, DENSE dense workers and one embedding worker whose process runs
# inside a memory cgroup (v1, or v2 where v1 is not mounted) of LIMIT bytes, under Criteo-like skew
# (the load generator's Zipf ids), at 270 candidates per request.
#
# The model is dlrm-terabyte (Criteo Terabyte table sizes, dim 64, one id
# per table) with every table capped at MAX_ROWS, chosen so the tables
# hold at least RATIO x LIMIT bytes: its dense part is a small MLP, so on
# CPU dense workers the end-to-end rate is set by the embedding tier's
# miss path, which is what this measures (dcnv2-mlperf's dim-128
# multi-hot bags and rank-512 cross layers would make the dense tier the
# bound on this machine, and its row scale cannot be sized as finely).
#
#  1. build the model (prism models build --max-rows), partition it (the
#     model itself is then deleted: the partition holds the tables), and
#     ingest it into WORK/db, all outside the cgroup;
#  2. all in memory: the embedding worker outside the cgroup with every
#     row preloaded in its hot tier; CLIENTS closed-loop clients for
#     DURATION give the all-in-memory throughput;
#  3. larger than memory: the store files' page cache dropped (fadvise),
#     the embedding worker started inside the cgroup (hot tier HOT, block
#     cache CACHE, no preload); Poisson arrivals at half the all-in-memory
#     throughput, WARM of warm-up, then DURATION measured (the worker
#     sizes Go's memory limit and its lookups in flight to the group's
#     limit, its "memory budget" line): samples/s, p99
#     (goal: under 60 ms), the hot tier's hit ratio and the rows/s read
#     from Pebble (prism_store_* on the worker's /metrics), and the
#     cgroup's peak and limit hits;
#  4. Redis (REDIS=1, when redis-server is installed): the embedding tier
#     cannot serve from Redis, so the comparison is the store benchmark's
#     Redis path (prism store bench --scenario redis: the store against
#     redis-server on loopback, one pipelined MGET per table and batch)
#     on the same table shapes at 270 samples a batch. It runs outside
#     the cgroup: it keeps the flat tables in memory to load Redis, and
#     Redis itself must hold every row in memory to serve the tables,
#     RATIO x the cgroup.
#
# Needs root and a memory cgroup, v1 (/sys/fs/cgroup/memory) or v2;
# removes its group.
# Disk: about 2 x the table bytes under WORK (partition tables + store;
# the model's bytes too while partitioning), and as much again under
# WORK/storebench for step 4. Defaults: LIMIT 768M, 3 GiB of tables,
# about 6.5 GB (13 GB with step 4).
#
#   scripts/bench-ltm-e2e.sh [WORK]
#   env: LIMIT RATIO MAX_ROWS HOT CACHE DENSE CLIENTS DURATION WARM RATE
#        MICRO REDIS REDIS_BATCHES PRISM KEEP_MODEL MEMLIMIT_PCT GCTRACE PROFILE
#        POOL (loadgen --pool; default 0: fresh requests) MISS_PAR (--miss-parallel)
#        DIRECT (default 1; 0: serve embedding --direct-reads=false, buffered
#        reads whose pages drop behind)
#        RESTART (1: restart the worker after the window and measure its
#        first RESTART_WINDOW, default 60s, in RESTART_STEPS windows)
#        WARM_RESTART (with RESTART; default 1, 0: --warm-restart=false)
#        DTYPE (float16 or int8: the tables stored so, in WORK/db-MAX_ROWS-DTYPE)
#        SIZE_BY (float32, the default: MAX_ROWS makes the model's float32
#        tables RATIO x LIMIT, so a DTYPE store holds less, int8 about a
#        quarter; stored: the tables as DTYPE stores them are RATIO x LIMIT,
#        more rows: int8 needs the float32 model and partition of about
#        RATIO x LIMIT x 3.8 each on disk while it partitions)
#        EMB_FLAGS (more flags for the larger-than-memory embedding worker)
#   smoke: LIMIT=256M HOT=24MiB CACHE=8MiB DURATION=10s WARM=5s CLIENTS=8 REDIS_BATCHES=200 scripts/bench-ltm-e2e.sh /tmp/ltm-smoke
#   (256M is about the least limit the memory budget takes with a 64 MiB memtable)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for a tier's address
WORK=${1:-/tmp/prism-ltm-e2e}
LIMIT=${LIMIT:-768M}
RATIO=${RATIO:-4}
HOT=${HOT:-320MiB}
CACHE=${CACHE:-32MiB}
DENSE=${DENSE:-1}
CLIENTS=${CLIENTS:-16}
DURATION=${DURATION:-30s}
WARM=${WARM:-30s}
MICRO=${MICRO:-512}
REDIS=${REDIS:-1}
REDIS_BATCHES=${REDIS_BATCHES:-1000}
CANDIDATES=270
MODEL=dlrm-terabyte
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
# Without PRISM, this checkout's binary, built into WORK on every run (go
# build is incremental): a binary left in WORK by an earlier checkout
# would otherwise be measured instead (it once lacked the memory budget
# and was OOM-killed in the cgroup).
if [ -z "${PRISM:-}" ]; then
	PRISM=$WORK/prism
	go build -o "$PRISM" ./cmd/prism
fi
# The memory group: cgroup v1's memory controller when mounted
# (/sys/fs/cgroup/memory), else cgroup v2's (/sys/fs/cgroup with memory
# among its controllers, enabled for its children here). The cg_*
# functions read each version's files under one name.
if [ -d /sys/fs/cgroup/memory ]; then
	CGV=1 CG=/sys/fs/cgroup/memory/prism-ltm-e2e-$$
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
	CGV=2 CG=/sys/fs/cgroup/prism-ltm-e2e-$$
	grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control ||
		{ echo "bench-ltm-e2e: cannot enable the v2 memory controller for child groups" >&2; exit 1; }
else
	echo "bench-ltm-e2e: needs a memory cgroup: v1 (/sys/fs/cgroup/memory) or v2 (memory in /sys/fs/cgroup/cgroup.controllers)" >&2; exit 1
fi
# cg_make LIMIT_BYTES: the group, limited (v2: no swap either, as v1's
# limit_in_bytes with no swap configured).
cg_make() {
	mkdir "$CG"
	if [ "$CGV" = 1 ]; then
		echo "$1" >"$CG/memory.limit_in_bytes"
	else
		echo "$1" >"$CG/memory.max"
		[ ! -f "$CG/memory.swap.max" ] || echo 0 >"$CG/memory.swap.max"
	fi
}
# cg_peak, cg_failcnt, cg_usage, cg_kmem: bytes at the peak, times the
# limit was hit (v2: memory.events' max), bytes now, kernel bytes now.
cg_peak() { if [ "$CGV" = 1 ]; then cat "$CG/memory.max_usage_in_bytes"; else cat "$CG/memory.peak" 2>/dev/null || cat "$CG/memory.current"; fi; }
cg_failcnt() { if [ "$CGV" = 1 ]; then cat "$CG/memory.failcnt"; else awk '$1 == "max" {print $2}' "$CG/memory.events"; fi; }
cg_usage() { if [ "$CGV" = 1 ]; then cat "$CG/memory.usage_in_bytes"; else cat "$CG/memory.current"; fi; }
cg_kmem() {
	if [ "$CGV" = 1 ]; then cat "$CG/memory.kmem.usage_in_bytes" 2>/dev/null || echo 0
	else awk '$1 == "kernel" {k=$2} END {print k+0}' "$CG/memory.stat"; fi
}
# cg_memstat: page cache (cache, of which mapped_file) against the
# process's anonymous memory (rss, and rss_huge: the hot tier's
# transparent huge pages), and the major faults taken, under v1's names
# (v2's file, file_mapped, anon, anon_thp).
cg_memstat() {
	awk -v v2="$([ "$CGV" = 2 ] && echo 1)" 'BEGIN {n["file"]="cache"; n["anon"]="rss"; n["anon_thp"]="rss_huge"; n["file_mapped"]="mapped_file"}
		{k=$1; if (v2 && (k in n)) k=n[k]; else if (v2 && k != "pgmajfault") next}
		k ~ /^(cache|rss|rss_huge|mapped_file|pgmajfault)$/ {v=$2; if (k != "pgmajfault") v=int(v/1048576)" MiB"; printf "%s%s %s", sep, k, v; sep=", "}' "$CG/memory.stat"
}

bytes() { python3 -c 'import sys,re
s=sys.argv[1]; m=re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?",s,re.I)
print(int(float(m.group(1))*1024**"_KMGT".index((m.group(2) or "_").upper())))' "$1"; }
limit_bytes=$(bytes "$LIMIT")

# Bytes a stored dim-64 row takes (store.DType.RowBytes): int8 a float32
# scale and a byte a value, float16 two bytes a value.
case "${DTYPE:-float32}" in
int8) stored_row=68 ;;
float16) stored_row=128 ;;
*) stored_row=256 ;;
esac
case "${SIZE_BY:=float32}" in
float32) size_row=256 ;;
stored) size_row=$stored_row ;;
*) echo "SIZE_BY=$SIZE_BY: want float32 or stored" >&2; exit 2 ;;
esac
# MAX_ROWS: the smallest cap whose tables hold RATIO x LIMIT (dim 64, at
# size_row bytes a row).
if [ -z "${MAX_ROWS:-}" ]; then
	MAX_ROWS=$(python3 - "$limit_bytes" "$RATIO" "$size_row" <<'EOF'
import sys
rows = [227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36]
want = float(sys.argv[2]) * int(sys.argv[1]) / int(sys.argv[3])
lo, hi = 1, max(rows)
while lo < hi:
    mid = (lo + hi) // 2
    if sum(min(r, mid) for r in rows) >= want:
        hi = mid
    else:
        lo = mid + 1
print(lo)
EOF
)
fi
part="$WORK/part-$MAX_ROWS"
# DTYPE (float16, int8): the tables' stored dtype (prism ingest --dtype),
# in a store of its own; the partition is the same.
db="$WORK/db-$MAX_ROWS${DTYPE:+-$DTYPE}"

echo "== model: $MODEL, tables capped at $MAX_ROWS rows (outside the cgroup)"
if [ ! -f "$part/plan.json" ]; then
	"$PRISM" models build "$MODEL" -o "$WORK/model-$MAX_ROWS" --max-rows "$MAX_ROWS" --seed 1
	"$PRISM" partition "$WORK/model-$MAX_ROWS/model.onnx" -o "$part"
	[ -n "${KEEP_MODEL:-}" ] || rm -rf "$WORK/model-$MAX_ROWS"
fi
if ! ls "$db"/OPTIONS-* >/dev/null 2>&1; then
	"$PRISM" ingest "$part" --db "$db" ${DTYPE:+--dtype "$DTYPE"}
fi
table_bytes=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(sum(t["rows"]*t["dim"]*4 for t in p["tables"]))' "$part/plan.json")
table_rows=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(sum(t["rows"] for t in p["tables"]))' "$part/plan.json")
stored_bytes=$((table_rows * stored_row))
echo "tables: $table_rows rows, $((table_bytes >> 20)) MiB of float32 = $(python3 -c "print(round($table_bytes/$limit_bytes,2))")x the cgroup's $LIMIT; stored as ${DTYPE:-float32}: $((stored_bytes >> 20)) MiB = $(python3 -c "print(round($stored_bytes/$limit_bytes,2))")x (SIZE_BY=$SIZE_BY); store $(du -sm "$db" | cut -f1) MiB on disk"

tmp=$(mktemp -d "$WORK/run.XXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -d "$CG" ]; then
		for _ in 1 2 3 4 5; do rmdir "$CG" 2>/dev/null && break; sleep 1; done
	fi
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$PRISM" serve router --insecure --addr 127.0.0.1:0 --micro-batch "$MICRO" >"$tmp/router.log" 2>&1 &
pids+=($!)
router=$(up_addr "$tmp/router.log" "${pids[-1]}" "router listening on" 1200)
for d in $(seq 1 "$DENSE"); do
	"$PRISM" serve dense --insecure --plan "$part" --router "$router" --threads 1 --addr 127.0.0.1:0 >"$tmp/dense-$d.log" 2>&1 &
	pids+=($!)
	up_addr "$tmp/dense-$d.log" "${pids[-1]}" "dense tier listening on" 1200 >/dev/null
done

name=$(python3 -c 'import json,sys,os; p=json.load(open(sys.argv[1])); print(p.get("model",{}).get("name") or os.path.basename(sys.argv[2]))' "$part/plan.json" "$part")
lg() { "$PRISM" loadgen --insecure --target "$router" --model "$name" --plan "$part" --candidates "$CANDIDATES" --pool "${POOL:-0}" --quiet "$@"; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
errors() { sed -n 's/^requests .* errors \([0-9]*\).*/\1/p'; }
metric() { awk -v m="$1" '$1 == m {print $2}' "$2"; }
scrape() { curl -s "http://$1/metrics" >"$2"; }
# until_served: requests succeed (the worker has registered).
until_served() {
	for _ in $(seq 1 240); do
		# at least one answered and none failed (a 1 s Poisson run at 5/s
		# sends none about once in 150: "errors 0" alone passed it)
		lg --rate 5 --duration 1s 2>/dev/null | grep -q '^requests .* ok [1-9][0-9]*  errors 0$' && return
		sleep 1
	done
	echo "bench-ltm-e2e: the stack never served a request" >&2; exit 1
}
# embedding LOG METRICS_PORT CGROUP FLAGS...: an embedding worker (inside
# CGROUP when not empty: its pid is written to cgroup.procs before it
# execs); its pid in emb_pid.
embedding() {
	local log=$1 mport=$2 cg=$3
	shift 3
	local cmd=("$PRISM" serve embedding --insecure --plan "$part" --db "$db" --router "$router" --addr 127.0.0.1:0 --metrics-addr "127.0.0.1:$mport" "$@")
	if [ -n "$cg" ]; then
		# The worker reads the group's limit and sizes itself to it
		# (its "memory budget" line: Go's memory limit, the hot tier's
		# cap, the bytes of lookups in flight). MEMLIMIT_PCT=N sets
		# GOMEMLIMIT to N% of the limit by hand instead (the worker then
		# keeps it). GCTRACE=1 logs each collection (GODEBUG=gctrace=1)
		# to the worker's log, WORK/run.*/embedding-ltm.log.
		sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" env ${MEMLIMIT_PCT:+GOMEMLIMIT=$((limit_bytes * ${MEMLIMIT_PCT:-75} / 100))} ${GCTRACE:+GODEBUG=gctrace=1} "${cmd[@]}" >"$log" 2>&1 &
	else
		"${cmd[@]}" >"$log" 2>&1 &
	fi
	emb_pid=$!
	pids+=($emb_pid)
	up_addr "$log" "$emb_pid" "embedding tier listening on" 1200 >/dev/null
}
stop_embedding() {
	kill -TERM "$emb_pid"
	wait "$emb_pid" 2>/dev/null || true
}

echo "== all in memory: every row preloaded, outside the cgroup; $CLIENTS closed-loop clients x $CANDIDATES candidates"
mport=$(freeport)
embedding "$tmp/embedding-mem.log" "$mport" "" --hot-bytes auto --preload on
sed -n 's/^preloaded/  preloaded/p' "$tmp/embedding-mem.log"
until_served
lg --clients "$CLIENTS" --duration 10s >/dev/null
mem=$(lg --clients "$CLIENTS" --duration "$DURATION")
mem_samples=$(samples <<<"$mem")
echo "  $mem_samples samples/s, p99 $(p99 <<<"$mem") (errors $(errors <<<"$mem"))"
stop_embedding

rate=${RATE:-$(python3 -c "print(round($mem_samples/2/$CANDIDATES, 2))")}
echo "== larger than memory: the embedding worker in a $LIMIT memory cgroup (hot tier $HOT, block cache $CACHE), Poisson at $rate req/s (half the all-in-memory throughput)"
# The store's files leave the page cache: the cgroup cannot claim pages
# charged to another group, which would serve its misses from memory.
python3 - "$db" <<'EOF'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(root, f), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
EOF
cg_make "$limit_bytes"
mport=$(freeport)
ltm_flags=(--hot-bytes "$HOT" --cache-bytes "$CACHE" --preload off ${MISS_PAR:+--miss-parallel "$MISS_PAR"} --direct-reads="$([ "${DIRECT:-1}" = 0 ] && echo false || echo true)" ${EMB_FLAGS:-})
embedding "$tmp/embedding-ltm.log" "$mport" "$CG" "${ltm_flags[@]}"
sed -n 's/^memory budget/  memory budget/p; s/^misses are read/  misses are read/p' "$tmp/embedding-ltm.log"
until_served
lg --rate "$rate" --duration "$WARM" >/dev/null
scrape "127.0.0.1:$mport" "$tmp/m0"
# PROFILE=1 (with PRISM_PPROF=1 in the environment): the worker's heap
# profile before and after the window, in WORK/run.*/heap{0,1}.pb.gz
# (go tool pprof -sample_index alloc_space -diff_base heap0 heap1).
[ -z "${PROFILE:-}" ] || curl -s "http://127.0.0.1:$mport/debug/pprof/heap" -o "$tmp/heap0.pb.gz"
# cpu_ticks PID: the process's user + system CPU in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
c0=$(cpu_ticks "$emb_pid")
t0=$(date +%s.%N)
ltm=$(lg --rate "$rate" --duration "$DURATION" --slo 60ms)
t1=$(date +%s.%N)
c1=$(cpu_ticks "$emb_pid")
scrape "127.0.0.1:$mport" "$tmp/m1"
[ -z "${PROFILE:-}" ] || curl -s "http://127.0.0.1:$mport/debug/pprof/heap" -o "$tmp/heap1.pb.gz"
echo "$ltm" | sed 's/^/  /'
closed=$(lg --clients "$CLIENTS" --duration "$DURATION")
peak=$(cg_peak)
failcnt=$(cg_failcnt)
usage=$(cg_usage)
kmem=$(cg_kmem)
# What the group's memory is at the end of the window.
memstat=$(cg_memstat)
stop_embedding
# hit_ratio M0 M1: the hot tier's hit ratio between two scrapes.
hit_ratio() { python3 - "$1" "$2" <<'EOF'
import sys
def load(p):
    return {l.split()[0]: float(l.split()[1]) for l in open(p) if l.startswith("prism_store_hot_")}
a, b = load(sys.argv[1]), load(sys.argv[2])
h = b.get("prism_store_hot_hits_total", 0) - a.get("prism_store_hot_hits_total", 0)
m = b.get("prism_store_hot_misses_total", 0) - a.get("prism_store_hot_misses_total", 0)
print("%.4f" % (h / max(h + m, 1)))
EOF
}
# RESTART=1: the worker just stopped (SIGTERM, so its store closed and,
# with --warm-restart, saved the hot tier's keys and sketch) starts again
# in the same cgroup with the same flags plus WARM_RESTART (default 1:
# --warm-restart=true; 0: false, a cold tier), and the same Poisson rate
# is offered from its first answer for RESTART_WINDOW (default 60s), in
# RESTART_STEPS (default 4) windows: each one's hit ratio and p99.
restart_rows=()
if [ "${RESTART:-0}" = 1 ]; then
	wr=$([ "${WARM_RESTART:-1}" = 0 ] && echo false || echo true)
	echo "== restart: the embedding worker stopped (SIGTERM) and started again in the cgroup, --warm-restart=$wr; Poisson at $rate req/s from its first answer"
	mport=$(freeport)
	embedding "$tmp/embedding-restart.log" "$mport" "$CG" "${ltm_flags[@]}" --warm-restart="$wr"
	until_served # the router has its announcement
	steps=${RESTART_STEPS:-4}
	win=$(python3 -c "import re; w='${RESTART_WINDOW:-60s}'; print(round(float(re.sub('s$','',w))/$steps, 3))")
	scrape "127.0.0.1:$mport" "$tmp/r0"
	for k in $(seq 1 "$steps"); do
		out=$(lg --rate "$rate" --duration "${win}s" --slo 60ms)
		scrape "127.0.0.1:$mport" "$tmp/r$k"
		slo=$(sed -n 's/^SLO *\([0-9.]*%\).*/\1/p' <<<"$out")
		restart_rows+=("| restart ($wr), seconds $(python3 -c "print(f'{($k-1)*$win:g}-{$k*$win:g}')") after its first answer: hit ratio, p99, within 60 ms, errors | $(hit_ratio "$tmp/r$((k-1))" "$tmp/r$k"), $(p99 <<<"$out"), ${slo:-?}, $(errors <<<"$out") |")
	done
	sed -n 's/^warm restart:/  warm restart:/p' "$tmp/embedding-restart.log"
	stop_embedding
fi
read -r hit miss_rows_s miss_path_rows_s pebble_mb_s direct_s phases stages <<<"$(python3 - "$tmp/m0" "$tmp/m1" "$t0" "$t1" <<'EOF'
import sys
def load(p):
    out = {}
    for line in open(p):
        if line.startswith(("prism_store_", "prism_embedding_stage_seconds_")):
            k, v = line.split()[:2]
            out[k] = float(v)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
d = lambda k: b.get(k, 0) - a.get(k, 0)
secs = float(sys.argv[4]) - float(sys.argv[3])
hits, misses = d("prism_store_hot_hits_total"), d("prism_store_hot_misses_total")
reads, rsecs = d("prism_store_pebble_reads_total"), d("prism_store_miss_read_seconds_total")
# A lookup's wall time by phase (ms): hot rows gathered, misses read, finished.
n = max(d("prism_store_lookups_total"), 1)
ph = "/".join("%.1f" % (1000 * d("prism_store_%s_seconds_total" % k) / n) for k in ("lookup", "lookup_gather", "miss_read", "lookup_finish"))
# The worker's stages per micro-batch, mean ms (prism_embedding_stage_seconds).
st = lambda k: 1000 * d('prism_embedding_stage_seconds_sum{stage="%s"}' % k) / max(d('prism_embedding_stage_seconds_count{stage="%s"}' % k), 1)
ph += " %s" % "/".join("%.1f" % st(k) for k in ("lookup", "transfer", "dense"))
print("%.4f %.0f %.0f %.1f %.0f %s" % (hits / max(hits + misses, 1), reads / secs, reads / rsecs if rsecs > 0 else 0, d("prism_store_pebble_read_bytes_total") / secs / 1e6, d("prism_store_direct_reads_total") / secs, ph))
EOF
)"

if [ "$REDIS" = 1 ] && command -v redis-server >/dev/null; then
	echo "== Redis: the store benchmark's Redis path on the same table shapes, $CANDIDATES samples a batch (outside the cgroup)"
	"$PRISM" store bench --work "$WORK/storebench-$MAX_ROWS" --model "$MODEL" --max-rows "$MAX_ROWS" --scenario redis \
		--batch "$CANDIDATES" --batches "$REDIS_BATCHES" --warmup "$REDIS_BATCHES" --hot-bytes "$HOT" --cache-bytes "$CACHE" | tee "$tmp/redis.txt"
elif [ "$REDIS" = 1 ]; then
	echo "== Redis: redis-server is not installed (apt-get install redis-server); skipped"
fi

ltm_samples=$(samples <<<"$ltm")
echo
echo "| measure | value |"
echo "|---|---:|"
echo "| model | $MODEL, --max-rows $MAX_ROWS: $table_rows rows, $((table_bytes >> 20)) MiB of float32, stored as ${DTYPE:-float32}: $((stored_bytes >> 20)) MiB |"
echo "| embedding worker's memory cgroup (tables as stored / limit) | $LIMIT ($(python3 -c "print(round($stored_bytes/$limit_bytes,2))")x; SIZE_BY=$SIZE_BY); hot tier $HOT, block cache $CACHE |"
echo "| all in memory, $CLIENTS clients x $CANDIDATES candidates (samples/s, p99) | $mem_samples, $(p99 <<<"$mem") |"
echo "| larger than memory at $rate req/s (samples/s, p99) | $ltm_samples, $(p99 <<<"$ltm") |"
echo "| larger than memory / all in memory (samples/s) | $(python3 -c "print(round(${ltm_samples:-0}/$mem_samples, 2))") |"
hot_rows=$(metric prism_store_hot_rows "$tmp/m1" | awk '{printf "%d", $1}')
bound=$(python3 scripts/hit-bound.py "$part" --zipf 1.05 --slots "${hot_rows:-0}" 2>/dev/null | awk '/at most/ {print $NF}')
echo "| hot tier hit ratio (measured window); the most a tier of its $hot_rows rows can reach (scripts/hit-bound.py) | $hit; ${bound:-n/a} |"
echo "| rows read from Pebble (miss path), rows/s of wall time | $miss_rows_s ($pebble_mb_s MB/s) |"
echo "| rows/s within the miss path (rows / miss-read seconds) | $miss_path_rows_s |"
echo "| file reads past the page cache (O_DIRECT), per second | $direct_s |"
echo "| a store lookup's wall time, ms: all / hot rows gathered / misses read / admitted and pooled | $phases |"
echo "| the embedding worker's stages per micro-batch, mean ms: lookup / transfer / dense (prism_embedding_stage_seconds) | $stages |"
ltm_cpu=$(python3 -c "print(round(($c1 - $c0) / $(getconf CLK_TCK) / ($t1 - $t0), 3))")
echo "| embedding worker CPU in the window (cores; ms per request answered) | $ltm_cpu; $(python3 -c "r=${ltm_samples:-0}/$CANDIDATES; print(round($ltm_cpu*1000/r, 2) if r else '-')") |"
echo "| larger than memory, $CLIENTS closed-loop clients (samples/s, p99) | $(samples <<<"$closed"), $(p99 <<<"$closed") |"
echo "| cgroup peak / limit hits | $((peak >> 20)) MiB / $failcnt |"
echo "| cgroup memory at the end (memory.stat) | $memstat |"
for r in "${restart_rows[@]}"; do echo "$r"; done
echo "| cgroup charge at the end: usage / kernel memory (memory.usage_in_bytes, memory.kmem.usage_in_bytes) | $((usage >> 20)) MiB / $((kmem >> 20)) MiB |"
