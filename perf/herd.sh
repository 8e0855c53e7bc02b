#!/usr/bin/env bash
# The origin under a herd (issue 15): ENGINES engines (default 3) that all miss one link at once
# (it is outside the hot-set snapshot: the control plane runs with --snapshot-recent-days 0, so a
# published snapshot holds none of the links, and the overlay forgets what the snapshot covers),
# then a scanner burst below the high-water marks (distinct never-issued counters of the leased
# block, which only the origin can call 404) while clients keep asking for the one real link.
#
# Printed per phase and engine: origin fetches, requests coalesced onto a fetch under way
# (singleflight), fresh-cache hits, 404s answered from the negative cache, lookups refused or shed
# while the origin's queue was full, and what the clients got (wrk: req/s, p50/p99, statuses).
#
#   perf/herd.sh                                   # ENGINES=3 DURATION=3 CONNS=32
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINES=${ENGINES:-3}
DURATION=${DURATION:-3}
CONNS=${CONNS:-32}
BASE_PORT=${BASE_PORT:-19280}
SCANNERS=${SCANNERS:-100000}
# The read-through's queue (engines' --origin-max-pending): small, so the scanners' connections
# fill it on this machine the way a slow or distant origin would fill the default 4096.
MAX_PENDING=${MAX_PENDING:-16}
command -v wrk >/dev/null || { echo "herd.sh: needs wrk" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p lasthop-control -p lasthop-engine -p lasthop-snapshot
  BIN=target/release
fi
work=$(mktemp -d /var/tmp/lasthop-herd.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
api=127.0.0.1:$BASE_PORT
edge=127.0.0.1:$((BASE_PORT + 1))
$BIN/lasthop-control keygen --out "$work/key" >/dev/null
owner=$($BIN/lasthop-control apikey create --data-dir "$work/data" --owner perf)
admin=$($BIN/lasthop-control apikey create --data-dir "$work/data" --owner ops --admin)
# Blocks of SCANNERS counters: the first link leases one, so counters 1.. below its end are
# below the mark and were never issued.
$BIN/lasthop-control serve --data-dir "$work/data" --key-file "$work/key" --api-listen "$api" \
  --edge-listen "$edge" --create-rate 0 --clicks off --block-size "$SCANNERS" \
  --snapshot-recent-days 0 >/dev/null 2>"$work/control.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://$api/healthz" >/dev/null && break; sleep 0.1; done
code=$(curl -sf -H "Authorization: Bearer $owner" -d '{"long_url":"https://example.com/launch"}' \
  "http://$api/v1/links" | sed 's/.*"code":"\([^"]*\)".*/\1/')
echo "$code" >"$work/warm"
# Scanner codes: every counter of the leased block, the real link's removed.
$BIN/lasthop-snapshot synth --key-file "$work/key" --count "$SCANNERS" --out "$work/s.snap" \
  --codes-out "$work/all" >/dev/null
head -n "$SCANNERS" "$work/all" | grep -vx "$code" >"$work/scan" || true
addrs=() admins=()
for i in $(seq "$ENGINES"); do
  port=$((BASE_PORT + 10 + 2 * i))
  $BIN/lasthop-engine --key-file "$work/key" --control "http://$edge" \
    --edge-token-file "$work/data/edge.token" --data-dir "$work/engine-$i" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --cores 1 \
    --engine-id "herd-$i" --pop "pop$i" --origin-max-pending "$MAX_PENDING" \
    >/dev/null 2>"$work/engine-$i.log" &
  pids+=($!)
  addrs+=("127.0.0.1:$port")
  admins+=("127.0.0.1:$((port + 1))")
done
metric() { curl -s "http://$1/metrics" | awk -v m="$2" '$1==m {print $2; f=1} END {if (!f) print 0}'; }
fetches() { curl -s "http://$1/metrics" | awk '$1 ~ /^lasthop_engine_origin_fetches_total/ {s+=$2} END {print s+0}'; }
# The snapshot that leaves the link out: published after it, so it covers its creation.
seq=$(curl -sf -X POST -H "Authorization: Bearer $admin" "http://$api/v1/admin/snapshots" |
  sed 's/.*"seq":\([0-9]*\).*/\1/')
for a in "${admins[@]}"; do
  for _ in $(seq 200); do
    [ "$(metric "$a" lasthop_engine_snapshot_sequence)" = "$seq" ] &&
      [ "$(metric "$a" lasthop_engine_overlay_links)" = "0" ] && break
    sleep 0.05
  done
done
echo "herd.sh: $ENGINES engines (1 core each, --origin-max-pending $MAX_PENDING), one control plane, $(nproc) CPUs; link $code outside the hot set (snapshot seq $seq); ${DURATION}s phases, $CONNS connections per engine and client"

counters=(lasthop_engine_origin_coalesced_total lasthop_engine_origin_fresh_hits_total
  lasthop_engine_origin_negative_hits_total lasthop_engine_origin_overflow_total lasthop_engine_origin_shed_total)
snap() { local a=$1; echo "$(fetches "$a") $(for m in "${counters[@]}"; do metric "$a" "$m"; done | tr '\n' ' ')"; }
report() {
  local phase=$1 i=0
  for a in "${admins[@]}"; do
    read -r -a b <<<"${before[$i]}"
    read -r -a n <<<"$(snap "$a")"
    echo "herd.sh: [$phase] engine $((i + 1)): origin fetches $((n[0] - b[0])), coalesced $((n[1] - b[1])), fresh $((n[2] - b[2])), negative $((n[3] - b[3])), overflow $((n[4] - b[4])), shed $((n[5] - b[5]))"
    i=$((i + 1))
  done
}
run_wrk() { # ADDR CODES_FILE OUT
  CODES_FILE=$2 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s perf/herd.lua "http://$1/" >"$3" 2>&1
}
summary() { # OUT
  awk '/Requests\/sec/ {r=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} /^statuses/ {$1=""; s=$0} END {printf "%s req/s, p50 %s, p99 %s;%s", r, p50, p99, s}' "$1"
}

# Phase 1: every engine misses the one link at once.
before=(); for a in "${admins[@]}"; do before+=("$(snap "$a")"); done
for i in "${!addrs[@]}"; do run_wrk "${addrs[$i]}" "$work/warm" "$work/herd-$i.out" & done
wait_wrk() { while pgrep -f "wrk -t1 -c$CONNS" >/dev/null; do sleep 0.1; done; }
wait_wrk
report herd
for i in "${!addrs[@]}"; do echo "herd.sh: [herd] engine $((i + 1)) clients: $(summary "$work/herd-$i.out")"; done

# Phase 2: a scanner burst below the marks on every engine, the real link asked meanwhile.
before=(); for a in "${admins[@]}"; do before+=("$(snap "$a")"); done
for i in "${!addrs[@]}"; do
  run_wrk "${addrs[$i]}" "$work/scan" "$work/scan-$i.out" &
  run_wrk "${addrs[$i]}" "$work/warm" "$work/warm-$i.out" &
done
wait_wrk
report scan
for i in "${!addrs[@]}"; do
  echo "herd.sh: [scan] engine $((i + 1)) scanners: $(summary "$work/scan-$i.out")"
  echo "herd.sh: [scan] engine $((i + 1)) the real link: $(summary "$work/warm-$i.out")"
done
