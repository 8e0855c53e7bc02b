//! `lasthop-store`: the control plane's durable record, behind a trait so PostgreSQL can stand
//! beside the embedded default ([`embedded`], redb with group commit, counter-block leasing and
//! the ordered change log; [`postgres`], the shared store several control planes use, see
//! store/STORE.md), with the whole record's export and import ([`transfer`]), API key
//! records ([`keys`]), and one write path, for both backends, for the changes another region
//! sends (`replica.rs`: each backend supplies only its storage steps). It depends on
//! `lasthop-core` and `lasthop-trust` alone (the wall clock and one-line error chains are
//! core's, re-exported here).
//!
//! Every method is synchronous and may block on disk; async callers run them on the blocking
//! pool. A `create` that returns `Created` is durable: the link, its state, the owner index, the
//! change-log entry and any counter lease are committed (fsync) in one transaction; so is a
//! state change with its change-log entry and its denylist entry.

pub mod embedded;
pub mod keys;
#[cfg(feature = "postgres")]
pub mod postgres;
mod replica;
pub mod transfer;

use std::sync::Arc;

use lasthop_core::feed::DenyKind;
use lasthop_core::{Change, CodeScheme, Hold, Link, LinkState};
use lasthop_trust::CanonicalHost;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use lasthop_core::error_chain::{chain, Cause};
pub use lasthop_core::{clock, error_chain};

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

/// Who made a change: the audit trail's `actor`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Actor {
    /// A caller of the API, by the public id of its key (`lhk_…`).
    Key(String),
    /// The scanner's verdict (heuristics and the webhook).
    Scanner,
    /// A reputation list, by name (a reload's time-bomb takedowns).
    List(String),
    /// The creation-velocity rule.
    Velocity,
    /// The control plane itself (e.g. an operator's CLI).
    System,
    /// Another region, whose change this is (replication between regions).
    Region(u32),
    /// A change another region forwarded to this one (the link's home), as its actor there.
    Forwarded(String),
}

impl Actor {
    /// Automatic actors never override an admin's decision: a pinned link ignores them.
    pub fn automatic(&self) -> bool {
        matches!(self, Actor::Scanner | Actor::List(_) | Actor::Velocity)
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Key(id) => f.write_str(id),
            Actor::Scanner => f.write_str("scanner"),
            Actor::List(name) => write!(f, "list:{name}"),
            Actor::Velocity => f.write_str("velocity"),
            Actor::System => f.write_str("system"),
            Actor::Region(r) => write!(f, "region:{r}"),
            Actor::Forwarded(who) => write!(f, "forwarded:{who}"),
        }
    }
}

/// One append-only audit record: when, who, what, why. It names the code, never the
/// destination, so erasing a link's URL leaves nothing of it behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub at_ms: i64,
    /// [`Actor`]'s text.
    pub actor: String,
    /// `created`, `takedown`, `warn`, `restore`, `disable`, `enable`, `expiry`, `hold`,
    /// `release`, `pin`, `unpin`, `delete`, `reported`, `appeal`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a restore or release: what it undid (`takedown: phishing`, `warn`, `disabled`,
    /// `held: velocity`), so the reason that was lifted is never lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undid: Option<String>,
    /// The change this record was written with: the region that made it and that region's
    /// change-log sequence. Replication between regions carries it, so a record is copied to
    /// every region exactly once and a region's history shows where each action was taken.
    /// Absent on records no change goes with (a report, an appeal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

impl AuditRecord {
    /// `action` by `actor` at `at_ms`, undoing nothing; its origin is set where it replicates.
    pub fn new(at_ms: i64, actor: String, action: &str, reason: Option<String>) -> AuditRecord {
        AuditRecord {
            at_ms,
            actor,
            action: action.to_string(),
            reason,
            undid: None,
            origin: None,
        }
    }

    /// A link created held (the one creation that gets a record: it says more than the link).
    pub fn created_held(at_ms: i64, actor: &Actor, hold: Hold) -> AuditRecord {
        let reason = Some(format!("held: {}", hold.as_str()));
        AuditRecord::new(at_ms, actor.to_string(), "created", reason)
    }

    /// A link erased by `actor`, now.
    pub fn deleted(actor: &Actor) -> AuditRecord {
        AuditRecord::new(crate::clock::now_ms(), actor.to_string(), "delete", None)
    }

    /// A report or an appeal filed about a link (`report.id` already assigned).
    pub fn filed(report: &Report) -> AuditRecord {
        let (actor, action) = match report.kind {
            ReportKind::Report => ("public".to_string(), "reported"),
            ReportKind::Appeal => (report.by.clone().unwrap_or_default(), "appeal"),
        };
        let reason = Some(format!("report {}: {}", report.id, report.reason));
        AuditRecord::new(report.created_at_ms, actor, action, reason)
    }
}

/// Where an audit record comes from ([`AuditRecord::origin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub region: u32,
    pub seq: u64,
}

/// Everything a create needs; URL and alias are already validated.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub owner: String,
    pub long_url: String,
    /// The branded domain the link is made on (`None`: the default domain). The link's code
    /// in the record is then its key, `domain/code` ([`lasthop_core::link_key`]).
    pub domain: Option<String>,
    /// A custom alias (unique on its domain); `None` mints a generated code (unique on all).
    pub alias: Option<String>,
    pub expires_at_ms: Option<i64>,
    pub idempotency: Option<IdempotencyClaim>,
    pub now_ms: i64,
    /// Created held (the interstitial until released).
    pub hold: Option<Hold>,
    /// How its redirect is served (issue 43).
    pub options: lasthop_core::LinkOptions,
    /// The owner's tags, checked ([`lasthop_core::tag_ok`], at most [`lasthop_core::TAGS_MAX`]).
    pub tags: Vec<String>,
    /// Who creates it, for the audit trail.
    pub actor: Actor,
    /// `long_url`'s destination, when the caller parsed it already (the store's writer then
    /// does not parse it again for the destination index).
    pub destination: Option<lasthop_trust::Destination>,
    /// Moved in from another shortener with its old code (`alias`, any of
    /// [`lasthop_core::code::legacy_shape`]'s codes): see [`Imported`].
    pub imported: Option<Imported>,
}

