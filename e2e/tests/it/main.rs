//! Whole-system tests of lasthop: the real `lasthop-control` and `lasthop-engine` binaries
//! together (found and started by `lasthop-testkit`), real sockets, real clients (curl, a raw
//! HTTP/1.1 client, headless Chromium).
//!
//! - `origin`: an engine's read-through to a running control plane;
//! - `clicks`: redirects at an engine through the control plane's processor into stats, by the
//!   spool and by Kafka;
//! - `feed`: the edge feed with a real control plane and several engines (new links,
//!   takedowns, restarts, a lost feed and safe mode, snapshot swaps under load, the token);
//! - `hotset`: hot-set snapshots: a link outside the budget read through, a clicked one
//!   promoted into the next snapshot;
//! - `safety`: trust and safety at the edge: a list reload's takedowns, an owner's suspension
//!   across two engines, held links' interstitial until the first verdict, the report form;
//! - `channel`: the edge channel secured: the feed, downloads and read-through over TLS with a
//!   CA made at test time, mutual TLS in place of the token, signed snapshots, and each refusal;
//! - `regions`: two regions replicating each other's links and state changes: a link made in
//!   one served by the other's engine, takedowns crossing regions, a region down and back;
//! - `packaging`: config files under the flags, SIGHUP re-reading one under wrk load, the
//!   Debian package extracted and run from its paths, dashboards and alerts against the
//!   exported metrics;
//! - `console`: the web console in headless Chromium against a control plane and an engine;
//! - `domains`: branded domains' certificates chosen by SNI at two engines, replaced under a
//!   client loop, and kept sealed across a restart with the control plane down;
//! - `harness`: what only these tests use: a TCP proxy standing in for a WAN link.

mod acme;
mod channel;
mod clicks;
mod console;
mod domains;
mod edits;
mod feed;
mod harness;
mod hotset;
mod imports;
mod options;
mod origin;
mod packaging;
mod regions;
mod safety;
