//! The default store: one redb file, one writer thread, group commit.
//!
//! Writes go through a single thread (`writer.rs`) that drains whatever is queued (up to
//! `max_batch` operations), applies them in order inside one write transaction and commits it
//! with `Durability::Immediate` (fsync) before answering any of them. Serialising writes this
//! way is what makes an alias claim a real conditional write: the check and the insert of two
//! competing claims can never interleave, and the second claim sees the first even within one
//! batch.
//!
//! Counter blocks are leased from `meta["counter_next/<region>"]` inside the same transaction
//! as the first link that uses them, so a block is durable before any of its codes is. A crash
//! burns the rest of the block (the sequence already moved past it); a graceful shutdown returns
//! it to `free_counter_ranges`, which the next lease takes first.
//!
//! Records are keyed by [`record_key`]: a generated code by its counter (`0x00 ‖ n`), an alias by
//! its name (`0x01 ‖ alias`). Counters are leased in blocks and handed out in order, so the
//! inserts of a group commit land on the same few B-tree leaves instead of one random leaf per
//! link: that locality is what lets one fsync cover a whole batch cheaply.
//!
//! Tables: `links` (key → Link JSON), `link_state` (key → LinkState JSON), `owner_links`
//! (owner ‖ 0x00 ‖ !seq → code; newest first), `changes` (seq → Change JSON), `meta`,
//! `free_counter_ranges` (start → end), `idempotency` (owner ‖ 0x00 ‖ key → record),
//! `idempotency_expiry` ((created_ms, owner ‖ 0x00 ‖ key) → ()) and `denied` (code → deny kind:
//! every link now disabled, taken down or flagged, kept in the transaction that changes the
//! state, so the feed's standing denylist is one small range read, never a scan of every link;
//! stores from before it existed had no way to take a link down, so it starts out complete);
//! the trust-and-safety tables: `dest_hosts` (the destination index: a host's links,
//! subdomains included, are one key range, so a new list entry finds what it matches without a
//! scan; each entry carries the hash of the URL's match key, so a URL entry is checked without
//! reading links; written and erased with the link), `audit` (append-only, per link),
//! `code_sets` (the pending-scan queue, suspensions' takedowns), `reports` and `reports_open`,
//! and `owners` (velocity flags, suspensions); `domains` (a branded domain's name → its
//! record, written by revision: `Store::write_domain`). The trust tables are keyed by the record key
//! too, not the code, so a group commit of new links appends to them in counter order rather
//! than dirtying one random leaf per link (which halved creates/s when they were keyed by code).
//!
//! After each durable commit the writer publishes the last change-log sequence on a
//! `tokio::sync::watch` channel ([`Store::commits`]) before answering the batch's callers, so a
//! feed subscriber is woken by the commit itself, never by polling.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use std::ops::Bound;

use lasthop_core::feed::DenyKind;
use lasthop_core::{classify, region_range, Change, CodeKind, CodeScheme, Link, LinkState};
use lasthop_trust::{CanonicalHost, Destination};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table,
    TableDefinition,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    Actor, AuditRecord, Batch, BatchResult, CodePage, CreateOutcome, CreateRequest, DeleteOutcome,
    DomainRecord, HostEntry, HostPage, LinkPage, OwnChange, OwnerRecord, ReplicateOutcome,
    Replicated, Report, ReportFilter, ReportPage, Resolution, Store, StoreError, StoredLink,
};
use crate::corrupt;
use writer::{Op, Reply, Writer};

pub mod transfer;
mod writer;

const LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("links");
const STATES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("link_state");
const OWNER_LINKS: TableDefinition<&[u8], &str> = TableDefinition::new("owner_links");
const CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("changes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const FREE_RANGES: TableDefinition<u64, u64> = TableDefinition::new("free_counter_ranges");
const IDEMPOTENCY: TableDefinition<&str, &[u8]> = TableDefinition::new("idempotency");
const IDEM_EXPIRY: TableDefinition<(i64, &str), ()> = TableDefinition::new("idempotency_expiry");
const DENIED: TableDefinition<&str, u8> = TableDefinition::new("denied");
/// `index_key(host) ‖ 0x00 ‖ record key` → url-key hash (8 bytes, big-endian) ‖ code: a
/// host's links, then its subdomains', are one key range, each host's in creation order.
const DEST_HOSTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dest_hosts");
/// `record key ‖ 0x00 ‖ n` (n the global audit counter) → AuditRecord JSON.
const AUDIT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("audit");
/// (set, record key) → code: the pending-scan queue and suspensions' takedowns.
const CODE_SETS: TableDefinition<(&str, &[u8]), &str> = TableDefinition::new("code_sets");
const REPORTS: TableDefinition<u64, &[u8]> = TableDefinition::new("reports");
const REPORTS_OPEN: TableDefinition<u64, ()> = TableDefinition::new("reports_open");
const OWNERS: TableDefinition<&str, &[u8]> = TableDefinition::new("owners");
/// Branded domains: name → DomainRecord JSON.
const DOMAINS: TableDefinition<&str, &[u8]> = TableDefinition::new("domains");
/// name → position of a background walk ([`Store::position`]).
const POSITIONS: TableDefinition<&str, &str> = TableDefinition::new("positions");
/// Change-log entries another region originated (replicated here): sequence → that region.
/// A peer's replication skips them, so nothing loops.
const ORIGINS: TableDefinition<u64, u32> = TableDefinition::new("change_origins");

/// `denied` values.
const DENY_GONE: u8 = 0;
const DENY_WARN: u8 = 1;

const META_KEY_ID: &str = "key_id";
/// Set once the destination index covers every link (stores from before it are backfilled).
const META_DEST_INDEX: &str = "dest_index_v1";
const META_AUDIT_NEXT: &str = "audit_next";
const META_REPORT_NEXT: &str = "report_next";
/// Bumped by every domain write: [`Store::domains_generation`].
pub(super) const META_DOMAINS_GENERATION: &str = "domains_generation";

const COUNTER_PREFIX: &str = "counter_next/";

fn storage<E: Into<crate::Cause>>(e: E) -> StoreError {
    StoreError::Embedded(e.into())
}

/// Settings of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedStoreConfig {
    /// The redb file.
    pub path: PathBuf,
    /// The code scheme (its key id is pinned in the store on first open).
    pub scheme: CodeScheme,
    /// This writer's region and the region count.
    pub region: u32,
    pub regions: u32,
    /// Counters leased at a time.
    pub block_size: u64,
    /// How long an idempotency key is remembered.
    pub idempotency_ttl_ms: i64,
    /// Most operations in one group commit.
    pub max_batch: usize,
}

