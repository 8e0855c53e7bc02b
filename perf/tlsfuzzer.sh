#!/usr/bin/env bash
# TLS 1.3 conformance of the HTTPS listener: tlsfuzzer's TLS 1.3 scripts against the engine
# (rustls, ring) and against `openssl s_server -www`, side by side, same RSA-2048 certificate,
# both offering TLS 1.3 and 1.2 (the engine's versions). Prints, per script, the cases each
# server passes (tlsfuzzer's PASS+XFAIL) out of those run, the totals and engine/openssl, then
# every case the engine fails and OpenSSL passes. Not a benchmark and never part of CI: it needs
# checkouts that the repository does not carry.
#
# TLSFUZZER_DIR holds checkouts of the public tlsfuzzer and tlslite-ng projects (tlsfuzzer's own
# repositories) as $TLSFUZZER_DIR/tlsfuzzer and $TLSFUZZER_DIR/tlslite-ng, and Python 3 with `ecdsa` installed.
# Each script runs with `-n $N` (0: every case, so both servers see the same cases rather than
# two random samples). A third column, PLAIN_RUSTLS=BINARY (invoked as `BINARY ADDR CERT KEY`,
# a bare rustls server), tells rustls' own behaviour from the engine's glue around it.
#
#   perf/tlsfuzzer.sh                     # TLSFUZZER_DIR=/work/tlsfuzz N=0 PORT=18453
#   BIN=target/debug SCRIPTS="finished ccs" OUT=/tmp/tf perf/tlsfuzzer.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TLSFUZZER_DIR=${TLSFUZZER_DIR:-/work/tlsfuzz}
N=${N:-0}
PORT=${PORT:-18453}
SCRIPT_TIMEOUT=${SCRIPT_TIMEOUT:-900}
PLAIN_RUSTLS=${PLAIN_RUSTLS:-}
# test-tls13-NAME.py from tlsfuzzer/scripts.
SCRIPTS=${SCRIPTS:-"finished zero-length-data 0rtt-garbage record-layer-limits legacy-version
  unrecognised-groups signature-algorithms keyupdate crfg-curves ccs large-number-of-extensions
  hrr nociphers empty-alert invalid-ciphers serverhello-random version-negotiation"}
for d in tlsfuzzer tlslite-ng; do
  [ -d "$TLSFUZZER_DIR/$d" ] || { echo "no $TLSFUZZER_DIR/$d (see the top of $0)" >&2; exit 1; }
done
python3 -c 'import ecdsa' 2>/dev/null || { echo "python3 needs the ecdsa package" >&2; exit 1; }
command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl; }
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
  BIN=$PWD/target/release
fi
BIN=$(cd "$BIN" && pwd)
work=$(mktemp -d /var/tmp/lasthop-tlsfuzzer.XXXXXX)
out=${OUT:-$work/out}
mkdir -p "$out"
pids=()
. perf/lib.sh
trap 'stop_server; rm -rf "$work"' EXIT

cd "$work"
openssl req -x509 -nodes -days 2 -subj /CN=localhost -newkey rsa:2048 -keyout srv.key \
  -out srv.pem -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
cd - >/dev/null
synth_links "$BIN" "$work" 100

servers=(engine openssl)
[ -n "$PLAIN_RUSTLS" ] && servers+=(rustls)

start_server() {
  case $1 in
    engine)
      # Userspace rustls (no kTLS), the default 0-RTT settings, no click sink.
      "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 --clicks off --no-ktls \
        --tls-listen 127.0.0.1:$PORT --cert "$work/srv.pem" --key "$work/srv.key" \
        >/dev/null 2>"$work/engine.err" &
      pids=($!) ;;
    openssl)
      # -www answers GET; TLS 1.2 and 1.3 like the engine. (-early_data cannot go with -www;
      # rejected 0-RTT is still skipped, up to the default 16 KiB.)
      openssl s_server -www -no_ssl3 -no_tls1 -no_tls1_1 -accept 127.0.0.1:$PORT \
        -cert "$work/srv.pem" -key "$work/srv.key" >/dev/null 2>"$work/openssl.err" </dev/null &
      pids=($!) ;;
    rustls)
      "$PLAIN_RUSTLS" 127.0.0.1:$PORT "$work/srv.pem" "$work/srv.key" >/dev/null 2>"$work/rustls.err" &
      pids=($!) ;;
  esac
  wait_up "$1" "https://127.0.0.1:$PORT/" -k --max-time 2
}

