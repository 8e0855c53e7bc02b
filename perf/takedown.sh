#!/usr/bin/env bash
# Takedown propagation: one control plane, ENGINES engines (default 4) subscribed to its feed,
# COUNT links (default 200). Each link is created (timing creation -> first 302 at every engine)
# and then taken down INTERVAL_MS apart (timing the API's 200 -> first 410 at every engine; every
# engine is polled on its own keep-alive connection). Prints p50/p99/max of both. Goal: takedown
# max under 1 s on this machine.
#
#   perf/takedown.sh                       # ENGINES=4 COUNT=200 INTERVAL_MS=50
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINES=${ENGINES:-4}
COUNT=${COUNT:-200}
INTERVAL_MS=${INTERVAL_MS:-50}
BASE_PORT=${BASE_PORT:-19080}
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl; }
cargo build --release -q -p lasthop-control -p lasthop-engine --bins --example propagation
BIN=target/release
work=$(mktemp -d /var/tmp/lasthop-takedown.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
api=127.0.0.1:$BASE_PORT
edge=127.0.0.1:$((BASE_PORT + 1))
$BIN/lasthop-control keygen --out "$work/key" >/dev/null
owner=$($BIN/lasthop-control apikey create --data-dir "$work/data" --owner perf)
admin=$($BIN/lasthop-control apikey create --data-dir "$work/data" --owner ops --admin)
$BIN/lasthop-control serve --data-dir "$work/data" --key-file "$work/key" \
  --api-listen "$api" --edge-listen "$edge" --create-rate 0 >/dev/null 2>"$work/control.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://$api/healthz" >/dev/null && break; sleep 0.1; done
addrs=()
for i in $(seq "$ENGINES"); do
  port=$((BASE_PORT + 10 + 2 * i))
  $BIN/lasthop-engine --key-file "$work/key" --control "http://$edge" \
    --edge-token-file "$work/data/edge.token" --data-dir "$work/engine-$i" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --cores 1 \
    --engine-id "perf-$i" --pop "pop$i" >/dev/null 2>"$work/engine-$i.log" &
  pids+=($!)
  addrs+=("127.0.0.1:$port")
done
for i in $(seq "$ENGINES"); do
  admin_port=$((BASE_PORT + 11 + 2 * i))
  for _ in $(seq 200); do
    curl -s "http://127.0.0.1:$admin_port/metrics" | grep -q '^lasthop_engine_feed_in_sync 1' && break
    sleep 0.05
  done
done
echo "takedown.sh: $ENGINES engines in sync; $COUNT links, $INTERVAL_MS ms apart"
$BIN/examples/propagation --api "http://$api" --owner-key "$owner" --admin-key "$admin" \
  --engines "$(IFS=,; echo "${addrs[*]}")" --count "$COUNT" --interval-ms "$INTERVAL_MS"
echo
echo "takedown.sh: GET /v1/edges"
curl -s -H "Authorization: Bearer $admin" "http://$api/v1/edges"
echo