impl EmbeddedStoreConfig {
    /// Defaults for everything but the path and scheme.
    pub fn new(path: PathBuf, scheme: CodeScheme) -> Self {
        EmbeddedStoreConfig {
            path,
            scheme,
            region: 0,
            regions: 1,
            block_size: 10_000,
            idempotency_ttl_ms: 24 * 3600 * 1000,
            max_batch: 1024,
        }
    }
}

/// A `links` row: the link and the change-log sequence of its creation (rows written before
/// `seq` was stored have none; [`writer::Writer::creation_seq`] finds it another way).
#[derive(Serialize)]
struct LinkRow<'a> {
    #[serde(flatten)]
    link: &'a Link,
    seq: u64,
}

/// The creation sequence of a `links` row, if it has one.
#[derive(Deserialize)]
struct RowSeq {
    #[serde(default)]
    seq: Option<u64>,
}

pub use super::CommitObserver;

/// The embedded store. Cheap to share behind an `Arc`.
pub struct EmbeddedStore {
    db: Arc<Database>,
    scheme: CodeScheme,
    /// This writer's region (the origin of the audit records it writes).
    region: u32,
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    commits: watch::Receiver<u64>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store and starts its writer thread.
    pub fn open(
        config: EmbeddedStoreConfig,
        observer: Option<CommitObserver>,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = config.path.parent() {
            std::fs::create_dir_all(dir).map_err(storage)?;
        }
        let db = Arc::new(Database::create(&config.path).map_err(storage)?);
        let counter_range = region_range(config.region, config.regions).map_err(storage)?;
        let next_seq = {
            let mut txn = db.begin_write().map_err(storage)?;
            txn.set_durability(Durability::Immediate).map_err(storage)?;
            let last = {
                let mut meta = txn.open_table(META).map_err(storage)?;
                let key_id = u64::from(config.scheme.key_id());
                let stored = meta.get(META_KEY_ID).map_err(storage)?.map(|g| g.value());
                match stored {
                    Some(id) if id != key_id => {
                        return Err(StoreError::Refused(format!(
                            "store was created under permutation key {id:08x}, not {key_id:08x}: \
                             refusing to mint codes under another key"
                        )))
                    }
                    Some(_) => {}
                    None => {
                        meta.insert(META_KEY_ID, key_id).map_err(storage)?;
                    }
                }
                // Create every table so readers never meet a missing one.
                txn.open_table(LINKS).map_err(storage)?;
                txn.open_table(STATES).map_err(storage)?;
                txn.open_table(OWNER_LINKS).map_err(storage)?;
                txn.open_table(FREE_RANGES).map_err(storage)?;
                txn.open_table(IDEMPOTENCY).map_err(storage)?;
                txn.open_table(IDEM_EXPIRY).map_err(storage)?;
                txn.open_table(DENIED).map_err(storage)?;
                txn.open_table(AUDIT).map_err(storage)?;
                txn.open_table(CODE_SETS).map_err(storage)?;
                txn.open_table(REPORTS).map_err(storage)?;
                txn.open_table(REPORTS_OPEN).map_err(storage)?;
                txn.open_table(OWNERS).map_err(storage)?;
                txn.open_table(DOMAINS).map_err(storage)?;
                txn.open_table(POSITIONS).map_err(storage)?;
                txn.open_table(ORIGINS).map_err(storage)?;
                let mut hosts = txn.open_table(DEST_HOSTS).map_err(storage)?;
                if meta.get(META_DEST_INDEX).map_err(storage)?.is_none() {
                    let links = txn.open_table(LINKS).map_err(storage)?;
                    let mut indexed = 0u64;
                    for item in links.iter().map_err(storage)? {
                        let (k, v) = item.map_err(storage)?;
                        let link: Link =
                            serde_json::from_slice(v.value()).map_err(|e| corrupt("links", e))?;
                        // Stores from before this index had no edits: the URL is the link's.
                        if index_destination(
                            &mut hosts,
                            k.value(),
                            &link.code,
                            &link.long_url,
                            true,
                        )? {
                            indexed += 1;
                        }
                    }
                    if indexed > 0 {
                        tracing::info!(links = indexed, "built the destination index");
                    }
                    meta.insert(META_DEST_INDEX, 1).map_err(storage)?;
                }
                let changes = txn.open_table(CHANGES).map_err(storage)?;
                let last = changes.last().map_err(storage)?.map(|(k, _)| k.value());
                last.unwrap_or(0)
            };
            txn.commit().map_err(storage)?;
            last + 1
        };
        let (tx, rx) = mpsc::channel();
        let (commits_tx, commits) = watch::channel(next_seq - 1);
        let writer = Writer::new(
            Arc::clone(&db),
            &config,
            counter_range,
            next_seq,
            observer,
            commits_tx,
        )?;
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(storage)?;
        Ok(EmbeddedStore {
            db,
            scheme: config.scheme,
            region: config.region,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            commits,
        })
    }

    fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let guard = self.tx.lock().map_err(|_| StoreError::ShuttingDown)?;
            let tx = guard.as_ref().ok_or(StoreError::ShuttingDown)?;
            tx.send(make(reply)).map_err(|_| StoreError::ShuttingDown)?;
        }
        answer.recv().map_err(|_| StoreError::ShuttingDown)?
    }

    fn read_link(
        &self,
        links: &impl ReadableTable<&'static [u8], &'static [u8]>,
        states: &impl ReadableTable<&'static [u8], &'static [u8]>,
        code: &str,
        seq: u64,
    ) -> Result<Option<StoredLink>, StoreError> {
        let Some(key) = record_key(&self.scheme, code) else {
            return Ok(None);
        };
        let Some(raw) = links.get(key.as_slice()).map_err(storage)? else {
            return Ok(None);
        };
        let link: Link = serde_json::from_slice(raw.value()).map_err(|e| corrupt(code, e))?;
        let state: LinkState = match states.get(key.as_slice()).map_err(storage)? {
            Some(s) => serde_json::from_slice(s.value()).map_err(|e| corrupt(code, e))?,
            None => LinkState::default(),
        };
        Ok(Some(StoredLink { link, state, seq }))
    }
}

impl Store for EmbeddedStore {
    fn create(&self, req: CreateRequest) -> Result<CreateOutcome, StoreError> {
        self.submit(|reply| Op::Create(Box::new(req), reply))
    }

    fn create_many(&self, reqs: Vec<CreateRequest>) -> Result<Vec<CreateOutcome>, StoreError> {
        self.submit(|reply| Op::CreateMany(reqs, reply))
    }

