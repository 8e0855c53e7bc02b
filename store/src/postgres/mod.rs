//! The shared store: PostgreSQL, for several control planes on one replicated record.
//!
//! The same contract as [`super::embedded`], with PostgreSQL doing what redb and the single
//! writer thread did:
//!
//! - **Writes** go through one writer task per control plane that drains whatever is queued
//!   and applies it in one transaction (group commit): runs of creates become a handful of
//!   `unnest` statements however many links they hold, so one commit (and one round trip to a
//!   synchronous standby) covers the batch. A 201 means committed on the primary, and with
//!   `synchronous_commit = on` and `synchronous_standby_names` set there, on a standby too.
//! - **The change log is gap-safe**: every transaction that appends to it first locks the one
//!   row of `change_seq` and holds it until it commits, so sequence numbers are handed out in
//!   commit order across every control plane; a reader tailing `seq > last` can never skip an
//!   entry that commits late. Each commit `NOTIFY`s `lasthop_changes`; every control plane
//!   `LISTEN`s, so feeds are woken by commits anywhere, never by polling.
//! - **Counter blocks** are leased per region with `UPDATE counters ... RETURNING` (a row lock:
//!   two control planes never get the same block); a graceful shutdown returns the unused rest
//!   to `free_counter_ranges`, which the next lease takes first. Aliases are claimed by the
//!   primary key (`INSERT ... ON CONFLICT DO NOTHING`): one winner, the other 409.
//! - **Reads** use a pool (`deadpool-postgres`); a libpq-style connection string with several
//!   hosts and `target_session_attrs=read-write` finds the primary after a failover, for the
//!   pool and the writer alike, without a restart.
//!
//! The [`Store`] trait is synchronous (callers are blocking threads); this store runs its own
//! small tokio runtime and hands each call to it.

pub mod keys;
mod schema;
mod shared;
pub mod tls;
pub mod transfer;
mod writer;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use lasthop_core::feed::DenyKind;
use lasthop_core::{Change, CodeScheme, Link, LinkState};
use lasthop_trust::CanonicalHost;
use tokio::sync::watch;

pub use schema::{migrate, MIGRATIONS};

use super::{
    Actor, AuditRecord, Batch, BatchResult, CodePage, CreateOutcome, CreateRequest, DeleteOutcome,
    DomainRecord, HostEntry, HostPage, LinkPage, OwnChange, OwnerRecord, ReplicateOutcome,
    Replicated, Report, ReportFilter, ReportPage, Resolution, Store, StoreError, StoredLink,
};
pub(crate) use crate::corrupt;
use writer::{Op, Writer};

/// The channel every commit is announced on.
pub const CHANGES_CHANNEL: &str = "lasthop_changes";

/// Settings of the PostgreSQL store.
#[derive(Clone)]
pub struct PgStoreConfig {
    /// A libpq connection string or `postgres://` URL (several hosts allowed).
    pub url: String,
    pub scheme: CodeScheme,
    pub region: u32,
    pub regions: u32,
    pub block_size: u64,
    pub idempotency_ttl_ms: i64,
    pub max_batch: usize,
    /// Pooled connections for reads.
    pub pool_size: usize,
    /// Observes each group commit (operations, seconds from begin to durable).
    pub observer: Option<crate::CommitObserver>,
}

impl PgStoreConfig {
    /// Defaults for everything but the URL and the scheme.
    pub fn new(url: impl Into<String>, scheme: CodeScheme) -> Self {
        PgStoreConfig {
            url: url.into(),
            scheme,
            region: 0,
            regions: 1,
            block_size: 10_000,
            idempotency_ttl_ms: 24 * 3600 * 1000,
            max_batch: 1024,
            pool_size: 8,
            observer: None,
        }
    }
}

pub(crate) fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::Postgres {
        what: "statement",
        cause: Box::new(e),
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Postgres {
        what: "pool",
        cause: Box::new(e),
    }
}

/// Parses a connection string (`postgres://…` or `host=… port=…`) with its TLS settings
/// ([`tls`]: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`), reading the files they name.
pub fn parse_config(url: &str) -> Result<tls::PgTarget, StoreError> {
    tls::target(url)
}

/// One connection, its connection task spawned on the current runtime.
pub(crate) async fn connect(target: &tls::PgTarget) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = target
        .config
        .connect(target.tls.clone())
        .await
        .map_err(|e| tls::connect_error(target, e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection ended");
        }
    });
    Ok(client)
}

/// News of shared state that control planes cache (keys, owners, lists): a generation per
/// kind, raised by every `NOTIFY` on [`keys::STATE_CHANNEL`] naming it, and raised for every
/// kind whenever the listener (re)connects, since news may have been missed meanwhile.
#[derive(Debug, Default)]
pub struct StateNews {
    keys: AtomicU64,
    owners: AtomicU64,
    snapshots: AtomicU64,
}

