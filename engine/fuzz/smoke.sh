#!/usr/bin/env bash
# Smoke-runs the engine's request fuzz target (HTTP parse, decide, render) for N seconds
# (default 30). Optional, outside the required CI path: needs cargo-fuzz and a nightly
# toolchain, and says "skipped: <reason>" otherwise.
#   engine/fuzz/smoke.sh [SECONDS]
set -euo pipefail
secs="${1:-30}"
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "skipped: cargo-fuzz is not installed (cargo install cargo-fuzz)"
    exit 0
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "skipped: no nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi

# Seed the corpus with real requests so the fuzzer starts from the interesting shapes.
mkdir -p corpus/request
printf 'GET /abcDEF1 HTTP/1.1\r\nHost: a\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n' \
    >corpus/request/curl
printf 'GET /fuzz-alias+ HTTP/1.1\r\nHost: a\r\nAccept: application/json\r\n\r\nHEAD /abcDEF1+?q HTTP/1.0\r\nConnection: keep-alive\r\n\r\n' \
    >corpus/request/pipelined
printf 'POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc' >corpus/request/post

exec cargo +nightly fuzz run request corpus/request -- \
    -max_total_time="$secs" -max_len=20000