    fn get(&self, code: &str) -> Result<Option<StoredLink>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let states = txn.open_table(STATES).map_err(storage)?;
        // The creation sequence is not needed for a point read; 0 marks it unknown.
        self.read_link(&links, &states, code, 0)
    }

    fn get_many(&self, codes: &[String]) -> Result<Vec<Option<StoredLink>>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let states = txn.open_table(STATES).map_err(storage)?;
        codes
            .iter()
            .map(|c| self.read_link(&links, &states, c, 0))
            .collect()
    }

    fn list(
        &self,
        owner: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LinkPage, StoreError> {
        let mut start = owner_prefix(owner);
        let mut end = start.clone();
        if let Some(last) = end.last_mut() {
            *last = 1; // owner ‖ 0x01: just past every key of this owner
        }
        match cursor {
            Some(c) => {
                let inv: u64 = c.parse().map_err(|_| StoreError::BadCursor)?;
                let Some(next) = inv.checked_add(1) else {
                    return Ok(LinkPage {
                        links: Vec::new(),
                        next_cursor: None,
                    });
                };
                start.extend_from_slice(&next.to_be_bytes());
            }
            None => start.extend_from_slice(&0u64.to_be_bytes()),
        }
        let txn = self.db.begin_read().map_err(storage)?;
        let index = txn.open_table(OWNER_LINKS).map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let states = txn.open_table(STATES).map_err(storage)?;
        let mut out = Vec::with_capacity(limit.min(1000));
        let mut last_inv = None;
        let mut more = false;
        for item in index
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(storage)?
        {
            let (k, code) = item.map_err(storage)?;
            if out.len() == limit {
                more = true;
                break;
            }
            let key = k.value();
            let inv_bytes: [u8; 8] = key[key.len().saturating_sub(8)..]
                .try_into()
                .map_err(|e| corrupt("owner_links", e))?;
            let inv = u64::from_be_bytes(inv_bytes);
            if let Some(found) = self.read_link(&links, &states, code.value(), !inv)? {
                out.push(found);
            }
            last_inv = Some(inv);
        }
        Ok(LinkPage {
            links: out,
            next_cursor: if more {
                last_inv.map(|i| i.to_string())
            } else {
                None
            },
        })
    }

    fn list_cursor_after(&self, seq: u64) -> String {
        // The owner index's keys end in the inverted sequence.
        (!seq).to_string()
    }

    fn delete(&self, code: &str, actor: &Actor) -> Result<DeleteOutcome, StoreError> {
        let code = code.to_string();
        let actor = actor.clone();
        self.submit(|reply| Op::Delete { code, actor, reply })
    }

    fn apply_batch(&self, batch: Batch) -> Result<Vec<BatchResult>, StoreError> {
        if batch.updates.is_empty() && batch.positions.is_empty() {
            return Ok(Vec::new());
        }
        self.submit(|reply| Op::Batch(Box::new(batch), reply))
    }

    fn denied(&self) -> Result<(u64, Vec<(String, DenyKind)>), StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let changes = txn.open_table(CHANGES).map_err(storage)?;
        let denied = txn.open_table(DENIED).map_err(storage)?;
        let seq = changes.last().map_err(storage)?.map(|(k, _)| k.value());
        let mut out = Vec::new();
        for item in denied.iter().map_err(storage)? {
            let (k, v) = item.map_err(storage)?;
            let kind = match v.value() {
                DENY_GONE => DenyKind::Gone,
                DENY_WARN => DenyKind::Warn,
                other => return Err(corrupt("denied", format!("unknown kind {other}"))),
            };
            out.push((k.value().to_string(), kind));
        }
        Ok((seq.unwrap_or(0), out))
    }

    fn commits(&self) -> watch::Receiver<u64> {
        self.commits.clone()
    }

    fn cache_bytes(&self) -> Option<u64> {
        Some(self.db.cache_stats().used_bytes() as u64)
    }

    fn position(&self, name: &str) -> Result<Option<String>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let positions = txn.open_table(POSITIONS).map_err(storage)?;
        let value = positions
            .get(name)
            .map_err(storage)?
            .map(|g| g.value().to_string());
        Ok(value)
    }

    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let changes = txn.open_table(CHANGES).map_err(storage)?;
        let mut out = Vec::new();
        let Some(from) = after.checked_add(1) else {
            return Ok(out);
        };
        for item in changes.range(from..).map_err(storage)?.take(limit) {
            let (k, v) = item.map_err(storage)?;
            let change = serde_json::from_slice(v.value()).map_err(|e| corrupt("changes", e))?;
            out.push((k.value(), change));
        }
        Ok(out)
    }

    fn own_changes_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<OwnChange>, u64), StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let changes = txn.open_table(CHANGES).map_err(storage)?;
        let origins = txn.open_table(ORIGINS).map_err(storage)?;
        let audit = txn.open_table(AUDIT).map_err(storage)?;
        let mut out = Vec::new();
        let mut upto = after;
        let Some(from) = after.checked_add(1) else {
            return Ok((out, upto));
        };
        // A region that mostly replicates others' changes still answers in bounded time: the
        // page ends after this many entries read, own or not (`upto` says how far it got).
        let scan = limit.saturating_mul(10).max(1_000);
        for item in changes.range(from..).map_err(storage)?.take(scan) {
            let (k, v) = item.map_err(storage)?;
            let seq = k.value();
            if origins.get(seq).map_err(storage)?.is_none() {
                if out.len() == limit {
                    break;
                }
                let change: Change =
                    serde_json::from_slice(v.value()).map_err(|e| corrupt("changes", e))?;
                let records = match record_key(&self.scheme, change.code()) {
                    Some(key) => audit_of(&audit, &key, self.region, seq)?,
                    None => Vec::new(),
                };
                out.push(OwnChange {
                    seq,
                    change,
                    audit: records,
                });
            }
            upto = seq;
        }
        Ok((out, upto))
    }

    fn replicate(&self, page: Replicated) -> Result<ReplicateOutcome, StoreError> {
        self.submit(|reply| Op::Replicate(Box::new(page), reply))
    }

    fn last_seq(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let changes = txn.open_table(CHANGES).map_err(storage)?;
        let last = changes.last().map_err(storage)?.map(|(k, _)| k.value());
        Ok(last.unwrap_or(0))
    }

    fn high_water_marks(&self) -> Result<Vec<(u32, u64)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        marks(&txn.open_table(META).map_err(storage)?)
    }

    fn for_each_link(
        &self,
        f: &mut dyn FnMut(&StoredLink) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let states = txn.open_table(STATES).map_err(storage)?;
        let changes = txn.open_table(CHANGES).map_err(storage)?;
        let seq = changes.last().map_err(storage)?.map(|(k, _)| k.value());
        for item in links.iter().map_err(storage)? {
            let (k, v) = item.map_err(storage)?;
            let link: Link = serde_json::from_slice(v.value()).map_err(|e| corrupt("links", e))?;
            let state: LinkState = match states.get(k.value()).map_err(storage)? {
                Some(s) => {
                    serde_json::from_slice(s.value()).map_err(|e| corrupt("link_state", e))?
                }
                None => LinkState::default(),
            };
            f(&StoredLink {
                link,
                state,
                seq: 0,
            })?;
        }
        Ok(seq.unwrap_or(0))
    }

    fn scan_links(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StoredLink>, Option<String>), StoreError> {
        let start = match after {
            Some(a) => Bound::Excluded(hex::decode(a).map_err(|_| StoreError::BadCursor)?),
            None => Bound::Unbounded,
        };
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let states = txn.open_table(STATES).map_err(storage)?;
        let bounds = (start.as_ref().map(Vec::as_slice), Bound::<&[u8]>::Unbounded);
        let mut out = Vec::with_capacity(limit.min(1024));
        let mut last = None;
        for item in links.range::<&[u8]>(bounds).map_err(storage)? {
            if out.len() == limit {
                return Ok((out, last));
            }
            let (k, v) = item.map_err(storage)?;
            let link: Link = serde_json::from_slice(v.value()).map_err(|e| corrupt("links", e))?;
            let state: LinkState = match states.get(k.value()).map_err(storage)? {
                Some(s) => {
                    serde_json::from_slice(s.value()).map_err(|e| corrupt("link_state", e))?
                }
                None => LinkState::default(),
            };
            last = Some(hex::encode(k.value()));
            out.push(StoredLink {
                link,
                state,
                seq: 0,
            });
        }
        Ok((out, None))
    }

    fn domain_links(&self, domain: &str, limit: u64) -> Result<u64, StoreError> {
        // A branded domain's records are one key range: `0x02 ‖ domain/` up to `0x02 ‖ domain0`.
        let bound = |last: u8| {
            let mut k = Vec::with_capacity(domain.len() + 2);
            k.push(2);
            k.extend_from_slice(domain.as_bytes());
            k.push(last);
            k
        };
        let (lo, hi) = (bound(b'/'), bound(b'0'));
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        let mut n = 0;
        for row in links.range(lo.as_slice()..hi.as_slice()).map_err(storage)? {
            if n >= limit {
                break;
            }
            let (_, value) = row.map_err(storage)?;
            let link: Link =
                serde_json::from_slice(value.value()).map_err(|e| corrupt("link", e))?;
            // A deleted link keeps its code, not its URL.
            if !link.long_url.is_empty() {
                n += 1;
            }
        }
        Ok(n)
    }

    fn count_links(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let links = txn.open_table(LINKS).map_err(storage)?;
        links.len().map_err(storage)
    }

    fn codes_by_host(
        &self,
        host: &CanonicalHost,
        subdomains: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Result<HostPage, StoreError> {
        let key = host.index_key();
        let bytes = |suffix: &[u8]| {
            let mut k = key.as_bytes().to_vec();
            k.extend_from_slice(suffix);
            k
        };
        // The host's own links (`key ‖ 0x00 ‖ …`), then its subdomains' (`key.…`): 0x00 sorts
        // before '.', so the two ranges in this order are one ascending walk.
        let mut ranges = vec![(bytes(b"\0"), bytes(b"\x01"))];
        if subdomains {
            ranges.push((bytes(b"."), bytes(b"/")));
        }
        let after = after
            .map(|a| hex::decode(a).map_err(|_| StoreError::BadCursor))
            .transpose()?;
        let txn = self.db.begin_read().map_err(storage)?;
        let index = txn.open_table(DEST_HOSTS).map_err(storage)?;
        let mut entries = Vec::with_capacity(limit.min(1024));
        let mut last: Option<Vec<u8>> = None;
        for (lo, hi) in &ranges {
            let start = match &after {
                Some(a) if a >= hi => continue,
                Some(a) if a >= lo => Bound::Excluded(a.as_slice()),
                _ => Bound::Included(lo.as_slice()),
            };
            for item in index
                .range::<&[u8]>((start, Bound::Excluded(hi.as_slice())))
                .map_err(storage)?
            {
                let (k, v) = item.map_err(storage)?;
                if entries.len() == limit {
                    return Ok(HostPage {
                        entries,
                        next: last.map(hex::encode),
                    });
                }
                let v = v.value();
                let (hash, code) = v
                    .split_at_checked(8)
                    .ok_or_else(|| corrupt("dest_hosts", "short value"))?;
                let mut h = [0u8; 8];
                h.copy_from_slice(hash);
                entries.push(HostEntry {
                    code: std::str::from_utf8(code)
                        .map_err(|e| corrupt("dest_hosts", e))?
                        .to_string(),
                    url_hash: u64::from_be_bytes(h),
                });
                last = Some(k.value().to_vec());
            }
        }
        Ok(HostPage {
            entries,
            next: None,
        })
    }

    fn code_set(
        &self,
        set: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CodePage, StoreError> {
        let after = after
            .map(|a| hex::decode(a).map_err(|_| StoreError::BadCursor))
            .transpose()?;
        let txn = self.db.begin_read().map_err(storage)?;
        let sets = txn.open_table(CODE_SETS).map_err(storage)?;
        let start = match &after {
            Some(a) => Bound::Excluded((set, a.as_slice())),
            None => Bound::Included((set, &b""[..])),
        };
        let mut codes = Vec::with_capacity(limit.min(1024));
        let mut last: Option<Vec<u8>> = None;
        for item in sets
            .range::<(&str, &[u8])>((start, Bound::Unbounded))
            .map_err(storage)?
        {
            let (k, v) = item.map_err(storage)?;
            let (s, key) = k.value();
            if s != set {
                break;
            }
            if codes.len() == limit {
                return Ok(CodePage {
                    codes,
                    next: last.map(hex::encode),
                });
            }
            codes.push(v.value().to_string());
            last = Some(key.to_vec());
        }
        Ok(CodePage { codes, next: None })
    }

    fn history(&self, code: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let Some(key) = record_key(&self.scheme, code) else {
            return Ok(Vec::new());
        };
        let lo = audit_key(&key, 0);
        let mut hi = key;
        hi.push(1);
        let txn = self.db.begin_read().map_err(storage)?;
        let audit = txn.open_table(AUDIT).map_err(storage)?;
        let mut out = Vec::new();
        for item in audit
            .range::<&[u8]>(lo.as_slice()..hi.as_slice())
            .map_err(storage)?
        {
            let (_, v) = item.map_err(storage)?;
            out.push(serde_json::from_slice(v.value()).map_err(|e| corrupt("audit", e))?);
        }
        Ok(out)
    }

    fn add_report(&self, report: Report) -> Result<Report, StoreError> {
        self.submit(|reply| Op::AddReport(Box::new(report), reply))
    }

    fn report(&self, id: u64) -> Result<Option<Report>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let reports = txn.open_table(REPORTS).map_err(storage)?;
        let raw = reports.get(id).map_err(storage)?;
        raw.map(|r| serde_json::from_slice(r.value()).map_err(|e| corrupt("reports", e)))
            .transpose()
    }

    fn reports(
        &self,
        filter: ReportFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ReportPage, StoreError> {
        let start = match cursor {
            Some(c) => Bound::Excluded(c.parse::<u64>().map_err(|_| StoreError::BadCursor)?),
            None => Bound::Unbounded,
        };
        let txn = self.db.begin_read().map_err(storage)?;
        let reports = txn.open_table(REPORTS).map_err(storage)?;
        let open = txn.open_table(REPORTS_OPEN).map_err(storage)?;
        let mut out: Vec<Report> = Vec::with_capacity(limit.min(1024));
        let mut more = false;
        let mut take = |report: Report| {
            if out.len() == limit {
                more = true;
                return false;
            }
            out.push(report);
            true
        };
        let read = |id: u64| -> Result<Option<Report>, StoreError> {
            reports
                .get(id)
                .map_err(storage)?
                .map(|raw| serde_json::from_slice(raw.value()).map_err(|e| corrupt("reports", e)))
                .transpose()
        };
        if filter == ReportFilter::Open {
            for item in open
                .range::<u64>((start, Bound::Unbounded))
                .map_err(storage)?
            {
                let (id, _) = item.map_err(storage)?;
                if let Some(r) = read(id.value())? {
                    if !take(r) {
                        break;
                    }
                }
            }
        } else {
            for item in reports
                .range::<u64>((start, Bound::Unbounded))
                .map_err(storage)?
            {
                let (_, raw) = item.map_err(storage)?;
                let r: Report =
                    serde_json::from_slice(raw.value()).map_err(|e| corrupt("reports", e))?;
                if filter == ReportFilter::Resolved && r.resolution.is_none() {
                    continue;
                }
                if !take(r) {
                    break;
                }
            }
        }
        let next_cursor = if more {
            out.last().map(|r| r.id.to_string())
        } else {
            None
        };
        Ok(ReportPage {
            reports: out,
            next_cursor,
        })
    }

    fn resolve_report(
        &self,
        id: u64,
        resolution: Resolution,
    ) -> Result<Option<Result<Report, Report>>, StoreError> {
        self.submit(|reply| Op::ResolveReport {
            id,
            resolution,
            reply,
        })
    }

    fn owner(&self, owner: &str) -> Result<Option<OwnerRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let owners = txn.open_table(OWNERS).map_err(storage)?;
        let raw = owners.get(owner).map_err(storage)?;
        raw.map(|r| serde_json::from_slice(r.value()).map_err(|e| corrupt("owners", e)))
            .transpose()
    }

    fn put_owner(&self, record: OwnerRecord) -> Result<(), StoreError> {
        self.submit(|reply| Op::PutOwner(Box::new(record), reply))
    }

    fn owners(&self) -> Result<Vec<OwnerRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let owners = txn.open_table(OWNERS).map_err(storage)?;
        let mut out = Vec::new();
        for item in owners.iter().map_err(storage)? {
            let (_, v) = item.map_err(storage)?;
            out.push(serde_json::from_slice(v.value()).map_err(|e| corrupt("owners", e))?);
        }
        Ok(out)
    }

    fn domain(&self, domain: &str) -> Result<Option<DomainRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let domains = txn.open_table(DOMAINS).map_err(storage)?;
        let raw = domains.get(domain).map_err(storage)?;
        raw.map(|r| serde_json::from_slice(r.value()).map_err(|e| corrupt("domains", e)))
            .transpose()
    }

    fn domains(&self) -> Result<Vec<DomainRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let domains = txn.open_table(DOMAINS).map_err(storage)?;
        let mut out = Vec::new();
        for item in domains.iter().map_err(storage)? {
            let (_, v) = item.map_err(storage)?;
            out.push(serde_json::from_slice(v.value()).map_err(|e| corrupt("domains", e))?);
        }
        Ok(out)
    }

    fn domains_generation(&self) -> Result<u64, StoreError> {
        read_meta(&self.db, META_DOMAINS_GENERATION)
    }

    fn write_domain(
        &self,
        record: DomainRecord,
        expected: Option<u64>,
        remove: bool,
    ) -> Result<bool, StoreError> {
        self.submit(|reply| Op::WriteDomain {
            record: Box::new(record),
            expected,
            remove,
            reply,
        })
    }

    fn find_text(&self, needle: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let needle = needle.as_bytes();
        let has = |b: &[u8]| !needle.is_empty() && b.windows(needle.len()).any(|w| w == needle);
        let txn = self.db.begin_read().map_err(storage)?;
        let mut out = Vec::new();
        let mut count = |name: &str, hits: u64| {
            if hits > 0 {
                out.push((name.to_string(), hits));
            }
        };
        macro_rules! scan {
            ($table:expr, $name:expr, |$k:ident, $v:ident| $bytes:expr) => {{
                let table = txn.open_table($table).map_err(storage)?;
                let mut hits = 0u64;
                for item in table.iter().map_err(storage)? {
                    let ($k, $v) = item.map_err(storage)?;
                    let ($k, $v) = ($k.value(), $v.value());
                    if $bytes {
                        hits += 1;
                    }
                }
                count($name, hits);
            }};
        }
        scan!(LINKS, "links", |k, v| has(k) || has(v));
        scan!(STATES, "link_state", |k, v| has(k) || has(v));
        scan!(OWNER_LINKS, "owner_links", |k, v| has(k)
            || has(v.as_bytes()));
        scan!(CHANGES, "changes", |_k, v| has(v));
        scan!(IDEMPOTENCY, "idempotency", |k, v| has(k.as_bytes())
            || has(v));
        scan!(IDEM_EXPIRY, "idempotency_expiry", |k, _v| has(k
            .1
            .as_bytes()));
        scan!(DENIED, "denied", |k, _v| has(k.as_bytes()));
        scan!(DEST_HOSTS, "dest_hosts", |k, v| has(k) || has(v));
        scan!(AUDIT, "audit", |k, v| has(k) || has(v));
        scan!(CODE_SETS, "code_sets", |k, v| has(k.0.as_bytes())
            || has(k.1)
            || has(v.as_bytes()));
        scan!(REPORTS, "reports", |_k, v| has(v));
        scan!(OWNERS, "owners", |k, v| has(k.as_bytes()) || has(v));
        scan!(POSITIONS, "positions", |k, v| has(k.as_bytes())
            || has(v.as_bytes()));
        Ok(out)
    }

    fn export(
        &self,
        out: &mut dyn FnMut(super::transfer::Record) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        transfer::export(self, out)
    }

    fn shutdown(&self) -> Result<(), StoreError> {
        let result = self.submit(Op::Shutdown);
        if let Ok(mut guard) = self.tx.lock() {
            guard.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut g| g.take());
        if let Some(handle) = handle {
            // A panicked writer already answered its callers with errors (dropped replies).
            let _ = handle.join();
        }
        result
    }
}

