#!/usr/bin/env bash
# HTTP/3 over QUIC: the engine (quinn-proto, rustls on ring, its own h3) against itself over
# HTTP/2 and HTTP/1.1 on TLS, and against Caddy (Debian's `caddy` 2.6: quic-go, HTTP/3 on by
# default), on the same links, same certificate (ECDSA P-256, lh.test), same core, same load
# generators. What is measured, per server CPU-second (server CPU time from /proc during each
# run; servers pinned to CPU 0 with one core/GOMAXPROCS=1, load generators to CPU 1):
#   h3 -m M        requests on CONNS long-lived HTTP/3 connections with M requests in flight on
#                  each (benches/examples/h3_load.rs --mode requests: quinn + hyperium's h3),
#                  the engine and Caddy; in rounds (--lockstep: a connection's M requests leave
#                  together and the next M once all M are answered), which is what h2load -m
#                  does over TCP (its M requests in one write, their answers in one read);
#                  LOCKSTEP=0 replaces each request as it ends, and quinn's client then sends
#                  them 3 or 4 a datagram
#   h2 -m M        the engine's HTTP/2 over TLS, the same URIs (h2load -c CONNS -m M, as
#                  perf/h2.sh runs it; TLS in userspace, --no-ktls)
#   h1 keep-alive  the engine's HTTP/1.1 keep-alive over the same TLS listener (h2load --h1 -m 1)
#   h3 full        new QUIC connections, NEWCONNS in flight, each a full handshake (no
#                  resumption) and one GET (h3_load --mode full), the engine and Caddy
#   h3 0-rtt       the same, each resuming with a ticket of its slot's previous connection and
#                  sending its GET in 0-RTT (h3_load --mode zero-rtt); the run fails unless
#                  0-RTT was accepted; the engine's own count of QUIC handshakes and accepted
#                  0-RTT (lasthop_engine_quic_*) is printed after each engine run
# Links: LINKS synthetic links (default 100000; cached in WORK like perf/h2.sh's), URLS of their
# codes (default 1000) round-robin, one a line: h2load reads them as https://127.0.0.1:PORT/CODE
# (no SNI, the certificate's IP), h3_load as /CODE with SNI and :authority lh.test (the
# certificate's name: the engine answers 421 for a name it does not cover). Caddy serves the same
# URIs from a Caddyfile `map {path}` and `redir ... 302` (404 for any other path) on
# https://lh.test:PORT with the same certificate (`tls CERT KEY`), admin, automatic HTTPS and
# logs off. Caddy's `map` compares the path with each entry in turn, so URLS also sets what
# Caddy's lookup costs: keep it in the thousands, not the LINKS (on a 2-core box, 1000 URLs
# cost Caddy about a fifth of its h3 requests per CPU-second against 10 URLs).
# One h3_load core may not keep the engine's core busy on long-lived connections (the "% of a
# core" column says): per server CPU-second is the figure to read, as in perf/h2.sh.
# Each round runs every kind back to back (engine and Caddy in flipped order every other round),
# so each round is a set of pairs; printed per run and as medians over ROUNDS (default 3), with
# paired ratios (per round, then their median):
#   engine h3/engine h2 per server CPU-second, at -m M                goal >= 0.8
#   engine h3/Caddy h3 per server CPU-second, at -m M                 goal >= 2
#   engine 0-RTT resumptions/full handshakes per server CPU-second    goal >= 3
# and, last, the floors under two goals, measured on CPU 0 in the same run: cargo bench --bench
# handshake (`full` and `resumed_psk_dhe`): what a resumption's crypto saves, and the best
# 0-RTT/full ratio that saving allows against the engine's CPU per full QUIC connection; and
# cargo bench --bench quic: quinn-proto's own CPU per request in memory, and the best h3/h2
# ratio it allows against the engine's h2 CPU per request.
# A peer that refuses connections under the handshake load (quic-go's accept queue: "the
# server refused to accept a new connection") fails the run like any other failure.
# Any answer but a 3xx, or another protocol than the one asked for (h3_load offers only ALPN h3
# and checks it; h2load's "Application protocol"), fails the script.
#
#   perf/h3.sh                                   # ROUNDS=3 DURATION=8 CONNS=64 M=10 NEWCONNS=64
#   ROUNDS=1 DURATION=3 perf/h3.sh               # a quick check that it all runs
# Env: LINKS, URLS, ROUNDS, DURATION (seconds a run), CONNS, M, LOCKSTEP, NEWCONNS (handshakes in
# flight), PORT (TCP and UDP, default 18473), CLICKS (the engine's --clicks, default spool as
# perf/h2.sh runs it; `off` for the redirect alone), WORK (the links' cache). Installs
# nghttp2-client, caddy, openssl and curl with apt-get when missing (as root; on a host that
# runs systemd, Debian's caddy package also starts its own caddy.service on :80: stop it).
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-100000}
URLS=${URLS:-1000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
M=${M:-10}
LOCKSTEP=${LOCKSTEP:-1}
NEWCONNS=${NEWCONNS:-64}
PORT=${PORT:-18473}
CLICKS=${CLICKS:-spool}

need=()
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v caddy >/dev/null || need+=(caddy)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# HTTP/3 is on by default from Caddy 2.6 (experimental_http3 before).
caddy_version=$(caddy version | awk '{print $1}')
case $caddy_version in
  v2.[0-5].*|v1.*) echo "caddy $caddy_version: HTTP/3 needs 2.6 or later" >&2; exit 1 ;;
