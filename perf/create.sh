#!/usr/bin/env bash
# Durable create throughput: CLIENTS concurrent connections POST /v1/links for DURATION seconds
# against a release build on the embedded store (fsync per group commit). Server pinned to CPU 0,
# wrk to CPU 1. Prints creates/s and p50/p99 latency, and checks that what wrk counted as 201s
# is what the store holds.
#
#   perf/create.sh                       # CLIENTS=64 DURATION=10
#   CLIENTS=16 DURATION=5 perf/create.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-10}
PORT=${PORT:-18081}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release -q -p lasthop-control
BIN=target/release/lasthop-control
work=$(mktemp -d /var/tmp/lasthop-create.XXXXXX)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
$BIN keygen --out "$work/key" >/dev/null
export LASTHOP_API_KEY=$($BIN apikey create --data-dir "$work/data" --owner perf)
taskset -c ${SERVER_CPUS:-0} $BIN serve --data-dir "$work/data" --key-file "$work/key" \
  --api-listen 127.0.0.1:$PORT --create-rate 0 2>"$work/server.log" &
pid=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null && break; sleep 0.1; done
t0=$(awk "{print \$14+\$15}" /proc/$pid/stat)
out=$(taskset -c 1 wrk -t1 -c"$CLIENTS" -d"${DURATION}s" --latency -s perf/create.lua http://127.0.0.1:$PORT/)
echo "$out" | sed 's/^/  wrk| /'
t1=$(awk "{print \$14+\$15}" /proc/$pid/stat)
rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
p50=$(echo "$out" | awk '$1=="50%" {print $2}')
p99=$(echo "$out" | awk '$1=="99%" {print $2}')
non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
metrics=$(curl -s http://127.0.0.1:$PORT/metrics)
created=$(echo "$metrics" | awk -F' ' '/^lasthop_api_requests_total\{route="\/v1\/links",status="201"\}/ {print $2}')
batches=$(echo "$metrics" | awk '/^lasthop_store_commit_ops_count/ {print $2}')
ops=$(echo "$metrics" | awk '/^lasthop_store_commit_ops_sum/ {print $2}')
echo
echo "create.sh: clients=$CLIENTS duration=${DURATION}s durable creates/s=$rps p50=$p50 p99=$p99 non-2xx=${non2xx:-0}"
echo "create.sh: server CPU $(awk -v a=$t0 -v b=$t1 -v d=$DURATION "BEGIN{printf \"%.0f%%\", (b-a)/d}") of one core (user+sys)"
echo "create.sh: server counted ${created:-0} x 201 in ${batches:-0} group commits (mean $(awk -v o="${ops:-0}" -v b="${batches:-1}" 'BEGIN{printf "%.1f", o/(b?b:1)}') ops/commit)"
