#!/usr/bin/env bash
# The cost of real interfaces (run as root: `sudo scripts/bench-multihost.sh`;
# needs bin/prism and iproute2). The same dlrm-tiny serving stack twice on
# this machine's cores: once as the multi-host test's topology (network
# namespaces on a bridge: the router on one "host", an embedding and a
# dense worker on each of two others, real TCP over veth, mutual TLS),
# once as `prism up` on loopback with the same workers (2 embedding, 2
# dense, one ONNX Runtime thread each). Closed-loop `prism loadgen` runs
# from the root namespace alternate between the two (order swapped every
# round); prints each round and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
prism=$(realpath "${PRISM:-bin/prism}")
clients=${CLIENTS:-8}
dur=${DURATION:-10s}
rounds=${ROUNDS:-3}
[ "$(id -u)" = 0 ] || { echo "bench-multihost: needs root (network namespaces)"; exit 1; }

tmp=$(mktemp -d)
p=pm$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')
net=10.77.$((RANDOM % 200 + 20))
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	ip link del "${p}r" 2>/dev/null || true
	for ns in "$p-h0" "$p-h1" "$p-h2" "$p-sw"; do ip netns del "$ns" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
if ip -4 route show table all | grep -q "^$net\."; then echo "bench-multihost: $net.0/24 is in use; run again"; exit 1; fi

# The topology of cmd/prism/multihost_e2e_test.go (internal/netns).
ip netns add "$p-sw"
ip -n "$p-sw" link add br0 type bridge
ip -n "$p-sw" link set br0 up
ip link add "${p}r" type veth peer name root netns "$p-sw"
ip -n "$p-sw" link set root master br0 up
ip addr add "$net.1/24" dev "${p}r"
ip link set "${p}r" up
for i in 0 1 2; do
	ns=$p-h$i
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip -n "$p-sw" link add "p$i" type veth peer name eth0 netns "$ns"
	ip -n "$p-sw" link set "p$i" master br0 up
	ip -n "$ns" addr add "$net.$((i + 2))/24" dev eth0
	ip -n "$ns" link set eth0 up
done

$prism models build dlrm-tiny -o "$tmp/m" --seed 5 >/dev/null
$prism partition "$tmp/m/model.onnx" -o "$tmp/part" >/dev/null
plan=$tmp/part
$prism certs init "$tmp/certs" --host "$net.2" --host "$net.3" --host "$net.4" >/dev/null

# start NS READY-PREFIX ARGS...: runs prism in NS, sets addr from its ready line.
start() {
	local ns=$1 prefix=$2 log="$tmp/$RANDOM.log"
	shift 2
	: >"$log" # before the first sed (set -e: a missing log ended the script)
	ip netns exec "$ns" "$prism" "$@" >"$log" 2>&1 &
	pids+=($!)
	addr=$(up_addr "$log" "${pids[-1]}" "$prefix") || exit 1
}
start "$p-h0" "router listening on" serve router --certs "$tmp/certs" --addr "$net.2:0" --micro-batch 512
router=$addr
for i in 1 2; do
	start "$p-h$i" "dense tier listening on" serve dense --certs "$tmp/certs" --plan "$plan" --threads 1 --max-batch 512 --addr :0 --router "$router"
	start "$p-h$i" "embedding tier listening on" serve embedding --certs "$tmp/certs" --plan "$plan" --db "$tmp/db$i" --addr :0 --router "$router"
done
: >"$tmp/up.log"
$prism up --model "$plan" --db "$tmp/updb" --certs "$tmp/upcerts" --addr 127.0.0.1:0 --embedding-workers 2 --dense-workers 2 --threads 1 >"$tmp/up.log" 2>&1 &
pids+=($!)
up=$(up_addr "$tmp/up.log" "${pids[-1]}") || exit 1
sleep 1 # both routers have heard from every worker

lg() { $prism loadgen --model dlrm-tiny --plan "$plan" --candidates 270 --pool 256 --quiet --clients "$clients" "$@"; }
hosts() { lg --target "$router" --certs "$tmp/certs" "$@"; }
loop() { lg --target "$up" --certs "$tmp/upcerts" "$@"; }
samples() { sed -n 's/^throughput .* req\/s  \([0-9]*\) samples\/s.*/\1/p'; }
p99() { sed -n 's/^latency .* p99 \([^ ]*\) .*/\1/p'; }
# An even number of rounds averages the middle two (was: the lower one).
median() { tr ' ' '\n' | sort -n | awk 'NF{a[++n]=$1} END{if (n % 2) print a[(n+1)/2]; else printf "%.10g\n", (a[n/2]+a[n/2+1])/2}'; }
hosts --duration 3s >/dev/null
loop --duration 3s >/dev/null
hs=""; ls=""
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then a=$(hosts --duration "$dur"); b=$(loop --duration "$dur"); else b=$(loop --duration "$dur"); a=$(hosts --duration "$dur"); fi
	h=$(samples <<<"$a"); l=$(samples <<<"$b")
	echo "round $r: namespaces $h samples/s (p99 $(p99 <<<"$a")), loopback $l samples/s (p99 $(p99 <<<"$b"))" >&2
	hs="$hs $h"; ls="$ls $l"
done
hm=$(median <<<"${hs# }"); lm=$(median <<<"${ls# }")
echo
echo "| dlrm-tiny, $clients clients x 270 candidates, mTLS | samples/s (median of $rounds x $dur) |"
echo "|---|---:|"
echo "| prism up on loopback (2 embedding, 2 dense workers) | $lm |"
echo "| three namespaces on a bridge, same workers | $hm |"
echo "| namespaces / loopback | $(awk -v a="$hm" -v b="$lm" 'BEGIN{printf "%.3f", a/b}') |"
