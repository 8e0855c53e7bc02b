//! The durable record, behind a trait so PostgreSQL can stand beside the embedded default.
//!
//! Every method is synchronous and may block on disk; async callers run them on the blocking
//! pool. A `create` that returns `Created` is durable: the link, its state, the owner index, the
//! change-log entry and any counter lease are committed (fsync) in one transaction; so is a
//! state change with its change-log entry and its denylist entry.

pub mod embedded;

use lasthop_core::feed::DenyKind;
use lasthop_core::{Change, Link, LinkState};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// A link with its state and the change-log sequence that created it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLink {
    pub link: Link,
    pub state: LinkState,
    /// Change-log sequence of the creation.
    pub seq: u64,
}

/// An `Idempotency-Key` presented with a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyClaim {
    pub key: String,
    /// SHA-256 of the canonical request body.
    pub body_hash: [u8; 32],
}

/// Everything a create needs; URL and alias are already validated.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub owner: String,
    pub long_url: String,
    pub alias: Option<String>,
    pub expires_at_ms: Option<i64>,
    pub idempotency: Option<IdempotencyClaim>,
    pub now_ms: i64,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// Written and durable.
    Created(StoredLink),
    /// The same idempotency key and body were seen before: this is the first answer.
    Replayed(StoredLink),
    /// The alias is claimed (by a live or deleted link).
    AliasTaken,
    /// The idempotency key was used before with another body.
    IdempotencyMismatch,
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    AlreadyDeleted,
    NotFound,
}

/// A change to a link's state (`link_state`); the link itself never changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateUpdate {
    /// An operator's takedown: blocked (410) with `reason`, or, with `warn`, served through the
    /// warning interstitial instead (the reason is then only logged: a set `takedown_reason`
    /// means blocked).
    Takedown { reason: String, warn: bool },
    /// Undoes takedowns, flags and disablement (not deletion, not expiry).
    Restore,
    /// The owner's settings; `None` leaves a field as it is.
    Settings {
        disabled: Option<bool>,
        /// `Some(None)` clears the expiry.
        expires_at_ms: Option<Option<i64>>,
    },
}

impl StateUpdate {
    /// The state after this update. A deleted link's state is final and never changes.
    pub fn apply(&self, state: &LinkState) -> LinkState {
        let mut next = state.clone();
        if state.deleted {
            return next;
        }
        match self {
            StateUpdate::Takedown {
                reason,
                warn: false,
            } => {
                next.takedown_reason = Some(reason.clone());
                next.warn = false;
            }
            StateUpdate::Takedown { warn: true, .. } => {
                next.takedown_reason = None;
                next.warn = true;
            }
            StateUpdate::Restore => {
                next.takedown_reason = None;
                next.disabled = false;
                next.warn = false;
            }
            StateUpdate::Settings {
                disabled,
                expires_at_ms,
            } => {
                if let Some(d) = disabled {
                    next.disabled = *d;
                }
                if let Some(e) = expires_at_ms {
                    next.expires_at_ms = *e;
                }
            }
        }
        next
    }
}

/// What the standing denylist says about a link in `state`: disabled or taken down is
/// [`DenyKind::Gone`], flagged is [`DenyKind::Warn`]; deleted links are never listed (the
/// snapshot and the feed carry them), and expiry is the engine's own clock's business.
pub fn deny_kind(state: &LinkState) -> Option<DenyKind> {
    if state.deleted {
        None
    } else if state.disabled || state.takedown_reason.is_some() {
        Some(DenyKind::Gone)
    } else if state.warn {
        Some(DenyKind::Warn)
    } else {
        None
    }
}

/// A page of an owner's links, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPage {
    pub links: Vec<StoredLink>,
    /// Pass back as `cursor` for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Storage failures. Logical outcomes (alias taken, not found) are not errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("storage: {0}")]
    Storage(String),
    #[error("corrupt record for {what}: {detail}")]
    Corrupt { what: String, detail: String },
    #[error("the counter range of region {region} is exhausted")]
    CounterExhausted { region: u32 },
    #[error("bad cursor")]
    BadCursor,
    #[error("the store is shutting down")]
    ShuttingDown,
}

/// The durable record of links.
pub trait Store: Send + Sync + 'static {
    /// Creates a link (generated code, or the alias if given) durably.
    fn create(&self, req: CreateRequest) -> Result<CreateOutcome, StoreError>;
    /// A link and its state, whoever owns it.
    fn get(&self, code: &str) -> Result<Option<StoredLink>, StoreError>;
    /// An owner's links, newest first.
    fn list(&self, owner: &str, cursor: Option<&str>, limit: usize)
        -> Result<LinkPage, StoreError>;
    /// Soft delete: the URL is erased, the code stays claimed forever.
    fn delete(&self, code: &str) -> Result<DeleteOutcome, StoreError>;
    /// Changes a link's state durably (state, change-log entry and denylist in one
    /// transaction) and returns the link as it now is; `None` if the code never existed. An
    /// update that changes nothing writes nothing.
    fn update_state(
        &self,
        code: &str,
        update: StateUpdate,
    ) -> Result<Option<StoredLink>, StoreError>;
    /// Every code now disabled or taken down ([`DenyKind::Gone`]) or flagged
    /// ([`DenyKind::Warn`]), deleted ones excluded, from one consistent read, with the
    /// change-log sequence that read is complete up to.
    fn denied(&self) -> Result<(u64, Vec<(String, DenyKind)>), StoreError>;
    /// The highest committed change-log sequence, updated as soon as each commit is durable:
    /// the edge feed waits on it instead of polling.
    fn commits(&self) -> watch::Receiver<u64>;
    /// Change-log entries with sequence > `after`, in order, at most `limit`.
    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>, StoreError>;
    /// Highest committed change-log sequence (0 when empty).
    fn last_seq(&self) -> Result<u64, StoreError>;
    /// Every region's high-water mark: all counters ever leased there are below it.
    fn high_water_marks(&self) -> Result<Vec<(u32, u64)>, StoreError>;
    /// Calls `f` for every link (deleted ones included) from one consistent read, and returns
    /// the change-log sequence that read is complete up to.
    fn for_each_link(
        &self,
        f: &mut dyn FnMut(&StoredLink) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError>;
    /// Graceful shutdown: returns the unused part of the leased counter block.
    fn shutdown(&self) -> Result<(), StoreError>;
}
