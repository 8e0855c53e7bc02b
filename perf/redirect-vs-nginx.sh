#!/usr/bin/env bash
# The engine against nginx on the same links, same core, same load generator.
#
# Synthesises a LINKS-link snapshot (default 1M), gives nginx the same links as a `map` answering
# `return 302`, then alternates wrk runs (random codes from the codes file) against: the engine's
# full path, the engine's fixed-response floor (--fixed-response: the loop and the kernel, no
# lookup), and nginx. Every server is pinned to CPU 0 with one worker/core, wrk to CPU 1. Prints
# requests/s, p99, and requests per server CPU-second (server CPU time from /proc during each
# run), medians over ROUNDS, and the ratios. Runs once with real codes and once with SCAN% (90)
# never-issued codes.
#
#   perf/redirect-vs-nginx.sh                   # LINKS=1000000 ROUNDS=3 DURATION=8 CONNS=64
#   LAYOUT=paged perf/redirect-vs-nginx.sh      # the snapshot in the paged layout
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
SCAN=${SCAN:-90}
PORT=${PORT:-18080}
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
BIN=$PWD/target/release
work=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$work"
. perf/lib.sh
synth_links "$BIN" "$work" "$LINKS"
nginx_conf "$work" "$PORT"

hz=$(getconf CLK_TCK)

start_server() { # name -> sets pids
  case $1 in
    engine|floor)
      local extra=(); [ "$1" = floor ] && extra=(--fixed-response)
      taskset -c 0 "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
        --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 \
        --data-dir "$work/engine-data" "${extra[@]}" \
        >"$work/$1.out" 2>"$work/$1.err" &
      pids=($!) ;;
    nginx)
      taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
      pids=($!) ;;
  esac
  wait_up "$1" "http://127.0.0.1:$PORT/healthcheck"
}
pids=()
trap stop_server EXIT

declare -A results
run_one() { # server scan round
  start_server "$1"
  local c0; c0=$(cpu_of "${pids[@]}")
  local out; out=$(CODES_FILE="$work/codes.common" SCAN_PERCENT=$2 taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s perf/redirect.lua "http://127.0.0.1:$PORT/")
  local c1; c1=$(cpu_of "${pids[@]}")
  stop_server
  local rps p99 cpu
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  local reqs; reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  local per; per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-6s scan=%-3s round %d: %10s req/s  p99 %-8s  server CPU %6ss  %9s req/CPU-s\n" "$1" "$2" "$3" "$rps" "$p99" "$cpu" "$per"
  results["$1,$2"]+="$per $rps $p99;"
}

echo "redirect-vs-nginx: $LINKS links, $ROUNDS rounds x ${DURATION}s, $CONNS connections, servers on CPU 0, wrk on CPU 1"
for scan in 0 "$SCAN"; do
  for r in $(seq "$ROUNDS"); do
    for s in engine floor nginx; do run_one "$s" "$scan" "$r"; done
  done
done
echo
printf "%-22s %14s %12s %10s\n" "median of $ROUNDS" "req/CPU-s" "req/s" "p99"
for scan in 0 "$SCAN"; do
  for s in engine floor nginx; do
    v=${results["$s,$scan"]}
    per=$(echo "$v" | tr ';' '\n' | awk '{print $1}' | median)
    rps=$(echo "$v" | tr ';' '\n' | awk '{print $2}' | median)
    p99=$(echo "$v" | tr ';' '\n' | awk '{print $3}' | tr '\n' ' ')
    printf "%-22s %14s %12s   %s\n" "$s (scan $scan%)" "$per" "$rps" "$p99"
    eval "per_${s}_${scan}=$per"
  done
  eval "e=\$per_engine_${scan}; f=\$per_floor_${scan}; n=\$per_nginx_${scan}"
  awk -v e="$e" -v f="$f" -v n="$n" -v s="$scan" 'BEGIN{printf "  scan %s%%: engine/nginx %.2fx   engine/floor %.1f%%   floor/nginx %.2fx  (medians, per server CPU-second)\n", s, e/n, 100*e/f, f/n}'
  # Paired: each round's servers ran back to back, so a ratio within a round cancels most of
  # the shared machine's drift between rounds.
  er=$(echo "${results["engine,$scan"]}" | tr ';' '\n' | awk 'NF {print $1}')
  fr=$(echo "${results["floor,$scan"]}" | tr ';' '\n' | awk 'NF {print $1}')
  nr=$(echo "${results["nginx,$scan"]}" | tr ';' '\n' | awk 'NF {print $1}')
  ef=$(paste <(echo "$er") <(echo "$fr") | awk '{printf "%.3f ", $1/$2}')
  en=$(paste <(echo "$er") <(echo "$nr") | awk '{printf "%.3f ", $1/$2}')
  printf "  scan %s%%: per-round engine/floor %s-> median %.1f%%;  engine/nginx %s-> median %.2fx\n" "$scan" \
    "$ef" "$(echo "$ef" | median | awk '{print 100*$1}')" "$en" "$(echo "$en" | median)"
done
