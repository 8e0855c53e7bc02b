"""An HTTP/3 client on aioquic for the engine's tests: one request per connection, printed as
JSON (status, headers, body, whether 0-RTT was accepted, the order the client saw things in).

    client.py HOST PORT PATH [--method M] [--ca FILE] [--sni NAME] [--ticket FILE]
              [--early] [--qlog FILE] [--port-change] [--header NAME:VALUE]
              [--requests N]

The output also carries "params": the server's transport parameters as the handshake left
them (initial_max_streams_bidi, initial_max_data, initial_max_stream_data_bidi_remote).

--ticket FILE: load a session ticket from FILE if it exists, and save the one received into it.
--early: send the request as soon as the connection starts (0-RTT, with a ticket).
--port-change: after the response, rebind to a new local port and send a second request on
the same connection (the server must follow it).
--time: report elapsed_ms, from the connection's start to the answer's HEADERS.
--hold SECONDS: after the response, keep the connection open until the server closes it (or
SECONDS pass), reporting the GOAWAY on the server's control stream and the close's code.
--header NAME:VALUE: one more request header (repeatable).
--requests N: N requests at once on the connection (their statuses in "statuses"), then the
one the output describes.
--abandon: before the request, abandon two others on the same connection: one whose stream
the client resets once its HEADERS were sent, and one whose answer it refuses (STOP_SENDING
H3_REQUEST_CANCELLED, then the stream's end); reports the resets the server sent ("resets").
"""

import argparse
import asyncio
import json
import os
import pickle
import socket
import ssl
import sys
import time

from aioquic.asyncio.client import connect
from cryptography.x509.oid import NameOID
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    StreamDataReceived,
    StreamReset,
)

H3_REQUEST_CANCELLED = 0x10C
from aioquic.quic.logger import QuicLogger


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.order = []
        self.responses = {}
        self.waiters = {}
        self.early_accepted = None
        self.resumed = None
        self.server_control = b""
        self.resets = {}
        self.closed = asyncio.get_event_loop().create_future()
        self.params = None
        self.extra_headers = []

    def quic_event_received(self, event):
        if isinstance(event, StreamDataReceived) and event.stream_id == 3:
            self.server_control += event.data
        if isinstance(event, StreamReset):
            self.resets[event.stream_id] = event.error_code
        if isinstance(event, ConnectionTerminated) and not self.closed.done():
            self.order.append("closed")
            self.closed.set_result(event.error_code)
        if isinstance(event, HandshakeCompleted):
            self.order.append("handshake_completed")
            self.early_accepted = event.early_data_accepted
            self.resumed = event.session_resumed
            q = self._quic
            self.params = {
                "initial_max_streams_bidi": q._remote_max_streams_bidi,
                "initial_max_data": q._remote_max_data,
                "initial_max_stream_data_bidi_remote": q._remote_max_stream_data_bidi_remote,
            }
        for e in self.h3.handle_event(event):
            if isinstance(e, HeadersReceived):
                self.order.append("headers")
                self.headers_at = time.perf_counter()
                r = self.responses.setdefault(e.stream_id, {"headers": [], "body": b""})
                r["headers"] += [(k.decode(), v.decode()) for k, v in e.headers]
                if e.stream_ended:
                    self.waiters[e.stream_id].set_result(None)
            elif isinstance(e, DataReceived):
                r = self.responses.setdefault(e.stream_id, {"headers": [], "body": b""})
                r["body"] += e.data
                if e.stream_ended:
                    self.waiters[e.stream_id].set_result(None)

    def fields(self, method, authority, path):
        return [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"aioquic-test/1"),
        ] + self.extra_headers

    async def abandon(self, authority, path):
        """One request reset by the client mid-way, one whose answer it refuses."""
        reset = self._quic.get_next_available_stream_id()
        self.h3.send_headers(reset, self.fields("GET", authority, path), end_stream=False)
        self.transmit()
        await asyncio.sleep(0.15)  # the server has read the HEADERS
        self._quic.reset_stream(reset, H3_REQUEST_CANCELLED)
        stopped = self._quic.get_next_available_stream_id()
        self.h3.send_headers(stopped, self.fields("GET", authority, path), end_stream=False)
        self.transmit()
        await asyncio.sleep(0.15)
        self._quic.stop_stream(stopped, H3_REQUEST_CANCELLED)
        self.h3.send_data(stopped, b"", end_stream=True)
        self.transmit()
        await asyncio.sleep(0.15)  # the server's RESET_STREAM for `stopped`

    async def request(self, method, authority, path):
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, self.fields(method, authority, path), end_stream=True)
        self.waiters[sid] = asyncio.get_running_loop().create_future()
        self.order.append("request_sent")
        self.transmit()
        await asyncio.wait_for(self.waiters[sid], 10)
        r = self.responses[sid]
        status = int(dict(r["headers"])[":status"])
        return {
            "status": status,
            "headers": [[k, v] for k, v in r["headers"] if k != ":status"],
            "body": r["body"].decode(errors="replace"),
        }


