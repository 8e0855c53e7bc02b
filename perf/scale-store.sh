#!/usr/bin/env bash
# Hot-set snapshots at store scale: does a snapshot build cost the hot set or the store?
#
# For each N in SIZES (default 1M, 10M and 50M links; a size the disk cannot hold is skipped, and
# the check is printed first) the links are loaded into an embedded store by bulk import (the
# `lasthop-control export` format; lasthop-snapshot synth makes realistic codes and URLs): all but
# the newest HOT (1M) were created 30-60 days ago, the newest HOT within the last day. Then:
#
# - `snapshot build --hot` with a fixed budget of HOT links (ROUNDS builds, the median), pinned
#   to CPU 0: build time, file size, bytes per link;
# - the engine's time to open and swap that file: an engine serving it is sent SIGHUP (re-open,
#   verify the checksums, swap) and /metrics is polled until the swap is counted (ms, median of
#   ROUNDS);
# - the store's create latency at that size: `serve` on the store, CREATES sequential creates
#   over one keep-alive connection, p50 and p99 in ms.
#
# Goal (issue 15): build time at 50M within 1.5x of the time at 1M; create latency unchanged.
#
#   perf/scale-store.sh                           # SIZES="1000000 10000000 50000000"
#   SIZES="1000000 10000000" ROUNDS=3 perf/scale-store.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1000000 10000000 50000000"}
HOT=${HOT:-1000000}
ROUNDS=${ROUNDS:-3}
CREATES=${CREATES:-2000}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p lasthop-control -p lasthop-snapshot -p lasthop-engine
  BIN=target/release
fi
work=$(mktemp -d /var/tmp/lasthop-scalestore.XXXXXX)
. perf/lib.sh
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }

# Bytes a size needs at once: the NDJSON export and the store being imported (measured: ~213
# and ~1,200 bytes a link; the synth snapshot and TSV are deleted before the import), the hot
# snapshot, and room to spare.
need_bytes() { awk -v n="$1" 'BEGIN{printf "%.0f", n * 1450 + 2e9}'; }
free=$(df -B1 --output=avail "$work" | tail -1)
echo "scale-store.sh: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $(awk -v f="$free" 'BEGIN{printf "%.1f", f/1e9}') GB free in $work"
sizes=()
for n in $SIZES; do
  if [ "$(need_bytes "$n")" -gt "$free" ]; then
    echo "scale-store.sh: [$n] skipped: needs about $(awk -v b="$(need_bytes "$n")" 'BEGIN{printf "%.0f", b/1e9}') GB of disk, $(awk -v f="$free" 'BEGIN{printf "%.0f", f/1e9}') GB free"
  else
    sizes+=("$n")
  fi
done

$BIN/lasthop-control keygen --out "$work/key" >/dev/null
key_id_header=$($BIN/lasthop-control export --data-dir "$work/empty" --key-file "$work/key" 2>/dev/null | head -1)

# export_links N FILE: N links in the export format, the newest HOT created within the last day.
export_links() {
  local n=$1 out=$2 synth=$work/synth.snap
  $BIN/lasthop-snapshot synth --key-file "$work/key" --count "$n" --out "$synth" \
    --codes-out "$work/codes" --tsv-out "$work/links.tsv" >/dev/null
  rm -f "$synth" "$work/codes"
  echo "$key_id_header" >"$out"
  local total
  total=$(wc -l <"$work/links.tsv")
  awk -F'\t' -v counters="$n" -v total="$total" -v hot="$HOT" -v now="$(date +%s)000" '
    BEGIN { printf "{\"type\":\"counter\",\"region\":0,\"high_water\":%d}\n", counters }
    {
      url = $2; gsub(/\\/, "\\\\", url); gsub(/"/, "\\\"", url)
      # Old links spread over 30..60 days ago; the newest `hot` within the last day.
      if (NR > total - hot) at = now - 86400000 + (NR - (total - hot)) * (86000000 / hot)
      else at = now - 60 * 86400000 + NR * (30 * 86400000 / total)
      printf "{\"type\":\"link\",\"code\":\"%s\",\"long_url\":\"%s\",\"owner\":\"perf\",\"created_at_ms\":%.0f,\"seq\":%d,\"state\":{}}\n", $1, url, at, NR
    }
    END { printf "{\"type\":\"end\",\"last_seq\":%d,\"links\":%d,\"records\":%d}\n", total, total, total + 1 }
  ' "$work/links.tsv" >>"$out"
  rm -f "$work/links.tsv"
  echo "$total"
}

