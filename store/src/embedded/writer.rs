//! The embedded store's writer: one thread, group commit.
//!
//! It drains what is queued (up to `max_batch` operations), applies it in order inside one
//! redb write transaction and commits it with `Durability::Immediate` (fsync) before answering
//! any of them; the last durable change-log sequence is published
//! ([`crate::Store::commits`]) before the callers hear back. Being the one writer is what
//! makes an alias claim a conditional write and hands counters out in order (the parent
//! module has the record's layout). An operation that fails is answered with its error and
//! the batch still commits, with whatever that operation wrote before it failed.

use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;

use lasthop_core::{Change, CodeKind, CodeScheme, Link, LinkState};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    audit_key, counter_key, index_destination, index_entry, owner_prefix, read_meta, record_key,
    reindex_destination, seq_in_owner_index, storage, write_denied, CommitObserver,
    EmbeddedStoreConfig, LinkRow, RowSeq, Tables, CHANGES, COUNTER_PREFIX, META_AUDIT_NEXT,
    META_REPORT_NEXT,
};
use crate::replica::{self, Replica};
use crate::{
    corrupt, Actor, AuditRecord, Batch, BatchResult, CreateOutcome, CreateRequest, DeleteOutcome,
    DomainRecord, Origin, OwnerRecord, ReplicateOutcome, Replicated, Report, Resolution,
    StoreError, StoredLink,
};

/// Idempotency records purged per commit, so a purge never makes one batch slow.
const PURGE_PER_COMMIT: usize = 256;

pub(super) type Reply<T> = mpsc::SyncSender<Result<T, StoreError>>;

/// An operation queued for the writer, with where its answer goes.
pub(super) enum Op {
    Create(Box<CreateRequest>, Reply<CreateOutcome>),
    /// All in the batch's transaction; an error aborts the transaction (every op of the batch).
    CreateMany(Vec<CreateRequest>, Reply<Vec<CreateOutcome>>),
    Delete {
        code: String,
        actor: Actor,
        reply: Reply<DeleteOutcome>,
    },
    Batch(Box<Batch>, Reply<Vec<BatchResult>>),
    AddReport(Box<Report>, Reply<Report>),
    ResolveReport {
        id: u64,
        resolution: Resolution,
        reply: Reply<Option<Result<Report, Report>>>,
    },
    PutOwner(Box<OwnerRecord>, Reply<()>),
    WriteDomain {
        record: Box<DomainRecord>,
        expected: Option<u64>,
        remove: bool,
        reply: Reply<bool>,
    },
    Replicate(Box<Replicated>, Reply<ReplicateOutcome>),
    Shutdown(Reply<()>),
}

/// An `idempotency` row: what a create with that key answered.
#[derive(Debug, Serialize, Deserialize)]
struct IdempotencyRecord {
    body_hash: String,
    created_at_ms: i64,
    /// The code the first create made; a replay answers with the link as it is now, so an
    /// erased destination is never replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    /// The whole first answer, as records written before `code` existed held it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<StoredLink>,
}

/// The `idempotency` table's key of `owner`'s idempotency key `key`.
fn idempotency_key(owner: &str, key: &str) -> String {
    format!("{owner}\0{key}")
}

/// A link and its state inside a write transaction, `None` if the record does not exist.
fn read_record(
    t: &Tables<'_>,
    key: &[u8],
    code: &str,
) -> Result<Option<(Link, LinkState)>, StoreError> {
    let Some(raw) = t
        .links
        .get(key)
        .map_err(storage)?
        .map(|g| g.value().to_vec())
    else {
        return Ok(None);
    };
    let link: Link = serde_json::from_slice(&raw).map_err(|e| corrupt(code, e))?;
    let state: LinkState = match t.states.get(key).map_err(storage)? {
        Some(s) => serde_json::from_slice(s.value()).map_err(|e| corrupt(code, e))?,
        None => LinkState::default(),
    };
    Ok(Some((link, state)))
}

/// What to tell a caller once its batch is durable (or failed).
type Finish = Box<dyn FnOnce(Option<&StoreError>) + Send>;

fn finish<T: Send + 'static>(reply: Reply<T>, outcome: Result<T, StoreError>) -> Finish {
    Box::new(move |commit_error| {
        let answer = match (commit_error, outcome) {
            (Some(e), Ok(_)) => Err(StoreError::CommitFailed {
                cause: e.to_string(),
            }),
            (_, outcome) => outcome,
        };
        // The caller may have gone away (timeout, disconnect); nothing to do then.
        let _ = reply.send(answer);
    })
}