/// An imported link (issue 44): its old code is kept, whatever its shape. A code of an alias's
/// shape is stored as an alias; one of a legacy code's shape is also added to [`LEGACY_SET`]
/// (which the snapshot's legacy set is built from); a 7-character base62 code, an FF1 output
/// under our key too, is a *claim*: its counter value n must be above every counter its region
/// ever leased (else [`CreateOutcome::Collision`]), is added to [`CLAIMED_SET`]
/// ([`claimed_entry`]) so no lease hands it out, and its key to [`LEGACY_SET`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    /// When the old shortener made it (`None`: the import's time).
    pub created_at_ms: Option<i64>,
    /// Its clicks there (`LinkState::imported_clicks`), when the import keeps them.
    pub clicks: Option<u64>,
}

/// The code set of every link key an import made that is no alias (a legacy code, or a claimed
/// 7-character code): the snapshot's legacy set holds them all.
pub const LEGACY_SET: &str = "legacy";
/// The code set of claimed counter values ([`claimed_entry`]), which counter leases skip.
pub const CLAIMED_SET: &str = "claimed";

/// A claimed counter's entry in [`CLAIMED_SET`]: 13 decimal digits (62^7 < 10^13), so the
/// entries sort as the counters do.
pub fn claimed_entry(n: u64) -> String {
    format!("{n:013}")
}

/// What an imported `code` would claim in the region of counter range `range`: `Ok(Some(n))`
/// for a 7-character base62 code (its counter n, in `range`), `Ok(None)` for any other code
/// (nothing to claim), `Err(why)` for a collision. The caller then checks n against its
/// region's mark with [`claim_below_mark`], which only it can read.
pub fn claimed_counter(
    scheme: &CodeScheme,
    range: &std::ops::Range<u64>,
    code: &str,
) -> Result<Option<u64>, String> {
    if lasthop_core::classify(code.as_bytes()) != lasthop_core::CodeKind::Generated {
        return Ok(None);
    }
    let n = scheme
        .decode(code.as_bytes())
        .ok_or_else(|| "not a code under this key".to_string())?;
    if !range.contains(&n) {
        return Err(format!(
            "its counter value {n} is in another region's range: import it there"
        ));
    }
    Ok(Some(n))
}

/// Why claiming counter `n` is a collision when its region's leases reached `mark`: one below
/// it may have been issued.
pub fn claim_below_mark(n: u64, mark: u64) -> Option<String> {
    (n < mark).then(|| {
        format!(
            "its counter value {n} is below the high-water mark {mark}: the generator may have \
             issued it"
        )
    })
}

/// The saved position of the replication from region `region` ([`Store::position`]): the
/// last of that region's change-log sequences applied here.
pub fn peer_position(region: u32) -> String {
    format!("peer/{region}")
}

/// One change another region originated, as it is applied here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatedChange {
    /// Its sequence in the originating region's log: one at or below the saved position is
    /// skipped (a page applied twice, or by two control planes of a region at once).
    pub seq: u64,
    pub change: Change,
    /// The originating region is the link's home: its state replaces ours. Otherwise only
    /// what it restricts is applied (a takedown, a flag, a disablement, a deletion issued
    /// there applies here at once; lifting one is the home's to decide).
    pub authoritative: bool,
    /// The audit records the originating region wrote with it (each with its
    /// [`AuditRecord::origin`]), added to the link's history here whatever the rule does.
    pub audit: Vec<AuditRecord>,
}

/// One change this region originated, with the audit records written with it: what a peer
/// region reads ([`Store::own_changes_since`], `GET /peer/v1/changes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnChange {
    pub seq: u64,
    pub change: Change,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditRecord>,
}

/// A page of another region's own changes, applied in one transaction with the position it
/// reaches, so a restart resumes exactly after it.
#[derive(Debug, Clone)]
pub struct Replicated {
    /// The originating region.
    pub region: u32,
    pub changes: Vec<ReplicatedChange>,
    /// That region's high-water mark: its codes below it are issued (edges must not 404 them).
    pub high_water: u64,
    /// The originating region's change-log sequence this page is complete up to.
    pub position: u64,
}

/// What a replicated page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicateOutcome {
    /// Changes that changed something here.
    pub applied: usize,
    /// Changes already here (a page applied twice, a link we have) or not ours to apply.
    pub skipped: usize,
}

/// `theirs` as far as it restricts `ours`: a takedown, a flag, a disablement or a deletion
/// `theirs` has is added; nothing `ours` has is lifted.
pub fn restrict(ours: &LinkState, theirs: &LinkState) -> LinkState {
    let mut next = ours.clone();
    if ours.deleted {
        return next;
    }
    next.deleted |= theirs.deleted;
    next.disabled |= theirs.disabled;
    if next.takedown_reason.is_none() && theirs.takedown_reason.is_some() {
        next.takedown_reason = theirs.takedown_reason.clone();
        next.warn = false;
    }
    if next.takedown_reason.is_none() {
        next.warn |= theirs.warn;
    }
    next
}

/// Another region's state of a link as this region applies it: the link's home region's
/// (`authoritative`) replaces ours, any other's only restricts it ([`restrict`]). `None` when
/// that changes nothing, or ours is deleted (final).
pub fn replicated_state(
    ours: &LinkState,
    theirs: &LinkState,
    authoritative: bool,
) -> Option<LinkState> {
    let next = if authoritative {
        theirs.clone()
    } else {
        restrict(ours, theirs)
    };
    (next != *ours && !ours.deleted).then_some(next)
}