# Script arguments. version-negotiation's TLS 1.2 fallbacks offer ECDHE-RSA with AES-GCM (its
# default is RSA key exchange with CBC, neither of which rustls has, by design). Per server:
# OpenSSL names the groups it prefers in EncryptedExtensions (allowed by RFC 8446 4.2.7) when
# the client's key share is not its first choice, rustls never does; rustls answers several
# KeyUpdate requests that arrive together with one KeyUpdate (RFC 8446 4.6.3 asks for one
# before the next application data), OpenSSL with one each.
extra_args() { # server script
  case $2 in
    version-negotiation) echo -C TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ;;
  esac
  case $1,$2 in
    openssl,large-number-of-extensions) echo --supgroup ;;
    engine,keyupdate|rustls,keyupdate) echo --coalescing ;;
  esac
}

# count FILE KEY...: the sum of tlsfuzzer's summary lines KEY: n.
count() {
  local f=$1; shift
  local k t=0
  for k in "$@"; do t=$((t + $(awk -v k="$k:" '$1 == k {print $2; exit}' "$f" | grep . || echo 0))); done
  echo $t
}

declare -A pass fail
for s in "${servers[@]}"; do
  start_server "$s"
  mkdir -p "$out/$s"
  for script in $SCRIPTS; do
    log=$out/$s/$script.log
    # shellcheck disable=SC2046
    PYTHONPATH=$TLSFUZZER_DIR/tlslite-ng timeout "$SCRIPT_TIMEOUT" python3 \
      "$TLSFUZZER_DIR/tlsfuzzer/scripts/test-tls13-$script.py" -h 127.0.0.1 -p "$PORT" -n "$N" \
      $(extra_args "$s" "$script") >"$log" 2>&1 || true
    if grep -q '^PASS:' "$log"; then
      pass[$s,$script]=$(count "$log" PASS XFAIL)
      fail[$s,$script]=$(count "$log" FAIL XPASS)
    else
      pass[$s,$script]=0; fail[$s,$script]=ERR
    fi
    # The failed cases' names, one a line.
    sed -n '/^FAILED:$/,/^[^\t]/p' "$log" | sed -n "s/^\t'\(.*\)'$/\1/p" | sort >"$out/$s/$script.failed"
    printf "  %-8s %-28s pass %5s  fail %5s\n" "$s" "$script" "${pass[$s,$script]}" "${fail[$s,$script]}"
  done
  # A server that died on the way would fail every later case: say so.
  kill -0 "${pids[0]}" 2>/dev/null || { echo "$s exited during the run:" >&2; tail -5 "$work/$s.err" >&2; }
  stop_server
done

echo
printf "%-28s" "passed/run (-n $N)"
for s in "${servers[@]}"; do printf " %15s" "$s"; done
echo
declare -A tp tr
for script in $SCRIPTS; do
  printf "%-28s" "$script"
  for s in "${servers[@]}"; do
    p=${pass[$s,$script]} f=${fail[$s,$script]}
    [ "$f" = ERR ] && f=0
    tp[$s]=$(( ${tp[$s]:-0} + p )); tr[$s]=$(( ${tr[$s]:-0} + p + f ))
    printf " %15s" "$p/$((p + f))"
  done
  echo
done
printf "%-28s" total
for s in "${servers[@]}"; do printf " %15s" "${tp[$s]}/${tr[$s]}"; done
echo
awk -v e="${tp[engine]}" -v o="${tp[openssl]}" \
  'BEGIN{printf "engine/openssl: %.3f (cases passed)\n", (o > 0) ? e/o : 0}'

echo
echo "cases the engine fails and openssl passes:"
for script in $SCRIPTS; do
  # Failed by the engine, not by openssl, and openssl's run finished.
  for s in engine openssl; do
    [ "${fail[$s,$script]}" = ERR ] && echo "  $script: $s's run did not finish (see its log)"
  done
  comm -23 "$out/engine/$script.failed" "$out/openssl/$script.failed" | sed "s/^/  $script: /"
done
[ -n "${OUT:-}" ] && echo "logs in $out"
exit 0