/// The writer thread's state: the counter lease, the next sequences, and the queue it drains.
pub(super) struct Writer {
    db: Arc<Database>,
    scheme: CodeScheme,
    region: u32,
    counter_range: Range<u64>,
    block_size: u64,
    /// The unused part of the leased block.
    block: Range<u64>,
    /// The claimed counters ([`crate::CLAIMED_SET`]) in the leased block, in order: skipped.
    skip: Vec<u64>,
    next_seq: u64,
    /// The next audit record's number (persisted in `meta` by each commit that writes one).
    next_audit: u64,
    idempotency_ttl_ms: i64,
    max_batch: usize,
    observer: Option<CommitObserver>,
    /// Last durable change-log sequence, for [`crate::Store::commits`].
    commits: watch::Sender<u64>,
}

impl Writer {
    /// The writer of the store `db` that [`super::EmbeddedStore::open`] just opened: the
    /// change log's next sequence is `next_seq`, counters are leased in `counter_range`.
    pub(super) fn new(
        db: Arc<Database>,
        config: &EmbeddedStoreConfig,
        counter_range: Range<u64>,
        next_seq: u64,
        observer: Option<CommitObserver>,
        commits: watch::Sender<u64>,
    ) -> Result<Writer, StoreError> {
        let next_audit = read_meta(&db, META_AUDIT_NEXT)?;
        Ok(Writer {
            db,
            scheme: config.scheme.clone(),
            region: config.region,
            counter_range,
            block_size: config.block_size.max(1),
            block: 0..0,
            skip: Vec::new(),
            next_seq,
            next_audit,
            idempotency_ttl_ms: config.idempotency_ttl_ms,
            max_batch: config.max_batch.max(1),
            observer,
            commits,
        })
    }