impl StateNews {
    fn heard(&self, what: &str) {
        match what {
            "keys" => {
                self.keys.fetch_add(1, Ordering::AcqRel);
            }
            "owners" => {
                self.owners.fetch_add(1, Ordering::AcqRel);
            }
            "snapshots" => {
                self.snapshots.fetch_add(1, Ordering::AcqRel);
            }
            _ => {}
        }
    }

    fn heard_everything(&self) {
        self.keys.fetch_add(1, Ordering::AcqRel);
        self.owners.fetch_add(1, Ordering::AcqRel);
        self.snapshots.fetch_add(1, Ordering::AcqRel);
    }

    /// The generation of `what`.
    pub fn get(&self, what: crate::News) -> u64 {
        match what {
            crate::News::Keys => self.keys(),
            crate::News::Owners => self.owners(),
            crate::News::Snapshots => self.snapshots.load(Ordering::Acquire),
        }
    }

    /// The generation of the API keys.
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Acquire)
    }

    /// The generation of the owner records (flags, suspensions).
    pub fn owners(&self) -> u64 {
        self.owners.load(Ordering::Acquire)
    }
}

/// The PostgreSQL store. Cheap to share behind an `Arc`.
pub struct PgStore {
    news: Arc<StateNews>,
    /// This control plane's region (the origin of the audit records it writes).
    region: u32,
    rt: tokio::runtime::Runtime,
    pool: Pool,
    config: tls::PgTarget,
    writer: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Op>>>,
    writer_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    commits: watch::Receiver<u64>,
}

impl std::fmt::Debug for PgStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStoreConfig")
            .field("region", &self.region)
            .field("regions", &self.regions)
            .field("block_size", &self.block_size)
            .field("max_batch", &self.max_batch)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects, applies the migrations, pins the permutation key id on first use (refusing a
    /// database made under another key) and starts the writer and the commit listener.
    pub fn open(config: PgStoreConfig) -> Result<PgStore, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("postgres")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Postgres {
                what: "runtime",
                cause: Box::new(e),
            })?;
        let pg_config = parse_config(&config.url)?;
        let key_id = i64::from(config.scheme.key_id());
        let (last_seq, pool) = rt.block_on(async {
            let mut client = connect(&pg_config).await?;
            migrate(&mut client).await?;
            client
                .execute(
                    "INSERT INTO meta (key, value) VALUES ('key_id', $1) ON CONFLICT DO NOTHING",
                    &[&key_id],
                )
                .await
                .map_err(pg)?;
            let stored: i64 = client
                .query_one("SELECT value FROM meta WHERE key = 'key_id'", &[])
                .await
                .map_err(pg)?
                .get(0);
            if stored != key_id {
                return Err(StoreError::Refused(format!(
                    "store was created under permutation key {stored:08x}, not {key_id:08x}: \
                     refusing to mint codes under another key"
                )));
            }
            let last = head_seq(&client).await?;
            let manager = Manager::from_config(
                pg_config.config.clone(),
                pg_config.tls.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            let pool = Pool::builder(manager)
                .max_size(config.pool_size.max(1))
                .build()
                .map_err(|e| StoreError::Postgres {
                    what: "pool",
                    cause: Box::new(e),
                })?;
            Ok::<_, StoreError>((last, pool))
        })?;
        let (commits_tx, commits) = watch::channel(last_seq);
        let commits_tx = Arc::new(commits_tx);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let writer = Writer::new(&config, pg_config.clone(), Arc::clone(&commits_tx))?;
        rt.spawn(async move {
            writer.run(rx).await;
            let _ = done_tx.send(());
        });
        let news = Arc::new(StateNews::default());
        rt.spawn(listen_for_commits(
            pg_config.clone(),
            commits_tx,
            Arc::clone(&news),
        ));
        Ok(PgStore {
            news,
            region: config.region,
            rt,
            pool,
            config: pg_config,
            writer: Mutex::new(Some(tx)),
            writer_done: Mutex::new(Some(done_rx)),
            commits,
        })
    }

    /// Runs `fut` on the store's runtime and waits for it (callers are blocking threads, in or
    /// out of another runtime).
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| StoreError::ShuttingDown)?
    }

    fn submit<T>(&self, make: impl FnOnce(writer::Reply<T>) -> Op) -> Result<T, StoreError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        {
            let guard = self.writer.lock().map_err(|_| StoreError::ShuttingDown)?;
            let tx = guard.as_ref().ok_or(StoreError::ShuttingDown)?;
            tx.send(make(reply)).map_err(|_| StoreError::ShuttingDown)?;
        }
        answer.recv().map_err(|_| StoreError::ShuttingDown)?
    }

    /// Runs `fut` on the store's runtime without waiting for it.
    fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.rt.spawn(fut);
    }

    /// A pooled connection.
    fn pool(&self) -> Pool {
        self.pool.clone()
    }

    /// The parsed connection settings (for tools that need a connection of their own).
    pub fn pg_config(&self) -> &tls::PgTarget {
        &self.config
    }

    /// Runs `f` with a pooled client on the store's runtime.
    pub fn with_client<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send,
    {
        let pool = self.pool();
        self.run(async move {
            let client = pool.get().await.map_err(pool_err)?;
            f(client).await
        })
    }
}

