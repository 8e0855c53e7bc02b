//! The PostgreSQL store's writer: one task per control plane, group commit.
//!
//! It drains what is queued (up to `max_batch` operations) and applies it in one transaction.
//! A transaction that appends to the change log first takes the row lock of `change_seq`
//! (every control plane's writer does), so the writers of a cluster take turns: sequence
//! numbers follow commit order, and everything read after the lock is what every earlier
//! writer committed (an alias is free or it is not; a link's state is its latest). Runs of
//! creates are written with one `unnest` statement per table, so a batch costs a handful of
//! round trips however many links it holds.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use lasthop_core::feed::DenyKind;
use lasthop_core::CodeKind;
use lasthop_core::{region_range, Change, CodeScheme, Link, LinkState};
use lasthop_trust::Destination;
use tokio::sync::watch;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};

use super::{announce, connect, corrupt, pg, PgStoreConfig, CHANGES_CHANNEL};
use crate::replica::{self, Replica};
use crate::{
    Actor, AuditRecord, Batch, BatchResult, CreateOutcome, CreateRequest, DeleteOutcome, Origin,
    OwnerRecord, ReplicateOutcome, Replicated, Report, Resolution, StoreError, StoredLink,
};

/// `denied.kind` values.
pub(crate) const DENY_GONE: i16 = 0;
pub(crate) const DENY_WARN: i16 = 1;
/// Idempotency records purged per commit, so a purge never makes one batch slow.
const PURGE_PER_COMMIT: i64 = 256;

pub(crate) type Reply<T> = std::sync::mpsc::SyncSender<Result<T, StoreError>>;

pub(crate) enum Op {
    Create(Box<CreateRequest>, Reply<CreateOutcome>),
    /// In the batch's transaction; an error rolls the transaction back.
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
    Replicate(Box<Replicated>, Reply<ReplicateOutcome>),
    Shutdown(Reply<()>),
}

/// What to tell a caller once its batch committed (or failed).
type Finish = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// Where an operation's outcome is put while its transaction runs.
type Slot<T> = Arc<std::sync::Mutex<Option<Result<T, StoreError>>>>;

/// Registers `reply` to be answered when the batch ends: with the slot's outcome once the
/// transaction committed, with the error otherwise. Registered before the transaction
/// begins, so no caller is ever left without an answer (a lost connection answers every
/// operation of the batch with the error, not with a dropped channel).
fn pending<T: Send + 'static>(reply: Reply<T>, finishes: &mut Vec<Finish>) -> Slot<T> {
    let slot: Slot<T> = Arc::new(std::sync::Mutex::new(None));
    let outcome = Arc::clone(&slot);
    finishes.push(Box::new(move |commit_error| {
        let answer = match commit_error {
            Some(e) => Err(StoreError::CommitFailed {
                cause: e.to_string(),
            }),
            None => outcome
                .lock()
                .ok()
                .and_then(|mut o| o.take())
                .unwrap_or_else(|| Err(StoreError::NotApplied("the writer stopped"))),
        };
        let _ = reply.send(answer);
    }));
    slot
}

fn fill<T>(slot: &Slot<T>, outcome: Result<T, StoreError>) {
    if let Ok(mut s) = slot.lock() {
        *s = Some(outcome);
    }
}

