#!/usr/bin/env bash
# The AF_XDP path against the io_uring path and nginx, on one veth pair between two network
# namespaces this script makes (root only; engine/DESIGN.md, "The AF_XDP path").
#
# The server namespace holds the engine (`--io uring`, then `--io xdp` on the veth) or nginx,
# pinned to CPU 0; the client namespace holds wrk, pinned to CPU 1, drawing random codes from a
# LINKS-link snapshot (default 1M). Rounds alternate the three servers. On a veth the receiving
# side's XDP and TCP work runs partly in the sender's softirq, on the other CPU, so the script
# prints requests per server-process CPU-second (utime+stime of the server's pids) and per
# whole-machine CPU-second (every CPU's busy time from /proc/stat, the client's included), the
# medians of both and the paired per-round ratios.
#
# MODE=https runs the same over HTTPS (each server also listens on TPORT with one ECDSA P-256
# certificate; wrk keeps its connections, so this is the record layer's cost); MODE=handshake
# opens NEWCONNS concurrent connections of benches/examples/tls_load.rs instead of wrk, each
# a full TLS 1.3 handshake and one request (wrk would resume: it keeps its session across
# reconnects), and the figure is full handshakes per server CPU-second; HANDSHAKE=resumed13 or
# resumed12 makes each one a TLS 1.3 (psk_dhe_ke) or TLS 1.2 ticket resumption instead. With
# full or resumed13, each round also measures the handshake's crypto floor on CPU 0
# (`crypto_floor` in perf/lib.sh: `cargo bench --bench handshake`) right after its servers, and
# the script prints each server's handshakes per server CPU-second as a share of its round's
# floor (the issue's goal: full handshakes >= 70%), paired, since this VM's speed drifts by
# a fifth within the hour. With full, each round also measures `rustls_server_full` (the
# server's side of a whole rustls handshake in memory: the crypto plus rustls, no I/O), and
# the engine's share of that floor is printed too: what its TCP, syscalls and HTTP cost.
#
#   sudo perf/bypass.sh                       # LINKS=1000000 ROUNDS=3 DURATION=8 CONNS=64
#   SERVERS="xdp" PERF_RECORD=1 perf/bypass.sh   # one server; perf record of it into $WORK
#   MODE=handshake SERVERS="xdp uring nginx" perf/bypass.sh
#   FAMILY=6 perf/bypass.sh                   # the same over IPv6 (2001:2::/64, RFC 5180)
#   RPS=1 perf/bypass.sh                      # the client end's receive steered to CPU 1
#
# RPS=1 sets the client end's RPS mask to CPU 1: a segment the server sends is then received
# (the client's kernel TCP) on the client's core, as on a wire, instead of inside the server's
# transmit on CPU 0; the server pays an inter-processor interrupt per batch instead.
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
PORT=${PORT:-18080}
TPORT=${TPORT:-18443}
MODE=${MODE:-http}
NEWCONNS=${NEWCONNS:-16}
HANDSHAKE=${HANDSHAKE:-full}
SERVERS=${SERVERS:-uring xdp nginx}
case $MODE in http|https|handshake) ;; *) echo "perf/bypass.sh: MODE is http, https or handshake" >&2; exit 2 ;; esac
SNS=lhbypass-s CNS=lhbypass-c SIF=lhbps CIF=lhbpc
FAMILY=${FAMILY:-4}
case $FAMILY in
  4) SADDR=198.18.0.2 CADDR=198.18.0.1 PREFIX=30 HOST=198.18.0.2 ;;
  # IPv6 addresses go in brackets before a port (URLs, --listen, nginx's listen).
  6) SADDR=2001:2::2 CADDR=2001:2::1 PREFIX=64 HOST=[2001:2::2] ;;
  *) echo "perf/bypass.sh: FAMILY is 4 or 6" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "perf/bypass.sh: needs root (network namespaces, XDP)" >&2; exit 1; }
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
command -v ethtool >/dev/null || need+=(ethtool)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
floor_name=
if [ "$MODE" = handshake ]; then
  cargo build --release -q -p lasthop-benches --example tls_load
  case $HANDSHAKE in full) floor_name=full ;; resumed13) floor_name=resumed_psk_dhe ;; esac
  [ -z "$floor_name" ] || cargo bench --no-run -q -p lasthop-benches --bench handshake 2>/dev/null
