//! Black-box tests of `lasthop-engine`: the real binary, real sockets, real clients (curl and a
//! raw TCP client for pipelining and load), a real control plane for read-through.
//!
//! - `serving`: the request path end to end on both socket backends;
//! - `lifecycle`: SIGHUP snapshot swap under load, SIGTERM drain, a non-root start under an
//!   8 MiB memlock limit;
//! - `origin`: read-through to a running control plane;
//! - `clicks`: click events from real redirects into the spool (and Kafka), and through the
//!   control plane's processor into stats;
//! - `feed`: the edge feed with a real control plane and several engines (new links,
//!   takedowns, restarts, a lost feed and safe mode, snapshot swaps under load, the token);
//! - `hotset`: hot-set snapshots: a link outside the budget read through, a clicked one
//!   promoted into the next snapshot;
//! - `safety`: trust and safety at the edge: a list reload's takedowns, an owner's suspension
//!   across two engines, held links' interstitial until the first verdict, the report form;
//! - `channel`: the edge channel secured: the feed, downloads and read-through over TLS with a
//!   CA made at test time, mutual TLS in place of the token, signed snapshots, and each refusal;
//! - `h2`: HTTP/2 on every backend (TLS with ALPN, h2c with prior knowledge): the serving
//!   contract with curl, nghttp, h2load and headless Chromium, and each flood limit with raw
//!   frames;
//! - `flight`: the TLS first flight with a rustls client: the post-quantum hybrid and X25519
//!   each alone, `--tls-groups`, certificate compression, a ClientHello in pieces;
//! - `tls`: HTTPS with curl and openssl: handshakes, resumption, 0-RTT, HSTS, the kTLS hand-off
//!   where the kernel has it (reported skipped where it does not);
//! - `regions`: two regions replicating each other's links and state changes: a link made in
//!   one served by the other's engine, takedowns crossing regions, a region down and back;
//! - `packaging`: config files under the flags, SIGHUP re-reading one under wrk load, the
//!   Debian package extracted and run from its paths, dashboards and alerts against the
//!   exported metrics;
//! - `xdp`: the AF_XDP path's kernel parts on a veth pair into a namespace the test makes: the
//!   XDP program through the verifier and test runs, SYNs redirected to a socket, resets written
//!   in userspace reaching a real client, a real client talking to the userspace TCP (echo,
//!   FIN both ways, frames lost both ways), other traffic reaching the kernel, the program gone
//!   when the server is killed (root only);
//! - `harness`: what the tests share: sites (key, snapshot), engines and control planes as real
//!   processes, a raw HTTP client, load, a Kafka-protocol broker.

mod channel;
mod clicks;
mod console;
mod feed;
mod flight;
mod h2;
mod harness;
mod hotset;
mod lifecycle;
mod origin;
mod packaging;
mod regions;
mod safety;
mod serving;
mod tls;
mod xdp;