/// Where a link's records live, by its [link key](lasthop_core::split_key): on the default
/// domain `0x00 ‖ n` for a generated code (n its counter), `0x01 ‖ alias` for an alias; on a
/// branded domain `0x02 ‖ domain/code`; `None` for a string that is no link key.
pub fn record_key(scheme: &CodeScheme, code: &str) -> Option<Vec<u8>> {
    if code.as_bytes().contains(&lasthop_core::code::KEY_SEPARATOR) {
        if lasthop_core::classify_key(code.as_bytes()) == CodeKind::Invalid {
            return None;
        }
        let mut key = Vec::with_capacity(code.len() + 1);
        key.push(2);
        key.extend_from_slice(code.as_bytes());
        return Some(key);
    }
    match classify(code.as_bytes()) {
        CodeKind::Generated => scheme.decode(code.as_bytes()).map(counter_key),
        // A legacy code is kept as an alias is: by its name.
        CodeKind::Alias | CodeKind::Legacy => {
            let mut key = Vec::with_capacity(code.len() + 1);
            key.push(1);
            key.extend_from_slice(code.as_bytes());
            Some(key)
        }
        CodeKind::Invalid => None,
    }
}

pub(crate) fn counter_key(n: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(9);
    key.push(0);
    key.extend_from_slice(&n.to_be_bytes());
    key
}