/// Calls `f` for every change after `after` up to `up_to`, in order, reading the log `page`
/// changes at a time; returns how many changes it read.
pub fn walk_changes(
    store: &dyn Store,
    after: u64,
    up_to: u64,
    page: usize,
    f: &mut dyn FnMut(u64, Change),
) -> Result<u64, StoreError> {
    let (mut cursor, mut read) = (after, 0u64);
    loop {
        let changes = store.changes_since(cursor, page)?;
        let Some(&(last, _)) = changes.last() else {
            return Ok(read);
        };
        read += changes.len() as u64;
        for (seq, change) in changes {
            if seq > up_to {
                return Ok(read);
            }
            f(seq, change);
        }
        cursor = last;
    }
}

/// The code set of the links an owner's suspension took down (`suspension/<owner>`), so an
/// unsuspension restores exactly those.
pub fn suspension_set(owner: &str) -> String {
    format!("suspension/{owner}")
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
    /// An imported 7-character code whose counter value may already have been issued (at or
    /// below its region's high-water mark), or that belongs to another region's range.
    Collision(String),
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    AlreadyDeleted,
    NotFound,
}

/// A scan or list verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Clean,
    Warn,
    Block,
}

impl Verdict {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Warn => "warn",
            Verdict::Block => "block",
        }
    }
}

/// A change to a link's state (`link_state`); the link itself never changes. It travels as
/// JSON (`{"type": "restore"}`) when a region forwards it to the link's home region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StateUpdate {
    /// An operator's takedown: blocked (410) with `reason`, or, with `warn`, served through the
    /// warning interstitial instead (the reason is then kept in the audit record only: a set
    /// `takedown_reason` means blocked).
    Takedown { reason: String, warn: bool },
    /// An admin's restore: undoes takedowns, flags, holds and disablement (not deletion, not
    /// expiry) and pins the link against automatic verdicts.
    Restore,
    /// The owner's settings; `None` leaves a field as it is.
    Settings {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disabled: Option<bool>,
        /// `Some(None)` clears the expiry (`null` in JSON; absent leaves it).
        #[serde(
            default,
            deserialize_with = "present",
            skip_serializing_if = "Option::is_none"
        )]
        expires_at_ms: Option<Option<i64>>,
        /// The redirect's options (issue 43) that change; absent leaves them all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        options: Option<lasthop_core::OptionsPatch>,
        /// The link's tags, all of them (absent leaves them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tags: Option<Vec<String>>,
    },
    /// An automatic verdict (scanner or list): `Block` takes the link down with `reason`,
    /// `Warn` flags it; either ends an `Unverified` hold, and so does `Clean`. Verdicts only
    /// ever tighten a link's state, and a pinned link ignores them.
    Verdict { verdict: Verdict, reason: String },
    /// An owner's suspension: takes a live link down with `reason`, leaving one already taken
    /// down (for its own reason) and the flag as they are, so [`StateUpdate::Lift`] undoes it
    /// exactly. Decided in the transaction, so a list takedown racing it is never replaced.
    Suspend { reason: String },
    /// Lifts a takedown whose reason is exactly `reason` (an unsuspension undoing its own
    /// takedowns) and nothing else; no pin.
    Lift { reason: String },
    /// Ends a hold of this kind, if the link has one.
    Release { hold: Hold },
    /// Lets automatic verdicts apply again.
    Unpin,
    /// An owner's destination edit (issue 43), checked by the API as a create's destination
    /// is. `hold`: `Unverified` keeps the current destination served until the new one's
    /// first verdict ([`StateUpdate::EditVerdict`]); `Velocity` serves the new one through the
    /// interstitial until an admin releases it, as a held create. `from` and `to` are the
    /// destinations' hashes ([`destination_hash`]), all the audit trail keeps of them.
    Edit {
        long_url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hold: Option<Hold>,
        from: String,
        to: String,
    },
    /// The scanner's first verdict on an edited destination whose hash is `to`: on a pending
    /// edit, `Clean` or `Warn` makes it current (`Warn` flagged), `Block` refuses it and keeps
    /// the destination served before; on an edit already served, `Block` takes the link down
    /// and `Warn` flags it, as a created link's first verdict. A verdict on a destination the
    /// link no longer has changes nothing.
    EditVerdict {
        verdict: Verdict,
        reason: String,
        to: String,
    },
}

/// A destination's hash as the audit trail records it: the first 16 hex digits of its
/// SHA-256, enough to tell edits apart and to check a URL one holds, never the URL.
pub fn destination_hash(url: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(url.as_bytes())[..8])
}

/// A field that is present (`null` included) is `Some`; an absent one is `None` (`default`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
    Option::<i64>::deserialize(d).map(Some)
}

impl StateUpdate {
    /// Whether this update, from `before`, only adds restrictions (a takedown, a flag, a
    /// disablement): such a change applies in any region at once. Anything else (lifting one,
    /// an expiry, a pin) is the home region's to apply.
    pub fn restricts_only(&self, before: &LinkState, actor: &Actor) -> bool {
        let after = self.apply(before, actor);
        restrict(before, &after) == after
    }

