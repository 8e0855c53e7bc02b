#!/usr/bin/env bash
# HTTPS: the engine (rustls, ring) against nginx (OpenSSL) with the same ECDSA P-256 certificate,
# each pinned to CPU 0 with one worker/core, clients on CPU 1, alternating, ROUNDS rounds:
#   - full handshakes/s       openssl s_time -new   (TLS 1.3, one connection at a time)
#   - resumed handshakes/s    openssl s_time -reuse (TLS 1.2 ticket resumption: s_time takes
#                             its session before a TLS 1.3 ticket arrives, so with 1.3 every
#                             "reuse" is a full handshake; stateless tickets on both sides, the
#                             engine with --tls-ticket-key-file, nginx's default tickets)
#   - keep-alive requests/s   wrk over HTTPS, CONNS connections, GET of one code -> 302
#   - full-conc               full TLS 1.3 handshakes from NEWCONNS concurrent connections of
#                             benches/examples/tls_load.rs (rustls and ring, like the engine; it
#                             checks no certificate, as wrk does not, so that one client core
#                             keeps the server core busy: `openssl s_time` verifies the server's
#                             signature on every handshake, which costs the client more than
#                             signing costs the server)
#   - resumed13-conc          the same client resuming TLS 1.3 with its last ticket (psk_dhe_ke:
#                             X25519 still paid, no signature); also what wrk does with
#                             `Connection: close`, since it keeps its session across reconnects
#   - resumed-conc            the same client resuming TLS 1.2 with a session ticket (no
#                             asymmetric crypto on either side)
#   - full-conc-hybrid        full-conc with the client offering only X25519MLKEM768 (the
#                             post-quantum hybrid Chrome and Apple send first); the engine only:
#                             Debian's OpenSSL 3.0 has no ML-KEM, so nginx cannot offer it
#   - full-conc-p256          full-conc with the client offering only secp256r1
#   - flight                  not a rate: the server's first flight in bytes (ServerHello through
#                             Finished, on the wire, benches/examples/first_flight.rs) for an
#                             ECDSA P-256 and an RSA-2048 chain (a leaf and one intermediate in a
#                             public CA's profile, perf/lib.sh tls_chain), with X25519 and with
#                             X25519MLKEM768, compressed (RFC 8879, the client taking brotli) and
#                             not (--no-tls-cert-compression); goal: the ECDSA chain's whole
#                             flight <= 3,600 bytes compressed (3 x QUIC's 1,200-byte first
#                             datagram, RFC 9000 §8.1) with the hybrid
# Each also per server CPU-second (server CPU time from /proc during the run), medians, ratios;
# after each engine run, the engine's own count of full and resumed handshakes
# (lasthop_engine_tls_handshakes_total), so each kind is what it says.
# Beside them, the crypto floor per server core from `cargo bench --bench handshake`: the full
# TLS 1.3 handshake's (X25519, ECDSA P-256 sign, key schedule, transcript), the same with the
# hybrid's key exchange in place of X25519 (aws-lc-rs' X25519 and the ML-KEM-768
# encapsulation), and a TLS 1.3 psk_dhe resumption's (what
# rustls resumes with: it still pays X25519); and rustls' own floor (`rustls_server_full`, and
# `_x25519mlkem768`: the server's side of a whole rustls handshake in memory, no I/O).
# Goals: handshakes per server CPU-second >= nginx's; full-conc >= 70% of the full floor; TLS 1.2
# ticket resumptions (resumed-conc) >= 3x full-conc; keep-alive requests per CPU-second >= 1.25x
# nginx's.
#
#   perf/tls.sh                    # ROUNDS=3 DURATION=5 CONNS=64 NEWCONNS=16
#   KINDS="full-conc resumed-conc" perf/tls.sh   # some of the kinds
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
NEWCONNS=${NEWCONNS:-16}
KINDS=${KINDS:-flight full resumed keepalive full-conc full-conc-hybrid full-conc-p256 resumed13-conc resumed-conc}
PORT=${PORT:-18443}
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
cargo build --release -q -p lasthop-benches --example tls_load --example first_flight
BIN=$PWD/target/release
LOAD=$BIN/examples/tls_load
FLIGHT=$BIN/examples/first_flight
work=$(mktemp -d /var/tmp/lasthop-tls.XXXXXX)
pids=()
. perf/lib.sh
trap 'stop_server; rm -rf "$work"' EXIT

tls_cert "$work" 127.0.0.1
cd "$work"
(umask 077; openssl rand -hex 32 >tickets.key)
"$BIN/lasthop-control" keygen --out key >/dev/null
"$BIN/lasthop-snapshot" synth --key-file key --count 1000 --out links.snap --codes-out codes >/dev/null
code=$(head -1 codes)
cd - >/dev/null

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
  ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_cache shared:SSL:10m;
  ssl_session_tickets on;
  server {
    listen 127.0.0.1:$PORT ssl reuseport;
    ssl_certificate $work/srv.pem;
    ssl_certificate_key $work/srv.key;
    location / { return 302 https://example.com/; }
  }
}
NGX