fn owner_prefix(owner: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(owner.len() + 9);
    key.extend_from_slice(owner.as_bytes());
    key.push(0);
    key
}

/// Writes (or erases) the destination-index entry of the link `code` (`key` its record key)
/// to `url`, its current destination; false when it is no web destination (deleted links
/// have none).
fn index_destination(
    hosts: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    code: &str,
    url: &str,
    insert: bool,
) -> Result<bool, StoreError> {
    let Some(dest) = Destination::parse(url) else {
        return Ok(false);
    };
    index_entry(hosts, key, code, &dest, insert)?;
    Ok(true)
}

/// Moves a link's destination-index entry when a state change changes its current
/// destination (an edit), so list takedowns by host find it under the host it now serves.
fn reindex_destination(
    hosts: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    link: &Link,
    before: &LinkState,
    after: &LinkState,
) -> Result<(), StoreError> {
    let (old, new) = (before.url(link), after.url(link));
    if old != new && !before.deleted && !after.deleted {
        index_destination(hosts, key, &link.code, old, false)?;
        index_destination(hosts, key, &link.code, new, true)?;
    }
    Ok(())
}

/// Writes (or erases) the destination-index entry of the link `code` (record key `key`) to
/// `dest`.
fn index_entry(
    hosts: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    code: &str,
    dest: &Destination,
    insert: bool,
) -> Result<(), StoreError> {
    let mut index_key = dest.host.index_key().into_bytes();
    index_key.push(0);
    index_key.extend_from_slice(key);
    if insert {
        let mut value = dest.url_hash().to_be_bytes().to_vec();
        value.extend_from_slice(code.as_bytes());
        hosts
            .insert(index_key.as_slice(), value.as_slice())
            .map_err(storage)?;
    } else {
        hosts.remove(index_key.as_slice()).map_err(storage)?;
    }
    Ok(())
}