    /// The state after this update by `actor`. A deleted link's state is final and never
    /// changes; a pinned one ignores automatic actors.
    pub fn apply(&self, state: &LinkState, actor: &Actor) -> LinkState {
        let mut next = state.clone();
        if state.deleted {
            return next;
        }
        // An edit's verdict judges the new destination, not the link: a pinned link's edit
        // is refused by a block all the same (the pin vouched for the old destination), but
        // the pin keeps automatic flags and takedowns off the link itself.
        if let StateUpdate::EditVerdict {
            verdict,
            reason,
            to,
        } = self
        {
            let hash_of = |u: &Option<String>| u.as_deref().map(destination_hash);
            if hash_of(&state.pending_destination).as_deref() == Some(to.as_str()) {
                let pending = next.pending_destination.take();
                if *verdict != Verdict::Block {
                    next.destination = pending;
                    next.destination_unscanned = false;
                    if *verdict == Verdict::Warn && !state.pinned && next.takedown_reason.is_none()
                    {
                        next.warn = true;
                    }
                }
            } else if state.destination_unscanned
                && hash_of(&state.destination).as_deref() == Some(to.as_str())
            {
                next.destination_unscanned = false;
                if !state.pinned && next.takedown_reason.is_none() {
                    match verdict {
                        Verdict::Clean => {}
                        Verdict::Warn => next.warn = true,
                        Verdict::Block => {
                            next.takedown_reason = Some(reason.clone());
                            next.warn = false;
                        }
                    }
                }
            }
            return next;
        }
        if state.pinned && actor.automatic() {
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
                next.held = None;
                next.pinned = true;
            }
            StateUpdate::Settings {
                disabled,
                expires_at_ms,
                options,
                tags,
            } => {
                if let Some(d) = disabled {
                    next.disabled = *d;
                }
                if let Some(e) = expires_at_ms {
                    next.expires_at_ms = *e;
                }
                if let Some(o) = options {
                    next.options = o.apply(next.options);
                }
                if let Some(t) = tags {
                    next.tags.clone_from(t);
                }
            }
            StateUpdate::Verdict { verdict, reason } => {
                if next.held == Some(Hold::Unverified) {
                    next.held = None;
                }
                match verdict {
                    Verdict::Clean => {}
                    Verdict::Warn => {
                        if next.takedown_reason.is_none() {
                            next.warn = true;
                        }
                    }
                    Verdict::Block => {
                        if next.takedown_reason.is_none() {
                            next.takedown_reason = Some(reason.clone());
                            next.warn = false;
                        }
                    }
                }
            }
            StateUpdate::Suspend { reason } => {
                if next.takedown_reason.is_none() {
                    next.takedown_reason = Some(reason.clone());
                }
            }
            StateUpdate::Lift { reason } => {
                if next.takedown_reason.as_deref() == Some(reason.as_str()) {
                    next.takedown_reason = None;
                }
            }
            StateUpdate::Release { hold } => {
                if next.held == Some(*hold) {
                    next.held = None;
                }
            }
            StateUpdate::Unpin => next.pinned = false,
            StateUpdate::Edit { long_url, hold, .. } => {
                // An admin's pin vouched for the destination it restored, not for this one:
                // automatic verdicts (the scanner's, the lists') apply again.
                next.pinned = false;
                if *hold == Some(Hold::Unverified) {
                    next.pending_destination = Some(long_url.clone());
                } else {
                    next.destination = Some(long_url.clone());
                    next.pending_destination = None;
                    next.destination_unscanned = true;
                    if *hold == Some(Hold::Velocity) {
                        next.held = Some(Hold::Velocity);
                    }
                }
            }
            StateUpdate::EditVerdict { .. } => {}
        }
        next
    }

    /// The audit record of this update by `actor` at `at_ms`, given the state before and
    /// after (only called when they differ).
    pub fn audit(
        &self,
        before: &LinkState,
        after: &LinkState,
        actor: &Actor,
        at_ms: i64,
    ) -> AuditRecord {
        let (action, reason): (&str, Option<String>) = match self {
            StateUpdate::Takedown {
                reason,
                warn: false,
            } => ("takedown", Some(reason.clone())),
            StateUpdate::Takedown { reason, warn: true } => ("warn", Some(reason.clone())),
            StateUpdate::Suspend { reason } => ("takedown", Some(reason.clone())),
            StateUpdate::Restore | StateUpdate::Lift { .. } => ("restore", None),
            StateUpdate::Settings { .. } => {
                if before.disabled != after.disabled {
                    (if after.disabled { "disable" } else { "enable" }, None)
                } else if before.tags != after.tags {
                    ("tags", Some(after.tags.join(", ")))
                } else if before.options != after.options {
                    let o = &after.options;
                    (
                        "options",
                        Some(format!(
                            "redirect_status {}, cache_seconds {}, forward_query {}{}",
                            o.redirect_status,
                            o.cache_seconds,
                            o.forward_query,
                            if o.request_precedence {
                                " (request first)"
                            } else {
                                ""
                            }
                        )),
                    )
                } else {
                    (
                        "expiry",
                        Some(match after.expires_at_ms {
                            Some(at) => format!("expires at {}", crate::clock::rfc3339(at)),
                            None => "no expiry".to_string(),
                        }),
                    )
                }
            }
            StateUpdate::Verdict { reason, .. } => {
                let action = if after.takedown_reason.is_some() && before.takedown_reason.is_none()
                {
                    "takedown"
                } else if after.warn && !before.warn {
                    "warn"
                } else {
                    "release"
                };
                (action, Some(reason.clone()))
            }
            StateUpdate::Release { .. } => ("release", None),
            StateUpdate::Unpin => ("unpin", None),
            StateUpdate::Edit { hold, from, to, .. } => (
                "edit",
                Some(format!(
                    "destination {from} -> {to}{}{}",
                    match hold {
                        Some(Hold::Unverified) => ", held until its first verdict",
                        Some(Hold::Velocity) => ", held: creation velocity",
                        None => "",
                    },
                    if before.pinned { ", unpinned" } else { "" }
                )),
            ),
            StateUpdate::EditVerdict {
                verdict,
                reason,
                to,
            } => {
                let refused = before.pending_destination.is_some()
                    && after.pending_destination.is_none()
                    && after.destination == before.destination;
                let action = if refused {
                    "edit_refused"
                } else if after.takedown_reason.is_some() && before.takedown_reason.is_none() {
                    "takedown"
                } else if after.warn && !before.warn {
                    "warn"
                } else if before.pending_destination.is_some() {
                    "edit_applied"
                } else {
                    "edit_verdict"
                };
                (
                    action,
                    Some(format!("{to}: {} ({reason})", verdict.as_str())),
                )
            }
        };
        let undid = match self {
            StateUpdate::Restore | StateUpdate::Lift { .. } | StateUpdate::Release { .. } => {
                undone(before, after)
            }
            // A warn on a taken-down link lifts the takedown: say so.
            StateUpdate::Takedown { warn: true, .. } => undone(before, after),
            StateUpdate::Verdict { .. } if before.held.is_some() && after.held.is_none() => {
                undone(before, after)
            }
            _ => None,
        };
        AuditRecord {
            undid,
            ..AuditRecord::new(at_ms, actor.to_string(), action, reason)
        }
    }
}