    /// Drains `rx` batch by batch until a shutdown (or every sender is gone).
    pub(super) fn run(mut self, rx: mpsc::Receiver<Op>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if self.commit_batch(batch) {
                return;
            }
        }
        // Every sender is gone without a Shutdown: hand the block back anyway.
        let _ = self.commit_batch(Vec::new());
    }

    /// Applies and commits one batch; true when a shutdown was in it.
    fn commit_batch(&mut self, batch: Vec<Op>) -> bool {
        let started = std::time::Instant::now();
        let size = batch.len();
        let mut finishes: Vec<Finish> = Vec::with_capacity(size);
        let mut shutdown = batch.is_empty();
        let result = (|| -> Result<(), StoreError> {
            let mut txn = self.db.begin_write().map_err(storage)?;
            txn.set_durability(Durability::Immediate).map_err(storage)?;
            {
                let mut t = Tables::open(&txn)?;
                let audit_before = self.next_audit;
                for op in batch {
                    match op {
                        Op::Create(req, reply) => {
                            let outcome = self.apply_create(&mut t, &req);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::CreateMany(reqs, reply) => {
                            let mut outcomes = Vec::with_capacity(reqs.len());
                            for req in &reqs {
                                match self.apply_create(&mut t, req) {
                                    Ok(o) => outcomes.push(o),
                                    // Nothing of the batch is committed; this caller hears why
                                    // (the others of the batch, that their commit failed).
                                    Err(e) => {
                                        let cause = e.to_string();
                                        finishes.push(finish(reply, Err(e)));
                                        return Err(StoreError::CommitFailed { cause });
                                    }
                                }
                            }
                            finishes.push(finish(reply, Ok(outcomes)));
                        }
                        Op::Delete { code, actor, reply } => {
                            let outcome = self.erase(&mut t, &code, Some(&actor));
                            finishes.push(finish(reply, outcome));
                        }
                        Op::Batch(batch, reply) => {
                            let outcome = self.apply_batch(&mut t, &batch);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::AddReport(report, reply) => {
                            let outcome = self.apply_add_report(&mut t, *report);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::ResolveReport {
                            id,
                            resolution,
                            reply,
                        } => {
                            let outcome = apply_resolve_report(&mut t, id, resolution);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::PutOwner(record, reply) => {
                            let outcome = apply_put_owner(&mut t, &record);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::WriteDomain {
                            record,
                            expected,
                            remove,
                            reply,
                        } => {
                            let outcome = apply_write_domain(&mut t, *record, expected, remove);
                            finishes.push(finish(reply, outcome));
                        }
                        Op::Replicate(page, reply) => {
                            let mut steps = ReplicaSteps {
                                writer: self,
                                t: &mut t,
                            };
                            let outcome = replica::ready(replica::apply(&mut steps, &page));
                            finishes.push(finish(reply, outcome));
                        }
                        Op::Shutdown(reply) => {
                            shutdown = true;
                            finishes.push(finish(reply, Ok(())));
                        }
                    }
                }
                if shutdown && !self.block.is_empty() {
                    t.free
                        .insert(self.block.start, self.block.end)
                        .map_err(storage)?;
                    self.block = 0..0;
                }
                self.purge_idempotency(&mut t)?;
                if self.next_audit != audit_before {
                    t.meta
                        .insert(META_AUDIT_NEXT, self.next_audit)
                        .map_err(storage)?;
                }
            }
            txn.commit().map_err(storage)
        })();
        if let Err(e) = &result {
            tracing::error!(error = %e, ops = size, "group commit failed");
            // In-memory state may be ahead of the disk: burn the block, re-read the counters.
            self.block = 0..0;
            if let Ok(txn) = self.db.begin_read() {
                if let Ok(changes) = txn.open_table(CHANGES) {
                    if let Ok(last) = changes.last() {
                        self.next_seq = last.map(|(k, _)| k.value()).unwrap_or(0) + 1;
                    }
                }
            }
            if let Ok(n) = read_meta(&self.db, META_AUDIT_NEXT) {
                self.next_audit = n;
            }
        } else {
            if let Some(observer) = &self.observer {
                observer(size, started.elapsed().as_secs_f64());
            }
            // Before the callers hear back: a takedown's 200 never precedes the feed's wake-up.
            let last = self.next_seq - 1;
            self.commits.send_if_modified(|seen| {
                let newer = *seen < last;
                if newer {
                    *seen = last;
                }
                newer
            });
        }
        let err = result.err();
        for f in finishes {
            f(err.as_ref());
        }
        shutdown
    }

    fn next_counter(&mut self, t: &mut Tables<'_>) -> Result<u64, StoreError> {
        loop {
            let n = self.next_leased(t)?;
            if self.skip.binary_search(&n).is_err() {
                return Ok(n);
            }
        }
    }

    /// The next counter of the lease (a new block when it is spent, with its claimed counters
    /// read into `skip`).
    fn next_leased(&mut self, t: &mut Tables<'_>) -> Result<u64, StoreError> {
        if self.block.is_empty() {
            let reused = t.free.pop_first().map_err(storage)?;
            self.block = match reused {
                Some((s, e)) => s.value()..e.value(),
                None => {
                    let key = format!("{COUNTER_PREFIX}{}", self.region);
                    let next = t
                        .meta
                        .get(key.as_str())
                        .map_err(storage)?
                        .map(|g| g.value())
                        .unwrap_or(self.counter_range.start);
                    if next >= self.counter_range.end {
                        return Err(StoreError::CounterExhausted {
                            region: self.region,
                        });
                    }
                    let end = next
                        .saturating_add(self.block_size)
                        .min(self.counter_range.end);
                    t.meta.insert(key.as_str(), end).map_err(storage)?;
                    next..end
                }
            };
            self.skip.clear();
            let from = counter_key(self.block.start);
            let to = counter_key(self.block.end);
            for item in t
                .code_sets
                .range((crate::CLAIMED_SET, from.as_slice())..(crate::CLAIMED_SET, to.as_slice()))
                .map_err(storage)?
            {
                let (k, _) = item.map_err(storage)?;
                let (_, key) = k.value();
                if let Some(n) = key.get(1..9).and_then(|b| b.try_into().ok()) {
                    self.skip.push(u64::from_be_bytes(n));
                }
            }
        }
        let n = self.block.start;
        self.block.start += 1;
        Ok(n)
    }

    fn apply_create(
        &mut self,
        t: &mut Tables<'_>,
        req: &CreateRequest,
    ) -> Result<CreateOutcome, StoreError> {
        let idem_key = req.idempotency.as_ref().map(|c| {
            (
                idempotency_key(&req.owner, &c.key),
                hex::encode(c.body_hash),
            )
        });
        if let Some((key, hash)) = &idem_key {
            if let Some(raw) = t.idem.get(key.as_str()).map_err(storage)? {
                let record: IdempotencyRecord =
                    serde_json::from_slice(raw.value()).map_err(|e| corrupt("idempotency", e))?;
                if req.now_ms - record.created_at_ms < self.idempotency_ttl_ms {
                    if &record.body_hash != hash {
                        return Ok(CreateOutcome::IdempotencyMismatch);
                    }
                    let replayed = match (record.code, record.answer) {
                        (Some(code), _) => {
                            let key = record_key(&self.scheme, &code)
                                .ok_or_else(|| corrupt("idempotency", format!("code {code}")))?;
                            let (link, state) = read_record(t, &key, &code)?
                                .ok_or_else(|| corrupt("idempotency", format!("no link {code}")))?;
                            let seq = self.creation_seq(t, &key, &link)?.unwrap_or(0);
                            StoredLink { link, state, seq }
                        }
                        (None, Some(answer)) => answer,
                        (None, None) => {
                            return Err(corrupt("idempotency", "a record without its answer"))
                        }
                    };
                    return Ok(CreateOutcome::Replayed(replayed));
                }
            }
        }

        let mut claim = None;
        let (code, key) = match &req.alias {
            Some(alias) => {
                // Aliases are unique per domain: the key carries the domain.
                let code = lasthop_core::link_key(req.domain.as_deref(), alias);
                let key = record_key(&self.scheme, &code).ok_or_else(|| StoreError::Corrupt {
                    what: format!("alias {code:?}"),
                    detail: "not an alias's shape".into(),
                })?;
                if req.imported.is_none()
                    && lasthop_core::classify(alias.as_bytes()) != CodeKind::Alias
                {
                    return Err(StoreError::Corrupt {
                        what: format!("alias {code:?}"),
                        detail: "not an alias's shape".into(),
                    });
                }
                if t.links.get(key.as_slice()).map_err(storage)?.is_some() {
                    return Ok(CreateOutcome::AliasTaken);
                }
                if req.imported.is_some() {
                    match self.claim(t, alias)? {
                        Ok(n) => claim = n,
                        Err(why) => return Ok(CreateOutcome::Collision(why)),
                    }
                }
                (code, key)
            }
            None => loop {
                let n = self.next_counter(t)?;
                let (code, key) = match req.domain.as_deref() {
                    // Keyed by counter: unique by construction, and a batch's inserts stay on a
                    // few leaves.
                    None => (
                        self.scheme.encode_string(n).map_err(storage)?,
                        counter_key(n),
                    ),
                    // The counter still makes it unique across domains; the key is the domain's.
                    Some(domain) => {
                        let code = lasthop_core::link_key(
                            Some(domain),
                            &self.scheme.encode_string(n).map_err(storage)?,
                        );
                        let key = record_key(&self.scheme, &code).ok_or_else(|| {
                            corrupt("domain", format!("{domain:?} is no domain name"))
                        })?;
                        (code, key)
                    }
                };
                if t.links.get(key.as_slice()).map_err(storage)?.is_none() {
                    break (code, key);
                }
                // Leasing never hands a counter out twice; burn it if it ever does.
                tracing::error!(counter = n, "counter already used; skipping");
            },
        };

        let link = Link {
            code: code.clone(),
            long_url: req.long_url.clone(),
            owner: req.owner.clone(),
            created_at_ms: req
                .imported
                .and_then(|i| i.created_at_ms)
                .unwrap_or(req.now_ms),
        };
        let state = LinkState {
            expires_at_ms: req.expires_at_ms,
            held: req.hold,
            options: req.options,
            tags: req.tags.clone(),
            imported_clicks: req.imported.and_then(|i| i.clicks),
            legacy_code: req.imported.is_some()
                && req
                    .alias
                    .as_deref()
                    .is_some_and(|a| lasthop_core::classify(a.as_bytes()) != CodeKind::Alias),
            ..LinkState::default()
        };
        let seq = self.write_new_link(t, &key, &link, &state)?;
        if let Some(n) = claim {
            t.code_sets
                .insert(
                    (crate::CLAIMED_SET, counter_key(n).as_slice()),
                    crate::claimed_entry(n).as_str(),
                )
                .map_err(storage)?;
        }
        match &req.destination {
            Some(dest) => index_entry(&mut t.dest_hosts, &key, &link.code, dest, true)?,
            None => {
                index_destination(&mut t.dest_hosts, &key, code.as_str(), &req.long_url, true)?;
            }
        }
        // A creation's audit record is written only when it says more than the link itself
        // (who owns it, when): a hold. An unconditional one cost ~15% of creates/s (its bytes
        // on every group commit's fsync); history shows the others from the link.
        if let Some(hold) = req.hold {
            let record = AuditRecord::created_held(req.now_ms, &req.actor, hold);
            self.write_audit(t, &key, record, Some(seq))?;
        }

        let stored = StoredLink { link, state, seq };
        if let Some((key, hash)) = idem_key {
            let record = IdempotencyRecord {
                body_hash: hash,
                created_at_ms: req.now_ms,
                code: Some(stored.link.code.clone()),
                answer: None,
            };
            let raw = serde_json::to_vec(&record)?;
            t.idem
                .insert(key.as_str(), raw.as_slice())
                .map_err(storage)?;
            t.idem_expiry
                .insert((req.now_ms, key.as_str()), ())
                .map_err(storage)?;
        }
        Ok(CreateOutcome::Created(stored))
    }

    /// What an imported code claims ([`crate::claimed_counter`]), against this region's mark.
    fn claim(&self, t: &Tables<'_>, code: &str) -> Result<Result<Option<u64>, String>, StoreError> {
        let n = match crate::claimed_counter(&self.scheme, &self.counter_range, code) {
            Ok(Some(n)) => n,
            other => return Ok(other),
        };
        let key = format!("{COUNTER_PREFIX}{}", self.region);
        let mark = t
            .meta
            .get(key.as_str())
            .map_err(storage)?
            .map(|g| g.value())
            .unwrap_or(self.counter_range.start);
        Ok(crate::claim_below_mark(n, mark).map_or(Ok(Some(n)), Err))
    }

    /// Soft-deletes `code` (see [`crate::Store::delete`]), with `actor`'s audit record (a
    /// replicated deletion, without one, brings the record of the region that made it
    /// instead).
    fn erase(
        &mut self,
        t: &mut Tables<'_>,
        code: &str,
        actor: Option<&Actor>,
    ) -> Result<DeleteOutcome, StoreError> {
        let Some(key) = record_key(&self.scheme, code) else {
            return Ok(DeleteOutcome::NotFound);
        };
        let key = key.as_slice();
        let Some((mut link, mut state)) = read_record(t, key, code)? else {
            return Ok(DeleteOutcome::NotFound);
        };
        if state.deleted {
            return Ok(DeleteOutcome::AlreadyDeleted);
        }
        // The index names the destination's host: it goes with the URL.
        index_destination(&mut t.dest_hosts, key, code, state.url(&link), false)?;
        // Erasure: the creation's log entry carried the URL; it keeps the code, not the URL.
        let created = self.creation_seq(t, key, &link)?;
        if let Some(seq) = created {
            scrub_creation(t, seq, code)?;
        }
        link.long_url.clear();
        state.deleted = true;
        state.destination = None;
        state.pending_destination = None;
        state.destination_unscanned = false;
        let row = LinkRow {
            link: &link,
            seq: created.unwrap_or(0),
        };
        let link_json = serde_json::to_vec(&row)?;
        t.links.insert(key, link_json.as_slice()).map_err(storage)?;
        let seq = self.write_state(t, key, code, &state)?;
        if let Some(actor) = actor {
            self.write_audit(t, key, AuditRecord::deleted(actor), Some(seq))?;
        }
        Ok(DeleteOutcome::Deleted)
    }

    /// Writes a new link under `key` as it is given: its row, state, owner index entry,
    /// denylist entry and `LinkCreated` change; returns the change's sequence.
    fn write_new_link(
        &mut self,
        t: &mut Tables<'_>,
        key: &[u8],
        link: &Link,
        state: &LinkState,
    ) -> Result<u64, StoreError> {
        let seq = self.next_seq;
        let link_json = serde_json::to_vec(&LinkRow { link, seq })?;
        t.links.insert(key, link_json.as_slice()).map_err(storage)?;
        let state_json = serde_json::to_vec(state)?;
        t.states
            .insert(key, state_json.as_slice())
            .map_err(storage)?;
        let mut index_key = owner_prefix(&link.owner);
        index_key.extend_from_slice(&(!seq).to_be_bytes());
        t.owner_links
            .insert(index_key.as_slice(), link.code.as_str())
            .map_err(storage)?;
        let change = Change::LinkCreated {
            link: link.clone(),
            state: state.logged(),
        };
        let change_json = serde_json::to_vec(&change)?;
        t.changes
            .insert(seq, change_json.as_slice())
            .map_err(storage)?;
        self.next_seq += 1;
        write_denied(t, &link.code, state)?;
        // An import's code that is no alias: in the legacy set snapshots carry (a replicated
        // link's too).
        if state.legacy_code {
            t.code_sets
                .insert((crate::LEGACY_SET, key), link.code.as_str())
                .map_err(storage)?;
        }
        Ok(seq)
    }

    fn apply_batch(
        &mut self,
        t: &mut Tables<'_>,
        batch: &Batch,
    ) -> Result<Vec<BatchResult>, StoreError> {
        let mut out = Vec::with_capacity(batch.updates.len());
        for u in &batch.updates {
            let code = u.code.as_str();
            let key = record_key(&self.scheme, code);
            if let (Some(set), Some(key)) = (&batch.unmark, &key) {
                t.code_sets
                    .remove((set.as_str(), key.as_slice()))
                    .map_err(storage)?;
            }
            let found = match key {
                Some(key) => read_record(t, &key, code)?.map(|r| (key, r)),
                None => None,
            };
            let Some((key, (link, state))) = found else {
                out.push(BatchResult {
                    code: u.code.clone(),
                    link: None,
                    changed: false,
                });
                continue;
            };
            let next = u.update.apply(&state, &batch.actor);
            let changed = next != state;
            if changed {
                reindex_destination(&mut t.dest_hosts, &key, &link, &state, &next)?;
                let seq = self.write_state(t, &key, code, &next)?;
                let record = u.update.audit(&state, &next, &batch.actor, batch.now_ms);
                self.write_audit(t, &key, record, Some(seq))?;
                if let Some(set) = &batch.mark_changed {
                    t.code_sets
                        .insert((set.as_str(), key.as_slice()), code)
                        .map_err(storage)?;
                }
            }
            out.push(BatchResult {
                code: u.code.clone(),
                link: Some(StoredLink {
                    link,
                    state: next,
                    seq: 0,
                }),
                changed,
            });
        }
        for (name, value) in &batch.positions {
            t.positions
                .insert(name.as_str(), value.as_str())
                .map_err(storage)?;
        }
        Ok(out)
    }

    /// The change-log sequence of a link's creation: stored in its row, or (rows from before
    /// it was) found through its owner's index, whose keys end in the inverted sequence.
    fn creation_seq(
        &self,
        t: &Tables<'_>,
        key: &[u8],
        link: &Link,
    ) -> Result<Option<u64>, StoreError> {
        if let Some(raw) = t.links.get(key).map_err(storage)? {
            let row: RowSeq =
                serde_json::from_slice(raw.value()).map_err(|e| corrupt(&link.code, e))?;
            if let Some(seq) = row.seq.filter(|s| *s > 0) {
                return Ok(Some(seq));
            }
        }
        seq_in_owner_index(&t.owner_links, link)
    }

    /// Appends an audit record to the trail of the link whose record key is `record_key`.
    /// `change` is the sequence of our change it goes with (see [`AuditRecord::origin`]); a
    /// record that has an origin (another region's) keeps it.
    fn write_audit(
        &mut self,
        t: &mut Tables<'_>,
        record_key: &[u8],
        mut record: AuditRecord,
        change: Option<u64>,
    ) -> Result<(), StoreError> {
        let key = audit_key(record_key, self.next_audit);
        if record.origin.is_none() {
            record.origin = change.map(|seq| Origin {
                region: self.region,
                seq,
            });
        }
        let json = serde_json::to_vec(&record)?;
        t.audit
            .insert(key.as_slice(), json.as_slice())
            .map_err(storage)?;
        self.next_audit += 1;
        Ok(())
    }

    fn apply_add_report(
        &mut self,
        t: &mut Tables<'_>,
        mut report: Report,
    ) -> Result<Report, StoreError> {
        let id = t
            .meta
            .get(META_REPORT_NEXT)
            .map_err(storage)?
            .map(|g| g.value())
            .unwrap_or(1);
        t.meta.insert(META_REPORT_NEXT, id + 1).map_err(storage)?;
        report.id = id;
        report.resolution = None;
        let json = serde_json::to_vec(&report)?;
        t.reports.insert(id, json.as_slice()).map_err(storage)?;
        t.reports_open.insert(id, ()).map_err(storage)?;
        let record = AuditRecord::filed(&report);
        if let Some(key) = record_key(&self.scheme, &report.code) {
            self.write_audit(t, &key, record, None)?;
        }
        Ok(report)
    }

    /// Writes a link's new state, its denylist entry and its `StateChanged` change.
    fn write_state(
        &mut self,
        t: &mut Tables<'_>,
        key: &[u8],
        code: &str,
        state: &LinkState,
    ) -> Result<u64, StoreError> {
        let state_json = serde_json::to_vec(state)?;
        t.states
            .insert(key, state_json.as_slice())
            .map_err(storage)?;
        write_denied(t, code, state)?;
        let change = Change::StateChanged {
            code: code.to_string(),
            state: state.logged(),
        };
        let change_json = serde_json::to_vec(&change)?;
        let seq = self.next_seq;
        t.changes
            .insert(seq, change_json.as_slice())
            .map_err(storage)?;
        self.next_seq += 1;
        Ok(seq)
    }

    fn purge_idempotency(&mut self, t: &mut Tables<'_>) -> Result<(), StoreError> {
        let cutoff = crate::clock::now_ms() - self.idempotency_ttl_ms;
        let mut expired = Vec::new();
        for item in t
            .idem_expiry
            .range::<(i64, &str)>(..(cutoff, ""))
            .map_err(storage)?
            .take(PURGE_PER_COMMIT)
        {
            let (k, _) = item.map_err(storage)?;
            let (at, key) = k.value();
            expired.push((at, key.to_string()));
        }
        for (at, key) in expired {
            t.idem_expiry.remove((at, key.as_str())).map_err(storage)?;
            // Only remove the record if it is the one this expiry entry belongs to.
            let stale = match t.idem.get(key.as_str()).map_err(storage)? {
                Some(raw) => serde_json::from_slice::<IdempotencyRecord>(raw.value())
                    .map(|r| r.created_at_ms == at)
                    .unwrap_or(true),
                None => false,
            };
            if stale {
                t.idem.remove(key.as_str()).map_err(storage)?;
            }
        }
        Ok(())
    }
}

/// The embedded store's steps of a replicated page ([`crate::replica`]), in the batch's write
/// transaction `t`; they never wait.
struct ReplicaSteps<'w, 't> {
    writer: &'w mut Writer,
    t: &'w mut Tables<'t>,
}

impl Replica for ReplicaSteps<'_, '_> {
    /// The link's record key and state.
    type Held = (Vec<u8>, LinkState);

    fn region(&self) -> u32 {
        self.writer.region
    }

    fn state(held: &Self::Held) -> &LinkState {
        &held.1
    }

    fn next_seq(&self) -> u64 {
        self.writer.next_seq
    }

    async fn position(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        let value = self.t.positions.get(name).map_err(storage)?;
        Ok(value.map(|p| p.value().to_string()))
    }

    async fn insert_link(&mut self, link: &Link, state: &LinkState) -> Result<bool, StoreError> {
        let Some(key) = record_key(&self.writer.scheme, &link.code) else {
            return Ok(false);
        };
        if self.t.links.get(key.as_slice()).map_err(storage)?.is_some() {
            return Ok(false);
        }
        self.writer.write_new_link(self.t, &key, link, state)?;
        if !state.deleted {
            index_destination(
                &mut self.t.dest_hosts,
                &key,
                &link.code,
                state.url(link),
                true,
            )?;
        }
        Ok(true)
    }

    async fn hold(&mut self, code: &str) -> Result<Option<Self::Held>, StoreError> {
        let Some(key) = record_key(&self.writer.scheme, code) else {
            return Ok(None);
        };
        Ok(read_record(self.t, &key, code)?.map(|(_, state)| (key, state)))
    }

    async fn set_state(
        &mut self,
        code: &str,
        (key, before): Self::Held,
        state: &LinkState,
    ) -> Result<(), StoreError> {
        if let Some((link, _)) = read_record(self.t, &key, code)? {
            reindex_destination(&mut self.t.dest_hosts, &key, &link, &before, state)?;
        }
        self.writer.write_state(self.t, &key, code, state)?;
        Ok(())
    }

    async fn erase(&mut self, code: &str, _: Self::Held) -> Result<(), StoreError> {
        self.writer.erase(self.t, code, None)?;
        Ok(())
    }

    async fn has_link(&mut self, code: &str) -> Result<bool, StoreError> {
        let Some(key) = record_key(&self.writer.scheme, code) else {
            return Ok(false);
        };
        Ok(self.t.links.get(key.as_slice()).map_err(storage)?.is_some())
    }

    async fn add_audit(&mut self, code: &str, record: AuditRecord) -> Result<(), StoreError> {
        if let Some(key) = record_key(&self.writer.scheme, code) {
            self.writer.write_audit(self.t, &key, record, None)?;
        }
        Ok(())
    }

    async fn mark_origins(&mut self, seqs: Range<u64>, region: u32) -> Result<(), StoreError> {
        for seq in seqs {
            self.t.origins.insert(seq, region).map_err(storage)?;
        }
        Ok(())
    }

    async fn raise_mark(&mut self, region: u32, mark: u64) -> Result<(), StoreError> {
        let key = format!("{COUNTER_PREFIX}{region}");
        let known = self
            .t
            .meta
            .get(key.as_str())
            .map_err(storage)?
            .map(|g| g.value());
        if known.is_none_or(|k| k < mark) {
            self.t.meta.insert(key.as_str(), mark).map_err(storage)?;
        }
        Ok(())
    }

    async fn save_position(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        self.t.positions.insert(name, value).map_err(storage)?;
        Ok(())
    }
}

/// Rewrites the creation entry (sequence `seq`) of a deleted link without its URL.
fn scrub_creation(t: &mut Tables<'_>, seq: u64, code: &str) -> Result<(), StoreError> {
    let Some(raw) = t
        .changes
        .get(seq)
        .map_err(storage)?
        .map(|g| g.value().to_vec())
    else {
        return Ok(());
    };
    let mut change: Change = serde_json::from_slice(&raw).map_err(|e| corrupt("changes", e))?;
    if let Change::LinkCreated { link, .. } = &mut change {
        if link.code == code {
            link.long_url.clear();
            let json = serde_json::to_vec(&change)?;
            t.changes.insert(seq, json.as_slice()).map_err(storage)?;
        }
    }
    Ok(())
}

fn apply_resolve_report(
    t: &mut Tables<'_>,
    id: u64,
    resolution: Resolution,
) -> Result<Option<Result<Report, Report>>, StoreError> {
    let Some(raw) = t
        .reports
        .get(id)
        .map_err(storage)?
        .map(|g| g.value().to_vec())
    else {
        return Ok(None);
    };
    let mut report: Report = serde_json::from_slice(&raw).map_err(|e| corrupt("reports", e))?;
    if report.resolution.is_some() {
        return Ok(Some(Err(report)));
    }
    report.resolution = Some(resolution);
    let json = serde_json::to_vec(&report)?;
    t.reports.insert(id, json.as_slice()).map_err(storage)?;
    t.reports_open.remove(id).map_err(storage)?;
    Ok(Some(Ok(report)))
}

/// [`crate::Store::write_domain`] inside the batch's transaction.
fn apply_write_domain(
    t: &mut Tables<'_>,
    mut record: DomainRecord,
    expected: Option<u64>,
    remove: bool,
) -> Result<bool, StoreError> {
    let stored = match t.domains.get(record.domain.as_str()).map_err(storage)? {
        Some(raw) => Some(
            serde_json::from_slice::<DomainRecord>(raw.value())
                .map_err(|e| corrupt("domains", e))?
                .revision,
        ),
        None => None,
    };
    if stored != expected || (remove && stored.is_none()) {
        return Ok(false);
    }
    bump_domains_generation(t)?;
    if remove {
        t.domains.remove(record.domain.as_str()).map_err(storage)?;
    } else {
        record.revision = expected.unwrap_or(0) + 1;
        let json = serde_json::to_vec(&record)?;
        t.domains
            .insert(record.domain.as_str(), json.as_slice())
            .map_err(storage)?;
    }
    Ok(true)
}

/// Moves [`crate::Store::domains_generation`] on: one more, or the time in Unix milliseconds
/// when that is larger, so that a store restored from a backup or imported never reuses a
/// number an engine already holds for other contents.
pub(super) fn bump_domains_generation(t: &mut Tables<'_>) -> Result<(), StoreError> {
    let was = t
        .meta
        .get(super::META_DOMAINS_GENERATION)
        .map_err(storage)?
        .map(|g| g.value())
        .unwrap_or(0);
    let now = u64::try_from(crate::clock::now_ms()).unwrap_or(0);
    t.meta
        .insert(super::META_DOMAINS_GENERATION, (was + 1).max(now))
        .map_err(storage)?;
    Ok(())
}

/// Writes an owner's trust record, or removes it when it holds nothing (also used by import).
pub(super) fn apply_put_owner(t: &mut Tables<'_>, record: &OwnerRecord) -> Result<(), StoreError> {
    if record.flagged.is_none() && record.suspended.is_none() && record.unsuspended_at_ms.is_none()
    {
        t.owners.remove(record.owner.as_str()).map_err(storage)?;
    } else {
        let json = serde_json::to_vec(record)?;
        t.owners
            .insert(record.owner.as_str(), json.as_slice())
            .map_err(storage)?;
    }
    Ok(())
}