fi
BIN=$PWD/target/release
work=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$work"
. perf/lib.sh
synth_links "$BIN" "$work" "$LINKS"
nginx_conf "$work" "$PORT"
sed -i "s/listen 127.0.0.1:$PORT reuseport;/listen $HOST:$PORT reuseport;/" "$work/nginx.conf"
tls_args=()
if [ "$MODE" != http ]; then
  # One ECDSA P-256 certificate for every server, and nginx's HTTPS server beside its plain one.
  tls_cert "$work" "$SADDR"
  tls_args=(--tls-listen "$HOST:$TPORT" --cert "$work/srv.pem" --key "$work/srv.key")
  sed -i '$ d' "$work/nginx.conf"
  cat >>"$work/nginx.conf" <<NGX
  ssl_protocols TLSv1.2 TLSv1.3;
  server {
    listen $HOST:$TPORT ssl reuseport;
    ssl_certificate $work/srv.pem;
    ssl_certificate_key $work/srv.key;
    location / {
      if (\$lh_dest = "") { return 404; }
      return 302 \$lh_dest;
    }
  }
}
NGX
fi

cleanup() { stop_server; ip netns del "$SNS" 2>/dev/null || true; ip netns del "$CNS" 2>/dev/null || true; }
trap cleanup EXIT
ip netns del "$SNS" 2>/dev/null || true
ip netns del "$CNS" 2>/dev/null || true
ip netns add "$SNS"
ip netns add "$CNS"
ip -n "$CNS" link add "$CIF" numtxqueues 1 numrxqueues 1 type veth peer name "$SIF" numtxqueues 1 numrxqueues 1
ip -n "$CNS" link set "$SIF" netns "$SNS"
# (nodad: an IPv6 address is usable at once, not tentative for a second or two.)
nodad=(); [ "$FAMILY" = 6 ] && nodad=(nodad)
ip -n "$CNS" addr add "$CADDR/$PREFIX" dev "$CIF" "${nodad[@]}"
ip -n "$SNS" addr add "$SADDR/$PREFIX" dev "$SIF" "${nodad[@]}"
# A veth leaves TCP checksums to an offload that never happens; a frame off a wire carries
# them whole, which is what the AF_XDP socket gets from a NIC.
ip netns exec "$CNS" ethtool -K "$CIF" tx off >/dev/null
for ns in "$SNS" "$CNS"; do ip -n "$ns" link set lo up; done
ip -n "$CNS" link set "$CIF" up
if [ "${RPS:-0}" = 1 ]; then
  ip netns exec "$CNS" sh -c "echo 2 > /sys/class/net/$CIF/queues/rx-0/rps_cpus"
fi
ip -n "$SNS" link set "$SIF" up

hz=$(getconf CLK_TCK)
# Busy clock ticks of the whole machine (every CPU: all but idle and iowait).
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }

pids=()
start_server() { # name
  local common=(--snapshot "$work/links.snap" --key-file "$work/key" --listen "$HOST:$PORT"
    --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 --data-dir "$work/engine-data" "${tls_args[@]}")
  case $1 in
    uring) ip netns exec "$SNS" taskset -c 0 "$BIN/lasthop-engine" "${common[@]}" --io uring \
             >"$work/$1.out" 2>"$work/$1.err" & pids=($!) ;;
    xdp) ip netns exec "$SNS" taskset -c 0 "$BIN/lasthop-engine" "${common[@]}" --io xdp \
           --xdp-interface "$SIF" >"$work/$1.out" 2>"$work/$1.err" & pids=($!) ;;
    nginx) ip netns exec "$SNS" taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
           pids=($!) ;;
  esac
  for _ in $(seq 1200); do
    if ip netns exec "$CNS" curl -s -o /dev/null "http://$HOST:$PORT/healthcheck"; then
      [ "$1" = nginx ] && pids+=($(pgrep -P "${pids[0]}" || true))
      return 0
    fi
    sleep 0.05
  done
  echo "$1 did not start" >&2; cat "$work/$1.err" >&2; return 1
}

declare -A results
run_one() { # server round
  start_server "$1"
  local c0 m0 c1 m1 out
  c0=$(cpu_of "${pids[@]}"); m0=$(machine_busy)
  local rec=()
  if [ -n "${PERF_RECORD:-}" ]; then
    perf record -g -o "$work/$1.perf.data" -p "${pids[0]}" -- sleep "$((DURATION - 1))" >/dev/null 2>&1 &
    rec=($!)
  fi
  local target="http://$HOST:$PORT/"
  [ "$MODE" = http ] || target="https://$HOST:$TPORT/"
  if [ "$MODE" = handshake ]; then
    # Printed in wrk's words, so the lines below read it alike.
    out=$(ip netns exec "$CNS" taskset -c 1 "$BIN/examples/tls_load" "$HOST:$TPORT" \
      "$(head -1 "$work/codes.common")" "$HANDSHAKE" "$NEWCONNS" "$DURATION" |
      awk -v d="$DURATION" '{printf "%d requests in %ds\nRequests/sec: %.2f\n", $1, d, $1 / d}')
  else
    out=$(ip netns exec "$CNS" env CODES_FILE="$work/codes.common" SCAN_PERCENT=0 taskset -c 1 \
      wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s perf/redirect.lua "$target")
  fi
  c1=$(cpu_of "${pids[@]}"); m1=$(machine_busy)
  [ ${#rec[@]} -eq 0 ] || wait "${rec[0]}" || true
  stop_server
  local rps p99 reqs cpu mcpu per mper
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  mcpu=$(awk -v a="$m0" -v b="$m1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  mper=$(awk -v r="$reqs" -v c="$mcpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-5s round %d: %10s req/s  p99 %-8s  server CPU %6ss %9s req/CPU-s  machine CPU %6ss %9s req/CPU-s\n" \
    "$1" "$2" "$rps" "$p99" "$cpu" "$per" "$mcpu" "$mper"
  results["$1"]+="$per $mper $rps $p99;"
}

case $MODE in
  http) what="$CONNS connections, plain HTTP" ;;
  https) what="$CONNS connections, HTTPS (TLS 1.3, kept alive)" ;;
  handshake) what="$NEWCONNS concurrent tls_load connections, a $HANDSHAKE handshake per request" ;;
