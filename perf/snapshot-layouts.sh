#!/usr/bin/env bash
# The engine on the same links with the snapshot in each layout (compact, the default, and
# paged: snapshot-builder/FORMAT.md), paired: the same binary, key and links, the two layouts
# alternated every round so the shared machine's drift falls on both. Prints requests per server
# CPU-second per round and the paged/compact ratio per round, for real codes and for SCAN%
# never-issued codes. Server pinned to CPU 0 (one core), wrk to CPU 1, as in
# perf/redirect-vs-nginx.sh.
#
#   perf/snapshot-layouts.sh            # LINKS=1000000 ROUNDS=4 DURATION=8 CONNS=64 SCAN=90
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
SCAN=${SCAN:-90}
PORT=${PORT:-18080}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
BIN=$PWD/target/release
work=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$work"
. perf/lib.sh
synth_links "$BIN" "$work" "$LINKS" # links.snap in the default layout, key, codes.common
# The same links (same key, same synthetic seed) in the paged layout.
"$BIN/lasthop-snapshot" synth --key-file "$work/key" --count "$LINKS" --out "$work/links-paged.snap" \
  --codes-out "$work/codes-paged" --layout paged >/dev/null
cmp -s "$work/codes" "$work/codes-paged" || { echo "snapshot-layouts.sh: the two builds differ" >&2; exit 1; }
hz=$(getconf CLK_TCK)
pids=()
trap stop_server EXIT

run_one() { # layout scan -> prints req/CPU-s
  local snap=$work/links.snap
  [ "$1" = paged ] && snap=$work/links-paged.snap
  taskset -c 0 "$BIN/lasthop-engine" --snapshot "$snap" --key-file "$work/key" \
    --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 \
    --data-dir "$work/engine-data" >"$work/engine.out" 2>"$work/engine.err" &
  pids=($!)
  wait_up engine "http://127.0.0.1:$PORT/healthcheck"
  local c0 c1 out reqs
  c0=$(cpu_of "${pids[@]}")
  out=$(CODES_FILE="$work/codes.common" SCAN_PERCENT=$2 taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s perf/redirect.lua "http://127.0.0.1:$PORT/")
  c1=$(cpu_of "${pids[@]}")
  stop_server
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  awk -v r="$reqs" -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{ if (b > a) printf "%.0f", r / ((b - a) / hz); else print 0 }'
}

echo "snapshot-layouts: $LINKS links, $ROUNDS rounds x ${DURATION}s, $CONNS connections, server on CPU 0, wrk on CPU 1"
for scan in 0 "$SCAN"; do
  ratios=()
  for r in $(seq "$ROUNDS"); do
    c=$(run_one compact "$scan")
    p=$(run_one paged "$scan")
    ratio=$(awk -v p="$p" -v c="$c" 'BEGIN{printf "%.3f", p / c}')
    ratios+=("$ratio")
    printf "  scan=%-3s round %d: compact %9s  paged %9s req/CPU-s  paged/compact %s\n" "$scan" "$r" "$c" "$p" "$ratio"
  done
  printf "  scan %s%%: paged/compact per round %s -> median %s\n" "$scan" "${ratios[*]}" "$(echo "${ratios[*]}" | median)"
done