hz=$(getconf CLK_TCK)
start_server() {
  case $1 in
    engine)
      taskset -c 0 "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 \
        --tls-listen 127.0.0.1:$PORT --cert "${ENGINE_CERT:-$work/srv.pem}" \
        --key "${ENGINE_KEY:-$work/srv.key}" ${ENGINE_EXTRA:-} \
        --tls-ticket-key-file "$work/tickets.key" >"$work/engine.out" 2>"$work/engine.err" &
      pids=($!) ;;
    nginx)
      taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
      pids=($!) ;;
  esac
  wait_up "$1" "https://127.0.0.1:$PORT/" -k
}

declare -A results
measure() { # server kind round
  start_server "$1"
  local c0; c0=$(cpu_of "${pids[@]}")
  local n rate
  case $2 in
    full|resumed)
      local mode=(-new -tls1_3); [ "$2" = resumed ] && mode=(-reuse -tls1_2)
      local out; out=$(taskset -c 1 openssl s_time -connect 127.0.0.1:$PORT "${mode[@]}" -time "$DURATION" 2>&1)
      n=$(echo "$out" | awk '/connections in .* real seconds/ {print $1; exit}')
      rate=$(echo "$out" | awk '/connections in .*s; / {printf "%.0f", $1/'"$DURATION"'; exit}') ;;
    keepalive)
      local out; out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" "https://127.0.0.1:$PORT/$code")
      n=$(echo "$out" | awk '/requests in/ {print $1}')
      rate=$(echo "$out" | awk '/Requests\/sec/ {printf "%.0f", $2}') ;;
    full-conc*|resumed13-conc|resumed-conc)
      local mode=full group=X25519
      [ "$2" = resumed13-conc ] && mode=resumed13
      [ "$2" = resumed-conc ] && mode=resumed12
      [ "$2" = full-conc-hybrid ] && group=X25519MLKEM768
      [ "$2" = full-conc-p256 ] && group=secp256r1
      local out; out=$(taskset -c 1 "$LOAD" "127.0.0.1:$PORT" "$code" "$mode" "$NEWCONNS" "$DURATION" "$group")
      n=$(echo "$out" | awk '{print $1}')
      rate=$((n / DURATION)) ;;
  esac
  local c1; c1=$(cpu_of "${pids[@]}")
  local seen=""
  if [ "$1" = engine ]; then
    local admin; admin=$(awk '/^admin listening on/ {print $4}' "$work/engine.out")
    seen=$(curl -s "$admin/metrics" | awk -F'[{}" ]+' '/^lasthop_engine_tls_handshakes_total\{kind="(full|resumed)"/ {printf "%s %s  ", $3, $4}
      /^lasthop_engine_tls_key_exchanges_total\{/ && $4 > 0 {printf "%s %s  ", $3, $4}')
  fi
  stop_server
  local cpu per
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  per=$(awk -v r="${n:-0}" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-6s %-14s round %d: %8s /s   server CPU %5ss   %8s per CPU-s   %s\n" "$1" "$2" "$3" "${rate:-0}" "$cpu" "$per" "${seen:+engine saw: $seen}"
  results["$1,$2"]+="$per $rate;"
}

# The servers a kind runs on: nginx (OpenSSL 3.0) has no ML-KEM.
servers() { case $1 in full-conc-hybrid) echo engine ;; *) echo engine nginx ;; esac; }

first_flight() {
  echo "first flight (bytes on the wire, ServerHello through Finished; the ClientHello beside it)"
  printf "  %-6s %-16s %12s %12s %8s %10s\n" chain group compressed uncompressed saved ClientHello
  for alg in ecdsa rsa; do
    tls_chain "$work" "$alg"
    for group in X25519 X25519MLKEM768; do
      local on off hello
      ENGINE_CERT=$work/chain-$alg.pem ENGINE_KEY=$work/leaf-$alg.key start_server engine
      on=$("$FLIGHT" "127.0.0.1:$PORT" "$group" compress)
      stop_server
      ENGINE_CERT=$work/chain-$alg.pem ENGINE_KEY=$work/leaf-$alg.key \
        ENGINE_EXTRA=--no-tls-cert-compression start_server engine
      off=$("$FLIGHT" "127.0.0.1:$PORT" "$group" compress)
      stop_server
      hello=$(echo "$on" | awk '{print $4}')
      on=$(echo "$on" | awk '{print $2}'); off=$(echo "$off" | awk '{print $2}')
      printf "  %-6s %-16s %12s %12s %7s%% %10s\n" "$alg" "$group" "$on" "$off" \
        "$(awk -v a="$on" -v b="$off" 'BEGIN{printf "%.0f", (b>0)? 100*(b-a)/b : 0}')" "$hello"
      [ "$alg/$group" = ecdsa/X25519MLKEM768 ] && ecdsa_hybrid_flight=$on
    done
    local leaf int
    leaf=$(openssl x509 -in "$work/leaf-$alg.pem" -outform der | wc -c)
    int=$(openssl x509 -in "$work/int-$alg.pem" -outform der | wc -c)
    echo "  ($alg chain: leaf $leaf bytes + intermediate $int bytes DER)"
  done
  awk -v f="$ecdsa_hybrid_flight" 'BEGIN{printf "  ECDSA chain, X25519MLKEM768, compressed: %d bytes (goal <= 3600: %s)\n", f, (f <= 3600) ? "met" : "NOT met"}'
  echo
}

