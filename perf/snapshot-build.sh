#!/usr/bin/env bash
# Snapshot build time from the store at LINKS links (default 1,000,000), PostgreSQL (a primary
# with a synchronous streaming standby, perf/lib.sh pg_pair) beside the embedded store.
#
# The links (lasthop-snapshot synth: realistic URL lengths, 1% aliases, 3% expiring) are turned
# into a `lasthop-control export` file and loaded with `import` into each store (load time
# printed too); then `lasthop-control snapshot build` runs ROUNDS times on each, and the median
# build time, the file size and the bytes per link are printed. The builder runs on CPU 0; the
# PostgreSQL servers are not pinned.
#
#   perf/snapshot-build.sh                     # LINKS=1000000 ROUNDS=3
#   LINKS=100000 ROUNDS=1 perf/snapshot-build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-3}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p lasthop-control -p lasthop-snapshot
  BIN=target/release
fi
work=$(mktemp -d /var/tmp/lasthop-snapbuild.XXXXXX)
. perf/lib.sh
trap 'pg_pair_stop; rm -rf "$work"' EXIT
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }

$BIN/lasthop-control keygen --out "$work/key" >/dev/null
$BIN/lasthop-snapshot synth --key-file "$work/key" --count "$LINKS" --out "$work/synth.snap" \
  --codes-out "$work/codes" --tsv-out "$work/links.tsv" >/dev/null
# The header of an export under this key, from an empty store.
$BIN/lasthop-control export --data-dir "$work/empty" --key-file "$work/key" 2>/dev/null |
  head -1 >"$work/links.ndjson"
total=$(wc -l <"$work/links.tsv")
awk -F'\t' -v counters="$LINKS" -v total="$total" -v t0="$(date +%s)000" '
  BEGIN { printf "{\"type\":\"counter\",\"region\":0,\"high_water\":%d}\n", counters }
  {
    url = $2; gsub(/\\/, "\\\\", url); gsub(/"/, "\\\"", url)
    printf "{\"type\":\"link\",\"code\":\"%s\",\"long_url\":\"%s\",\"owner\":\"perf\",\"created_at_ms\":%.0f,\"seq\":%d,\"state\":{}}\n", $1, url, t0 + NR, NR
  }
  END { printf "{\"type\":\"end\",\"last_seq\":%d,\"links\":%d,\"records\":%d}\n", total, total, total + 1 }
' "$work/links.tsv" >>"$work/links.ndjson"
echo "snapshot-build.sh: $total links ($(du -h "$work/links.ndjson" | cut -f1) of NDJSON), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"

# measure NAME STORE_ARGS...: import, then ROUNDS builds; prints one line.
measure() {
  local name=$1
  shift
  local t0 t1 builds=() size
  t0=$(now)
  $BIN/lasthop-control import --key-file "$work/key" "$@" --in "$work/links.ndjson" 2>"$work/import.err" ||
    { cat "$work/import.err" >&2; return 1; }
  t1=$(now)
  local load
  load=$(secs "$t0" "$t1")
  for _ in $(seq "$ROUNDS"); do
    taskset -c 0 $BIN/lasthop-control snapshot build --key-file "$work/key" "$@" \
      --out "$work/$name.snap" 2>"$work/build.err" >/dev/null ||
      { cat "$work/build.err" >&2; return 1; }
    builds+=("$(awk '/built in/ {print $3}' "$work/build.err")")
  done
  size=$(stat -c %s "$work/$name.snap")
  echo "snapshot-build.sh: [$name] import $load s ($(awk -v n="$total" -v s="$load" 'BEGIN{printf "%.0f", n/s}') links/s); snapshot build ${builds[*]} s (median $(echo "${builds[@]}" | median) s); $size bytes, $(awk -v s="$size" -v n="$total" 'BEGIN{printf "%.1f", s/n}') bytes/link"
}

pg_pair "$work"
pg_sql "CREATE DATABASE lasthop"
measure postgres --store "$(pg_url lasthop)"
measure embedded --data-dir "$work/emb"