/// An operation of a batch, its reply registered.
enum Work {
    Create(Box<CreateRequest>, Slot<CreateOutcome>),
    CreateMany(Vec<CreateRequest>, Slot<Vec<CreateOutcome>>),
    Delete(String, Actor, Slot<DeleteOutcome>),
    Batch(Box<Batch>, Slot<Vec<BatchResult>>),
    AddReport(Box<Report>, Slot<Report>),
    ResolveReport(u64, Resolution, Slot<Option<Result<Report, Report>>>),
    PutOwner(Box<OwnerRecord>, Slot<()>),
    Replicate(Box<Replicated>, Slot<ReplicateOutcome>),
    Shutdown(Slot<()>),
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    Ok(serde_json::to_string(v)?)
}

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Runs a statement in one round trip (`execute_typed`: the parameter types are given, so no
/// prepare round trip first). The create path's statements run so: a group commit to a
/// synchronous standby is mostly round trips.
async fn run(
    txn: &Transaction<'_>,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<u64, StoreError> {
    txn.execute_typed(sql, params).await.map_err(pg)
}

fn deny_code(kind: DenyKind) -> i16 {
    match kind {
        DenyKind::Gone => DENY_GONE,
        DenyKind::Warn => DENY_WARN,
    }
}

/// Changes a transaction writes to the log, the denylist and the audit trail, written with
/// one statement per table at the end.
#[derive(Default)]
struct Appends {
    /// This region: the origin of the audit records written with its changes.
    region: u32,
    changes: Vec<(i64, String)>,
    audit: Vec<(String, String)>,
    deny_set: HashMap<String, Option<i16>>,
    /// Change-log entries another region originated (`change_origins`): sequence, region.
    origins: Vec<(i64, i32)>,
}

impl Appends {
    /// Appends `code`'s new `state` to the log (the next sequence, which it returns) and its
    /// denylist entry.
    fn state_changed(
        &mut self,
        next_seq: &mut i64,
        code: &str,
        state: &LinkState,
    ) -> Result<i64, StoreError> {
        let seq = *next_seq;
        *next_seq += 1;
        self.changes.push((
            seq,
            json(&Change::StateChanged {
                code: code.to_string(),
                state: state.logged(),
            })?,
        ));
        self.deny_set
            .insert(code.to_string(), state.deny_kind().map(deny_code));
        Ok(seq)
    }

    /// Appends an audit record of `code`; `change` is the sequence of our change it goes
    /// with ([`AuditRecord::origin`]; a record with an origin already, another region's,
    /// keeps it).
    fn record(
        &mut self,
        code: &str,
        mut record: AuditRecord,
        change: Option<i64>,
    ) -> Result<(), StoreError> {
        if record.origin.is_none() {
            record.origin = change.map(|seq| Origin {
                region: self.region,
                seq: u64::try_from(seq).unwrap_or(0),
            });
        }
        self.audit.push((code.to_string(), json(&record)?));
        Ok(())
    }

    /// The statements that write them, to be sent together (pipelined: one round trip for
    /// the lot, [`all`]).
    fn statements<'a>(self, txn: &'a Transaction<'a>) -> Vec<Pending<'a>> {
        let mut out: Vec<Pending<'a>> = Vec::new();
        if !self.changes.is_empty() {
            let (seqs, texts): (Vec<i64>, Vec<String>) = self.changes.into_iter().unzip();
            out.push(Box::pin(async move {
                run(
                    txn,
                    "INSERT INTO changes (seq, change) \
                     SELECT * FROM unnest($1::bigint[], $2::text[])",
                    &[(&seqs, Type::INT8_ARRAY), (&texts, Type::TEXT_ARRAY)],
                )
                .await
            }));
        }
        if !self.audit.is_empty() {
            let (codes, records): (Vec<String>, Vec<String>) = self.audit.into_iter().unzip();
            out.push(Box::pin(async move {
                run(
                    txn,
                    "INSERT INTO audit (code, record) SELECT * FROM unnest($1::text[], $2::text[])",
                    &[(&codes, Type::TEXT_ARRAY), (&records, Type::TEXT_ARRAY)],
                )
                .await
            }));
        }
        if !self.origins.is_empty() {
            let (seqs, regions): (Vec<i64>, Vec<i32>) = self.origins.into_iter().unzip();
            out.push(Box::pin(async move {
                run(
                    txn,
                    "INSERT INTO change_origins (seq, region) \
                     SELECT * FROM unnest($1::bigint[], $2::int[])",
                    &[(&seqs, Type::INT8_ARRAY), (&regions, Type::INT4_ARRAY)],
                )
                .await
            }));
        }
        let (mut set_codes, mut set_kinds, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for (code, kind) in self.deny_set {
            match kind {
                Some(k) => {
                    set_codes.push(code);
                    set_kinds.push(k);
                }
                None => gone.push(code),
            }
        }
        if !set_codes.is_empty() {
            out.push(Box::pin(async move {
                run(
                    txn,
                    "INSERT INTO denied (code, kind) \
                     SELECT * FROM unnest($1::text[], $2::smallint[]) \
                     ON CONFLICT (code) DO UPDATE SET kind = excluded.kind",
                    &[
                        (&set_codes, Type::TEXT_ARRAY),
                        (&set_kinds, Type::INT2_ARRAY),
                    ],
                )
                .await
            }));
        }
        if !gone.is_empty() {
            out.push(Box::pin(async move {
                run(
                    txn,
                    "DELETE FROM denied WHERE code = ANY($1)",
                    &[(&gone, Type::TEXT_ARRAY)],
                )
                .await
            }));
        }
        out
    }
}

/// A statement sent but not yet answered.
type Pending<'a> = std::pin::Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send + 'a>>;

/// Sends every statement before waiting for any answer: tokio-postgres pipelines requests
/// polled together on one connection, so independent statements of a transaction cost one
/// round trip (the server still runs them in order).
async fn all(pending: Vec<Pending<'_>>) -> Result<(), StoreError> {
    futures_util::future::try_join_all(pending).await.map(drop)
}

pub(crate) struct Writer {
    pg: super::tls::PgTarget,
    client: Option<Client>,
    scheme: CodeScheme,
    region: u32,
    counter_range: Range<u64>,
    block_size: u64,
    /// The unused part of the leased block.
    block: Range<u64>,
    /// The claimed counters in `block` ([`crate::CLAIMED_SET`]), in order: skipped.
    skip: Vec<u64>,
    idempotency_ttl_ms: i64,
    max_batch: usize,
    commits: Arc<watch::Sender<u64>>,
    observer: Option<crate::CommitObserver>,
}

impl Writer {
    pub(crate) fn new(
        config: &PgStoreConfig,
        pg: super::tls::PgTarget,
        commits: Arc<watch::Sender<u64>>,
    ) -> Result<Writer, StoreError> {
        let counter_range = region_range(config.region, config.regions)
            .map_err(|e| StoreError::Refused(e.to_string()))?;
        Ok(Writer {
            pg,
            client: None,
            scheme: config.scheme.clone(),
            region: config.region,
            counter_range,
            block_size: config.block_size.max(1),
            block: 0..0,
            skip: Vec::new(),
            idempotency_ttl_ms: config.idempotency_ttl_ms,
            max_batch: config.max_batch.max(1),
            commits,
            observer: config.observer.clone(),
        })
    }

    pub(crate) async fn run(mut self, mut rx: tokio::sync::mpsc::UnboundedReceiver<Op>) {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if self.commit_batch(batch).await {
                return;
            }
        }
        // Every sender is gone without a Shutdown: hand the block back anyway.
        let _ = self.commit_batch(Vec::new()).await;
    }

    /// The connection, opened again if it was lost (a restart or a failover: with several
    /// hosts and `target_session_attrs=read-write` this finds the new primary).
    async fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = None;
            self.client = Some(connect(&self.pg).await?);
        }
        self.client
            .as_mut()
            .ok_or(StoreError::NotApplied("no postgres connection"))
    }

    /// Applies and commits one batch; true when a shutdown was in it.
    async fn commit_batch(&mut self, batch: Vec<Op>) -> bool {
        let mut shutdown = batch.is_empty();
        let ops = batch.len();
        let began = std::time::Instant::now();
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        let result = self.apply(batch, &mut finishes, &mut shutdown).await;
        let err = match result {
            Ok(last) => {
                if let Some(observe) = &self.observer {
                    observe(ops, began.elapsed().as_secs_f64());
                }
                if let Some(last) = last {
                    // Before the callers hear back: a takedown's 200 never precedes the feed.
                    announce(&self.commits, last);
                }
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "postgres group commit failed");
                // Burn the block: a lease made in the failed transaction never happened, and a
                // commit whose answer was lost may have written links with its counters.
                self.block = 0..0;
                if self.client.as_ref().is_some_and(|c| c.is_closed()) {
                    self.client = None;
                }
                Some(e)
            }
        };
        for f in finishes {
            f(err.as_ref());
        }
        shutdown
    }

    /// The transaction of one batch; the last change-log sequence it wrote, if any.
    async fn apply(
        &mut self,
        batch: Vec<Op>,
        finishes: &mut Vec<Finish>,
        shutdown: &mut bool,
    ) -> Result<Option<u64>, StoreError> {
        let writes_log = batch.iter().any(|op| {
            matches!(
                op,
                Op::Create(..)
                    | Op::CreateMany(..)
                    | Op::Delete { .. }
                    | Op::Batch(..)
                    | Op::Replicate(..)
            )
        });
        // Every reply registered first: whatever fails below, each caller hears of it.
        let work: Vec<Work> = batch
            .into_iter()
            .map(|op| match op {
                Op::Create(req, reply) => Work::Create(req, pending(reply, finishes)),
                Op::CreateMany(reqs, reply) => Work::CreateMany(reqs, pending(reply, finishes)),
                Op::Delete { code, actor, reply } => {
                    Work::Delete(code, actor, pending(reply, finishes))
                }
                Op::Batch(b, reply) => Work::Batch(b, pending(reply, finishes)),
                Op::AddReport(r, reply) => Work::AddReport(r, pending(reply, finishes)),
                Op::ResolveReport {
                    id,
                    resolution,
                    reply,
                } => Work::ResolveReport(id, resolution, pending(reply, finishes)),
                Op::PutOwner(r, reply) => Work::PutOwner(r, pending(reply, finishes)),
                Op::Replicate(page, reply) => Work::Replicate(page, pending(reply, finishes)),
                Op::Shutdown(reply) => {
                    *shutdown = true;
                    Work::Shutdown(pending(reply, finishes))
                }
            })
            .collect();
        let ttl = self.idempotency_ttl_ms;
        let scheme = self.scheme.clone();
        // Borrow-splitting: the counter state is used while the client is borrowed.
        let mut counters = Counters {
            region: self.region,
            range: self.counter_range.clone(),
            block_size: self.block_size,
            block: self.block.clone(),
            skip: std::mem::take(&mut self.skip),
            mark: None,
        };
        let client = self.client().await?;
        let txn = client.transaction().await.map_err(pg)?;
        let first_seq: i64 = if writes_log {
            txn.query_typed_one("SELECT next FROM change_seq WHERE id = 1 FOR UPDATE", &[])
                .await
                .map_err(pg)?
                .get(0)
        } else {
            0
        };
        let mut next_seq = first_seq;
        let mut appends = Appends {
            region: counters.region,
            ..Appends::default()
        };
        let mut work = work.into_iter().peekable();
        while let Some(item) = work.next() {
            match item {
                Work::Create(req, slot) => {
                    let mut run = vec![(*req, slot)];
                    while let Some(Work::Create(..)) = work.peek() {
                        if let Some(Work::Create(req, slot)) = work.next() {
                            run.push((*req, slot));
                        }
                    }
                    let (reqs, slots): (Vec<_>, Vec<_>) = run.into_iter().unzip();
                    let outcomes = apply_creates(
                        &txn,
                        &reqs,
                        &mut counters,
                        &mut next_seq,
                        &mut appends,
                        ttl,
                        &scheme,
                    )
                    .await?;
                    for (slot, outcome) in slots.iter().zip(outcomes) {
                        fill(slot, outcome);
                    }
                }
                Work::CreateMany(reqs, slot) => {
                    let outcomes = apply_creates(
                        &txn,
                        &reqs,
                        &mut counters,
                        &mut next_seq,
                        &mut appends,
                        ttl,
                        &scheme,
                    )
                    .await?;
                    // All or nothing: an error rolls the whole transaction back.
                    let outcomes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
                    fill(&slot, Ok(outcomes));
                }
                Work::Delete(code, actor, slot) => {
                    let outcome =
                        apply_delete(&txn, &code, &actor, &mut next_seq, &mut appends).await?;
                    fill(&slot, Ok(outcome));
                }
                Work::Batch(batch, slot) => {
                    let outcome = apply_batch(&txn, &batch, &mut next_seq, &mut appends).await?;
                    fill(&slot, Ok(outcome));
                }
                Work::AddReport(report, slot) => {
                    let outcome = add_report(&txn, *report, &mut appends).await?;
                    fill(&slot, Ok(outcome));
                }
                Work::ResolveReport(id, resolution, slot) => {
                    let outcome = resolve_report(&txn, id, resolution).await?;
                    fill(&slot, Ok(outcome));
                }
                Work::PutOwner(record, slot) => {
                    put_owner(&txn, &record).await?;
                    fill(&slot, Ok(()));
                }
                Work::Replicate(page, slot) => {
                    let mut steps = ReplicaSteps {
                        txn: &txn,
                        region: counters.region,
                        next_seq: &mut next_seq,
                        appends: &mut appends,
                    };
                    let outcome = replica::apply(&mut steps, &page).await?;
                    fill(&slot, Ok(outcome));
                }
                Work::Shutdown(slot) => fill(&slot, Ok(())),
            }
        }
        if *shutdown && !counters.block.is_empty() {
            txn.execute(
                "INSERT INTO free_counter_ranges (start_n, end_n, region) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
                &[
                    &i64_of(counters.block.start),
                    &i64_of(counters.block.end),
                    &(counters.region as i32),
                ],
            )
            .await
            .map_err(pg)?;
            counters.block = 0..0;
        }
        // The log, the denylist, the audit trail, a few expired idempotency records and the
        // sequence's new value with the wake-up: sent together, one round trip.
        let mut pending = appends.statements(&txn);
        let cutoff = crate::clock::now_ms() - ttl;
        let txn_ref = &txn;
        pending.push(Box::pin(async move {
            run(
                txn_ref,
                "DELETE FROM idempotency WHERE ctid IN \
                 (SELECT ctid FROM idempotency WHERE created_at_ms < $1 LIMIT $2)",
                &[(&cutoff, Type::INT8), (&PURGE_PER_COMMIT, Type::INT8)],
            )
            .await
        }));
        let last = if next_seq != first_seq {
            let last = next_seq - 1;
            let payload = last.to_string();
            pending.push(Box::pin(async move {
                run(
                    txn_ref,
                    "UPDATE change_seq SET next = $1 WHERE id = 1 \
                     RETURNING pg_notify($2, $3)",
                    &[
                        (&next_seq, Type::INT8),
                        (&CHANGES_CHANNEL, Type::TEXT),
                        (&payload, Type::TEXT),
                    ],
                )
                .await
            }));
            Some(u64::try_from(last).unwrap_or(0))
        } else {
            None
        };
        all(pending).await?;
        txn.commit().await.map_err(pg)?;
        self.block = counters.block;
        self.skip = counters.skip;
        Ok(last)
    }
}

