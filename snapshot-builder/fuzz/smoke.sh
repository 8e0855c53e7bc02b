#!/usr/bin/env bash
# Smoke-runs the snapshot fuzz target for N seconds (default 30). Optional, outside the required
# CI path: needs cargo-fuzz and a nightly toolchain, and says "skipped: <reason>" otherwise.
#   snapshot-builder/fuzz/smoke.sh [SECONDS]
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

# Seed the corpus with the checked-in fixtures so the fuzzer starts from valid files.
mkdir -p corpus/open_lookup
cp ../tests/fixtures/v1.snap ../tests/fixtures/v2.snap ../tests/fixtures/v3.snap \
    ../tests/fixtures/v4.snap corpus/open_lookup/

exec cargo +nightly fuzz run open_lookup corpus/open_lookup -- \
    -max_total_time="$secs" -max_len=65536
