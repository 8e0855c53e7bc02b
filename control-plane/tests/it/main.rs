//! Integration tests of `lasthop-control`, one binary:
//!
//! - `router`: every API call through the axum router without a socket, on a real store;
//! - `process`: the real binary over real sockets (curl and an HTTP client crate): concurrent
//!   alias claims, graceful and hard restarts, and the SIGKILL crash test.

mod harness;
mod process;
mod router;