/// What went from `before` to `after`: the restrictions lifted, in words.
fn undone(before: &LinkState, after: &LinkState) -> Option<String> {
    let mut parts = Vec::new();
    if let (Some(r), None) = (&before.takedown_reason, &after.takedown_reason) {
        parts.push(format!("takedown: {r}"));
    }
    if before.warn && !after.warn {
        parts.push("warn".to_string());
    }
    if before.disabled && !after.disabled {
        parts.push("disabled".to_string());
    }
    if let (Some(h), None) = (before.held, after.held) {
        parts.push(format!("held: {}", h.as_str()));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A page of an owner's links, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPage {
    pub links: Vec<StoredLink>,
    /// Pass back as `cursor` for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// One state change of a [`Store::apply_batch`].
#[derive(Debug, Clone)]
pub struct BatchUpdate {
    pub code: String,
    pub update: StateUpdate,
}

/// State changes by one actor, committed in one transaction.
#[derive(Debug, Clone)]
pub struct Batch {
    pub updates: Vec<BatchUpdate>,
    pub actor: Actor,
    pub now_ms: i64,
    /// Adds every code whose state this batch changed to this code set.
    pub mark_changed: Option<String>,
    /// Removes every code of the batch (changed or not) from this code set.
    pub unmark: Option<String>,
    /// Named positions of background walks (the scanner's in the change log, the re-scan's in
    /// the links), written in the same transaction as the verdicts they got to
    /// ([`Store::position`]).
    pub positions: Vec<(String, String)>,
}

/// [`Store::position`] of the first scans: the change-log sequence every link created at or
/// before has had its verdict.
pub const SCAN_POSITION: &str = "scan";
/// [`Store::position`] of the re-scan: `<sweep start ms> <links cursor>`.
pub const RESCAN_POSITION: &str = "rescan";

/// What one update of a batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    pub code: String,
    /// The link as it now is; `None` if the code never existed.
    pub link: Option<StoredLink>,
    /// Whether its state changed (and so a change-log entry and an audit record were written).
    pub changed: bool,
}

/// A page of codes (index and code-set walks), in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodePage {
    pub codes: Vec<String>,
    /// Pass back as `after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// One destination-index entry: a link, and the hash of its URL's match key
/// ([`lasthop_trust::url_key_hash`]), so a URL entry is checked without reading links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub code: String,
    pub url_hash: u64,
}

/// A page of [`Store::codes_by_host`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPage {
    pub entries: Vec<HostEntry>,
    /// Pass back as `after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Where a report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportKind {
    /// Anyone, through `POST /v1/reports` or an edge page's form.
    Report,
    /// The link's owner, appealing a takedown.
    Appeal,
}

/// A report or an appeal in the review queue. Names the code, never the destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub id: u64,
    pub kind: ReportKind,
    pub code: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    pub created_at_ms: i64,
    /// For an appeal, the owner who sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
}

/// How a report was closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// `takedown`, `warn`, `restore` or `dismiss`.
    pub action: String,
    /// The admin key's public id.
    pub by: String,
    pub at_ms: i64,
}

/// Which reports a listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFilter {
    Open,
    Resolved,
    All,
}

/// A page of reports, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPage {
    pub reports: Vec<Report>,
    pub next_cursor: Option<String>,
}

/// What trust and safety know about an owner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flagged: Option<OwnerFlag>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<Suspension>,
    /// When the last suspension was lifted. With [`Suspension::at_ms`] it orders suspensions
    /// between regions: each region copies a peer's record when the peer's latest suspension
    /// event ([`OwnerRecord::suspension_event_ms`]) is newer than its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsuspended_at_ms: Option<i64>,
}

impl OwnerRecord {
    /// The time of the latest suspension or unsuspension; `None` for an owner never suspended.
    pub fn suspension_event_ms(&self) -> Option<i64> {
        self.suspended
            .as_ref()
            .map(|s| s.at_ms)
            .max(self.unsuspended_at_ms)
    }
}

/// A branded short domain: who holds it, how its edge answers, whether it is suspended. The
/// fleet's own short domain (`--short-base`) is not one: it is the default domain, held by no
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainRecord {
    /// Lowercase ASCII, IDN labels as punycode, no trailing dot.
    pub domain: String,
    pub owner: String,
    pub created_at_ms: i64,
    /// 1 when created, one more on every write ([`Store::write_domain`] compares it).
    pub revision: u64,
    #[serde(default)]
    pub settings: DomainSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<DomainSuspension>,
    /// The domain's own certificate, once it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<DomainCertificate>,
    /// Where its ACME certificate stands (`lasthop-control serve --acme-directory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<Box<DomainAcme>>,
}

/// A domain's automatic certificate (README "Automatic certificates"): the order in progress
/// and who holds it, the challenge answer the engines publish meanwhile, and how the last
/// attempts went. Kept in the domain's record, so every control plane on one store sees one
/// state and one holder (the record's revision makes taking the lock a compare-and-swap).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainAcme {
    /// The control plane ordering for the domain now, until when (a lease: a holder that dies
    /// frees it by letting it lapse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<AcmeLock>,
    /// The challenge answer every engine serves while the CA validates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<AcmeChallenge>,
    /// The last attempt's error (the CA's problem document, or why it could not be asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the last attempt ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<i64>,
    /// Failed attempts in a row (the backoff doubles with each).
    #[serde(default)]
    pub failures: u32,
    /// No attempt before this (the backoff after a failure, or a rate limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<i64>,
    /// An admin asked for a new certificate now (`POST /v1/domains/{domain}/renew`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_requested_ms: Option<i64>,
    /// When each order of the last day was placed (the per-domain rate limit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orders_ms: Vec<i64>,
    /// When the CA's renewal information (RFC 9773) says to renew the current certificate,
    /// where it offers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ari_renew_at_ms: Option<i64>,
}