echo "tls.sh: $ROUNDS rounds x ${DURATION}s, servers on CPU 0, clients on CPU 1; ECDSA P-256"
case " $KINDS " in *" flight "*) first_flight ;; esac
KINDS=$(echo " $KINDS " | sed 's/ flight / /; s/^ //; s/ $//')
for kind in $KINDS; do
  for r in $(seq "$ROUNDS"); do
    for s in $(servers "$kind"); do measure "$s" "$kind" "$r"; done
  done
done
echo
printf "%-22s %14s %12s\n" "median of $ROUNDS" "per CPU-s" "per s"
for kind in $KINDS; do
  if [ "$(servers "$kind")" = engine ]; then
    v=${results["engine,$kind"]}
    per=$(echo "$v" | tr ';' '\n' | awk '{print $1}' | median)
    rate=$(echo "$v" | tr ';' '\n' | awk '{print $2}' | median)
    printf "%-22s %14s %12s\n" "engine $kind" "$per" "$rate"
    printf "%-22s %14s %12s\n" "nginx $kind" "n/a" "(no ML-KEM in OpenSSL 3.0)"
    eval "per_engine_${kind//-/_}=$per"
    continue
  fi
  for s in engine nginx; do
    v=${results["$s,$kind"]}
    per=$(echo "$v" | tr ';' '\n' | awk '{print $1}' | median)
    rate=$(echo "$v" | tr ';' '\n' | awk '{print $2}' | median)
    printf "%-22s %14s %12s\n" "$s $kind" "$per" "$rate"
    eval "per_${s}_${kind//-/_}=$per"
  done
  eval "e=\$per_engine_${kind//-/_}; n=\$per_nginx_${kind//-/_}"
  awk -v e="$e" -v n="$n" -v k="$kind" 'BEGIN{printf "  %s: engine/nginx %.2fx per server CPU-second\n", k, (n>0)? e/n : 0}'
done

# The crypto floor on this machine, per core (criterion's median), on the servers' CPU.
cargo bench --no-run -q -p lasthop-benches --bench handshake 2>/dev/null
full_floor=$(crypto_floor full 0)
hybrid_floor=$(crypto_floor full_x25519mlkem768 0)
resumed_floor=$(crypto_floor resumed_psk_dhe 0)
rustls_floor=$(crypto_floor rustls_server_full 0)
rustls_hybrid_floor=$(crypto_floor rustls_server_full_x25519mlkem768 0)
echo
echo "crypto floor per core (cargo bench --bench handshake): full TLS 1.3 $full_floor/s (X25519), $hybrid_floor/s (X25519MLKEM768: aws-lc-rs' X25519 and the ML-KEM-768 encapsulation), TLS 1.3 psk_dhe resumption $resumed_floor/s"
echo "rustls floor per core (in memory): $rustls_floor/s (X25519), $rustls_hybrid_floor/s (X25519MLKEM768)"
case " $KINDS " in *" full-conc-hybrid "*)
  awk -v e="$per_engine_full_conc_hybrid" -v x="${per_engine_full_conc:-0}" -v f="$hybrid_floor" -v r="$rustls_hybrid_floor" 'BEGIN{
    printf "  full-conc-hybrid per server CPU-second: engine %.0f%% of the hybrid floor, %.0f%% of rustls in memory with it; %.2fx the X25519 rate\n",
      (f > 0) ? 100 * e / f : 0, (r > 0) ? 100 * e / r : 0, (x > 0) ? e / x : 0 }' ;;
esac
case " $KINDS " in *" full-conc "*)
  awk -v e="$per_engine_full_conc" -v n="$per_nginx_full_conc" -v f="$full_floor" -v r="$rustls_floor" 'BEGIN{
    printf "  full-conc per server CPU-second: engine %.0f%% of the floor, nginx %.0f%% (goal: engine >= 70%%)\n",
      (f > 0) ? 100 * e / f : 0, (f > 0) ? 100 * n / f : 0
    printf "  rustls in memory: %.0f%% of the crypto floor; the engine %.0f%% of rustls in memory\n",
      (f > 0) ? 100 * r / f : 0, (r > 0) ? 100 * e / r : 0 }' ;;
esac
case " $KINDS " in *" resumed13-conc "*)
  awk -v e="$per_engine_resumed13_conc" -v f="$resumed_floor" 'BEGIN{
    printf "  resumed13-conc per server CPU-second: engine %.0f%% of the psk_dhe resumption floor\n",
      (f > 0) ? 100 * e / f : 0 }' ;;
esac
case " $KINDS " in *" full-conc "*) case " $KINDS " in *" resumed-conc "*)
  awk -v r="$per_engine_resumed_conc" -v f="$per_engine_full_conc" 'BEGIN{
    printf "  engine TLS 1.2 ticket resumptions / full handshakes per server CPU-second: %.2fx (goal >= 3x)\n",
      (f > 0) ? r / f : 0 }' ;;
esac ;; esac
