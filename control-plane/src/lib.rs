//! `lasthop-control`: the control plane.
//!
//! - [`store`]: the durable record, the `lasthop-store` crate re-exported: [`store::embedded`],
//!   the default redb store with group commit, counter-block leasing and the ordered change log,
//!   and [`store::postgres`], the shared store several control planes use
//!   (store/STORE.md);
//! - [`backup`]: `export` and `import` of the whole record;
//! - [`api`]: the public HTTP API (axum);
//! - [`reply`]: the one error envelope of the API and the edge listener, and the one way their
//!   handlers run blocking work;
//! - [`edge`]: the internal edge listener engines use: origin lookups, the feed, snapshot
//!   downloads, status reports;
//! - [`edge_token`]: the shared secret the edge listener requires;
//! - [`edge_tls`]: TLS on the edge listener, with client certificates optionally;
//! - [`signing`]: the snapshot signing key;
//! - [`feed`]: the edge feed stream (core/FEED.md);
//! - [`publish`]: publishing, serving and garbage-collecting snapshots in `serve`;
//! - [`fleet`]: engines' status reports, their lag and the lag alarm;
//! - [`body_stream`]: response bodies fed from a bounded channel;
//! - [`auth`]: API keys, stored hashed in a file beside the store or in the shared store;
//! - [`ratelimit`]: per-owner token buckets for creation (and per-network ones for reports);
//! - [`safety`]: trust and safety: reputation lists and their reloads, the scanner and its
//!   verdict webhook, bulk takedowns (list entries, hosts, suspended owners), velocity holds;
//! - [`metrics`]: the Prometheus registry;
//! - [`snapshot`]: building an edge snapshot from the store;
//! - [`clock`]: wall-clock milliseconds and RFC 3339 formatting (`lasthop-store`'s);
//! - [`clicks`]: the `lasthop-clicks` crate re-exported: the click stream processor (spool or Kafka → dedup, bots, rollups, archive),
//!   the rollup store behind `GET /v1/links/{code}/stats`, recompute and the synthetic stream.

pub mod acme;
pub mod api;
pub mod auth;
pub mod backup;
pub mod body_stream;
#[cfg(feature = "console")]
pub mod dashboard;
pub mod edge;
pub mod edge_tls;
pub mod edge_token;
pub mod feed;
pub mod fleet;
pub mod import;
pub mod legacy;
pub mod metrics;
pub mod peers;
pub mod publish;
pub mod qr;
pub mod ratelimit;
pub mod reply;
pub mod safety;
pub mod signing;
pub mod snapshot;

pub use lasthop_clicks as clicks;
pub use lasthop_store as store;
pub use lasthop_store::clock;
pub(crate) use lasthop_store::error_chain;

pub use api::{router, ApiConfig, ApiParts, AppState};
pub use auth::{ApiKeys, Principal};
pub use store::embedded::{EmbeddedStore, EmbeddedStoreConfig};
pub use store::{
    Actor, CreateOutcome, CreateRequest, DeleteOutcome, StateUpdate, Store, StoreError, StoredLink,
};