esac

cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
cargo build --release -q -p lasthop-benches --example h3_load
BIN=$PWD/target/release
LOAD=$BIN/examples/h3_load
cache=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$cache"
work=$(mktemp -d /var/tmp/lasthop-h3.XXXXXX)
pids=()
. perf/lib.sh
trap 'stop_server; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

synth_links "$BIN" "$cache" "$LINKS"
tls_cert "$work" 127.0.0.1
head -n "$URLS" "$cache/codes.common" >"$work/codes"
[ -s "$work/codes" ] || { echo "no codes in $cache/codes.common" >&2; exit 1; }
awk -v p="$PORT" '{print "https://127.0.0.1:" p "/" $1}' "$work/codes" >"$work/urls"
sed 's|^|/|' "$work/codes" >"$work/paths"

# Caddy: the same codes' destinations (codes.common's URLs have no $ " \ ; { }: safe in a
# double-quoted Caddyfile token), 302 to each, 404 for anything else.
{
  cat <<CADDY
{
	admin off
	auto_https off
	log default {
		output file $work/caddy.log
		level ERROR
	}
}
https://lh.test:$PORT {
	bind 127.0.0.1
	tls $work/srv.pem $work/srv.key
	map {path} {lh_dest} {
		default ""
CADDY
  awk -F'\t' 'NR == FNR {want[$1] = 1; next} ($1 in want) && !seen[$1]++ {printf "\t\t/%s \"%s\"\n", $1, $2}' \
    "$work/codes" "$cache/links.tsv"
  cat <<CADDY
	}
	@hit not vars {lh_dest} ""
	redir @hit {lh_dest} 302
	respond 404
}
CADDY
} >"$work/Caddyfile"
caddy validate --config "$work/Caddyfile" --adapter caddyfile >/dev/null 2>"$work/caddy.err" || {
  echo "caddy rejects the Caddyfile:" >&2; cat "$work/caddy.err" >&2; exit 1; }

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null ||
  { command -v ss >/dev/null && [ -n "$(ss -Huan "sport = :$PORT")" ]; }; then
  echo "127.0.0.1:$PORT (TCP or UDP) is already in use: pick another PORT" >&2; exit 1
fi
hz=$(getconf CLK_TCK)
start_server() { # engine|caddy -> sets pids
  case $1 in
    engine)
      local clicks=(--data-dir "$work/engine-data")
      [ "$CLICKS" = spool ] || clicks+=(--clicks "$CLICKS")
      taskset -c 0 "$BIN/lasthop-engine" --snapshot "$cache/links.snap" --key-file "$cache/key" \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 "${clicks[@]}" \
        --tls-listen 127.0.0.1:$PORT --cert "$work/srv.pem" --key "$work/srv.key" --no-ktls \
        >"$work/engine.out" 2>"$work/engine.err" &
      pids=($!) ;;
    caddy)
      # Its autosave.json and data folder in $work, not the user's.
      XDG_CONFIG_HOME=$work/xdg XDG_DATA_HOME=$work/xdg GOMAXPROCS=1 taskset -c 0 \
        caddy run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.out" 2>"$work/caddy.err" &
      pids=($!) ;;
  esac
  wait_up "$1" "https://lh.test:$PORT/" -k --resolve "lh.test:$PORT:127.0.0.1"
  # What answered must be ours (not a server someone else left on PORT).
  kill -0 "${pids[0]}" 2>/dev/null || { echo "$1 exited:" >&2; cat "$work/$1.err" >&2; exit 1; }
  if [ "$1" = engine ]; then
    for _ in $(seq 100); do grep -q '^quic listening' "$work/engine.out" && break; sleep 0.05; done
    grep -q "^quic listening on udp://127.0.0.1:$PORT\$" "$work/engine.out" || {
      echo "the engine serves no QUIC on 127.0.0.1:$PORT:" >&2; cat "$work/engine.out" "$work/engine.err" >&2; exit 1; }
  fi
}

