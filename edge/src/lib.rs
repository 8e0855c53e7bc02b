//! `lasthop-edge`: what the edge engine decides, without I/O (engine/DESIGN.md, "The request
//! path"). Every function here is a function of bytes, read-only tables and `now`: no sockets,
//! no threads, no clocks read, no `unsafe`. `lasthop-engine` wires it to the machine (io_uring
//! or epoll loops, TLS, the feed, the origin, click recording); benches and fuzz targets link
//! this crate alone.
//!
//! - [`http`]: request parsing (httparse, our limits and policy);
//! - [`answer`]: the redirect decision for one request;
//! - [`click`]: a redirect's click event (visitor hash, referrer, user agent), encoded;
//! - [`render`]: the response bytes, preview and interstitial pages;
//! - [`session`]: one connection's protocol state machine, fed bytes, origin replies and `now`,
//!   reporting effects (ask the origin, record a click, count an answer);
//! - [`tables`]: what a core reads per request (scheme, high water, denylist, snapshot,
//!   overlay); [`denylist`], [`overlay`]: the two changeable tables, published in
//!   [`generations`] that cost what changed;
//! - [`domains`]: the branded domains by `Host` (their namespaces and settings);
//! - [`query`]: a request's query merged into a destination's (query forwarding, issue 43's
//!   building block; not yet wired to links);
//! - [`feed_apply`]: what the feed's frames do to the tables;
//! - [`quic`]: what a QUIC datagram's long headers say (0-RTT, Handshake), beside quinn-proto;
//! - [`origin_cache`]: the read-through's decisions (singleflight, fresh, stale and negative
//!   caches, breakers);
//! - [`topk`]: the hot-code sketch;
//! - [`tcp`]: the kernel-bypass path's passive TCP (SYN cookies, a connection per 4-tuple,
//!   retransmission, FIN/RST, timers), frames in and out, time an argument;
//! - [`wire`]: the kernel-bypass path's frames (Ethernet, IPv4 or IPv6, TCP) parsed and checked, and
//!   the reset a passive side writes.

pub mod answer;
pub mod click;
pub mod denylist;
pub mod domains;
pub mod feed_apply;
pub mod generations;
pub mod h2;
pub mod h3;
pub mod http;
pub mod origin_cache;
pub mod overlay;
pub mod query;
pub mod quic;
pub mod render;
pub mod session;
pub mod tables;
pub mod tcp;
pub mod topk;
pub mod wire;
