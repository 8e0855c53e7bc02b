//! `lasthop-analytics`: the click processor's rules and sketches, as pure functions of their
//! inputs (no I/O, no clock: callers pass times). The control plane's processor wires them to the
//! spool, Kafka, the archive and the store.
//!
//! - [`rules`]: the bot rules (user-agent patterns, published crawler ranges, behaviour thresholds),
//!   loaded from the shipped data files or an operator's own;
//! - [`classify`]: per-event verdicts (bot or human, and why; device, browser, OS);
//! - [`uniques`]: the HyperLogLog unique-visitor sketch (mergeable, ≤ 2% error);
//! - [`dedup`]: the event-id window that drops duplicates;
//! - [`rollup`]: the per-(link, day) counters and breakdowns (a link by its key: the code, or
//!   `domain/code` on a branded domain).

pub mod classify;
mod codec;
pub mod dedup;
pub mod rollup;
pub mod rules;
pub mod uniques;

pub use classify::{BotReason, Classifier, Device, Verdict};
pub use dedup::{early_key, Dedup, KeyDedup};
pub use rollup::{Breakdown, Rollup};
pub use rules::{AgentKind, Rules, RulesError};
pub use uniques::{SketchError, Uniques};
