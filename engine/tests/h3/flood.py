"""Floods a QUIC listener for the engine's tests, from one UDP socket, for SECONDS:

    flood.py HOST PORT SECONDS initial|garbage

initial: real QUIC v1 Initials (aioquic client connections started and never continued: each
costs the server a handshake's state and its first flight); garbage: random datagrams, half of
them with a long header's first byte so they look like Initials. Prints how many were sent.
"""

import os
import socket
import sys
import time

from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection


def main():
    host, port, seconds, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    addr = (host, port)
    sent = 0
    end = time.monotonic() + seconds
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = "lh.test"
    while time.monotonic() < end:
        if kind == "initial":
            conn = QuicConnection(configuration=config)
            conn.connect(addr, now=time.monotonic())
            datagrams = [d for d, _ in conn.datagrams_to_send(now=time.monotonic())]
        else:
            datagrams = []
            for i in range(32):
                d = bytearray(os.urandom(1200 if i % 2 else 60 + i))
                if i % 2:
                    d[0] = 0xC0 | (d[0] & 0x0F)  # long header, Initial
                    d[1:5] = b"\x00\x00\x00\x01"  # QUIC v1
                datagrams.append(bytes(d))
        for d in datagrams:
            try:
                sock.sendto(d, addr)
                sent += 1
            except BlockingIOError:
                time.sleep(0.0005)
    print(sent)


if __name__ == "__main__":
    main()