esac
echo "bypass: $LINKS links, $ROUNDS rounds x ${DURATION}s, $what, over a veth pair (IPv$FAMILY$([ "${RPS:-0}" = 1 ] && echo ", client receive on CPU 1 by RPS")); servers on CPU 0 in $SNS, wrk on CPU 1 in $CNS"
floors=()
rustls_floors=()
for r in $(seq "$ROUNDS"); do
  for s in $SERVERS; do run_one "$s" "$r"; done
  if [ -n "$floor_name" ]; then
    floors+=("$(crypto_floor "$floor_name" 0)")
    echo "  floor round $r: ${floors[-1]} $floor_name handshakes/s of crypto on CPU 0"
    if [ "$floor_name" = full ]; then
      rustls_floors+=("$(crypto_floor rustls_server_full 0)")
      echo "  floor round $r: ${rustls_floors[-1]} rustls_server_full handshakes/s (crypto and rustls, in memory) on CPU 0"
    fi
  fi
done
echo
printf "%-10s %18s %20s %12s   %s\n" "median" "req/server-CPU-s" "req/machine-CPU-s" "req/s" "p99 (each round)"
col() { echo "${results[$1]}" | tr ';' '\n' | awk -v c="$2" 'NF {print $c}'; }
for s in $SERVERS; do
  printf "%-10s %18s %20s %12s   %s\n" "$s" "$(col "$s" 1 | median)" "$(col "$s" 2 | median)" \
    "$(col "$s" 3 | median)" "$(col "$s" 4 | tr '\n' ' ')"
done
# Paired: each round's servers ran back to back.
for pair in "xdp uring" "xdp nginx" "uring nginx"; do
  set -- $pair
  [ -n "${results[$1]:-}" ] && [ -n "${results[$2]:-}" ] || continue
  sr=$(paste <(col "$1" 1) <(col "$2" 1) | awk '{printf "%.3f ", $1/$2}')
  mr=$(paste <(col "$1" 2) <(col "$2" 2) | awk '{printf "%.3f ", $1/$2}')
  printf "  %s/%s per server CPU-s: %s-> median %.2fx;  per machine CPU-s: %s-> median %.2fx\n" \
    "$1" "$2" "$sr" "$(echo "$sr" | median)" "$mr" "$(echo "$mr" | median)"
done
# Each round's handshakes per server CPU-second against the floor measured in that round.
if [ ${#floors[@]} -gt 0 ]; then
  for s in $SERVERS; do
    shares=$(paste <(col "$s" 1) <(printf '%s\n' "${floors[@]}") | awk '$2 > 0 {printf "%.3f ", $1/$2}')
    printf "  %s / %s crypto floor per server CPU-s: %s-> median %.0f%%%s\n" "$s" "$floor_name" "$shares" \
      "$(echo "$shares" | median | awk '{print 100 * $1}')" \
      "$([ "$floor_name" = full ] && [ "$s" != nginx ] && echo " (goal >= 70%)")"
  done
fi
if [ ${#rustls_floors[@]} -gt 0 ]; then
  shares=$(paste <(printf '%s\n' "${rustls_floors[@]}") <(printf '%s\n' "${floors[@]}") |
    awk '$2 > 0 {printf "%.3f ", $1/$2}')
  printf "  rustls_server_full / full crypto floor: %s-> median %.0f%%\n" "$shares" \
    "$(echo "$shares" | median | awk '{print 100 * $1}')"
  for s in $SERVERS; do
    [ "$s" = nginx ] && continue
    shares=$(paste <(col "$s" 1) <(printf '%s\n' "${rustls_floors[@]}") | awk '$2 > 0 {printf "%.3f ", $1/$2}')
    printf "  %s / rustls_server_full floor per server CPU-s: %s-> median %.0f%%\n" "$s" "$shares" \
      "$(echo "$shares" | median | awk '{print 100 * $1}')"
  done
fi
