//! Replication between regions, the write side: how a page of another region's own changes
//! ([`Replicated`]) is applied here. The sequence is the same on every backend and is written
//! once ([`apply`]); a backend supplies only its storage steps ([`Replica`]), run inside the
//! one transaction its writer commits the page in.
//!
//! For a page from region `r`:
//!
//! 1. **Skip to the saved position** (`peer/<r>`, [`peer_position`]): a change at or below it
//!    was applied already (the page came twice, or two control planes of this region applied
//!    it at once) and is skipped.
//! 2. **Apply each change after it**: a link we lack is written as it is there; a state by the
//!    rule ([`replicated_state`]: the link's home region's replaces ours, any other's only
//!    restricts it; a deletion erases).
//! 3. **Attach its audit records**: those region `r` wrote with the change (their origins
//!    kept) join the link's history if the link is here, whether or not the rule changed
//!    anything, so a region's history shows where each action was taken.
//! 4. **Record origins**: every change-log entry the change wrote here is marked as `r`'s, so
//!    it is never served back to a peer ([`crate::Store::own_changes_since`]) and nothing
//!    loops. Marked change by change: a backend whose failed operation still commits what it
//!    wrote (the embedded writer's) never leaves an entry of `r`'s looking like ours.
//! 5. **Raise the mark**: `r`'s high-water mark goes up to the page's (never down; our own
//!    region's is ours alone), so edges here never 404 a code `r` issued.
//! 6. **Save the position**: the page's, or the saved one if that is further. It commits with
//!    everything above, so a page delivered again, or after a crash, applies nothing twice.
//!
//! The steps are `async` because PostgreSQL's are; the embedded store's never wait, and its
//! writer thread runs [`apply`] with [`ready`].

use std::future::Future;
use std::ops::Range;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use lasthop_core::{Change, Link, LinkState};

use crate::{
    peer_position, replicated_state, AuditRecord, ReplicateOutcome, Replicated, StoreError,
};

/// A backend's storage steps for [`apply`], bound to the transaction the page is written in.
pub(crate) trait Replica {
    /// A link read for a change in this transaction (locked, where the backend locks rows).
    type Held;

    /// This region: its own high-water mark is never raised by a peer's page.
    fn region(&self) -> u32;
    /// A held link's state.
    fn state(held: &Self::Held) -> &LinkState;
    /// The change-log sequence the next entry written in this transaction will get.
    fn next_seq(&self) -> u64;
    /// The saved position `name` ([`crate::Store::position`]), if there is one.
    async fn position(&mut self, name: &str) -> Result<Option<String>, StoreError>;
    /// Writes another region's link as it is there (its row, owner and destination indexes,
    /// denylist entry, legacy-set entry and `LinkCreated` change), unless a link with its code
    /// is here; true if written.
    async fn insert_link(&mut self, link: &Link, state: &LinkState) -> Result<bool, StoreError>;
    /// The link `code` read for a change, `None` if it is not here.
    async fn hold(&mut self, code: &str) -> Result<Option<Self::Held>, StoreError>;
    /// Writes a held link's new state, with its denylist entry and `StateChanged` change.
    async fn set_state(
        &mut self,
        code: &str,
        held: Self::Held,
        state: &LinkState,
    ) -> Result<(), StoreError>;
    /// Erases a held link as a deletion does, writing no audit record of ours (the deleting
    /// region's comes with the change).
    async fn erase(&mut self, code: &str, held: Self::Held) -> Result<(), StoreError>;
    /// Whether a link `code` is here.
    async fn has_link(&mut self, code: &str) -> Result<bool, StoreError>;
    /// Appends another region's audit record to `code`'s history, its origin as it is.
    async fn add_audit(&mut self, code: &str, record: AuditRecord) -> Result<(), StoreError>;
    /// Marks the change-log entries `seqs` (written in this transaction) as `region`'s.
    async fn mark_origins(&mut self, seqs: Range<u64>, region: u32) -> Result<(), StoreError>;
    /// Raises `region`'s high-water mark to `mark`, leaving a higher one as it is.
    async fn raise_mark(&mut self, region: u32, mark: u64) -> Result<(), StoreError>;
    /// Saves the position `name` as `value`.
    async fn save_position(&mut self, name: &str, value: &str) -> Result<(), StoreError>;
}

/// Applies `page` through `replica`'s steps (the module docs give the sequence); what
/// [`crate::Store::replicate`] does on every backend.
pub(crate) async fn apply<R: Replica>(
    replica: &mut R,
    page: &Replicated,
) -> Result<ReplicateOutcome, StoreError> {
    let name = peer_position(page.region);
    let done: u64 = replica
        .position(&name)
        .await?
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mut outcome = ReplicateOutcome::default();
    for c in page.changes.iter().filter(|c| c.seq > done) {
        let first = replica.next_seq();
        let applied = match &c.change {
            Change::LinkCreated { link, state } => replica.insert_link(link, state).await?,
            Change::StateChanged { code, state } => {
                apply_state(replica, code, state, c.authoritative).await?
            }
        };
        let code = c.change.code();
        if !c.audit.is_empty() && replica.has_link(code).await? {
            for record in &c.audit {
                replica.add_audit(code, record.clone()).await?;
            }
        }
        let written = first..replica.next_seq();
        if !written.is_empty() {
            replica.mark_origins(written, page.region).await?;
        }
        if applied {
            outcome.applied += 1;
        } else {
            outcome.skipped += 1;
        }
    }
    if page.region != replica.region() {
        replica.raise_mark(page.region, page.high_water).await?;
    }
    let position = page.position.max(done).to_string();
    replica.save_position(&name, &position).await?;
    Ok(outcome)
}

/// Applies another region's state of `code` by the rule ([`replicated_state`]); true if it
/// changed anything.
async fn apply_state<R: Replica>(
    replica: &mut R,
    code: &str,
    theirs: &LinkState,
    authoritative: bool,
) -> Result<bool, StoreError> {
    let Some(held) = replica.hold(code).await? else {
        return Ok(false);
    };
    let Some(next) = replicated_state(R::state(&held), theirs, authoritative) else {
        return Ok(false);
    };
    if next.deleted {
        replica.erase(code, held).await?;
    } else {
        replica.set_state(code, held, &next).await?;
    }
    Ok(true)
}

/// Runs a future whose steps never wait (the embedded store's: redb calls on its writer
/// thread) to its end: it is ready on its first poll. One that is not would be a bug, and
/// is answered with an error rather than a hang.
pub(crate) fn ready<T>(
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => Err(StoreError::NotApplied("a synchronous step waited")),
    }
}