/// A link's `denied` entry as its state says: gone, warn, or none.
fn write_denied(t: &mut Tables<'_>, code: &str, state: &LinkState) -> Result<(), StoreError> {
    match state.deny_kind() {
        Some(DenyKind::Gone) => t.denied.insert(code, DENY_GONE).map_err(storage)?,
        Some(DenyKind::Warn) => t.denied.insert(code, DENY_WARN).map_err(storage)?,
        None => t.denied.remove(code).map_err(storage)?,
    };
    Ok(())
}

/// `record key ‖ 0x00 ‖ n`: a link's audit records are one key range, in order (aliases'
/// record keys vary in length, so the separator keeps one alias's range from holding a longer
/// one's).
fn audit_key(record_key: &[u8], n: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(record_key.len() + 9);
    key.extend_from_slice(record_key);
    key.push(0);
    key.extend_from_slice(&n.to_be_bytes());
    key
}

/// The audit records of the link under `record_key` written with our (`region`'s) change
/// `seq`, oldest first: read from the newest back, so only the records since that change are
/// read.
fn audit_of(
    audit: &impl ReadableTable<&'static [u8], &'static [u8]>,
    record_key: &[u8],
    region: u32,
    seq: u64,
) -> Result<Vec<AuditRecord>, StoreError> {
    let lo = audit_key(record_key, 0);
    let mut hi = record_key.to_vec();
    hi.push(1);
    let mut out = Vec::new();
    for item in audit
        .range::<&[u8]>(lo.as_slice()..hi.as_slice())
        .map_err(storage)?
        .rev()
    {
        let (_, v) = item.map_err(storage)?;
        let record: AuditRecord =
            serde_json::from_slice(v.value()).map_err(|e| corrupt("audit", e))?;
        match record.origin {
            Some(o) if o.region == region && o.seq == seq => out.push(record),
            Some(o) if o.region == region && o.seq < seq => break,
            _ => {}
        }
    }
    out.reverse();
    Ok(out)
}

/// Every region's high-water mark, from the `counter_next/<region>` keys of `meta`.
fn marks(meta: &impl ReadableTable<&'static str, u64>) -> Result<Vec<(u32, u64)>, StoreError> {
    let mut out = Vec::new();
    for item in meta
        .range(COUNTER_PREFIX.."counter_next0")
        .map_err(storage)?
    {
        let (k, v) = item.map_err(storage)?;
        let region = k.value()[COUNTER_PREFIX.len()..]
            .parse()
            .map_err(|e| corrupt("meta", e))?;
        out.push((region, v.value()));
    }
    Ok(out)
}

/// A counter kept in `meta` (0 when absent).
fn read_meta(db: &Database, key: &str) -> Result<u64, StoreError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    let value = meta.get(key).map_err(storage)?.map(|g| g.value());
    Ok(value.unwrap_or(0))
}

