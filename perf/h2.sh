#!/usr/bin/env bash
# HTTP/2 over TLS: the engine (rustls, its own h2) against nginx (OpenSSL, ngx_http_v2_module) on
# the same links, same certificate (ECDSA P-256), same core, same load generator.
#
# Synthesises a LINKS-link snapshot (default 1M; cached like perf/redirect-vs-nginx.sh's, in
# WORK), gives nginx the same links as a `map` answering `return 302` on `listen ... ssl http2`,
# and points h2load (nghttp2-client) at URLS codes (default 4000) nginx also has, one URI a line
# (`-i`): CONNS connections (default 64), DURATION seconds a run (`-D`, default 8), at each
# multiplexing level of M_LEVELS (`-m`, default "1 10": streams in flight per connection). Each
# round runs engine and nginx back to back at each level (the order flips every other round),
# so each round is a pair, then the engine's HTTP/1.1 keep-alive over the same TLS listener
# (`h2load --h1 -m 1`: one request in flight per connection, no pipelining, as wrk does). Every
# server is pinned to CPU 0 with one worker/core, h2load to CPU 1; the engine serves TLS in
# userspace (--no-ktls), as nginx does. Prints requests/s and requests per server CPU-second
# (server CPU time from /proc during each run) per round and their medians over ROUNDS (default
# 3); the paired ratio engine/nginx per round and its median; and engine h2/engine HTTP/1.1
# keep-alive per server CPU-second (above 1: a multiplexed h2 request costs the server less CPU
# than a keep-alive HTTP/1.1 one). A run that negotiated another protocol than asked, or got
# any answer but a 3xx, fails the script.
# Goals: at -m 10, >= 1.5x nginx's requests per server CPU-second; and a multiplexed h2 request
# (-m 10) costs no more server CPU than an HTTP/1.1 keep-alive request (h2/h1 >= 1.0).
#
#   perf/h2.sh                                  # LINKS=1000000 ROUNDS=3 DURATION=8 CONNS=64
#   M_LEVELS=10 ROUNDS=5 perf/h2.sh             # only -m 10, more rounds
#   ROUNDS=1 DURATION=3 LINKS=100000 perf/h2.sh # a quick check that it all runs
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
M_LEVELS=${M_LEVELS:-1 10}
URLS=${URLS:-4000}
PORT=${PORT:-18453}

# nginx must have HTTP/2: Debian's `nginx` binary package is built --with-http_v2_module
# (bookworm's nginx-light is only `nginx` plus a module; elsewhere nginx-core is the one to take).
has_h2() { command -v nginx >/dev/null && nginx -V 2>&1 | grep -q -- --with-http_v2_module; }
need=()
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
has_h2 || need+=(nginx)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
has_h2 || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-core >/dev/null || true; }
has_h2 || { echo "nginx has no HTTP/2 module (nginx -V lacks --with-http_v2_module)" >&2; exit 1; }

cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
BIN=$PWD/target/release
cache=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$cache"
work=$(mktemp -d /var/tmp/lasthop-h2.XXXXXX)
pids=()
. perf/lib.sh
trap 'stop_server; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

synth_links "$BIN" "$cache" "$LINKS"
tls_cert "$work" 127.0.0.1
head -n "$URLS" "$cache/codes.common" | awk -v p="$PORT" '{print "https://127.0.0.1:" p "/" $1}' >"$work/urls"
[ -s "$work/urls" ] || { echo "no codes in $cache/codes.common" >&2; exit 1; }

cat >"$work/nginx.conf" <<NGX
worker_processes 1;
worker_cpu_affinity 01;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  map_hash_max_size 4194304;
  map_hash_bucket_size 256;
  include $cache/map.conf;
  ssl_protocols TLSv1.2 TLSv1.3;
  server {
    listen 127.0.0.1:$PORT ssl http2 reuseport;
    ssl_certificate $work/srv.pem;
    ssl_certificate_key $work/srv.key;
    location / {
      if (\$lh_dest = "") { return 404; }
      return 302 \$lh_dest;
    }
  }
}
NGX

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "127.0.0.1:$PORT is already in use: pick another PORT" >&2; exit 1
fi
hz=$(getconf CLK_TCK)
start_server() { # engine|nginx -> sets pids
  case $1 in
    engine)
      taskset -c 0 "$BIN/lasthop-engine" --snapshot "$cache/links.snap" --key-file "$cache/key" \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 \
        --data-dir "$work/engine-data" \
        --tls-listen 127.0.0.1:$PORT --cert "$work/srv.pem" --key "$work/srv.key" --no-ktls \
        >"$work/engine.out" 2>"$work/engine.err" &
      pids=($!) ;;
    nginx)
      taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
      pids=($!) ;;
  esac
  wait_up "$1" "https://127.0.0.1:$PORT/" -k
  # What answered must be ours (not a server someone else left on PORT).
  kill -0 "${pids[0]}" 2>/dev/null || { echo "$1 exited:" >&2; cat "$work/$1.err" >&2; exit 1; }
}

