//! Black-box tests of `lasthop-engine` alone: the real binary, real sockets, real clients (curl
//! and a raw TCP client for pipelining and load). Tests that run it with a control plane are the
//! whole-system tests, `lasthop-e2e`.
//!
//! - `serving`: the request path end to end on both socket backends;
//! - `lifecycle`: SIGHUP snapshot swap under load, SIGTERM drain, a non-root start under an
//!   8 MiB memlock limit;
//! - `clicks`: click events from real redirects into the spool (and Kafka);
//! - `h2`: HTTP/2 on every backend (TLS with ALPN, h2c with prior knowledge): the serving
//!   contract with curl, nghttp, h2load and headless Chromium, and each flood limit with raw
//!   frames;
//! - `h3`: HTTP/3 over QUIC with aioquic (the exact 302, 0-RTT's answer in the server's first
//!   flight from its qlog, amplification, HEAD/404/410/preview/405/425, Retry, a client that
//!   changes its port, SIGTERM's GOAWAY) and ngtcp2 (0-RTT, Retry, version negotiation), and
//!   `Alt-Svc` over TCP;
//! - `flight`: the TLS first flight with a rustls client: the post-quantum hybrid and X25519
//!   each alone, `--tls-groups`, certificate compression, a ClientHello in pieces;
//! - `tls`: HTTPS with curl and openssl: handshakes, resumption, 0-RTT, HSTS, the kTLS hand-off
//!   where the kernel has it (reported skipped where it does not);
//! - `xdp`: the AF_XDP path's kernel parts on a veth pair into a namespace the test makes: the
//!   XDP program through the verifier and test runs, SYNs redirected to a socket, resets written
//!   in userspace reaching a real client, a real client talking to the userspace TCP (echo,
//!   FIN both ways, frames lost both ways), other traffic reaching the kernel, the program gone
//!   when the server is killed (root only);
//! - `harness`: the engine binary cargo built for these tests (the rest is `lasthop-testkit`).

mod clicks;
mod flight;
mod h2;
mod h3;
mod harness;
mod lifecycle;
mod serving;
mod tls;
#[cfg(feature = "xdp")]
mod xdp;
