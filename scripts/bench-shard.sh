#!/usr/bin/env bash
# Sharded against unsharded embedding tier, in one run on this machine
# (issue 16; needs `make demo` first, or set PLAN/DB): the dlrm-kaggle
# partition sharded over SHARDS embedding workers (`prism shard`, then
# `prism ingest --shard K` into a store each) served by a router and two
# dense workers started by hand, beside `prism up` on the unsharded store
# (one embedding worker, two dense workers), both up at once on the same
# cores; closed loops of 270 candidates alternate between them (order
# swapped every round). Prints each round, the medians and their ratio.
# SHARD_GOMAXPROCS=N runs each shard's embedding worker with GOMAXPROCS=N
# (default: the serving cores / SHARDS, at least 1, as prism up starts a
# sharded model's workers); DENSE=N gives both stacks N dense workers
# (default 2); EMB_FLAGS adds flags to each shard's serve embedding (as
# --dictionary-frames=false). The shards are planned for the load generator's ids (Zipf
# 1.05, SHARD_ZIPF), not ../shared's Criteo sample, which only some
# machines have.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=${PRISM:-bin/prism}
# SERVER_CPUS and CLIENT_CPUS pin the stacks and the load generator apart (scripts/pin.sh).
. scripts/pin.sh
out=${BENCH_DIR:-out/demo}
model=${BENCH_MODEL:-dlrm-kaggle}
plan=${PLAN:-$out/$model-part}
db=${DB:-$out/db}
shards=${SHARDS:-3}
dense=${DENSE:-2}
clients=${CLIENTS:-16}
dur=${DURATION:-15s}
rounds=${ROUNDS:-3}
certs=${CERTS:-$(dirname "$db")/certs}
scores=$("${srv[@]}" nproc)
gomaxprocs=${SHARD_GOMAXPROCS:-$(( scores / shards > 0 ? scores / shards : 1 ))}
[ -f "$plan/plan.json" ] || { echo "bench-shard: no partition at $plan (run make demo first)"; exit 1; }

tmp=${SHARD_DIR:-$(mktemp -d)}
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[ -n "${SHARD_DIR:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# The sharded plan: plan.json and the ONNX files copied, the table files
# linked (prism shard rewrites plan.json only).
# A SHARD_DIR kept from a run of other settings (SHARDS, SHARD_ZIPF, the
# source plan) is sharded and ingested anew: reused, its table read
# "sharded over $SHARDS" for a plan of another shard count.
sp="$tmp/plan"
made="$shards ${SHARD_ZIPF:-1.05} $(cd "$plan" && pwd)"
if [ ! -f "$sp/plan.json" ] || ! grep -q '"sharding"' "$sp/plan.json" || [ "$(cat "$tmp/settings" 2>/dev/null)" != "$made" ]; then
	rm -rf "$sp" "$tmp"/db-*; mkdir -p "$sp"
	cp "$plan"/*.json "$sp"/; cp "$plan"/*.onnx "$sp"/ 2>/dev/null || true
	cp -al "$plan/tables" "$sp/tables"
	$prism shard "$sp" --shards "$shards" --zipf "${SHARD_ZIPF:-1.05}" >&2
	echo "$made" >"$tmp/settings"
fi
for k in $(seq 0 $((shards - 1))); do
	[ -d "$tmp/db-$k" ] || $prism ingest "$sp" --db "$tmp/db-$k" --shard "$k" --shards "$shards" >&2
done

# Each LOG is emptied (: >LOG) before its child starts: the child's own
# >LOG may come after up_addr's first sed, which would read a ready line
# an earlier run left in SHARD_DIR.
: >"$tmp/router.log"
"${srv[@]}" $prism serve router --certs "$certs" --addr 127.0.0.1:0 >"$tmp/router.log" 2>&1 &
pids+=($!)
sharded_addr=$(up_addr "$tmp/router.log" "${pids[-1]}" "router listening on")
for d in $(seq 0 $((dense - 1))); do
	: >"$tmp/dense-$d.log"
	"${srv[@]}" $prism serve dense --certs "$certs" --plan "$sp" --router "$sharded_addr" --threads 1 --addr 127.0.0.1:0 >"$tmp/dense-$d.log" 2>&1 &
	pids+=($!)
	up_addr "$tmp/dense-$d.log" "${pids[-1]}" "dense tier listening on" >/dev/null
done
for k in $(seq 0 $((shards - 1))); do
	: >"$tmp/embedding-$k.log"
	env GOMAXPROCS="$gomaxprocs" "${srv[@]}" $prism serve embedding --certs "$certs" --plan "$sp" --db "$tmp/db-$k" --router "$sharded_addr" --addr 127.0.0.1:0 ${EMB_FLAGS:-} >"$tmp/embedding-$k.log" 2>&1 &
	pids+=($!)
	up_addr "$tmp/embedding-$k.log" "${pids[-1]}" "embedding tier listening on" >/dev/null
done

: >"$tmp/up.log"
"${srv[@]}" $prism up --model "$plan" --db "$db" --certs "$certs" --addr 127.0.0.1:0 --dense-workers "$dense" >"$tmp/up.log" 2>&1 &
pids+=($!)
whole_addr=$(up_addr "$tmp/up.log" "${pids[-1]}" "Prism is up: Recommend at")

lg() { "${cli[@]}" $prism loadgen --model "$model" --plan "$plan" --candidates 270 --pool ${POOL:-512} --quiet --clients "$clients" --certs "$certs" "$@"; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
median() { tr ' ' '\n' | sort -n | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }

# Warm-up (the workers wait for every shard's registration too).
served=""
for _ in $(seq 1 30); do lg --target "$sharded_addr" --duration 2s 2>/dev/null | grep -q " ok [1-9][0-9]*  errors 0" && { served=1; break; }; sleep 1; done
[ -n "$served" ] || { echo "bench-shard: the sharded stack answered no 2 s run without errors in 30 tries" >&2; tail -n 5 "$tmp"/*.log >&2; exit 1; }
lg --target "$sharded_addr" --duration 10s >/dev/null
lg --target "$whole_addr" --duration 10s >/dev/null
ss=""; ws=""
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then
		a=$(lg --target "$sharded_addr" --duration "$dur"); b=$(lg --target "$whole_addr" --duration "$dur")
	else
		b=$(lg --target "$whole_addr" --duration "$dur"); a=$(lg --target "$sharded_addr" --duration "$dur")
	fi
	s=$(samples <<<"$a"); w=$(samples <<<"$b")
	echo "round $r: sharded $s samples/s (p99 $(p99 <<<"$a")), unsharded $w samples/s (p99 $(p99 <<<"$b"))" >&2
	ss="$ss $s"; ws="$ws $w"
done
sm=$(median <<<"${ss# }"); wm=$(median <<<"${ws# }")
echo
echo "| measure | value |"
echo "|---|---:|"
echo "| unsharded (prism up: 1 embedding, $dense dense workers), $clients clients x 270 candidates (samples/s; median of${ws}) | $wm |"
echo "| sharded over $shards embedding workers (GOMAXPROCS $gomaxprocs each; $dense dense workers) (samples/s; median of${ss}) | $sm |"
echo "| sharded / unsharded | $(awk -v a="$sm" -v b="$wm" 'BEGIN{printf "%.2f", a/b}') |"