declare -A results
run_one() { # server proto(h2|h1) m round
  local server=$1 proto=$2 m=$3 round=$4 label want extra=()
  if [ "$proto" = h1 ]; then label="$server h1 keep-alive"; want=http/1.1; extra=(--h1)
  else label="$server h2 -m $m"; want=h2; fi
  start_server "$server"
  local c0 c1 out
  c0=$(cpu_of "${pids[@]}")
  out=$(timeout $((DURATION + 60)) taskset -c 1 h2load -t1 -c"$CONNS" -m"$m" -D"$DURATION" \
    "${extra[@]}" -i "$work/urls" 2>&1) || {
    echo "$label round $round: h2load failed:" >&2; echo "$out" >&2; exit 1; }
  c1=$(cpu_of "${pids[@]}")
  stop_server
  local got cipher rps ndone ok fail codes n3 other cpu per
  got=$(echo "$out" | awk -F': ' '/^Application protocol:/ {print $2; exit}')
  cipher=$(echo "$out" | awk -F': ' '/^Cipher:/ {print $2; exit}')
  rps=$(echo "$out" | awk '/^finished in/ {printf "%.0f", $4}')
  read -r ndone ok fail < <(echo "$out" | awk '/^requests:/ {print $6, $8, $10+$12+$14}') || true
  codes=$(echo "$out" | awk '/^status codes:/ {print $3, $5, $7, $9}')
  n3=$(echo "$codes" | awk '{print $2}')
  other=$(echo "$codes" | awk '{print $1 + $3 + $4}')
  if [ "$got" != "$want" ] || [ -z "$n3" ] || [ "$n3" -eq 0 ] || [ "$other" -ne 0 ]; then
    echo "$label round $round: wanted only 3xx over $want, got protocol '${got:-none}'," \
      "status codes (2xx 3xx 4xx 5xx) '${codes:-none}':" >&2
    echo "$out" >&2
    exit 1
  fi
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  per=$(awk -v r="$n3" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-20s round %d: %8s req/s  server CPU %6ss (%3.0f%% of a core)  %8s req/CPU-s  %s 3xx%s  %s\n" \
    "$label" "$round" "$rps" "$cpu" "$(awk -v c="$cpu" -v d="$DURATION" 'BEGIN{print 100*c/d}')" \
    "$per" "$n3" "$([ "${fail:-0}" -gt 0 ] && echo ", $fail failed/errored/timed out")" "$cipher"
  results["$label"]+="$per $rps;"
}

# The per-round figures of one label, one a line.
pers() { echo "${results["$1"]}" | tr ';' '\n' | awk 'NF {print $1}'; }
# Per-round a/b of two labels' figures, space separated (paired: the same round's runs ran back
# to back, so a ratio within a round cancels most of the shared machine's drift between rounds).
paired() { paste <(pers "$1") <(pers "$2") | awk '{printf "%.3f ", ($2 > 0) ? $1/$2 : 0}'; }

echo "h2.sh: $LINKS links, $(wc -l <"$work/urls") URLs, $ROUNDS rounds x ${DURATION}s, $CONNS connections," \
  "-m $M_LEVELS; servers on CPU 0, h2load on CPU 1; TLS (engine --no-ktls), ECDSA P-256"
for r in $(seq "$ROUNDS"); do
  order="engine nginx"; [ $((r % 2)) -eq 0 ] && order="nginx engine"
  for m in $M_LEVELS; do
    for s in $order; do run_one "$s" h2 "$m" "$r"; done
  done
  run_one engine h1 1 "$r"
done

echo
printf "%-22s %14s %12s\n" "median of $ROUNDS" "req/CPU-s" "req/s"
labels=()
for m in $M_LEVELS; do labels+=("engine h2 -m $m" "nginx h2 -m $m"); done
labels+=("engine h1 keep-alive")
for l in "${labels[@]}"; do
  per=$(pers "$l" | median)
  rps=$(echo "${results["$l"]}" | tr ';' '\n' | awk 'NF {print $2}' | median)
  printf "%-22s %14s %12s\n" "$l" "$per" "$rps"
done
for m in $M_LEVELS; do
  en=$(paired "engine h2 -m $m" "nginx h2 -m $m")
  eh=$(paired "engine h2 -m $m" "engine h1 keep-alive")
  printf "  -m %-3s engine/nginx per server CPU-second, per round %s-> median %.2fx%s\n" "$m" "$en" \
    "$(echo "$en" | median)" "$([ "$m" = 10 ] && echo "  (goal >= 1.5x)")"
  printf "  -m %-3s engine h2/engine HTTP/1.1 keep-alive per server CPU-second, per round %s-> median %.2fx%s\n" \
    "$m" "$eh" "$(echo "$eh" | median)" "$([ "$m" = 10 ] && echo "  (goal >= 1.0x: an h2 request costs no more)")"
done