/// The writer's counter lease, moved into a transaction.
struct Counters {
    region: u32,
    range: Range<u64>,
    block_size: u64,
    block: Range<u64>,
    skip: Vec<u64>,
    /// This transaction's read of the region's mark ([`Counters::mark`]), kept up to date by
    /// its leases: an import's claims read it once, not once a row.
    mark: Option<u64>,
}

impl Counters {
    /// The next counter, leasing a block (a returned one first) when the current is used up;
    /// claimed counters are skipped.
    async fn next(&mut self, txn: &Transaction<'_>) -> Result<u64, StoreError> {
        loop {
            let n = self.next_leased(txn).await?;
            if self.skip.binary_search(&n).is_err() {
                return Ok(n);
            }
        }
    }

    /// Where this region's leases have got to: every counter it ever leased is below it (the
    /// row is locked until the transaction ends, so the answer holds for it).
    async fn mark(&mut self, txn: &Transaction<'_>) -> Result<u64, StoreError> {
        if let Some(mark) = self.mark {
            return Ok(mark);
        }
        let row = txn
            .query_opt(
                "SELECT next FROM counters WHERE region = $1 FOR UPDATE",
                &[&(self.region as i32)],
            )
            .await
            .map_err(pg)?;
        let mark = row
            .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))
            .unwrap_or(self.range.start)
            .max(self.range.start);
        self.mark = Some(mark);
        Ok(mark)
    }

    async fn next_leased(&mut self, txn: &Transaction<'_>) -> Result<u64, StoreError> {
        if self.block.is_empty() {
            let region = self.region as i32;
            let reused = txn
                .query_opt(
                    "DELETE FROM free_counter_ranges WHERE start_n = \
                     (SELECT start_n FROM free_counter_ranges WHERE region = $1 \
                      ORDER BY start_n LIMIT 1 FOR UPDATE) \
                     RETURNING start_n, end_n",
                    &[&region],
                )
                .await
                .map_err(pg)?;
            self.block = match reused {
                Some(row) => {
                    let (s, e): (i64, i64) = (row.get(0), row.get(1));
                    u64::try_from(s).unwrap_or(0)..u64::try_from(e).unwrap_or(0)
                }
                None => {
                    txn.execute(
                        "INSERT INTO counters (region, next) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                        &[&region, &i64_of(self.range.start)],
                    )
                    .await
                    .map_err(pg)?;
                    let next: i64 = txn
                        .query_one(
                            "SELECT next FROM counters WHERE region = $1 FOR UPDATE",
                            &[&region],
                        )
                        .await
                        .map_err(pg)?
                        .get(0);
                    let next = u64::try_from(next).unwrap_or(0).max(self.range.start);
                    if next >= self.range.end {
                        return Err(StoreError::CounterExhausted {
                            region: self.region,
                        });
                    }
                    let end = next.saturating_add(self.block_size).min(self.range.end);
                    txn.execute(
                        "UPDATE counters SET next = $2 WHERE region = $1",
                        &[&region, &i64_of(end)],
                    )
                    .await
                    .map_err(pg)?;
                    self.mark = Some(end);
                    next..end
                }
            };
            self.load_skip(txn).await?;
        }
        let n = self.block.start;
        self.block.start += 1;
        Ok(n)
    }

    /// Reads the claimed counters of the block just leased into `skip`.
    async fn load_skip(&mut self, txn: &Transaction<'_>) -> Result<(), StoreError> {
        let rows = txn
            .query(
                "SELECT code FROM code_sets WHERE set_name = $1 AND code >= $2 AND code < $3 \
                 ORDER BY code",
                &[
                    &crate::CLAIMED_SET,
                    &crate::claimed_entry(self.block.start),
                    &crate::claimed_entry(self.block.end),
                ],
            )
            .await
            .map_err(pg)?;
        self.skip = rows
            .iter()
            .filter_map(|r| r.get::<_, String>(0).parse().ok())
            .collect();
        Ok(())
    }
}

