//! `lasthop-engine`: the edge redirect server.
//!
//! What the engine decides lives in the `lasthop-edge` crate, re-exported here: [`http`]
//! (parse), [`answer`] (decide), [`render`] (write the response), [`tables`] (what a core reads,
//! and the generation swap), [`denylist`], [`overlay`], [`topk`] (the hot-code sketch), and the
//! state machines `lasthop_edge::session` (a connection), `lasthop_edge::feed_apply` (what the
//! feed does to the tables) and `lasthop_edge::origin_cache` (the read-through's caches and
//! breakers), all tested and benchmarked without sockets. This crate wires them to the machine
//! (`docs/ARCHITECTURE.md`):
//!
//! - [`io`]: the syscalls and the only `unsafe`: the per-core io_uring loop, the epoll
//!   fallback, SO_REUSEPORT listeners, signals, eventfds;
//! - [`serve`]: one pinned glommio executor per core, each driving one loop; [`session`]: a
//!   core's side of a connection (its context and the session's effects);
//! - [`tls`]: the rustls configuration, shared ticket keys, kTLS, TLS counters;
//! - [`control`]: the control planes (`--control`, repeatable) and which one is in use;
//!   [`origin`]: read-through to it on a miss; [`feed`]: the subscription to its changes;
//! - [`clicks`]: per-core click buffers, their flusher and sinks (spool, Kafka);
//! - [`metrics`], [`admin`]: the operator surface.
//!
//! Two Cargo features, both default, gate the paths that link a C library built from source:
//! `kafka` (the Kafka click sink, `clicks::kafka`: rdkafka and librdkafka) and `xdp` (the
//! AF_XDP path, `io::xdp` and `serve::Backend::Xdp`: libbpf). Without them the engine serves
//! through io_uring or epoll and spools its clicks; the binary still parses `--io xdp` and
//! `--clicks kafka`, and refuses them at start, naming the feature.

pub mod admin;
pub mod clicks;
pub mod control;
pub mod feed;
pub mod io;
pub mod metrics;
pub mod origin;
pub mod quic;
pub mod serve;
pub mod session;
pub mod tls;

pub use lasthop_edge::{answer, h2, h3, http, render, tables, topk};