/// The `meta` key of [`Store::domains_generation`].
pub(crate) const DOMAINS_GENERATION: &str = "domains_generation";

/// Moves [`Store::domains_generation`] on in `txn`: one more, or the time in Unix
/// milliseconds when that is larger (a restored or imported store never reuses a number an
/// engine holds for other contents).
pub(crate) async fn bump_domains_generation(
    txn: &tokio_postgres::Transaction<'_>,
) -> Result<(), StoreError> {
    let now = crate::clock::now_ms();
    txn.execute(
        "INSERT INTO meta (key, value) VALUES ($1, GREATEST(1, $2::bigint)) \
         ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value + 1, $2::bigint)",
        &[&DOMAINS_GENERATION, &now],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// A `REPEATABLE READ READ ONLY` transaction (one consistent snapshot) and the change-log
/// sequence it is complete up to.
pub(crate) async fn consistent_read(
    c: &mut tokio_postgres::Client,
) -> Result<(tokio_postgres::Transaction<'_>, u64), StoreError> {
    let txn = c
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg)?;
    let seq = head_seq(&txn).await?;
    Ok((txn, seq))
}

/// The change log's head: the highest committed sequence (0 when the log is empty).
pub(crate) async fn head_seq(c: &impl tokio_postgres::GenericClient) -> Result<u64, StoreError> {
    let last: i64 = c
        .query_one("SELECT coalesce(max(seq), 0) FROM changes", &[])
        .await
        .map_err(pg)?
        .get(0);
    Ok(u64::try_from(last).unwrap_or(0))
}

/// Sends a query's rows through a portal, a page at a time, converted by `convert`, so a
/// million rows never sit in memory; false when the receiver went away.
pub(crate) async fn stream_pages<T>(
    txn: &tokio_postgres::Transaction<'_>,
    sql: &str,
    tx: &std::sync::mpsc::SyncSender<Result<Vec<T>, StoreError>>,
    convert: impl Fn(&tokio_postgres::Row) -> Result<T, StoreError>,
) -> Result<bool, StoreError> {
    let portal = txn.bind(sql, &[]).await.map_err(pg)?;
    loop {
        let rows = txn.query_portal(&portal, 2048).await.map_err(pg)?;
        if rows.is_empty() {
            return Ok(true);
        }
        let page = rows.iter().map(&convert).collect::<Result<Vec<_>, _>>()?;
        if tx.send(Ok(page)).is_err() {
            return Ok(false);
        }
    }
}

/// A current-thread runtime for a one-off connection (a command, a check).
pub(crate) fn one_off_runtime() -> Result<tokio::runtime::Runtime, StoreError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Postgres {
            what: "runtime",
            cause: Box::new(e),
        })
}

/// Connects to `url` (its TLS as the store would: `serve --check-config`) and runs `SELECT 1`:
/// a server that cannot be reached, a certificate that does not verify or a refused login is
/// the error, naming the store.
pub fn check_connection(url: &str) -> Result<(), StoreError> {
    let target = parse_config(url)?;
    let rt = one_off_runtime()?;
    rt.block_on(async {
        let connecting = connect(&target);
        let client = tokio::time::timeout(std::time::Duration::from_secs(10), connecting)
            .await
            .map_err(|_| {
                StoreError::Connect(format!(
                    "PostgreSQL store {}: no answer within 10 s",
                    target.hosts
                ))
            })??;
        client.simple_query("SELECT 1").await.map_err(pg)?;
        Ok(())
    })
}

/// Connects to `url` and applies the migrations it lacks (`lasthop-control migrate`).
pub fn migrate_only(url: &str) -> Result<usize, StoreError> {
    let config = parse_config(url)?;
    let rt = one_off_runtime()?;
    rt.block_on(async {
        let mut client = connect(&config).await?;
        migrate(&mut client).await
    })
}