/// A run of creates: one statement per table for all of them.
async fn apply_creates(
    txn: &Transaction<'_>,
    reqs: &[CreateRequest],
    counters: &mut Counters,
    next_seq: &mut i64,
    appends: &mut Appends,
    ttl: i64,
    scheme: &CodeScheme,
) -> Result<Vec<Result<CreateOutcome, StoreError>>, StoreError> {
    let mut outcomes: Vec<Option<Result<CreateOutcome, StoreError>>> =
        (0..reqs.len()).map(|_| None).collect();

    // Idempotency: what earlier transactions answered.
    let keyed: Vec<usize> = (0..reqs.len())
        .filter(|&i| reqs[i].idempotency.is_some())
        .collect();
    let mut remembered: HashMap<(String, String), (String, i64, String)> = HashMap::new();
    if !keyed.is_empty() {
        let owners: Vec<&str> = keyed.iter().map(|&i| reqs[i].owner.as_str()).collect();
        let keys: Vec<&str> = keyed
            .iter()
            .filter_map(|&i| reqs[i].idempotency.as_ref().map(|c| c.key.as_str()))
            .collect();
        let rows = txn
            .query(
                "SELECT i.owner, i.key, i.body_hash, i.created_at_ms, i.code FROM idempotency i \
                 JOIN unnest($1::text[], $2::text[]) AS k(owner, key) \
                   ON i.owner = k.owner AND i.key = k.key",
                &[&owners, &keys],
            )
            .await
            .map_err(pg)?;
        for row in rows {
            remembered.insert(
                (row.get(0), row.get(1)),
                (row.get(2), row.get(3), row.get(4)),
            );
        }
    }
    // Replays need the link as it is now (a deleted one has no URL left to replay).
    let mut replay_codes = Vec::new();
    for &i in &keyed {
        let (Some(claim), req) = (&reqs[i].idempotency, &reqs[i]) else {
            continue;
        };
        if let Some((hash, at, code)) = remembered.get(&(req.owner.clone(), claim.key.clone())) {
            if req.now_ms - at < ttl {
                if *hash == hex::encode(claim.body_hash) {
                    replay_codes.push((i, code.clone()));
                } else {
                    outcomes[i] = Some(Ok(CreateOutcome::IdempotencyMismatch));
                }
            }
        }
    }
    if !replay_codes.is_empty() {
        let codes: Vec<&str> = replay_codes.iter().map(|(_, c)| c.as_str()).collect();
        let rows = txn
            .query(
                &format!(
                    "SELECT {} FROM links WHERE code = ANY($1)",
                    super::LINK_COLUMNS
                ),
                &[&codes],
            )
            .await
            .map_err(pg)?;
        let mut found = HashMap::new();
        for row in &rows {
            let s = super::row_link(row)?;
            found.insert(s.link.code.clone(), s);
        }
        for (i, code) in replay_codes {
            outcomes[i] = Some(match found.get(&code) {
                Some(s) => Ok(CreateOutcome::Replayed(s.clone())),
                None => Err(corrupt("idempotency", format!("no link {code}"))),
            });
        }
    }

    // Aliases: taken in the store, or earlier in this run.
    // An alias's key carries its domain: aliases are unique per domain.
    let aliases: Vec<String> = (0..reqs.len())
        .filter(|&i| outcomes[i].is_none())
        .filter_map(|i| {
            let req = &reqs[i];
            let alias = req.alias.as_deref()?;
            Some(lasthop_core::link_key(req.domain.as_deref(), alias))
        })
        .collect();
    let mut taken: HashSet<String> = HashSet::new();
    if !aliases.is_empty() {
        for row in txn
            .query("SELECT code FROM links WHERE code = ANY($1)", &[&aliases])
            .await
            .map_err(pg)?
        {
            taken.insert(row.get(0));
        }
    }
    // Idempotency keys first used earlier in this run: replays of that create.
    let mut first_of_key: HashMap<(String, String), usize> = HashMap::new();

    let mut codes = Vec::new();
    let mut urls = Vec::new();
    let mut owners = Vec::new();
    let mut created = Vec::new();
    let mut seqs = Vec::new();
    let mut states = Vec::new();
    let (mut idx_keys, mut idx_codes, mut idx_hashes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut idem_owner, mut idem_key, mut idem_hash, mut idem_at, mut idem_code) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut made: Vec<Option<StoredLink>> = (0..reqs.len()).map(|_| None).collect();
    let mut legacy = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        if outcomes[i].is_some() {
            continue;
        }
        if let Some(claim) = &req.idempotency {
            let k = (req.owner.clone(), claim.key.clone());
            if let Some(&j) = first_of_key.get(&k) {
                let same = reqs[j]
                    .idempotency
                    .as_ref()
                    .is_some_and(|c| c.body_hash == claim.body_hash);
                outcomes[i] = Some(Ok(match (&made[j], same) {
                    (Some(s), true) => CreateOutcome::Replayed(s.clone()),
                    (_, false) => CreateOutcome::IdempotencyMismatch,
                    (None, true) => CreateOutcome::AliasTaken,
                }));
                continue;
            }
            first_of_key.insert(k, i);
        }
        let code = match &req.alias {
            Some(alias) => {
                let key = lasthop_core::link_key(req.domain.as_deref(), alias);
                if req.imported.is_none()
                    && lasthop_core::classify(alias.as_bytes()) != lasthop_core::CodeKind::Alias
                {
                    outcomes[i] = Some(Err(corrupt(
                        "alias",
                        format!("{key:?} is not an alias's shape"),
                    )));
                    continue;
                }
                if taken.contains(&key) {
                    outcomes[i] = Some(Ok(CreateOutcome::AliasTaken));
                    continue;
                }
                if req.imported.is_some() {
                    if let Err(why) = claim(txn, counters, scheme, alias).await? {
                        outcomes[i] = Some(Ok(CreateOutcome::Collision(why)));
                        continue;
                    }
                }
                taken.insert(key.clone());
                key
            }
            None => match counters.next(txn).await {
                Ok(n) => {
                    let code = scheme.encode_string(n).map_err(|e| StoreError::Corrupt {
                        what: format!("counter {n}"),
                        detail: e.to_string(),
                    })?;
                    lasthop_core::link_key(req.domain.as_deref(), &code)
                }
                Err(e @ StoreError::CounterExhausted { .. }) => {
                    outcomes[i] = Some(Err(e));
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let seq = *next_seq;
        *next_seq += 1;
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
        if state.legacy_code {
            legacy.push(code.clone());
        }
        appends.changes.push((
            seq,
            json(&Change::LinkCreated {
                link: link.clone(),
                state: state.logged(),
            })?,
        ));
        if let Some(kind) = state.deny_kind() {
            appends.deny_set.insert(code.clone(), Some(deny_code(kind)));
        }
        if let Some(hold) = req.hold {
            let record = AuditRecord::created_held(req.now_ms, &req.actor, hold);
            appends.record(&code, record, Some(seq))?;
        }
        let dest = match &req.destination {
            Some(d) => Some(d.clone()),
            None => Destination::parse(&req.long_url),
        };
        if let Some(dest) = dest {
            idx_keys.push(dest.host.index_key());
            idx_codes.push(code.clone());
            idx_hashes.push(dest.url_hash() as i64);
        }
        if let Some(claim) = &req.idempotency {
            idem_owner.push(req.owner.clone());
            idem_key.push(claim.key.clone());
            idem_hash.push(hex::encode(claim.body_hash));
            idem_at.push(req.now_ms);
            idem_code.push(code.clone());
        }
        codes.push(code);
        urls.push(req.long_url.clone());
        owners.push(req.owner.clone());
        created.push(link.created_at_ms);
        seqs.push(seq);
        states.push(json(&state)?);
        let stored = StoredLink {
            link,
            state,
            seq: u64::try_from(seq).unwrap_or(0),
        };
        made[i] = Some(stored.clone());
        outcomes[i] = Some(Ok(CreateOutcome::Created(stored)));
    }
    let mut pending: Vec<Pending<'_>> = Vec::new();
    if !codes.is_empty() {
        pending.push(Box::pin(async move {
            run(
                txn,
                "INSERT INTO links (code, long_url, owner, created_at_ms, created_seq, state) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], \
                                      $5::bigint[], $6::text[])",
                &[
                    (&codes, Type::TEXT_ARRAY),
                    (&urls, Type::TEXT_ARRAY),
                    (&owners, Type::TEXT_ARRAY),
                    (&created, Type::INT8_ARRAY),
                    (&seqs, Type::INT8_ARRAY),
                    (&states, Type::TEXT_ARRAY),
                ],
            )
            .await
        }));
    }
    if !idx_keys.is_empty() {
        pending.push(Box::pin(async move {
            run(
                txn,
                "INSERT INTO dest_hosts (index_key, code, url_hash) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
                &[
                    (&idx_keys, Type::TEXT_ARRAY),
                    (&idx_codes, Type::TEXT_ARRAY),
                    (&idx_hashes, Type::INT8_ARRAY),
                ],
            )
            .await
        }));
    }
    if !idem_owner.is_empty() {
        pending.push(Box::pin(async move {
            run(
                txn,
                "INSERT INTO idempotency (owner, key, body_hash, created_at_ms, code) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], \
                                      $5::text[]) \
                 ON CONFLICT (owner, key) DO UPDATE SET body_hash = excluded.body_hash, \
                   created_at_ms = excluded.created_at_ms, code = excluded.code",
                &[
                    (&idem_owner, Type::TEXT_ARRAY),
                    (&idem_key, Type::TEXT_ARRAY),
                    (&idem_hash, Type::TEXT_ARRAY),
                    (&idem_at, Type::INT8_ARRAY),
                    (&idem_code, Type::TEXT_ARRAY),
                ],
            )
            .await
        }));
    }
    if !legacy.is_empty() {
        pending.push(Box::pin(async move {
            run(
                txn,
                "INSERT INTO code_sets (set_name, code) SELECT $1, c FROM unnest($2::text[]) AS c \
                 ON CONFLICT DO NOTHING",
                &[
                    (&crate::LEGACY_SET, Type::TEXT),
                    (&legacy, Type::TEXT_ARRAY),
                ],
            )
            .await
        }));
    }
    all(pending).await?;
    Ok(outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(StoreError::NotApplied("create"))))
        .collect())
}