def varint(b, i):
    n = 1 << (b[i] >> 6)
    v = b[i] & 0x3F
    for x in b[i + 1 : i + n]:
        v = (v << 8) | x
    return v, i + n


def goaway_id(control):
    """The id in the first GOAWAY frame on the server's control stream (after its type)."""
    if not control:
        return None
    _, i = varint(control, 0)
    while i < len(control):
        t, i = varint(control, i)
        length, i = varint(control, i)
        if t == 0x7:
            return varint(control, i)[0]
        i += length
    return None


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("path")
    p.add_argument("--method", default="GET")
    p.add_argument("--ca")
    p.add_argument("--sni", default="lh.test")
    p.add_argument("--ticket")
    p.add_argument("--early", action="store_true")
    p.add_argument("--qlog")
    p.add_argument("--port-change", action="store_true")
    p.add_argument("--hold", type=float)
    p.add_argument("--time", action="store_true")
    p.add_argument("--abandon", action="store_true")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--requests", type=int, default=0)
    a = p.parse_args()

    logger = QuicLogger() if a.qlog else None
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, quic_logger=logger)
    config.server_name = a.sni
    if a.ca:
        config.load_verify_locations(a.ca)
    else:
        config.verify_mode = ssl.CERT_NONE
    if a.ticket and os.path.exists(a.ticket):
        with open(a.ticket, "rb") as f:
            config.session_ticket = pickle.load(f)

    def save_ticket(ticket):
        if a.ticket:
            with open(a.ticket, "wb") as f:
                pickle.dump(ticket, f)

    out = {}
    started = time.perf_counter()
    async with connect(
        a.host,
        a.port,
        configuration=config,
        create_protocol=Client,
        session_ticket_handler=save_ticket,
        wait_connected=not a.early,
    ) as client:
        client.extra_headers = [
            (n.strip().lower().encode(), v.strip().encode())
            for n, v in (h.split(":", 1) for h in a.header)
        ]
        if a.abandon:
            await client.abandon(a.sni, a.path)
        if a.requests:
            many = await asyncio.gather(
                *(client.request(a.method, a.sni, a.path) for _ in range(a.requests))
            )
            out["statuses"] = [r["status"] for r in many]
        r = await client.request(a.method, a.sni, a.path)
        out.update(r)
        if a.time:
            # From the connection's start to the answer's HEADERS.
            out["elapsed_ms"] = round((client.headers_at - started) * 1e3, 2)
        if a.port_change:
            client.change_connection_id()  # a new connection ID, as a migrating client would
            # Rebind: a new socket (a new local port) carries the rest of the connection.
            loop = asyncio.get_running_loop()
            # (aioquic's own socket is a dual-stack IPv6 one, addresses IPv4-mapped.)
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            old = client._transport
            await loop.create_datagram_endpoint(lambda: client, sock=sock)
            old.close()
            out["second"] = await client.request("GET", a.sni, a.path)
        if a.hold:
            print("holding", flush=True)
            try:
                out["close_code"] = await asyncio.wait_for(client.closed, a.hold)
            except asyncio.TimeoutError:
                out["close_code"] = None
            out["goaway_id"] = goaway_id(client.server_control)
        await asyncio.sleep(0.2)  # the ticket (NEW_SESSION_TICKET) arrives after the handshake
        out["early_data_accepted"] = client.early_accepted
        out["session_resumed"] = client.resumed
        out["order"] = client.order
        out["params"] = client.params
        cert = client._quic.tls._peer_certificate
        out["peer_cn"] = (
            cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value if cert else None
        )
        out["resets"] = {str(k): v for k, v in client.resets.items()}
    if logger:
        with open(a.qlog, "w") as f:
            json.dump(logger.to_dict(), f)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