/// An order's hold on a domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeLock {
    pub holder: String,
    pub until_ms: i64,
}

/// A challenge answer: HTTP-01's key authorization at `/.well-known/acme-challenge/TOKEN`,
/// or TLS-ALPN-01's certificate and key for `acme-tls/1`. Its `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeChallenge {
    /// `http-01` or `tls-alpn-01`.
    pub kind: String,
    pub token: String,
    pub key_authorization: String,
    /// TLS-ALPN-01: the self-signed certificate carrying the key authorization's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_pem: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_pem: Option<String>,
}

impl std::fmt::Debug for AcmeChallenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcmeChallenge")
            .field("kind", &self.kind)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// A domain's certificate and private key (PEM), checked when stored
/// (`lasthop_tls::certificate::check`). Its `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainCertificate {
    /// Leaf first.
    pub chain_pem: String,
    pub key_pem: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    /// The leaf's issuer (RFC 4514).
    pub issuer: String,
    pub stored_at_ms: i64,
    /// `upload` (`PUT /v1/domains/{domain}/certificate`).
    pub source: String,
}

impl std::fmt::Debug for DomainCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainCertificate")
            .field("not_before_ms", &self.not_before_ms)
            .field("not_after_ms", &self.not_after_ms)
            .field("issuer", &self.issuer)
            .field("stored_at_ms", &self.stored_at_ms)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A domain's own answers at the edge (`PATCH /v1/domains/{domain}`). Stored and shown by the
/// API; the engines do not apply them yet (they come with the domains' namespaces).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainSettings {
    /// Where `GET /` on the domain redirects; `None`: the fleet's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_redirect: Option<String>,
    /// Where a code the domain does not have redirects; `None`: the fleet's 404 page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_found_redirect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<Hsts>,
    /// The old shortener a code the domain does not have is asked of (issue 44's lazy
    /// fallback): an `http(s)` URL template with `{code}`, e.g. `https://old.example/{code}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_fallback: Option<String>,
}

/// `Strict-Transport-Security` for a domain's HTTPS answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hsts {
    pub max_age: u32,
    #[serde(default)]
    pub include_subdomains: bool,
    #[serde(default)]
    pub preload: bool,
}

/// An admin's suspension of a domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainSuspension {
    pub at_ms: i64,
    /// The admin key's public id.
    pub by: String,
    pub reason: String,
}

/// Flagged by the creation-velocity rule: new links are created held until an admin clears it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerFlag {
    pub at_ms: i64,
    pub reason: String,
    /// Distinct destination domains in the hour up to the flag.
    pub domains_last_hour: u64,
    /// The limit it passed.
    pub limit: u64,
}

/// An account suspension: the owner's keys answer 401 `key_suspended`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    pub at_ms: i64,
    /// The admin key's public id.
    pub by: String,
    pub reason: String,
    pub takedown_links: bool,
    /// The takedown reason its links carry, which the unsuspension lifts.
    pub takedown_reason: String,
}