/// Claims what an imported code claims ([`crate::claimed_counter`]) against this region's
/// mark: the claimed counter is written at once, so a lease later in the same transaction
/// skips it. `Err(why)` for a collision.
async fn claim(
    txn: &Transaction<'_>,
    counters: &mut Counters,
    scheme: &CodeScheme,
    code: &str,
) -> Result<Result<(), String>, StoreError> {
    let n = match crate::claimed_counter(scheme, &counters.range, code) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(Ok(())),
        Err(why) => return Ok(Err(why)),
    };
    if let Some(why) = crate::claim_below_mark(n, counters.mark(txn).await?) {
        return Ok(Err(why));
    }
    txn.execute(
        "INSERT INTO code_sets (set_name, code) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&crate::CLAIMED_SET, &crate::claimed_entry(n)],
    )
    .await
    .map_err(pg)?;
    Ok(Ok(()))
}

/// Locks and reads links by code.
async fn read_for_update(
    txn: &Transaction<'_>,
    codes: &[String],
) -> Result<HashMap<String, StoredLink>, StoreError> {
    let rows = txn
        .query(
            &format!(
                "SELECT {} FROM links WHERE code = ANY($1) ORDER BY code FOR UPDATE",
                super::LINK_COLUMNS
            ),
            &[&codes],
        )
        .await
        .map_err(pg)?;
    let mut out = HashMap::new();
    for row in &rows {
        let s = super::row_link(row)?;
        out.insert(s.link.code.clone(), s);
    }
    Ok(out)
}

