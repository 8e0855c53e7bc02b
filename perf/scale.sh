#!/usr/bin/env bash
# How the engine scales with cores, beside nginx, on a many-core host (run once on a 16-core
# machine; the 2-core development VM cannot show it).
#
# For each N in CORES (1 2 4 8 16): the engine with --cores N pinned to CPUs 0..N-1 (click
# recording on, spool sink, as deployed), then nginx with N workers on the same CPUs, each loaded
# by wrk on the upper half of the CPUs (8 threads on CPUs 8-15; at N=16 server and wrk share all
# CPUs, which the table marks). Prints requests/s and requests per server CPU-second.
#
#   BIN=target/release perf/scale.sh        # LINKS=200000 DURATION=5 CORES="1 2 4 8 16"
#   ENGINE_ARGS="--clicks off" SERVERS=engine perf/scale.sh    # the engine without click recording
# BIN must hold lasthop-engine, lasthop-snapshot, lasthop-control (and may hold wrk, nginx and a
# lib/ of their shared libraries, for a host without them).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
LINKS=${LINKS:-200000}
DURATION=${DURATION:-5}
CORES=${CORES:-"1 2 4 8 16"}
SERVERS=${SERVERS:-"engine nginx"}
ENGINE_ARGS=${ENGINE_ARGS:-}
PORT=${PORT:-18080}
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$PWD/$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WRK=$(command -v wrk || echo "$BIN/wrk")
NGINX=$(command -v nginx || echo "$BIN/nginx")
work=${WORK:-/tmp/lasthop-scale}
rm -rf "$work"; mkdir -p "$work/logs"
cpus=$(nproc)
hz=$(getconf CLK_TCK)
echo "host: $cpus CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), kernel $(uname -r)"

. perf/lib.sh
synth_links "$BIN" "$work" "$LINKS"

pids=()
trap stop_server EXIT

run() { # server n -> prints one row
  local server=$1 n=$2 list wrk_cpus threads
  list=$(seq -s, 0 $((n - 1)))
  if [ "$n" -le $((cpus / 2)) ]; then wrk_cpus="$((cpus / 2))-$((cpus - 1))"; threads=$((cpus / 2)); else wrk_cpus="0-$((cpus - 1))"; threads=$((cpus / 2)); fi
  case $server in
    engine)
      taskset -c "$list" "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
        --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:0 --cores "$n" --cpus "$list" \
        --data-dir "$work/engine" $ENGINE_ARGS >"$work/logs/engine-$n.out" 2>"$work/logs/engine-$n.err" &
      pids=($!) ;;
    nginx)
      cat >"$work/nginx-$n.conf" <<NGX
worker_processes $n;
worker_cpu_affinity $(for i in $(seq 0 $((n - 1))); do printf '%s ' "$(awk -v c="$cpus" -v i="$i" 'BEGIN{s=""; for(j=c-1;j>=0;j--) s=s (j==i?"1":"0"); print s}')"; done);
daemon off;
pid $work/nginx.pid;
error_log $work/logs/nginx-$n.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $work/tmp-body;
  proxy_temp_path $work/tmp-proxy;
  fastcgi_temp_path $work/tmp-fastcgi;
  uwsgi_temp_path $work/tmp-uwsgi;
  scgi_temp_path $work/tmp-scgi;
  keepalive_requests 10000000;
  map_hash_max_size 4194304;
  map_hash_bucket_size 256;
  include $work/map.conf;
  server {
    listen 127.0.0.1:$PORT reuseport;
    location / { if (\$lh_dest = "") { return 404; } return 302 \$lh_dest; }
  }
}
NGX
      "$NGINX" -c "$work/nginx-$n.conf" -p "$work" >/dev/null 2>&1 &
      pids=($!) ;;
  esac
  if ! wait_up "$server" "http://127.0.0.1:$PORT/healthcheck"; then
    printf "%-6s %3d  did not start\n" "$server" "$n"; cat "$work/logs/$server-$n.err" 2>/dev/null | tail -3; stop_server; return
  fi
  local conns=$((64 * n)); [ $conns -gt 1024 ] && conns=1024; [ $conns -lt $threads ] && conns=$threads
  local c0; c0=$(cpu_of "${pids[@]}")
  local out; out=$(CODES_FILE="$work/codes.common" SCAN_PERCENT=0 taskset -c "$wrk_cpus" "$WRK" -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s perf/redirect.lua "http://127.0.0.1:$PORT/")
  local c1; c1=$(cpu_of "${pids[@]}")
  stop_server
  local rps reqs cpu per p99
  rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%.0f", $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "%-6s %3d  %10s req/s  %9s req/CPU-s  p99 %-8s  server CPU %6ss  wrk on %s%s\n" "$server" "$n" "$rps" "$per" "$p99" "$cpu" "$wrk_cpus" \
    "$([ "$n" -gt $((cpus / 2)) ] && echo ' (shared with the server)')"
}

echo "links $LINKS, ${DURATION}s per run, wrk $((cpus / 2)) threads"
for n in $CORES; do
  [ "$n" -le "$cpus" ] || continue
  for s in $SERVERS; do run "$s" "$n"; done
done
