//! `lasthop-testkit`: what the workspace's test suites share (a dev-dependency only).
//!
//! Real processes, each started on loopback ports of its choosing with its state in a temp dir
//! and stopped when dropped:
//!
//! - [`Engine`] on a [`Site`] (a key and a snapshot), and [`Control`], a control plane for that
//!   site with engines [subscribed](subscribed_engine) to its feed; their binaries found by
//!   [`engine_bin`] and [`control_bin`] from any crate's tests;
//! - [`Postgres`] and [`ClickHouse`] servers (Debian's packages, no system service), and a
//!   Kafka-protocol broker, [`Tansu`];
//! - [`pki`]: a CA and server certificates made with openssl.
//!
//! Around them: [`wait_until`] a condition holds, [`free_port`], [`process`] signals and a
//! [`KillOnDrop`] guard, [`logs`] and [`metrics`] (a sample from a `/metrics` text), the
//! clients ([`curl`], a raw HTTP/1.1 [`Conn`], [`Load`]), and [`skip`]: a test that cannot
//! run here (a tool or server is missing) says so as `SKIPPED <what>: <why>`, which
//! `scripts/test` lists; under `CI=true`, where `scripts/test` has installed every such tool,
//! the same call fails the test instead, so a green CI means those suites ran.

mod binary;
mod broker;
mod clickhouse;
mod control;
mod engine;
mod h3;
mod http;
mod load;
mod pebble;
mod pki;
mod port;
mod postgres;
mod skip;
mod verdicts;
mod wait;

pub mod logs;
pub mod metrics;
pub mod process;
pub mod s3;

pub use binary::{control_bin, engine_bin};
pub use broker::Tansu;
pub use clickhouse::{ClickHouse, CLICKHOUSE_USER};
pub use control::{spool_to, subscribed_engine, Control};
pub use engine::{in_sync, set_mode, write_secret, Engine, Site};
pub use h3::{aioquic, aioquic_json, aioquic_python, h3, h3_client};
pub use http::{curl, h2_status, location_of, status_of, Conn, Resp};
pub use load::Load;
pub use pebble::Pebble;
pub use pki::{ca_and_server, openssl, pki, server_cert, signed_cert, test_ca, Pki, P256};
pub use port::free_port;
pub use postgres::Postgres;
pub use process::KillOnDrop;
pub use s3::{s3_tools, S3, S3_ACCESS_KEY, S3_SECRET_KEY};
pub use skip::{skip, under_ci};
pub use verdicts::verdict_service;
pub use wait::{wait_until, wait_until_every};