async fn apply_delete(
    txn: &Transaction<'_>,
    code: &str,
    actor: &Actor,
    next_seq: &mut i64,
    appends: &mut Appends,
) -> Result<DeleteOutcome, StoreError> {
    let mut found = read_for_update(txn, &[code.to_string()]).await?;
    let Some(s) = found.remove(code) else {
        return Ok(DeleteOutcome::NotFound);
    };
    if s.state.deleted {
        return Ok(DeleteOutcome::AlreadyDeleted);
    }
    erase(txn, s, Some(actor), next_seq, appends).await?;
    Ok(DeleteOutcome::Deleted)
}

/// Soft-deletes the link `s` (read for update, not deleted): its URL and index entries go,
/// the code stays. With `actor`, its audit record is written (a replicated deletion brings
/// the record of the region that made it instead).
async fn erase(
    txn: &Transaction<'_>,
    mut s: StoredLink,
    actor: Option<&Actor>,
    next_seq: &mut i64,
    appends: &mut Appends,
) -> Result<(), StoreError> {
    let code = s.link.code.clone();
    index_destination(txn, &code, s.state.url(&s.link), false).await?;
    s.link.long_url.clear();
    s.state.deleted = true;
    s.state.destination = None;
    s.state.pending_destination = None;
    s.state.destination_unscanned = false;
    txn.execute(
        "UPDATE links SET long_url = '', state = $2 WHERE code = $1",
        &[&code, &json(&s.state)?],
    )
    .await
    .map_err(pg)?;
    // Erasure: the creation's log entry carried the URL; it keeps the code, not the URL.
    scrub_creation(txn, &s.link, s.seq).await?;
    let seq = appends.state_changed(next_seq, &code, &s.state)?;
    if let Some(actor) = actor {
        appends.record(&code, AuditRecord::deleted(actor), Some(seq))?;
    }
    Ok(())
}

