#!/usr/bin/env bash
# Smoke-runs the engine's fuzz targets (request: HTTP parse, decide, render; frame: the
# kernel-bypass path's Ethernet/IPv4/TCP frames; quic_packets: the QUIC listener's long-header
# walk) for N seconds each (default 30). Optional, outside the required CI path: needs cargo-fuzz and a nightly
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

cargo +nightly fuzz run request corpus/request -- \
    -max_total_time="$secs" -max_len=20000

# The kernel-bypass path's frames (wire::parse, write_reset), seeded with a SYN and a request
# segment written by hand (Ethernet, IPv4 and TCP headers with their checksums).
mkdir -p corpus/frame
python3 - corpus/frame <<'PY'
import struct, sys
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
def frame(flags, payload):
    src, dst = bytes([198, 18, 0, 2]), bytes([198, 18, 0, 1])
    tcp = struct.pack("!HHIIBBHHH", 40000, 80, 1, 0 if flags == 2 else 7, 5 << 4, flags, 1024, 0, 0) + payload
    pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return bytes([2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0]) + ip + tcp
open(sys.argv[1] + "/syn", "wb").write(frame(2, b""))
open(sys.argv[1] + "/request", "wb").write(frame(0x18, b"GET /abcDEF1 HTTP/1.1\r\nHost: a\r\n\r\n"))
PY
cargo +nightly fuzz run frame corpus/frame -- -max_total_time="$secs" -max_len=2000

# QUIC datagrams: an Initial (with a token) coalesced with a 0-RTT packet, and a Handshake
# packet followed by a short-header one.
mkdir -p corpus/quic_packets
python3 - corpus/quic_packets <<'PY'
import sys
def long(kind, payload, token=None):
    p = bytes([0xC0 | (kind << 4), 0, 0, 0, 1, 8]) + bytes(8) + bytes([8]) + bytes(8)
    if token is not None:
        p += bytes([len(token)]) + token
    return p + bytes([0x40 | (len(payload) >> 8), len(payload) & 0xFF]) + payload
open(sys.argv[1] + "/initial-0rtt", "wb").write(long(0, bytes(900), b"tok") + long(1, bytes(200)))
open(sys.argv[1] + "/handshake-short", "wb").write(long(2, bytes(60)) + bytes([0x41]) + bytes(40))
PY
exec cargo +nightly fuzz run quic_packets corpus/quic_packets -- -max_total_time="$secs" -max_len=1500
