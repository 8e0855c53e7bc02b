//! `lasthop-engine`: the edge redirect server.
//!
//! The request path is pure and lives in the `lasthop-edge` crate, re-exported here: [`http`]
//! (parse), [`answer`] (decide) and [`render`] (write the response), a function of the request
//! bytes, the read-only [`tables`] ([`denylist`], [`overlay`]) and `now`, tested and benchmarked
//! without sockets; [`topk`], the hot-code sketch. This crate wires it to the machine:
//!
//! - [`serve`]: one pinned glommio executor per core, each driving one loop; [`session`]: a
//!   connection's protocol state, shared by both loops; [`socket`]: SO_REUSEPORT listeners;
//!   [`signals`]: SIGHUP/SIGTERM on the control thread;
//! - [`uring`]: the per-core io_uring loop (SINGLE_ISSUER | DEFER_TASKRUN, multishot accept and
//!   recv, provided buffers); [`epoll`]: the fallback loop;
//! - [`control`]: the control planes (`--control`, repeatable) and which one is in use;
//!   [`origin`]: read-through to it on a miss; [`feed`]: the subscription to its changes;
//! - [`clicks`]: per-core click buffers and their flusher; [`spool`] and [`kafka`]: its sinks;
//! - [`metrics`], [`admin`]: the operator surface.

pub mod admin;
pub mod clicks;
pub mod control;
pub mod epoll;
pub mod feed;
pub mod kafka;
pub mod metrics;
pub mod origin;
pub mod serve;
pub mod session;
pub mod signals;
pub mod socket;
pub mod spool;
pub mod tls;
pub mod uring;

pub use lasthop_edge::{answer, denylist, http, overlay, render, tables, topk};
