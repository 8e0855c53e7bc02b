#!/usr/bin/env bash
# Round trips to the redirect (issue 39): a new and a returning visitor, over TCP+TLS and over
# QUIC, timed from the first packet to the 302 through a userspace delay relay
# (benches/examples/rtt.rs: this kernel has no netem) that holds every TCP chunk and every UDP
# datagram DELAY ms each way, so one round trip is 2 x DELAY.
#   tcp-full       a new visitor: TCP's handshake, a full TLS 1.3 handshake, the GET   goal ~3 RTT
#   tcp-early      a returning visitor: resumed, the GET in 0-RTT early data, answered in the
#                  server's first flight (--tls-early-answer on)                        goal ~2 RTT
#   tcp-early-off  the same with --tls-early-answer off (the answer waits for the client's
#                  Finished: today's behaviour before issue 39)                         ~3 RTT
#   quic-full      a new visitor over QUIC (aioquic): the GET sent as soon as it may    goal ~2 RTT
#   quic-0rtt      a returning visitor over QUIC: the GET in 0-RTT                     goal 1 RTT + 1 ms
# Each is also run with DELAY 0 through the same relay: the floor of the clients' and the
# server's processing, which the round trips add to. Reported: medians (ms) of ROUNDS visits,
# and (median - floor) / RTT, the round trips themselves.
#   perf/rtt.sh                     # DELAY=20 ROUNDS=9
set -euo pipefail
cd "$(dirname "$0")/.."
DELAY=${DELAY:-20}
ROUNDS=${ROUNDS:-9}
PY=${LASTHOP_AIOQUIC_PYTHON:-$HOME/.cache/lasthop/aioquic-1.7.2/bin/python}
"$PY" -c 'import aioquic' 2>/dev/null || { echo "perf/rtt.sh: needs aioquic (scripts/test installs it; LASTHOP_AIOQUIC_PYTHON)" >&2; exit 1; }
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
cargo build --release -q -p lasthop-benches --example rtt
BIN=$PWD/target/release
RTT=$BIN/examples/rtt
CLIENT=$PWD/engine/tests/h3/client.py
work=$(mktemp -d /var/tmp/lasthop-rtt.XXXXXX)
pids=()
. perf/lib.sh
relay_pid=
trap 'stop_server; [ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null; rm -rf "$work"' EXIT

tls_cert "$work" 127.0.0.1
"$BIN/lasthop-control" keygen --out "$work/key" >/dev/null
"$BIN/lasthop-snapshot" synth --key-file "$work/key" --count 1000 --out "$work/links.snap" --codes-out "$work/codes" >/dev/null
code=$(head -1 "$work/codes")

start_engine() { # $1: --tls-early-answer value
  "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
    --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 --clicks off \
    --tls-listen 127.0.0.1:0 --cert "$work/srv.pem" --key "$work/srv.key" \
    --tls-early-answer "$1" >"$work/engine.out" 2>"$work/engine.err" &
  pids=($!)
  for _ in $(seq 200); do grep -q '^quic ' "$work/engine.out" 2>/dev/null && break; sleep 0.05; done
  tls=$(sed -n 's|^tls listening on https://||p' "$work/engine.out")
  quic=$(sed -n 's|^quic listening on udp://||p' "$work/engine.out")
}

start_relay() { # $1: delay (ms)
  exec 7> >(exec "$RTT" relay --tcp-to "$tls" --udp-to "$quic" --delay-ms "$1" >"$work/relay.out")
  relay_pid=$!
  for _ in $(seq 100); do [ "$(wc -l <"$work/relay.out")" -ge 2 ] && break; sleep 0.05; done
  via_tcp=$(awk '$1=="tcp"{print $2}' "$work/relay.out")
  via_udp=$(awk '$1=="udp"{print $2}' "$work/relay.out")
}

stop_relay() { exec 7>&-; wait "$relay_pid" 2>/dev/null || true; relay_pid=; }

# quic_visits DELAY: medians of ROUNDS new and returning visitors over QUIC through the relay.
quic_visits() {
  local full=() early=() t
  for i in $(seq "$ROUNDS"); do
    rm -f "$work/ticket"
    t=$("$PY" "$CLIENT" "${via_udp%:*}" "${via_udp##*:}" "/$code" --ca "$work/ca.pem" --ticket "$work/ticket" --early --time \
      | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["elapsed_ms"])')
    full+=("$t")
    t=$("$PY" "$CLIENT" "${via_udp%:*}" "${via_udp##*:}" "/$code" --ca "$work/ca.pem" --ticket "$work/ticket" --early --time \
      | "$PY" -c 'import json,sys; r=json.load(sys.stdin); assert r["early_data_accepted"], r; print(r["elapsed_ms"])')
    early+=("$t")
  done
  echo "quic-full $(echo "${full[@]}" | median)"
  echo "quic-0rtt $(echo "${early[@]}" | median)"
}

declare -A result
for answer in on off; do
  start_engine "$answer"
  for delay in 0 "$DELAY"; do
    start_relay "$delay"
    while read -r kind ms; do
      [ "$answer" = off ] && kind=${kind/tcp-early/tcp-early-off}
      result[$kind/$delay]=$ms
    done < <("$RTT" tcp --via "$via_tcp" --ca "$work/ca.pem" --path "/$code" --delay-ms "$delay" --rounds "$ROUNDS"
             [ "$answer" = on ] && quic_visits "$delay")
    stop_relay
  done
  stop_server
done

rtt=$((2 * DELAY))
printf '%-15s %10s %10s %10s %8s\n' visit "ms@${DELAY}ms" "floor ms" "RTTs" goal
for kind in tcp-full tcp-early tcp-early-off quic-full quic-0rtt; do
  case $kind in tcp-full|tcp-early-off) goal=3 ;; tcp-early|quic-full) goal=2 ;; quic-0rtt) goal=1 ;; esac
  ms=${result[$kind/$DELAY]}; floor=${result[$kind/0]}
  printf '%-15s %10s %10s %10s %8s\n' "$kind" "$ms" "$floor" "$(awk -v m="$ms" -v f="$floor" -v r="$rtt" 'BEGIN{printf "%.2f", (m-f)/r}')" "$goal"
done