# The engine's QUIC counters (before it stops).
engine_quic() {
  local admin; admin=$(awk '/^admin listening on/ {print $4}' "$work/engine.out")
  curl -s "$admin/metrics" | awk '/^lasthop_engine_quic_handshakes_total / {h = $2}
    /^lasthop_engine_quic_zero_rtt_accepted_total / {z = $2}
    /^lasthop_engine_quic_retries_total / {r = $2}
    /^lasthop_engine_quic_packets_received_total / {pi = $2}
    /^lasthop_engine_quic_packets_sent_total / {po = $2}
    /^lasthop_engine_quic_send_batches_total / {b = $2}
    END {printf "quic handshakes %s, 0-RTT accepted %s, retries %s, datagrams in %s out %s in %s sendmmsg", h, z, r, pi, po, b}'
}

declare -A results
# One run: server kind round. Kinds: h3 (requests), h2, h1, full, 0rtt.
run_one() {
  local server=$1 kind=$2 round=$3 label unit out c0 c1 n rate detail="" seen=""
  case $kind in
    h3) label="$server h3 -m $M"; unit=req ;;
    h2) label="$server h2 -m $M"; unit=req ;;
    h1) label="$server h1 keep-alive"; unit=req ;;
    full) label="$server h3 full"; unit=conn ;;
    0rtt) label="$server h3 0-rtt"; unit=conn ;;
  esac
  start_server "$server"
  c0=$(cpu_of "${pids[@]}")
  case $kind in
    h3|full|0rtt)
      local mode=requests conns=$CONNS
      [ "$kind" = full ] && { mode=full; conns=$NEWCONNS; }
      [ "$kind" = 0rtt ] && { mode=zero-rtt; conns=$NEWCONNS; }
      local rounds=()
      [ "$kind" = h3 ] && [ "$LOCKSTEP" = 1 ] && rounds=(--lockstep)
      out=$(timeout $((DURATION + 60)) taskset -c 1 "$LOAD" --addr "127.0.0.1:$PORT" --name lh.test \
        --urls "$work/paths" --mode "$mode" --conns "$conns" --streams "$M" "${rounds[@]}" \
        --secs "$DURATION" 2>"$work/h3_load.err") || {
        echo "$label round $round: h3_load failed (only 3xx over h3 passes):" >&2
        echo "$out" >&2; cat "$work/h3_load.err" >&2; exit 1; }
      c1=$(cpu_of "${pids[@]}")
      [ "$server" = engine ] && seen=$(engine_quic)
      local kv; kv=$(echo "$out" | tail -1)
      kv_of() { echo "$kv" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k {print $2}'; }
      if [ "$(kv_of alpn)" != h3 ] || [ "$(kv_of other)" != 0 ] || [ "$(kv_of 3xx)" = 0 ]; then
        echo "$label round $round: wanted only 3xx over h3, got: $kv" >&2; exit 1
      fi
      if [ "$kind" = h3 ]; then n=$(kv_of requests); else n=$(kv_of connections); fi
      rate=$(kv_of rate)
      detail="$(kv_of 3xx) 3xx, h3"
      if [ "$kind" = 0rtt ]; then
        detail+=", 0-RTT accepted $(kv_of zero_rtt), rejected $(kv_of zero_rtt_rejected), full $(kv_of full_handshakes)"
      fi ;;
    h2|h1)
      local want=h2 extra=(-m"$M")
      [ "$kind" = h1 ] && { want=http/1.1; extra=(--h1 -m1); }
      out=$(timeout $((DURATION + 60)) taskset -c 1 h2load -t1 -c"$CONNS" -D"$DURATION" \
        "${extra[@]}" -i "$work/urls" 2>&1) || {
        echo "$label round $round: h2load failed:" >&2; echo "$out" >&2; exit 1; }
      c1=$(cpu_of "${pids[@]}")
      local got codes n3 other fail
      got=$(echo "$out" | awk -F': ' '/^Application protocol:/ {print $2; exit}')
      read -r fail < <(echo "$out" | awk '/^requests:/ {print $10+$12+$14}') || true
      codes=$(echo "$out" | awk '/^status codes:/ {print $3, $5, $7, $9}')
      n3=$(echo "$codes" | awk '{print $2}')
      other=$(echo "$codes" | awk '{print $1 + $3 + $4}')
      if [ "$got" != "$want" ] || [ -z "$n3" ] || [ "$n3" -eq 0 ] || [ "$other" -ne 0 ]; then
        echo "$label round $round: wanted only 3xx over $want, got protocol '${got:-none}'," \
          "status codes (2xx 3xx 4xx 5xx) '${codes:-none}':" >&2
        echo "$out" >&2; exit 1
      fi
      n=$n3
      rate=$(echo "$out" | awk '/^finished in/ {printf "%.0f", $4}')
      detail="$n3 3xx, $got"
      [ "${fail:-0}" -eq 0 ] || detail+=", $fail failed/errored/timed out" ;;
  esac
  stop_server
  rm -rf "$work/engine-data"
  local cpu per
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  per=$(awk -v r="$n" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-20s round %d: %8s %s/s  server CPU %6ss (%3.0f%% of a core)  %8s %s/CPU-s  %s%s\n" \
    "$label" "$round" "$rate" "$unit" "$cpu" "$(awk -v c="$cpu" -v d="$DURATION" 'BEGIN{print 100*c/d}')" \
    "$per" "$unit" "$detail" "${seen:+  (engine saw: $seen)}"
  results["$label"]+="$per $rate;"
}