/// The PostgreSQL store's steps of a replicated page ([`crate::replica`]), in the batch's
/// transaction. That transaction holds the change-log lock, so control planes of one region
/// applying the same page take turns, and the second skips what the first applied. Its
/// change-log entries, denylist entries, audit records and origins go out with the batch's
/// other appends ([`Appends`]).
struct ReplicaSteps<'a, 't> {
    txn: &'a Transaction<'t>,
    region: u32,
    next_seq: &'a mut i64,
    appends: &'a mut Appends,
}

impl Replica for ReplicaSteps<'_, '_> {
    /// The link, read and locked for update.
    type Held = StoredLink;

    fn region(&self) -> u32 {
        self.region
    }

    fn state(held: &StoredLink) -> &LinkState {
        &held.state
    }

    fn next_seq(&self) -> u64 {
        u64::try_from(*self.next_seq).unwrap_or(0)
    }

    async fn position(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .txn
            .query_opt("SELECT value FROM positions WHERE name = $1", &[&name])
            .await
            .map_err(pg)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn insert_link(&mut self, link: &Link, state: &LinkState) -> Result<bool, StoreError> {
        let seq = *self.next_seq;
        let written = self
            .txn
            .execute(
                "INSERT INTO links (code, long_url, owner, created_at_ms, created_seq, state) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (code) DO NOTHING",
                &[
                    &link.code,
                    &link.long_url,
                    &link.owner,
                    &link.created_at_ms,
                    &seq,
                    &json(state)?,
                ],
            )
            .await
            .map_err(pg)?;
        if written == 0 {
            return Ok(false);
        }
        *self.next_seq += 1;
        self.appends.changes.push((
            seq,
            json(&Change::LinkCreated {
                link: link.clone(),
                state: state.logged(),
            })?,
        ));
        if let Some(kind) = state.deny_kind() {
            self.appends
                .deny_set
                .insert(link.code.clone(), Some(deny_code(kind)));
        }
        if !state.deleted {
            index_destination(self.txn, &link.code, state.url(link), true).await?;
        }
        if state.legacy_code {
            self.txn
                .execute(
                    "INSERT INTO code_sets (set_name, code) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[&crate::LEGACY_SET, &link.code],
                )
                .await
                .map_err(pg)?;
        }
        Ok(true)
    }

    async fn hold(&mut self, code: &str) -> Result<Option<StoredLink>, StoreError> {
        let mut found = read_for_update(self.txn, &[code.to_string()]).await?;
        Ok(found.remove(code))
    }

    async fn set_state(
        &mut self,
        code: &str,
        held: StoredLink,
        state: &LinkState,
    ) -> Result<(), StoreError> {
        reindex_destination(self.txn, &held.link, &held.state, state).await?;
        self.txn
            .execute(
                "UPDATE links SET state = $2 WHERE code = $1",
                &[&code, &json(state)?],
            )
            .await
            .map_err(pg)?;
        self.appends.state_changed(self.next_seq, code, state)?;
        Ok(())
    }

    async fn erase(&mut self, _: &str, held: StoredLink) -> Result<(), StoreError> {
        erase(self.txn, held, None, self.next_seq, self.appends).await
    }

    async fn has_link(&mut self, code: &str) -> Result<bool, StoreError> {
        let row = self
            .txn
            .query_opt("SELECT 1 FROM links WHERE code = $1", &[&code])
            .await
            .map_err(pg)?;
        Ok(row.is_some())
    }

    async fn add_audit(&mut self, code: &str, record: AuditRecord) -> Result<(), StoreError> {
        self.appends.record(code, record, None)
    }

    async fn mark_origins(&mut self, seqs: Range<u64>, region: u32) -> Result<(), StoreError> {
        let region = region as i32;
        self.appends
            .origins
            .extend(seqs.map(|seq| (i64_of(seq), region)));
        Ok(())
    }

    async fn raise_mark(&mut self, region: u32, mark: u64) -> Result<(), StoreError> {
        self.txn
            .execute(
                "INSERT INTO counters (region, next) VALUES ($1, $2) \
                 ON CONFLICT (region) DO UPDATE SET next = GREATEST(counters.next, excluded.next)",
                &[&(region as i32), &i64_of(mark)],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn save_position(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        save_position(self.txn, name, value).await
    }
}

/// Saves a position (`positions`), as [`crate::Store::position`] reads it.
async fn save_position(txn: &Transaction<'_>, name: &str, value: &str) -> Result<(), StoreError> {
    txn.execute(
        "INSERT INTO positions (name, value) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        &[&name, &value],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Rewrites the creation entry (sequence `seq`) of a deleted link without its URL.
async fn scrub_creation(txn: &Transaction<'_>, link: &Link, seq: u64) -> Result<(), StoreError> {
    let seq = i64_of(seq);
    let Some(row) = txn
        .query_opt("SELECT change FROM changes WHERE seq = $1", &[&seq])
        .await
        .map_err(pg)?
    else {
        return Ok(());
    };
    let text: String = row.get(0);
    let mut change: Change = serde_json::from_str(&text).map_err(|e| corrupt("changes", e))?;
    if let Change::LinkCreated { link: l, .. } = &mut change {
        if l.code == link.code {
            l.long_url.clear();
            txn.execute(
                "UPDATE changes SET change = $2 WHERE seq = $1",
                &[&seq, &json(&change)?],
            )
            .await
            .map_err(pg)?;
        }
    }
    Ok(())
}

/// Writes (or erases) the destination-index entry of the link `code` to `url`, its current
/// destination (nothing when it is no web destination).
async fn index_destination(
    txn: &Transaction<'_>,
    code: &str,
    url: &str,
    insert: bool,
) -> Result<(), StoreError> {
    let Some(dest) = Destination::parse(url) else {
        return Ok(());
    };
    if insert {
        txn.execute(
            "INSERT INTO dest_hosts (index_key, code, url_hash) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
            &[&dest.host.index_key(), &code, &(dest.url_hash() as i64)],
        )
        .await
        .map_err(pg)?;
    } else {
        txn.execute(
            "DELETE FROM dest_hosts WHERE index_key = $1 AND code = $2",
            &[&dest.host.index_key(), &code],
        )
        .await
        .map_err(pg)?;
    }
    Ok(())
}

/// Moves a link's destination-index entry when a state change changes its current
/// destination (an edit), so list takedowns by host find it under the host it now serves.
async fn reindex_destination(
    txn: &Transaction<'_>,
    link: &Link,
    before: &LinkState,
    after: &LinkState,
) -> Result<(), StoreError> {
    let (old, new) = (before.url(link), after.url(link));
    if old != new && !before.deleted && !after.deleted {
        index_destination(txn, &link.code, old, false).await?;
        index_destination(txn, &link.code, new, true).await?;
    }
    Ok(())
}

async fn apply_batch(
    txn: &Transaction<'_>,
    batch: &Batch,
    next_seq: &mut i64,
    appends: &mut Appends,
) -> Result<Vec<BatchResult>, StoreError> {
    let codes: Vec<String> = batch.updates.iter().map(|u| u.code.clone()).collect();
    let mut links = if codes.is_empty() {
        HashMap::new()
    } else {
        read_for_update(txn, &codes).await?
    };
    let mut out = Vec::with_capacity(batch.updates.len());
    let mut states: HashMap<String, String> = HashMap::new();
    let mut marked = Vec::new();
    for u in &batch.updates {
        let Some(s) = links.get_mut(&u.code) else {
            out.push(BatchResult {
                code: u.code.clone(),
                link: None,
                changed: false,
            });
            continue;
        };
        let next = u.update.apply(&s.state, &batch.actor);
        let changed = next != s.state;
        if changed {
            reindex_destination(txn, &s.link, &s.state, &next).await?;
            let record = u.update.audit(&s.state, &next, &batch.actor, batch.now_ms);
            let seq = appends.state_changed(next_seq, &u.code, &next)?;
            appends.record(&u.code, record, Some(seq))?;
            states.insert(u.code.clone(), json(&next)?);
            if batch.mark_changed.is_some() {
                marked.push(u.code.clone());
            }
            s.state = next;
        }
        out.push(BatchResult {
            code: u.code.clone(),
            link: Some(StoredLink {
                seq: 0,
                ..s.clone()
            }),
            changed,
        });
    }
    if !states.is_empty() {
        let (codes, texts): (Vec<String>, Vec<String>) = states.into_iter().unzip();
        txn.execute(
            "UPDATE links SET state = u.state FROM unnest($1::text[], $2::text[]) AS u(code, state) \
             WHERE links.code = u.code",
            &[&codes, &texts],
        )
        .await
        .map_err(pg)?;
    }
    if let (Some(set), false) = (&batch.mark_changed, marked.is_empty()) {
        txn.execute(
            "INSERT INTO code_sets (set_name, code) SELECT $1, c FROM unnest($2::text[]) AS c \
             ON CONFLICT DO NOTHING",
            &[set, &marked],
        )
        .await
        .map_err(pg)?;
    }
    if let Some(set) = &batch.unmark {
        txn.execute(
            "DELETE FROM code_sets WHERE set_name = $1 AND code = ANY($2)",
            &[set, &codes],
        )
        .await
        .map_err(pg)?;
    }
    for (name, value) in &batch.positions {
        save_position(txn, name, value).await?;
    }
    Ok(out)
}

async fn add_report(
    txn: &Transaction<'_>,
    mut report: Report,
    appends: &mut Appends,
) -> Result<Report, StoreError> {
    let id: i64 = txn
        .query_one("SELECT nextval('reports_id_seq')", &[])
        .await
        .map_err(pg)?
        .get(0);
    report.id = u64::try_from(id).unwrap_or(0);
    report.resolution = None;
    txn.execute(
        "INSERT INTO reports (id, open, report) VALUES ($1, true, $2)",
        &[&id, &json(&report)?],
    )
    .await
    .map_err(pg)?;
    appends
        .audit
        .push((report.code.clone(), json(&AuditRecord::filed(&report))?));
    Ok(report)
}

async fn resolve_report(
    txn: &Transaction<'_>,
    id: u64,
    resolution: Resolution,
) -> Result<Option<Result<Report, Report>>, StoreError> {
    let id = i64_of(id);
    let Some(row) = txn
        .query_opt(
            "SELECT report FROM reports WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(pg)?
    else {
        return Ok(None);
    };
    let text: String = row.get(0);
    let mut report: Report = serde_json::from_str(&text).map_err(|e| corrupt("reports", e))?;
    if report.resolution.is_some() {
        return Ok(Some(Err(report)));
    }
    report.resolution = Some(resolution);
    txn.execute(
        "UPDATE reports SET open = false, report = $2 WHERE id = $1",
        &[&id, &json(&report)?],
    )
    .await
    .map_err(pg)?;
    Ok(Some(Ok(report)))
}

async fn put_owner(txn: &Transaction<'_>, record: &OwnerRecord) -> Result<(), StoreError> {
    if record.flagged.is_none() && record.suspended.is_none() && record.unsuspended_at_ms.is_none()
    {
        txn.execute("DELETE FROM owners WHERE owner = $1", &[&record.owner])
            .await
            .map_err(pg)?;
    } else {
        txn.execute(
            "INSERT INTO owners (owner, record) VALUES ($1, $2) \
             ON CONFLICT (owner) DO UPDATE SET record = excluded.record",
            &[&record.owner, &json(record)?],
        )
        .await
        .map_err(pg)?;
    }
    // Every control plane reloads its cache of owners (suspensions, flags) on this.
    txn.execute(
        "SELECT pg_notify($1, 'owners')",
        &[&super::keys::STATE_CHANNEL],
    )
    .await
    .map_err(pg)?;
    Ok(())
}
