//! `lasthop-edge`: what the edge engine decides, without I/O (engine/DESIGN.md, "The request
//! path"). Every function here is a function of bytes, read-only tables and `now`: no sockets,
//! no threads, no clocks read, no `unsafe`. `lasthop-engine` wires it to the machine (io_uring
//! or epoll loops, TLS, the feed, the origin, click recording); benches and fuzz targets link
//! this crate alone.
//!
//! - [`http`]: request parsing (httparse, our limits and policy);
//! - [`answer`]: the redirect decision for one request;
//! - [`render`]: the response bytes, preview and interstitial pages;
//! - [`tables`]: what a core reads per request (scheme, high water, denylist, snapshot,
//!   overlay); [`denylist`], [`overlay`]: the two changeable tables;
//! - [`topk`]: the hot-code sketch.

pub mod answer;
pub mod denylist;
pub mod http;
pub mod overlay;
pub mod render;
pub mod tables;
pub mod topk;
