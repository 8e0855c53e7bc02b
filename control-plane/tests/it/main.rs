//! Integration tests of `lasthop-control`, one binary:
//!
//! - `clicks`: the click processor in the real binary: spool segments and a Kafka-protocol
//!   broker in, stats over HTTP out; dedup, bots, late events, recompute, restarts, corruption;
//! - `edge`: the internal edge listener (origin lookups, the edge token), through its router and
//!   over a socket;
//! - `erasure`: a deleted destination is found nowhere (store tables on both backends, API,
//!   feed replay, idempotent replay, next snapshot);
//! - `feed`: the edge feed, snapshot publishing and status reports, over real sockets;
//! - `rollups`: the rollup store's contract, one suite run on the embedded store and on a real
//!   ClickHouse;
//! - `router`: every API call through the axum router without a socket, on a real store;
//! - `process`: the real binary over real sockets (curl and an HTTP client crate): concurrent
//!   alias claims, graceful and hard restarts, and the SIGKILL crash test;
//! - `pg_tls`: the shared store over TLS (sslmode, the default for hosts that are not loopback,
//!   client certificates, `--check-config`) against PostgreSQL with `ssl = on`;
//! - `replication`: a PostgreSQL primary and synchronous standby, failover under load, over
//!   TLS (`verify-full` against the test CA);
//! - `store`: the store's contract, one suite run on the embedded store and on a real
//!   PostgreSQL;
//! - `safety`: trust and safety in the real binary: reputation lists (spellings, formats,
//!   reloads), chained shorteners, the scanner with a real verdict webhook, holds, velocity,
//!   suspension, key revocation, reports and the review queue, appeals, history, hosts.

mod clicks;
mod edge;
mod erasure;
mod feed;
mod harness;
mod pg_tls;
mod process;
mod replication;
mod rollups;
mod router;
mod safety;
mod shared;
mod store;
mod transfer;