/// Every table a batch touches, opened once per transaction.
struct Tables<'t> {
    links: Table<'t, &'static [u8], &'static [u8]>,
    states: Table<'t, &'static [u8], &'static [u8]>,
    owner_links: Table<'t, &'static [u8], &'static str>,
    changes: Table<'t, u64, &'static [u8]>,
    meta: Table<'t, &'static str, u64>,
    free: Table<'t, u64, u64>,
    idem: Table<'t, &'static str, &'static [u8]>,
    idem_expiry: Table<'t, (i64, &'static str), ()>,
    denied: Table<'t, &'static str, u8>,
    dest_hosts: Table<'t, &'static [u8], &'static [u8]>,
    audit: Table<'t, &'static [u8], &'static [u8]>,
    code_sets: Table<'t, (&'static str, &'static [u8]), &'static str>,
    reports: Table<'t, u64, &'static [u8]>,
    reports_open: Table<'t, u64, ()>,
    owners: Table<'t, &'static str, &'static [u8]>,
    domains: Table<'t, &'static str, &'static [u8]>,
    positions: Table<'t, &'static str, &'static str>,
    origins: Table<'t, u64, u32>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t redb::WriteTransaction) -> Result<Tables<'t>, StoreError> {
        Ok(Tables {
            links: txn.open_table(LINKS).map_err(storage)?,
            states: txn.open_table(STATES).map_err(storage)?,
            owner_links: txn.open_table(OWNER_LINKS).map_err(storage)?,
            changes: txn.open_table(CHANGES).map_err(storage)?,
            meta: txn.open_table(META).map_err(storage)?,
            free: txn.open_table(FREE_RANGES).map_err(storage)?,
            idem: txn.open_table(IDEMPOTENCY).map_err(storage)?,
            idem_expiry: txn.open_table(IDEM_EXPIRY).map_err(storage)?,
            denied: txn.open_table(DENIED).map_err(storage)?,
            dest_hosts: txn.open_table(DEST_HOSTS).map_err(storage)?,
            audit: txn.open_table(AUDIT).map_err(storage)?,
            code_sets: txn.open_table(CODE_SETS).map_err(storage)?,
            reports: txn.open_table(REPORTS).map_err(storage)?,
            reports_open: txn.open_table(REPORTS_OPEN).map_err(storage)?,
            owners: txn.open_table(OWNERS).map_err(storage)?,
            domains: txn.open_table(DOMAINS).map_err(storage)?,
            positions: txn.open_table(POSITIONS).map_err(storage)?,
            origins: txn.open_table(ORIGINS).map_err(storage)?,
        })
    }
}

/// A link's creation sequence from its owner's index, whose keys end in the inverted sequence
/// (for rows written before the sequence was stored in them).
fn seq_in_owner_index(
    owner_links: &impl ReadableTable<&'static [u8], &'static str>,
    link: &Link,
) -> Result<Option<u64>, StoreError> {
    let start = owner_prefix(&link.owner);
    let mut end = start.clone();
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    for item in owner_links
        .range::<&[u8]>(start.as_slice()..end.as_slice())
        .map_err(storage)?
    {
        let (k, code) = item.map_err(storage)?;
        if code.value() == link.code {
            let k = k.value();
            let inv: [u8; 8] = k[k.len().saturating_sub(8)..]
                .try_into()
                .map_err(|e| corrupt("owner_links", e))?;
            return Ok(Some(!u64::from_be_bytes(inv)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    //! What only the embedded store has; everything else is in the suite every backend runs
    //! (control-plane/tests/it/store.rs).
    use super::*;
    use lasthop_core::PermutationKey;

    fn open(dir: &std::path::Path, key: &PermutationKey) -> EmbeddedStore {
        let scheme = CodeScheme::new(key).unwrap();
        EmbeddedStore::open(
            EmbeddedStoreConfig::new(dir.join("links.redb"), scheme),
            None,
        )
        .unwrap()
    }

    fn create_url(store: &EmbeddedStore, owner: &str, url: &str) -> String {
        let req = CreateRequest {
            owner: owner.into(),
            long_url: url.into(),
            domain: None,
            alias: None,
            expires_at_ms: None,
            idempotency: None,
            now_ms: 1,
            hold: None,
            options: Default::default(),
            tags: Vec::new(),
            actor: Actor::Key("lhk_0123456789abcdef".into()),
            destination: None,
            imported: None,
        };
        match store.create(req).unwrap() {
            CreateOutcome::Created(s) => s.link.code,
            other => panic!("{other:?}"),
        }
    }

    fn host(s: &str) -> CanonicalHost {
        CanonicalHost::parse(s).unwrap()
    }

    fn all_by_host(store: &EmbeddedStore, h: &str, page: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let p = store
                .codes_by_host(&host(h), true, after.as_deref(), page)
                .unwrap();
            assert!(p.entries.len() <= page);
            out.extend(p.entries.into_iter().map(|e| e.code));
            match p.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_store_from_before_the_destination_index_is_backfilled() {
        let dir = tempfile::tempdir().unwrap();
        let key = PermutationKey::generate(16).unwrap();
        let store = open(dir.path(), &key);
        let code = create_url(&store, "a", "https://old.example/page");
        store.shutdown().unwrap();
        drop(store);
        {
            // What an older version left: no index tables, no marker.
            let db = Database::create(dir.path().join("links.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            txn.delete_table(DEST_HOSTS).unwrap();
            txn.open_table(META)
                .unwrap()
                .remove(META_DEST_INDEX)
                .unwrap();
            txn.commit().unwrap();
        }
        let store = open(dir.path(), &key);
        assert_eq!(all_by_host(&store, "old.example", 10), vec![code]);
        store.shutdown().unwrap();
    }
}
