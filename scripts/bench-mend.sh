#!/usr/bin/env bash
# How long is a stranded embedding worker out of serving when it mends
# itself (prism serve embedding --mend, the default)? Two embedding
# workers, A and B, serve copies of the store in DB (plan PLAN, default
# the demo's dlrm-kaggle, which make demo builds) under one router that
# keeps its update log in memory (--update-quorum one), over mutual TLS
# on loopback. B stops; A alone applies UPDATES updates; the router
# restarts (its log lost), and B comes back holding none of them:
# stranded. B copies A's whole store at --mend-rate RATE and exits; this
# script restarts it as Kubernetes or prism up would, and B swaps the
# copy in, preloads its hot tier and serves in sync. Prints the seconds
# from B's start to its exit (told it is stranded, the copy, the exit)
# and from its restart to both workers in sync, per round.
#
#   scripts/bench-mend.sh [WORK]
#   env: DB (default out/demo/db) PLAN (default out/demo/dlrm-kaggle-part)
#        CERTS (default out/demo/certs; made when absent) RATE (200MiB/s)
#        ROUNDS (2) PRISM (default bin/prism)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh
WORK=${1:-/tmp/prism-mend}
DB=${DB:-out/demo/db}
PLAN=${PLAN:-out/demo/dlrm-kaggle-part}
CERTS=${CERTS:-out/demo/certs}
RATE=${RATE:-200MiB/s}
ROUNDS=${ROUNDS:-2}
PRISM=${PRISM:-bin/prism}
[ -x "$PRISM" ] || go build -o "$PRISM" ./cmd/prism
if [ ! -d "$DB" ] || [ ! -f "$PLAN/plan.json" ]; then
	echo "bench-mend: no store $DB or plan $PLAN (make demo builds them; or set DB and PLAN)" >&2
	exit 1
fi
[ -d "$CERTS" ] || "$PRISM" certs init "$CERTS" >/dev/null
model=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model']['name'])" "$PLAN/plan.json")
rm -rf "$WORK"
mkdir -p "$WORK"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT
# start LOG ARGS...: runs prism ARGS in the background, its stderr and
# stdout in LOG; sets started (its pid).
start() {
	local log=$1
	shift
	"$PRISM" "$@" >"$log" 2>&1 &
	started=$!
	pids+=("$started")
}
# inSync N: whether the router names N embedding workers of the model, all
# in sync (or the model has had no update), none stranded.
inSync() {
	"$PRISM" status --router "$raddr" --certs "$CERTS" --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
n = int(sys.argv[2])
u = r.get("updates", {}).get(sys.argv[1])  # none: no update yet, all serve
emb = [w for w in r.get("workers", []) if w.get("role") == "ROLE_EMBEDDING"]
sys.exit(0 if len(emb) == n and (u is None or (len(u.get("inSync", [])) == n and not u.get("stranded") and not u.get("settling"))) else 1)' "$model" "$1"
}
waitFor() { # waitFor SECONDS CMD...: polls CMD every 0.2 s
	local deadline=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}
now() { date +%s.%N; }

# The two workers' stores: copies of DB, taken from a worker serving it.
start "$WORK/source.log" serve embedding --certs "$CERTS" --plan "$PLAN" --db "$DB" --addr 127.0.0.1:0 --metrics-addr off
src=$started
saddr=$(up_addr "$WORK/source.log" "$src" "embedding tier listening on")
for w in a b; do
	"$PRISM" store copy --from "$saddr" --db "$WORK/db-$w" --certs "$CERTS" >"$WORK/seed-$w.out" 2>&1
done
kill "$src"
wait "$src" 2>/dev/null || true
echo "store $DB ($(du -sh "$DB" | cut -f1)), $(nproc) cores, --mend-rate $RATE"

router() {
	start "$WORK/router.log" serve router --certs "$CERTS" --addr "${1:-127.0.0.1:0}" --metrics-addr off --heartbeat 500ms --update-quorum one
	rpid=$started
	raddr=$(up_addr "$WORK/router.log" "$rpid" "router listening on")
}
embedding() { # embedding NAME: serves WORK/db-NAME; sets epid
	start "$WORK/$1.log" serve embedding --certs "$CERTS" --plan "$PLAN" --db "$WORK/db-$1" --router "$raddr" --addr 127.0.0.1:0 --metrics-addr off --mend-rate "$RATE"
	epid=$started
}
router
embedding a
embedding b
bpid=$epid
waitFor 120 inSync 2 || { echo "bench-mend: the two workers did not register" >&2; exit 1; }
for r in $(seq 1 "$ROUNDS"); do
	kill "$bpid"
	wait "$bpid" 2>/dev/null || true
	"$PRISM" loadgen --target "$raddr" --certs "$CERTS" --model "$model" --plan "$PLAN" --update-only --update-rate 10 --duration 2s >"$WORK/updates-$r.out" 2>&1 || { cat "$WORK/updates-$r.out" >&2; exit 1; }
	kill -9 "$rpid"
	wait "$rpid" 2>/dev/null || true
	router "$raddr"
	t0=$(now)
	embedding b
	bpid=$epid
	if ! wait "$bpid"; then :; fi
	t1=$(now)
	grep -q "exiting to be restarted" "$WORK/b.log" || { echo "bench-mend: B exited without mending itself:" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
	bytes=$(grep -o 'bytes=[0-9]*' "$WORK/b.log" | tail -1 | cut -d= -f2)
	cp "$WORK/b.log" "$WORK/b-mend-$r.log"
	# Where B's time went, from its log's stamps: its start-up (the store
	# opened, the hot tier preloaded), until the router's answer said it
	# is stranded, until a worker to copy from was named, the copy.
	python3 - "$WORK/b-mend-$r.log" "$t0" <<'PY'
import re, sys, datetime
t0 = float(sys.argv[2])
marks = [("serving", "msg=serving "), ("told stranded", "(stranded)"), ("copy started", "mend: replacing"), ("copy received", "mend: received"), ("exit", "mend: exiting")]
at = {}
for line in open(sys.argv[1]):
    m = re.match(r"time=(\S+)", line)
    if not m:
        continue
    t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    for name, pat in marks:
        if pat in line and name not in at:
            at[name] = t
prev, out = t0, []
for name, _ in marks:
    if name in at:
        out.append(f"{name} +{at[name] - prev:.2f} s")
        prev = at[name]
print("  B: " + ", ".join(out))
PY
	embedding b
	bpid=$epid
	waitFor 300 inSync 2 || { echo "bench-mend: B did not serve in sync after its restart" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
	t2=$(now)
	python3 -c "import sys; a,b,c,n=map(float,sys.argv[1:5]); print(f'round {sys.argv[5]}: stranded B copied {n/1e9:.2f} GB and exited {b-a:.2f} s after its start ({n/(b-a)/1e6:.0f} MB/s overall); restart to both in sync {c-b:.2f} s; out of serving {c-a:.2f} s')" "$t0" "$t1" "$t2" "${bytes:-0}" "$r"
	# The next round is a mend of its own: the store from before and the
	# record of this copy (--mend-every would hold the next back) go.
	rm -rf "$WORK"/db-b/replaced-* "$WORK"/db-b/copy-mended
done
