#!/usr/bin/env bash
# Refusals below saturation (issue 18): what an admission rule refuses
# when the load is light. Starts prism up (BIN, default bin/prism, with
# UP_FLAGS) on make demo's artifacts, then, with 60 ms deadlines, a
# closed loop of CLIENTS (default 3; a refused client retries at once)
# and Poisson arrivals at RATE req/s (default 200; "50%": half of the
# closed-loop maximum of MAX_CLIENTS clients, default 16, measured
# first), DUR seconds each (default 15), and prints each load's answers
# and errors as the load generator counted them. SERVER_CPUS and
# CLIENT_CPUS pin the stack and the load generator apart
# (scripts/pin.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/upaddr.sh # up_addr: waits for prism up's address
bin=${BIN:-bin/prism}
out=${BENCH_DIR:-out/demo}
. scripts/pin.sh
log=$(mktemp)
"${srv[@]}" $bin up --model $out/dlrm-kaggle-part --db $out/db --addr 127.0.0.1:0 --certs $out/certs ${UP_FLAGS:-} >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; rm -f $log' EXIT
addr=$(up_addr "$log" $up) || exit 1
lg() { "${cli[@]}" $bin loadgen --target "$addr" --certs $out/certs --model dlrm-kaggle --plan $out/dlrm-kaggle-part --candidates 270 --pool 512 --quiet "$@" 2>/dev/null; }
lg --clients "${MAX_CLIENTS:-16}" --duration 5s --timeout 60ms >/dev/null
rate=${RATE:-200}
if [[ $rate == *% ]]; then
	max=$(lg --clients "${MAX_CLIENTS:-16}" --duration 10s | sed -n 's/^throughput *\([0-9.]*\) req\/s.*/\1/p')
	[ -n "$max" ] || { echo "refusals: no closed-loop maximum (loadgen failed)"; exit 1; }
	rate=$(awk -v m="$max" -v p="${rate%\%}" 'BEGIN{printf "%.1f", m*p/100}')
	echo "$bin ${UP_FLAGS:-(default)}: closed-loop maximum $max req/s, ${RATE} is $rate req/s"
fi
for load in "--clients ${CLIENTS:-3}" "--rate $rate"; do
	res=$(lg $load --timeout 60ms --duration "${DUR:-15}s")
	echo "$bin ${UP_FLAGS:-(default)} $load: $(grep -E '^requests|^errors|^SLO' <<<"$res" | tr -s ' ' | tr '\n' ' ')"
done