# The per-round figures of one label, one a line.
pers() { echo "${results["$1"]}" | tr ';' '\n' | awk 'NF {print $1}'; }
# Per-round a/b of two labels' figures, space separated (paired: the same round's runs ran back
# to back, so a ratio within a round cancels most of the shared machine's drift between rounds).
paired() { paste <(pers "$1") <(pers "$2") | awk '{printf "%.3f ", ($2 > 0) ? $1/$2 : 0}'; }

echo "h3.sh: $LINKS links, $(wc -l <"$work/paths") URLs, $ROUNDS rounds x ${DURATION}s, $CONNS connections," \
  "-m $M, $NEWCONNS handshakes in flight; servers on CPU 0, load on CPU 1; ECDSA P-256;" \
  "caddy $caddy_version; engine --clicks $CLICKS"
for r in $(seq "$ROUNDS"); do
  order="engine caddy"; [ $((r % 2)) -eq 0 ] && order="caddy engine"
  for kind in h3 full 0rtt; do
    for s in $order; do run_one "$s" "$kind" "$r"; done
  done
  run_one engine h2 "$r"
  run_one engine h1 "$r"
done

echo
printf "%-22s %14s %12s\n" "median of $ROUNDS" "per CPU-s" "per s"
for l in "engine h3 -m $M" "caddy h3 -m $M" "engine h2 -m $M" "engine h1 keep-alive" \
  "engine h3 full" "caddy h3 full" "engine h3 0-rtt" "caddy h3 0-rtt"; do
  per=$(pers "$l" | median)
  rate=$(echo "${results["$l"]}" | tr ';' '\n' | awk 'NF {print $2}' | median)
  printf "%-22s %14s %12s\n" "$l" "$per" "$rate"
done
ratio() { # label a b goal
  local v; v=$(paired "$2" "$3")
  printf "  %s per server CPU-second, per round %s-> median %.2fx%s\n" "$1" "$v" \
    "$(echo "$v" | median)" "${4:+  ($4)}"
}
ratio "engine h3/engine h2 -m $M" "engine h3 -m $M" "engine h2 -m $M" "goal >= 0.8x"
ratio "engine h3/engine HTTP/1.1 keep-alive" "engine h3 -m $M" "engine h1 keep-alive"
ratio "engine h3/caddy h3 -m $M" "engine h3 -m $M" "caddy h3 -m $M" "goal >= 2x"
ratio "engine 0-RTT/full handshakes" "engine h3 0-rtt" "engine h3 full" "goal >= 3x"
ratio "caddy 0-RTT/full handshakes" "caddy h3 0-rtt" "caddy h3 full"
ratio "engine/caddy full handshakes" "engine h3 full" "caddy h3 full"
ratio "engine/caddy 0-RTT" "engine h3 0-rtt" "caddy h3 0-rtt"