/// Storage failures. Logical outcomes (alias taken, not found) are not errors.
///
/// A variant that wraps a [`Cause`] writes it, with its whole chain, into its own message and
/// does not also report it as its `source`: a log line shows the failure once, however it is
/// printed (`%e`, `{:#}`, or the binary's `Caused by:` list).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The embedded database (redb) failed.
    #[error("embedded store: {}", chain(.0))]
    Embedded(Cause),
    /// The store named needs a backend this build does not have (a `postgres://` store
    /// without the `postgres` feature).
    #[error("{0}: this build has no `postgres` feature (the PostgreSQL store)")]
    NotBuilt(&'static str),
    /// PostgreSQL failed: `what` says where (a statement, the pool, migrations, the client's
    /// runtime).
    #[error("postgres {what}: {}", chain(cause))]
    Postgres { what: &'static str, cause: Cause },
    /// A connection to the store could not be made or secured: the message names the store,
    /// the `sslmode` in force and, where it can, what to change.
    #[error("{0}")]
    Connect(String),
    /// A file kept beside the store (an export, the API keys, a snapshot, the edge token).
    #[error("{what}: {}", chain(cause))]
    File { what: &'static str, cause: Cause },
    /// A record could not be encoded.
    #[error("encoding a record: {0}")]
    Encode(#[from] serde_json::Error),
    /// The store's own rules refuse the operation: another permutation key, an import into a
    /// store that holds links.
    #[error("{0}")]
    Refused(String),
    /// The batch an operation was in did not commit; `cause` is the commit's error.
    #[error("commit failed: {cause}")]
    CommitFailed { cause: String },
    /// The writer ended before it applied the operation.
    #[error("not applied ({0})")]
    NotApplied(&'static str),
    /// A worker thread or task the store relies on panicked or could not run.
    #[error("{what}: {}", chain(cause))]
    Task { what: &'static str, cause: Cause },
    #[error("corrupt record for {what}: {detail}")]
    Corrupt { what: String, detail: String },
    #[error("the counter range of region {region} is exhausted")]
    CounterExhausted { region: u32 },
    #[error("bad cursor")]
    BadCursor,
    #[error("the store is shutting down")]
    ShuttingDown,
}

/// A record that does not decode: `what` it is and why.
pub(crate) fn corrupt<E: std::fmt::Display>(what: &str, e: E) -> StoreError {
    StoreError::Corrupt {
        what: what.to_string(),
        detail: e.to_string(),
    }
}

/// Observes each group commit: (operations, seconds from begin to durable).
pub type CommitObserver = Arc<dyn Fn(usize, f64) + Send + Sync>;

/// The durable record of links.
pub trait Store: Send + Sync + 'static {
    /// Creates a link (generated code, or the alias if given) durably.
    fn create(&self, req: CreateRequest) -> Result<CreateOutcome, StoreError>;
    /// Creates several links in one transaction, all or nothing: an error writes none of them
    /// (an outcome such as [`CreateOutcome::AliasTaken`] is an answer, not an error). An
    /// import's batch (issue 44).
    fn create_many(&self, reqs: Vec<CreateRequest>) -> Result<Vec<CreateOutcome>, StoreError>;
    /// A link and its state, whoever owns it.
    fn get(&self, code: &str) -> Result<Option<StoredLink>, StoreError>;
    /// [`Store::get`] of each code, from one consistent read where the store can.
    fn get_many(&self, codes: &[String]) -> Result<Vec<Option<StoredLink>>, StoreError> {
        codes.iter().map(|c| self.get(c)).collect()
    }
    /// An owner's links, newest first.
    fn list(&self, owner: &str, cursor: Option<&str>, limit: usize)
        -> Result<LinkPage, StoreError>;
    /// The [`Store::list`] cursor that continues just after the link created at change `seq`
    /// (a page cut short by a filter ends there).
    fn list_cursor_after(&self, seq: u64) -> String;
    /// Soft delete: the URL and its destination-index entries are erased, the code stays
    /// claimed forever; an audit record says who.
    fn delete(&self, code: &str, actor: &Actor) -> Result<DeleteOutcome, StoreError>;
    /// Changes a link's state durably (state, change-log entry, denylist and audit record in
    /// one transaction) and returns the link as it now is; `None` if the code never existed.
    /// An update that changes nothing writes nothing.
    fn update_state(
        &self,
        code: &str,
        update: StateUpdate,
        actor: &Actor,
    ) -> Result<Option<StoredLink>, StoreError> {
        let batch = Batch {
            updates: vec![BatchUpdate {
                code: code.to_string(),
                update,
            }],
            actor: actor.clone(),
            now_ms: crate::clock::now_ms(),
            mark_changed: None,
            unmark: None,
            positions: Vec::new(),
        };
        Ok(self
            .apply_batch(batch)?
            .into_iter()
            .next()
            .and_then(|r| r.link))
    }
    /// Applies a batch of state changes in one transaction (each as [`Store::update_state`]
    /// would), with its code-set bookkeeping; one result per update, in order.
    fn apply_batch(&self, batch: Batch) -> Result<Vec<BatchResult>, StoreError>;
    /// Every code now disabled or taken down ([`DenyKind::Gone`]) or flagged
    /// ([`DenyKind::Warn`]), deleted ones excluded, from one consistent read, with the
    /// change-log sequence that read is complete up to.
    fn denied(&self) -> Result<(u64, Vec<(String, DenyKind)>), StoreError>;
    /// The highest committed change-log sequence, updated as soon as each commit is durable:
    /// the edge feed waits on it instead of polling.
    fn commits(&self) -> watch::Receiver<u64>;
    /// Bytes the store's own page cache holds in this process (the embedded store's redb
    /// cache); `None` for a store whose cache lives in its server.
    fn cache_bytes(&self) -> Option<u64> {
        None
    }
    /// A background walk's saved position ([`SCAN_POSITION`], [`RESCAN_POSITION`]); `None`
    /// before it ever saved one.
    fn position(&self, name: &str) -> Result<Option<String>, StoreError>;
    /// Change-log entries with sequence > `after`, in order, at most `limit`.
    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>, StoreError>;
    /// The changes after `after` this region originated (not those replicated from another),
    /// at most `limit`, and the sequence the read is complete up to (past the last change
    /// returned when replicated ones follow it), for a peer region's replication. A read may
    /// stop early (a long run of replicated entries): the caller continues from that sequence.
    fn own_changes_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<OwnChange>, u64), StoreError> {
        let _ = (after, limit);
        Err(StoreError::Refused(
            "this store does not replicate between regions yet".into(),
        ))
    }
    /// Applies a page of another region's own changes ([`Replicated`]) with its position, in
    /// one transaction; the changes it writes here are marked as that region's, so they are
    /// never sent back.
    fn replicate(&self, page: Replicated) -> Result<ReplicateOutcome, StoreError> {
        let _ = page;
        Err(StoreError::Refused(
            "this store does not replicate between regions yet".into(),
        ))
    }
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
    /// Calls `f` for every link in key order, starting after the key `after` (a value of a
    /// previous page's `next`), at most `limit`; the scanner's re-check walks the store so.
    fn scan_links(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StoredLink>, Option<String>), StoreError>;
    /// How many links (deleted ones included) the store holds.
    fn count_links(&self) -> Result<u64, StoreError>;
    /// The links whose destination is `host` (and, with `subdomains`, one of its subdomains),
    /// from the destination index kept in the links' own transactions: in index order, after
    /// `after` (a previous page's `next`), at most `limit`.
    fn codes_by_host(
        &self,
        host: &CanonicalHost,
        subdomains: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Result<HostPage, StoreError>;
    /// The codes in a code set, in order, after `after`, at most `limit`.
    fn code_set(
        &self,
        set: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CodePage, StoreError>;
    /// A link's audit records, oldest first.
    fn history(&self, code: &str) -> Result<Vec<AuditRecord>, StoreError>;
    /// Files a report (or appeal) with the next id, with a `reported`/`appeal` audit record on
    /// its code.
    fn add_report(&self, report: Report) -> Result<Report, StoreError>;
    /// One report.
    fn report(&self, id: u64) -> Result<Option<Report>, StoreError>;
    /// Reports, oldest first, that `filter` picks, after `cursor`, at most `limit`.
    fn reports(
        &self,
        filter: ReportFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ReportPage, StoreError>;
    /// Closes an open report; `None` if there is no such report, `Some(Err(report))` if it was
    /// already resolved.
    fn resolve_report(
        &self,
        id: u64,
        resolution: Resolution,
    ) -> Result<Option<Result<Report, Report>>, StoreError>;
    /// An owner's trust record, if any was ever written.
    fn owner(&self, owner: &str) -> Result<Option<OwnerRecord>, StoreError>;
    /// Writes an owner's trust record (an empty one is removed).
    fn put_owner(&self, record: OwnerRecord) -> Result<(), StoreError>;
    /// Every owner with a trust record, by name.
    fn owners(&self) -> Result<Vec<OwnerRecord>, StoreError>;
    /// How many links on the branded domain `domain` are not deleted, counted up to `limit`
    /// (a domain is deleted only once none is left).
    fn domain_links(&self, domain: &str, limit: u64) -> Result<u64, StoreError>;
    /// A branded domain's record.
    fn domain(&self, domain: &str) -> Result<Option<DomainRecord>, StoreError>;
    /// Every branded domain, by name.
    fn domains(&self) -> Result<Vec<DomainRecord>, StoreError>;
    /// A number that grows with every write of any domain record ([`Store::write_domain`],
    /// an import): one more, or the write's time in Unix milliseconds when that is larger, so a
    /// restored store never repeats a number for other contents. The feed tells engines when
    /// it moved, so they fetch the certificates again.
    fn domains_generation(&self) -> Result<u64, StoreError>;
    /// Writes `record` if the stored one is at revision `expected` (`None`: none stored yet),
    /// storing it at the next revision, and answers whether it did; a caller that lost the
    /// race reads again. `remove` deletes the record instead (with `expected` its revision).
    fn write_domain(
        &self,
        record: DomainRecord,
        expected: Option<u64>,
        remove: bool,
    ) -> Result<bool, StoreError>;
    /// A secret every control plane on a shared store uses (the edge token): the one stored,
    /// or `make()`'s, stored first. `None` for a store of one process (embedded), whose secrets
    /// live in files in its data directory.
    fn shared_secret(
        &self,
        name: &str,
        make: &dyn Fn() -> Result<String, StoreError>,
    ) -> Result<Option<String>, StoreError> {
        let _ = (name, make);
        Ok(None)
    }
    /// Every table of the record where `needle` appears, in a key or a value, with how many
    /// rows: an erasure audit (a deleted link's URL must be found nowhere). Bytes the storage
    /// engine alone still holds (freed pages, dead tuples, WAL) are not rows and not seen.
    fn find_text(&self, needle: &str) -> Result<Vec<(String, u64)>, StoreError>;
    /// Streams the record for `lasthop-control export` ([`transfer`]): counters, links, audit
    /// records, code sets, reports, owners and positions, then API keys where the store keeps
    /// them, in that order, from one consistent read; returns the change-log head that read is
    /// complete up to.
    fn export(
        &self,
        out: &mut dyn FnMut(transfer::Record) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError>;
    /// Where this store keeps API keys, if it keeps them (the shared store does; beside the
    /// embedded store they are the `api-keys` file).
    fn key_store(self: Arc<Self>) -> Option<Arc<dyn keys::KeyStore>> {
        None
    }
    /// What several control planes on this store share beyond the record (leader locks, the
    /// fleet, snapshot files, news of cached state); `None` for the embedded store, whose one
    /// process keeps all that in memory and in its data directory.
    fn shared(self: Arc<Self>) -> Option<Arc<dyn Shared>> {
        None
    }
    /// Graceful shutdown: returns the unused part of the leased counter block.
    fn shutdown(&self) -> Result<(), StoreError>;
}

/// Cached shared state a control plane reloads when another changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum News {
    /// API keys (the control plane's `auth::ApiKeys`).
    Keys,
    /// Owners' trust records (flags, suspensions).
    Owners,
    /// Published snapshots.
    Snapshots,
}

/// A leader lock: while held, no other control plane on the store holds the same name.
pub trait Lead: Send + Sync {
    /// False once the lock is lost (its connection closed); the holder stops leading then.
    fn held(&self) -> bool;
}

/// What several control planes on one store share beyond the record itself (the PostgreSQL
/// store). See store/STORE.md.
pub trait Shared: Send + Sync {
    /// Takes the leader lock `name` if no control plane holds it; released when the returned
    /// guard drops (or its connection is lost).
    fn try_lead(&self, name: &str) -> Result<Option<Box<dyn Lead>>, StoreError>;
    /// The generation of `what`: raised whenever any control plane changes it (and whenever
    /// news could have been missed); a cache loaded at an older generation is stale.
    fn generation(&self, what: News) -> u64;
    /// Records engine `engine`'s latest status entry (JSON) as of `received_ms`, and forgets
    /// every engine's entry received before `forget_before_ms` (the fleet's horizon).
    fn put_edge(
        &self,
        engine: &str,
        entry: &str,
        received_ms: i64,
        forget_before_ms: i64,
    ) -> Result<(), StoreError>;
    /// Every engine's entry received since `since_ms`.
    fn edges(&self, since_ms: i64) -> Result<Vec<String>, StoreError>;
    /// Forgets `engine`'s entry (an admin removed it from the fleet); false when there was none.
    fn delete_edge(&self, engine: &str) -> Result<bool, StoreError>;
    /// Stores a published snapshot's bytes from `file` under its frame, and announces it.
    fn put_snapshot(
        &self,
        frame: &lasthop_core::feed::SnapshotFrame,
        file: &std::path::Path,
    ) -> Result<(), StoreError>;
    /// Every stored snapshot, newest first.
    fn snapshots(&self) -> Result<Vec<lasthop_core::feed::SnapshotFrame>, StoreError>;
    /// Writes snapshot `id`'s bytes to `dest`; false if the store has no such snapshot.
    fn fetch_snapshot(&self, id: &str, dest: &std::path::Path) -> Result<bool, StoreError>;
    /// Forgets snapshot `id`.
    fn drop_snapshot(&self, id: &str) -> Result<(), StoreError>;
}