# create_latency API KEY: CREATES sequential creates over one connection; "p50 p99" in ms.
create_latency() {
  python3 - "$1" "$2" "$CREATES" <<'EOF'
import http.client, json, sys, time
host, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = http.client.HTTPConnection(host)
lat = []
for i in range(n):
    body = json.dumps({"long_url": f"https://scale.example/{i}"})
    t = time.perf_counter()
    c.request("POST", "/v1/links", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = c.getresponse(); r.read()
    lat.append((time.perf_counter() - t) * 1000)
    assert r.status == 201, r.status
lat.sort()
print(f"{lat[len(lat)//2]:.2f} {lat[int(len(lat)*0.99)]:.2f}")
EOF
}

# swap_ms ENGINE_ADMIN PID: SIGHUP, then poll until the swap is counted; ms.
swap_ms() {
  local admin=$1 pid=$2 before t0 t1
  before=$(curl -s "http://$admin/metrics" | awk '$1=="lasthop_engine_snapshot_swaps_total"{print $2}')
  t0=$(now)
  kill -HUP "$pid"
  while :; do
    n=$(curl -s "http://$admin/metrics" | awk '$1=="lasthop_engine_snapshot_swaps_total"{print $2}')
    [ "$n" != "$before" ] && break
    sleep 0.005
  done
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", (b-a)*1000}'
}

for n in "${sizes[@]}"; do
  store=$work/store-$n
  t0=$(now)
  total=$(export_links "$n" "$work/links.ndjson")
  t1=$(now)
  $BIN/lasthop-control import --key-file "$work/key" --data-dir "$store" --in "$work/links.ndjson" \
    2>"$work/import.err" >/dev/null || { cat "$work/import.err" >&2; exit 1; }
  t2=$(now)
  rm -f "$work/links.ndjson"
  builds=()
  for _ in $(seq "$ROUNDS"); do
    taskset -c 0 $BIN/lasthop-control snapshot build --hot --snapshot-max-links "$HOT" \
      --snapshot-recent-days 7 --key-file "$work/key" --data-dir "$store" \
      --out "$work/hot.snap" 2>"$work/build.err" >/dev/null || { cat "$work/build.err" >&2; exit 1; }
    builds+=("$(awk '/built in/ {print $3}' "$work/build.err")")
  done
  size=$(stat -c %s "$work/hot.snap")
  links=$($BIN/lasthop-snapshot inspect "$work/hot.snap" | awk '$1=="links" {print $2; exit}')
  # The engine: open and swap the hot snapshot.
  $BIN/lasthop-engine --key-file "$work/key" --snapshot "$work/hot.snap" --listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 --cores 1 --data-dir "$work/engine" >"$work/engine.out" 2>"$work/engine.err" &
  epid=$!
  pids+=("$epid")
  for _ in $(seq 200); do grep -q "admin listening" "$work/engine.out" && break; sleep 0.05; done
  admin=$(awk '/admin listening on/ {sub("http://", "", $4); print $4}' "$work/engine.out")
  swaps=()
  for _ in $(seq "$ROUNDS"); do swaps+=("$(swap_ms "$admin" "$epid")"); done
  kill "$epid"
  wait "$epid" 2>/dev/null || true
  # The store under creates.
  key=$($BIN/lasthop-control apikey create --owner perf --data-dir "$store")
  $BIN/lasthop-control serve --key-file "$work/key" --data-dir "$store" --api-listen 127.0.0.1:0 \
    --edge-listen 127.0.0.1:0 --create-rate 0 --clicks off >"$work/serve.out" 2>"$work/serve.err" &
  spid=$!
  pids+=("$spid")
  for _ in $(seq 600); do grep -q "api listening" "$work/serve.out" && break; sleep 0.05; done
  api=$(awk '/api listening on/ {sub("http://", "", $4); print $4}' "$work/serve.out")
  lat=$(create_latency "$api" "$key")
  kill "$spid"
  wait "$spid" 2>/dev/null || true
  echo "scale-store.sh: [$total links] export $(secs "$t0" "$t1") s, import $(secs "$t1" "$t2") s; hot build (budget $HOT) ${builds[*]} s (median $(echo "${builds[@]}" | median) s), $links links, $size bytes ($(awk -v s="$size" -v n="$links" 'BEGIN{printf "%.1f", s/n}') B/link); engine open+swap ${swaps[*]} ms (median $(echo "${swaps[@]}" | median)); create p50/p99 $(echo "$lat" | awk '{print $1 "/" $2}') ms; store $(du -sh "$store" | cut -f1)"
  rm -rf "$store" "$work/hot.snap" "$work/engine"
done