# The floor under the 0-RTT/full goal, in the same run and on the same CPU the servers had: a
# resumption's crypto (rustls resumes with psk_dhe_ke only: the binder, an X25519 exchange, the
# key schedule) against a full handshake's (the same plus the ECDSA signature and the
# transcript), from benches/benches/handshake.rs. Everything else a QUIC connection costs
# (packets, AEAD, the GET) is the same for both, so the best 0-RTT/full ratio any server on
# rustls can reach is 1 / (1 - (full - resumed) / (per-connection CPU of a full handshake)).
echo
floor=$(taskset -c 0 cargo bench -q -p lasthop-benches --bench handshake -- --warm-up-time 1 \
  --measurement-time 3 --noplot 'handshake/(full|resumed_psk_dhe)$' 2>/dev/null |
  awk '$1 ~ /^handshake\/(full|resumed_psk_dhe)$/ {name = $1}
    name { for (i = 1; i <= NF; i++) if ($i == "time:") {
      v = $(i + 3); u = $(i + 4)
      us = (u == "ns") ? v / 1000 : (u == "ms") ? v * 1000 : v
      sub(/^handshake\//, "", name); printf "%s=%.2f ", name, us; name = "" } }')
full_us=$(echo "$floor" | tr ' ' '\n' | awk -F= '$1 == "full" {print $2}')
res_us=$(echo "$floor" | tr ' ' '\n' | awk -F= '$1 == "resumed_psk_dhe" {print $2}')
if [ -n "$full_us" ] && [ -n "$res_us" ]; then
  per_conn=$(pers "engine h3 full" | median)
  awk -v f="$full_us" -v r="$res_us" -v p="$per_conn" 'BEGIN {
    conn = 1e6 / p
    printf "crypto floor (CPU 0): full handshake %.1f us, psk_dhe_ke resumption %.1f us: a resumption saves %.1f us\n", f, r, f - r
    printf "  of the engine'"'"'s %.1f us per full QUIC connection: best 0-RTT/full per server CPU-second on rustls %.2fx (goal 3x)\n", conn, conn / (conn - (f - r)) }'
else
  echo "crypto floor: cargo bench --bench handshake gave no figures" >&2
fi

# The floor under the h3/h2 goal, in the same run and on the same CPU: the QUIC implementation
# the engine drives (quinn-proto, configured as the engine configures it) alone, in memory, per
# request on a long-lived connection with M streams in flight (benches/benches/quic.rs: the
# server's calls only: datagrams decrypted and handled, streams accepted, read, answered and
# finished, packets built and encrypted, acknowledgements; no sockets, no syscalls, no HTTP/3,
# no lookup). Beside the engine's whole h2 cost per request (1 / its requests per CPU-second),
# it bounds the h3/h2 ratio any server on this QUIC stack can reach.
quic=$(taskset -c 0 cargo bench -q -p lasthop-benches --bench quic -- --warm-up-time 1 \
  --measurement-time 5 --noplot 2>/dev/null |
  awk '$1 == "quic/quinn_server_request" {name = 1}
    name { for (i = 1; i <= NF; i++) if ($i == "time:") {
      v = $(i + 3); u = $(i + 4)
      us = (u == "ns") ? v / 1000 : (u == "ms") ? v * 1000 : v
      printf "%.3f", us; name = 0 } }')
if [ -n "$quic" ]; then
  h2_per=$(pers "engine h2 -m $M" | median)
  h3_per=$(pers "engine h3 -m $M" | median)
  awk -v q="$quic" -v h2="$h2_per" -v h3="$h3_per" 'BEGIN {
    h2us = 1e6 / h2; h3us = 1e6 / h3
    printf "QUIC floor (CPU 0): quinn-proto alone %.2f us per request in memory; the engine'"'"'s h3 %.2f us, its h2 %.2f us per request, all in\n", q, h3us, h2us
    printf "  best h3/h2 per server CPU-second on quinn-proto with nothing else: %.2fx (goal 0.8x); quinn-proto is %.0f%% of the engine'"'"'s h3 CPU\n", h2us / q, 100 * q / h3us }'
else
  echo "QUIC floor: cargo bench --bench quic gave no figures" >&2
fi
