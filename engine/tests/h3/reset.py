"""Stateless reset (RFC 9000 §10.3) seen by a client: aioquic's sans-I/O connection over a plain
UDP socket completes a handshake, then says nothing for WAIT seconds (past the server's idle
timeout, so the server forgets the connection while this client keeps it), then sends a PING on
it. The server, holding no state for the connection ID, must answer with a stateless reset: a
short-header-looking datagram smaller than the one that incited it, ending in the reset token
the server gave for that connection ID in its transport parameters. aioquic stores the token
but does not act on a reset, so this script checks the datagram itself. Prints JSON:
alive_reply_is_reset (a PING while the connection lives: must be false), reset (the reply after
WAIT ends in the token), sent and got (their sizes), first_byte.

    reset.py HOST PORT --ca FILE [--sni NAME] [--wait SECONDS]
"""

import argparse
import json
import socket
import time

from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--ca", required=True)
    p.add_argument("--sni", default="lh.test")
    p.add_argument("--wait", type=float, default=3.0)
    a = p.parse_args()

    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = a.sni
    config.load_verify_locations(a.ca)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(0.02)
    server = (a.host, a.port)
    conn = QuicConnection(configuration=config)
    conn.connect(server, now=time.time())
    done = []

    def pump(seconds, until=lambda: False):
        deadline = time.time() + seconds
        while time.time() < deadline:
            for data, to in conn.datagrams_to_send(now=time.time()):
                sock.sendto(data, to)
            if until():
                return
            try:
                data, frm = sock.recvfrom(65536)
                conn.receive_datagram(data, frm, now=time.time())
            except socket.timeout:
                pass
            t = conn.get_timer()
            if t is not None and t <= time.time():
                conn.handle_timer(now=time.time())
            while (ev := conn.next_event()) is not None:
                if isinstance(ev, HandshakeCompleted):
                    done.append(ev)

    pump(5, lambda: bool(done))
    if not done:
        raise SystemExit("no handshake")
    pump(0.3)  # HANDSHAKE_DONE, new connection IDs, acknowledgements
    token = conn._peer_cid.stateless_reset_token

    def ping():
        """One PING on the connection; the first datagram that comes back, and what was sent."""
        conn.send_ping(1)
        sent = 0
        for data, to in conn.datagrams_to_send(now=time.time()):
            sock.sendto(data, to)
            sent = max(sent, len(data))
        sock.settimeout(2)
        try:
            reply, _ = sock.recvfrom(65536)
        except socket.timeout:
            reply = b""
        sock.settimeout(0.02)
        return sent, reply

    _, alive = ping()
    # Take the ACK in, as a client would, then go quiet while the server forgets.
    if alive:
        conn.receive_datagram(alive, server, now=time.time())
    time.sleep(a.wait)
    sent, reply = ping()
    print(
        json.dumps(
            {
                "alive_reply_is_reset": bool(alive) and alive[-16:] == token,
                "reset": bool(reply) and reply[-16:] == token,
                "sent": sent,
                "got": len(reply),
                "first_byte": reply[0] if reply else None,
            }
        )
    )


if __name__ == "__main__":
    main()