/// Keeps a `LISTEN` connection and announces every commit any control plane makes, and every
/// change of cached shared state; after a lost connection it reconnects with backoff, catches
/// up from the log's end and marks every cache stale.
async fn listen_for_commits(
    config: tls::PgTarget,
    commits: Arc<watch::Sender<u64>>,
    news: Arc<StateNews>,
) {
    use futures_util::StreamExt as _;
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match config.config.connect(config.tls.clone()).await {
            Ok((client, mut connection)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let heard = (n.channel().to_string(), n.payload().to_string());
                                if tx.send(heard).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "postgres commit listener lost");
                                return;
                            }
                        }
                    }
                });
                let listened = client
                    .batch_execute(&format!(
                        "LISTEN {CHANGES_CHANNEL}; LISTEN {}",
                        keys::STATE_CHANNEL
                    ))
                    .await
                    .is_ok();
                if listened {
                    backoff = std::time::Duration::from_millis(100);
                    // Catch up on what was committed while nobody listened.
                    if let Ok(last) = head_seq(&client).await {
                        announce(&commits, last);
                    }
                    news.heard_everything();
                    while let Some((channel, payload)) = rx.recv().await {
                        if channel == keys::STATE_CHANNEL {
                            news.heard(&payload);
                        } else if let Ok(seq) = payload.parse::<u64>() {
                            announce(&commits, seq);
                        }
                    }
                }
                driver.abort();
            }
            Err(e) => tracing::warn!(error = %e, "postgres commit listener cannot connect"),
        }
        if commits.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
    }
}

/// Raises the announced sequence (never lowers it).
pub(crate) fn announce(commits: &watch::Sender<u64>, seq: u64) {
    commits.send_if_modified(|seen| {
        let newer = *seen < seq;
        if newer {
            *seen = seq;
        }
        newer
    });
}

fn row_link(row: &tokio_postgres::Row) -> Result<StoredLink, StoreError> {
    let code: String = row.get("code");
    let state: String = row.get("state");
    let state: LinkState = serde_json::from_str(&state).map_err(|e| corrupt(&code, e))?;
    let seq: i64 = row.get("created_seq");
    Ok(StoredLink {
        link: Link {
            long_url: row.get("long_url"),
            owner: row.get("owner"),
            created_at_ms: row.get("created_at_ms"),
            code,
        },
        state,
        seq: u64::try_from(seq).unwrap_or(0),
    })
}

const LINK_COLUMNS: &str = "code, long_url, owner, created_at_ms, created_seq, state";

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl crate::keys::KeyStore for PgStore {
    fn add_key(&self, key: &crate::keys::KeyRecord) -> Result<(), StoreError> {
        let key = key.clone();
        self.with_client(move |mut c| async move { keys::insert(&mut c, &key).await })
    }

    fn revoke_key(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        let (id, at) = (id.to_string(), at.to_string());
        self.with_client(move |mut c| async move { keys::revoke(&mut c, &id, &at).await })
    }

    fn keys(&self) -> Result<Vec<crate::keys::KeyRecord>, StoreError> {
        self.with_client(|c| async move { keys::all(&c).await })
    }

    fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<crate::keys::KeyRecord>, StoreError> {
        let hash = *hash;
        self.with_client(move |c| async move { keys::by_hash(&c, &hash).await })
    }

    fn keys_generation(&self) -> u64 {
        self.news.keys()
    }
}

impl PgStore {
    /// The generations of cached shared state.
    pub fn news(&self) -> &StateNews {
        &self.news
    }
}

impl Store for PgStore {
    fn key_store(self: Arc<Self>) -> Option<Arc<dyn crate::keys::KeyStore>> {
        Some(self)
    }

    fn shared(self: Arc<Self>) -> Option<Arc<dyn crate::Shared>> {
        Some(self)
    }

    fn create(&self, req: CreateRequest) -> Result<CreateOutcome, StoreError> {
        self.submit(|reply| Op::Create(Box::new(req), reply))
    }

    fn create_many(&self, reqs: Vec<CreateRequest>) -> Result<Vec<CreateOutcome>, StoreError> {
        self.submit(|reply| Op::CreateMany(reqs, reply))
    }

    fn get(&self, code: &str) -> Result<Option<StoredLink>, StoreError> {
        let code = code.to_string();
        self.with_client(move |c| async move {
            let row = c
                .query_opt(
                    &format!("SELECT {LINK_COLUMNS} FROM links WHERE code = $1"),
                    &[&code],
                )
                .await
                .map_err(pg)?;
            row.as_ref().map(row_link).transpose()
        })
    }

