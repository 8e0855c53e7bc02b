//! `lasthop-engine`: the edge redirect server.
//!
//! The request path is pure and lives in [`http`] (parse), [`answer`] (decide) and [`render`]
//! (write the response): a function of the request bytes, the read-only tables and `now`, tested
//! and benchmarked without sockets. The rest wires it to the machine:
//!
//! - [`tables`]: what a core reads per request (scheme, high water, denylist, snapshot, overlay),
//!   and how a new generation reaches every core;
//! - [`denylist`], [`overlay`]: the two changeable tables;
//! - [`serve`]: one pinned glommio executor per core, each driving one loop; [`session`]: a
//!   connection's protocol state, shared by both loops; [`socket`]: SO_REUSEPORT listeners;
//!   [`signals`]: SIGHUP/SIGTERM on the control thread;
//! - [`uring`]: the per-core io_uring loop (SINGLE_ISSUER | DEFER_TASKRUN, multishot accept and
//!   recv, provided buffers); [`epoll`]: the fallback loop;
//! - [`control`]: the control planes (`--control`, repeatable) and which one is in use;
//!   [`origin`]: read-through to it on a miss; [`feed`]: the subscription to its changes;
//! - [`clicks`]: per-core click buffers and their flusher; [`spool`] and [`kafka`]: its sinks;
//! - [`metrics`], [`topk`], [`admin`]: the operator surface.

pub mod admin;
pub mod answer;
pub mod clicks;
pub mod control;
pub mod denylist;
pub mod epoll;
pub mod feed;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod origin;
pub mod overlay;
pub mod render;
pub mod serve;
pub mod session;
pub mod signals;
pub mod socket;
pub mod spool;
pub mod tables;
pub mod tls;
pub mod topk;
pub mod uring;