    fn get_many(&self, codes: &[String]) -> Result<Vec<Option<StoredLink>>, StoreError> {
        let codes = codes.to_vec();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    &format!("SELECT {LINK_COLUMNS} FROM links WHERE code = ANY($1)"),
                    &[&codes],
                )
                .await
                .map_err(pg)?;
            let mut found = std::collections::HashMap::new();
            for row in &rows {
                let s = row_link(row)?;
                found.insert(s.link.code.clone(), s);
            }
            Ok(codes.iter().map(|c| found.remove(c)).collect())
        })
    }

    fn list(
        &self,
        owner: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LinkPage, StoreError> {
        let before: i64 = match cursor {
            Some(c) => c.parse().map_err(|_| StoreError::BadCursor)?,
            None => i64::MAX,
        };
        let owner = owner.to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT {LINK_COLUMNS} FROM links WHERE owner = $1 AND created_seq < $2 \
                         ORDER BY created_seq DESC LIMIT $3"
                    ),
                    &[&owner, &before, &(limit_i64(limit) + 1)],
                )
                .await
                .map_err(pg)?;
            let mut links = rows.iter().map(row_link).collect::<Result<Vec<_>, _>>()?;
            let more = links.len() > limit;
            links.truncate(limit);
            let next_cursor = if more {
                links.last().map(|s| s.seq.to_string())
            } else {
                None
            };
            Ok(LinkPage { links, next_cursor })
        })
    }

    fn list_cursor_after(&self, seq: u64) -> String {
        seq.to_string()
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
        self.with_client(move |mut c| async move {
            // One snapshot: the list is complete up to the sequence it reports.
            let (txn, seq) = consistent_read(&mut c).await?;
            let rows = txn
                .query("SELECT code, kind FROM denied ORDER BY code", &[])
                .await
                .map_err(pg)?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let kind: i16 = row.get(1);
                let kind = match kind {
                    writer::DENY_GONE => DenyKind::Gone,
                    writer::DENY_WARN => DenyKind::Warn,
                    other => return Err(corrupt("denied", format!("unknown kind {other}"))),
                };
                out.push((row.get(0), kind));
            }
            txn.commit().await.map_err(pg)?;
            Ok((seq, out))
        })
    }

    fn commits(&self) -> watch::Receiver<u64> {
        self.commits.clone()
    }

    fn position(&self, name: &str) -> Result<Option<String>, StoreError> {
        let name = name.to_string();
        self.with_client(move |c| async move {
            let row = c
                .query_opt("SELECT value FROM positions WHERE name = $1", &[&name])
                .await
                .map_err(pg)?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>, StoreError> {
        let after = to_i64(after);
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT seq, change FROM changes WHERE seq > $1 ORDER BY seq LIMIT $2",
                    &[&after, &limit_i64(limit)],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let seq: i64 = r.get(0);
                    let text: String = r.get(1);
                    let change = serde_json::from_str(&text).map_err(|e| corrupt("changes", e))?;
                    Ok((u64::try_from(seq).unwrap_or(0), change))
                })
                .collect()
        })
    }

    fn own_changes_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<OwnChange>, u64), StoreError> {
        let region = self.region;
        // A region that mostly replicates others' changes still answers in bounded time: the
        // page ends after this many entries read, own or not (`upto` says how far it got).
        let scan = limit.saturating_mul(10).max(1_000);
        let from = to_i64(after);
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT c.seq, c.change, o.region IS NULL FROM changes c \
                     LEFT JOIN change_origins o ON o.seq = c.seq \
                     WHERE c.seq > $1 ORDER BY c.seq LIMIT $2",
                    &[&from, &limit_i64(scan)],
                )
                .await
                .map_err(pg)?;
            let mut out: Vec<OwnChange> = Vec::new();
            let mut upto = after;
            for r in &rows {
                let seq = u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
                if r.get::<_, bool>(2) {
                    if out.len() == limit {
                        break;
                    }
                    let text: String = r.get(1);
                    let change = serde_json::from_str(&text).map_err(|e| corrupt("changes", e))?;
                    out.push(OwnChange {
                        seq,
                        change,
                        audit: Vec::new(),
                    });
                }
                upto = seq;
            }
            // The records written with those changes: one read for the page.
            let codes: Vec<String> = out.iter().map(|o| o.change.code().to_string()).collect();
            if !codes.is_empty() {
                let rows = c
                    .query(
                        "SELECT code, record FROM audit WHERE code = ANY($1) ORDER BY id",
                        &[&codes],
                    )
                    .await
                    .map_err(pg)?;
                let at: std::collections::HashMap<u64, usize> =
                    out.iter().enumerate().map(|(i, o)| (o.seq, i)).collect();
                for r in &rows {
                    let text: String = r.get(1);
                    let record: AuditRecord =
                        serde_json::from_str(&text).map_err(|e| corrupt("audit", e))?;
                    let Some(o) = record.origin.filter(|o| o.region == region) else {
                        continue;
                    };
                    if let Some(&i) = at.get(&o.seq) {
                        out[i].audit.push(record);
                    }
                }
            }
            Ok((out, upto))
        })
    }

    fn replicate(&self, page: Replicated) -> Result<ReplicateOutcome, StoreError> {
        self.submit(|reply| Op::Replicate(Box::new(page), reply))
    }

    fn last_seq(&self) -> Result<u64, StoreError> {
        self.with_client(move |c| async move { head_seq(&**c).await })
    }

    fn high_water_marks(&self) -> Result<Vec<(u32, u64)>, StoreError> {
        self.with_client(move |c| async move {
            let rows = c
                .query("SELECT region, next FROM counters ORDER BY region", &[])
                .await
                .map_err(pg)?;
            Ok(rows
                .iter()
                .map(|r| {
                    let region: i32 = r.get(0);
                    let next: i64 = r.get(1);
                    (
                        u32::try_from(region).unwrap_or(0),
                        u64::try_from(next).unwrap_or(0),
                    )
                })
                .collect())
        })
    }

    fn for_each_link(
        &self,
        f: &mut dyn FnMut(&StoredLink) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        // One consistent snapshot, streamed in pages so a million links never sit in memory.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<StoredLink>, StoreError>>(2);
        let (seq_tx, seq_rx) = std::sync::mpsc::sync_channel::<u64>(1);
        let pool = self.pool();
        self.rt.spawn(async move {
            let result = async {
                let mut c = pool.get().await.map_err(pool_err)?;
                let (txn, seq) = consistent_read(&mut c).await?;
                let _ = seq_tx.send(seq);
                let sql = format!("SELECT {LINK_COLUMNS} FROM links ORDER BY code");
                if !stream_pages(&txn, &sql, &tx, row_link).await? {
                    return Ok(());
                }
                txn.commit().await.map_err(pg)?;
                Ok::<_, StoreError>(())
            }
            .await;
            if let Err(e) = result {
                let _ = tx.send(Err(e));
            }
        });
        let seq = seq_rx.recv().unwrap_or(0);
        for page in rx {
            for s in page? {
                f(&s)?;
            }
        }
        Ok(seq)
    }

    fn scan_links(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StoredLink>, Option<String>), StoreError> {
        let after = after.unwrap_or("").to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT {LINK_COLUMNS} FROM links WHERE code > $1 ORDER BY code LIMIT $2"
                    ),
                    &[&after, &(limit_i64(limit) + 1)],
                )
                .await
                .map_err(pg)?;
            let mut links = rows.iter().map(row_link).collect::<Result<Vec<_>, _>>()?;
            let more = links.len() > limit;
            links.truncate(limit);
            let next = if more {
                links.last().map(|s| s.link.code.clone())
            } else {
                None
            };
            Ok((links, next))
        })
    }

    fn domain_links(&self, domain: &str, limit: u64) -> Result<u64, StoreError> {
        // A branded domain's keys are one range in the "C" collation: `domain/` up to `domain0`.
        let (lo, hi) = (format!("{domain}/"), format!("{domain}0"));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_client(move |c| async move {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM (SELECT 1 FROM links WHERE code >= $1 AND code < $2 \
                     AND long_url <> '' LIMIT $3) live",
                    &[&lo, &hi, &limit],
                )
                .await
                .map_err(pg)?
                .get(0);
            Ok(n as u64)
        })
    }

    fn count_links(&self) -> Result<u64, StoreError> {
        self.with_client(move |c| async move {
            // The planner's estimate is free and good enough for pacing; small or never
            // analysed tables get an exact count.
            let estimate: f32 = c
                .query_one(
                    "SELECT coalesce(reltuples, -1) FROM pg_class WHERE relname = 'links'",
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            if estimate >= 100_000.0 {
                return Ok(estimate as u64);
            }
            let n: i64 = c
                .query_one("SELECT count(*) FROM links", &[])
                .await
                .map_err(pg)?
                .get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn codes_by_host(
        &self,
        host: &CanonicalHost,
        subdomains: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Result<HostPage, StoreError> {
        let key = host.index_key();
        let (after_key, after_code) = match after {
            Some(a) => {
                let (k, c) = a.split_once('\u{0}').ok_or(StoreError::BadCursor)?;
                (k.to_string(), c.to_string())
            }
            None => (String::new(), String::new()),
        };
        self.with_client(move |c| async move {
            // The host itself, then (byte order, "C" collation) everything under `key.`.
            let sub_lo = format!("{key}.");
            let sub_hi = format!("{key}/");
            let rows = c
                .query(
                    "SELECT index_key, code, url_hash FROM dest_hosts \
                     WHERE (index_key = $1 OR ($2 AND index_key > $3 AND index_key < $4)) \
                       AND (index_key, code) > ($5, $6) \
                     ORDER BY index_key, code LIMIT $7",
                    &[
                        &key,
                        &subdomains,
                        &sub_lo,
                        &sub_hi,
                        &after_key,
                        &after_code,
                        &(limit_i64(limit) + 1),
                    ],
                )
                .await
                .map_err(pg)?;
            let more = rows.len() > limit;
            let mut entries = Vec::with_capacity(rows.len().min(limit));
            let mut last = None;
            for row in rows.iter().take(limit) {
                let index_key: String = row.get(0);
                let code: String = row.get(1);
                let hash: i64 = row.get(2);
                last = Some(format!("{index_key}\u{0}{code}"));
                entries.push(HostEntry {
                    code,
                    url_hash: hash as u64,
                });
            }
            Ok(HostPage {
                entries,
                next: if more { last } else { None },
            })
        })
    }

    fn code_set(
        &self,
        set: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CodePage, StoreError> {
        let set = set.to_string();
        let after = after.unwrap_or("").to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT code FROM code_sets WHERE set_name = $1 AND code > $2 \
                     ORDER BY code LIMIT $3",
                    &[&set, &after, &(limit_i64(limit) + 1)],
                )
                .await
                .map_err(pg)?;
            let mut codes: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let more = codes.len() > limit;
            codes.truncate(limit);
            let next = if more { codes.last().cloned() } else { None };
            Ok(CodePage { codes, next })
        })
    }

    fn history(&self, code: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let code = code.to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT record FROM audit WHERE code = $1 ORDER BY id",
                    &[&code],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let text: String = r.get(0);
                    serde_json::from_str(&text).map_err(|e| corrupt("audit", e))
                })
                .collect()
        })
    }

    fn add_report(&self, report: Report) -> Result<Report, StoreError> {
        self.submit(|reply| Op::AddReport(Box::new(report), reply))
    }

    fn report(&self, id: u64) -> Result<Option<Report>, StoreError> {
        let id = to_i64(id);
        self.with_client(move |c| async move {
            let row = c
                .query_opt("SELECT report FROM reports WHERE id = $1", &[&id])
                .await
                .map_err(pg)?;
            row.map(|r| {
                let text: String = r.get(0);
                serde_json::from_str(&text).map_err(|e| corrupt("reports", e))
            })
            .transpose()
        })
    }

    fn reports(
        &self,
        filter: ReportFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ReportPage, StoreError> {
        let after: i64 = match cursor {
            Some(c) => c.parse().map_err(|_| StoreError::BadCursor)?,
            None => 0,
        };
        let condition = match filter {
            ReportFilter::Open => "open",
            ReportFilter::Resolved => "NOT open",
            ReportFilter::All => "true",
        };
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT report FROM reports WHERE id > $1 AND {condition} \
                         ORDER BY id LIMIT $2"
                    ),
                    &[&after, &(limit_i64(limit) + 1)],
                )
                .await
                .map_err(pg)?;
            let mut reports = rows
                .iter()
                .map(|r| {
                    let text: String = r.get(0);
                    serde_json::from_str::<Report>(&text).map_err(|e| corrupt("reports", e))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let more = reports.len() > limit;
            reports.truncate(limit);
            let next_cursor = if more {
                reports.last().map(|r| r.id.to_string())
            } else {
                None
            };
            Ok(ReportPage {
                reports,
                next_cursor,
            })
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
        let owner = owner.to_string();
        self.with_client(move |c| async move {
            let row = c
                .query_opt("SELECT record FROM owners WHERE owner = $1", &[&owner])
                .await
                .map_err(pg)?;
            row.map(|r| {
                let text: String = r.get(0);
                serde_json::from_str(&text).map_err(|e| corrupt("owners", e))
            })
            .transpose()
        })
    }

    fn put_owner(&self, record: OwnerRecord) -> Result<(), StoreError> {
        self.submit(|reply| Op::PutOwner(Box::new(record), reply))
    }

    fn owners(&self) -> Result<Vec<OwnerRecord>, StoreError> {
        self.with_client(move |c| async move {
            let rows = c
                .query("SELECT record FROM owners ORDER BY owner", &[])
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let text: String = r.get(0);
                    serde_json::from_str(&text).map_err(|e| corrupt("owners", e))
                })
                .collect()
        })
    }

    fn domain(&self, domain: &str) -> Result<Option<DomainRecord>, StoreError> {
        let domain = domain.to_string();
        self.with_client(move |c| async move {
            let row = c
                .query_opt("SELECT record FROM domains WHERE domain = $1", &[&domain])
                .await
                .map_err(pg)?;
            row.map(|r| {
                let text: String = r.get(0);
                serde_json::from_str(&text).map_err(|e| corrupt("domains", e))
            })
            .transpose()
        })
    }

    fn domains(&self) -> Result<Vec<DomainRecord>, StoreError> {
        self.with_client(move |c| async move {
            let rows = c
                .query("SELECT record FROM domains ORDER BY domain", &[])
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let text: String = r.get(0);
                    serde_json::from_str(&text).map_err(|e| corrupt("domains", e))
                })
                .collect()
        })
    }

    fn domains_generation(&self) -> Result<u64, StoreError> {
        self.with_client(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT value FROM meta WHERE key = $1",
                    &[&DOMAINS_GENERATION],
                )
                .await
                .map_err(pg)?;
            let value: i64 = row.map(|r| r.get(0)).unwrap_or(0);
            Ok(u64::try_from(value).unwrap_or(0))
        })
    }

    fn write_domain(
        &self,
        mut record: DomainRecord,
        expected: Option<u64>,
        remove: bool,
    ) -> Result<bool, StoreError> {
        let revision = |r: u64| i64::try_from(r).map_err(|_| corrupt("domains", "revision"));
        let expected = expected.map(revision).transpose()?;
        record.revision = u64::try_from(expected.unwrap_or(0)).unwrap_or(0) + 1;
        let next = revision(record.revision)?;
        let text = serde_json::to_string(&record)?;
        self.with_client(move |mut c| async move {
            let txn = c.transaction().await.map_err(pg)?;
            // The comparison and the write are one statement; the generation moves in the same
            // transaction.
            let n = match (expected, remove) {
                (None, true) => 0,
                (None, false) => txn
                    .execute(
                        "INSERT INTO domains (domain, revision, record) VALUES ($1, $2, $3) \
                         ON CONFLICT (domain) DO NOTHING",
                        &[&record.domain, &next, &text],
                    )
                    .await
                    .map_err(pg)?,
                (Some(rev), false) => txn
                    .execute(
                        "UPDATE domains SET revision = $2, record = $3 \
                         WHERE domain = $1 AND revision = $4",
                        &[&record.domain, &next, &text, &rev],
                    )
                    .await
                    .map_err(pg)?,
                (Some(rev), true) => txn
                    .execute(
                        "DELETE FROM domains WHERE domain = $1 AND revision = $2",
                        &[&record.domain, &rev],
                    )
                    .await
                    .map_err(pg)?,
            };
            if n == 1 {
                bump_domains_generation(&txn).await?;
            }
            txn.commit().await.map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn shared_secret(
        &self,
        name: &str,
        make: &dyn Fn() -> Result<String, StoreError>,
    ) -> Result<Option<String>, StoreError> {
        let candidate = make()?;
        let name = name.to_string();
        self.with_client(move |c| async move {
            c.execute(
                "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&name, &candidate.as_bytes()],
            )
            .await
            .map_err(pg)?;
            let value: Vec<u8> = c
                .query_one("SELECT value FROM secrets WHERE name = $1", &[&name])
                .await
                .map_err(pg)?
                .get(0);
            String::from_utf8(value)
                .map(Some)
                .map_err(|e| corrupt("secrets", e))
        })
    }

    fn find_text(&self, needle: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let needle = needle.to_string();
        self.with_client(move |c| async move {
            let tables = c
                .query(
                    "SELECT table_name::text FROM information_schema.tables                      WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'                      ORDER BY table_name",
                    &[],
                )
                .await
                .map_err(pg)?;
            let mut out = Vec::new();
            for row in tables {
                let table: String = row.get(0);
                // Every column as text (bytea too, hex): the row's whole text form.
                let hits: i64 = c
                    .query_one(
                        &format!(
                            "SELECT count(*) FROM \"{table}\" t                              WHERE strpos(t::text, $1) > 0                                 OR strpos(encode(convert_to(t::text, 'UTF8'), 'escape'), $1) > 0"
                        ),
                        &[&needle],
                    )
                    .await
                    .map_err(pg)?
                    .get(0);
                if hits > 0 {
                    out.push((table, u64::try_from(hits).unwrap_or(0)));
                }
            }
            Ok(out)
        })
    }

    fn export(
        &self,
        out: &mut dyn FnMut(super::transfer::Record) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        transfer::export(self, out)
    }

    fn shutdown(&self) -> Result<(), StoreError> {
        let result = self.submit(Op::Shutdown);
        if let Ok(mut guard) = self.writer.lock() {
            guard.take();
        }
        let done = self.writer_done.lock().ok().and_then(|mut g| g.take());
        if let Some(done) = done {
            let _ = done.recv_timeout(std::time::Duration::from_secs(10));
        }
        result
    }
}
