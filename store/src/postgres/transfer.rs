//! Export and import of the PostgreSQL store ([`crate::transfer`] has the format).
//!
//! Export reads everything in one `REPEATABLE READ READ ONLY` transaction through portals, a
//! page at a time. Import is one transaction that first locks `links` and `counters` (a
//! control plane that starts leasing meanwhile waits, then leases above the imported marks)
//! and refuses a database that holds links, counters or changes.

use std::collections::HashMap;
use std::io::BufRead;

use lasthop_core::{Change, CodeKind, LinkState};
use lasthop_trust::Destination;
use tokio_postgres::Transaction;

use super::{
    consistent_read, corrupt, keys, pg, pool_err, row_link, stream_pages, PgStore, CHANGES_CHANNEL,
    LINK_COLUMNS,
};
use crate::transfer::{AuditLine, Imported, KeyLine, LinkRecord, Reader, Record};
use crate::{AuditRecord, DomainRecord, OwnerRecord, Report, StoreError};

/// Records written per batch of statements.
const PAGE: i32 = 2048;

type Page = Result<Vec<Record>, StoreError>;

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// [`crate::Store::export`] of the PostgreSQL store.
pub(super) fn export(
    store: &PgStore,
    out: &mut dyn FnMut(Record) -> Result<(), StoreError>,
) -> Result<u64, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Page>(2);
    let (seq_tx, seq_rx) = std::sync::mpsc::sync_channel::<u64>(1);
    let pool = store.pool();
    store.spawn(async move {
        let result = async {
            let mut c = pool.get().await.map_err(pool_err)?;
            let (txn, seq) = consistent_read(&mut c).await?;
            let _ = seq_tx.send(seq);
            type Convert<'a> =
                &'a (dyn Fn(&tokio_postgres::Row) -> Result<Record, StoreError> + Sync);
            let queries: [(&str, Convert<'_>); 9] = [
                ("SELECT region, next FROM counters ORDER BY region", &|r| {
                    let region: i32 = r.get(0);
                    let next: i64 = r.get(1);
                    Ok(Record::Counter {
                        region: u32::try_from(region).map_err(|e| corrupt("counters", e))?,
                        high_water: u64::try_from(next).map_err(|e| corrupt("counters", e))?,
                    })
                }),
                (links_sql(), &|r| {
                    let s = row_link(r)?;
                    Ok(Record::Link(LinkRecord {
                        code: s.link.code,
                        long_url: s.link.long_url,
                        owner: s.link.owner,
                        created_at_ms: s.link.created_at_ms,
                        seq: s.seq,
                        state: s.state,
                    }))
                }),
                ("SELECT code, record FROM audit ORDER BY code, id", &|r| {
                    let record: AuditRecord = parse("audit", r.get(1))?;
                    Ok(AuditLine::record_of(r.get(0), record))
                }),
                (
                    "SELECT set_name, code FROM code_sets ORDER BY set_name, code",
                    &|r| {
                        Ok(Record::CodeSet {
                            set: r.get(0),
                            code: r.get(1),
                        })
                    },
                ),
                ("SELECT report FROM reports ORDER BY id", &|r| {
                    let report: Report = parse("reports", r.get(0))?;
                    Ok(Record::Report { report })
                }),
                ("SELECT record FROM owners ORDER BY owner", &|r| {
                    let record: OwnerRecord = parse("owners", r.get(0))?;
                    Ok(Record::Owner { record })
                }),
                ("SELECT record FROM domains ORDER BY domain", &|r| {
                    let record: DomainRecord = parse("domains", r.get(0))?;
                    Ok(Record::Domain { record })
                }),
                ("SELECT name, value FROM positions ORDER BY name", &|r| {
                    Ok(Record::Position {
                        name: r.get(0),
                        value: r.get(1),
                    })
                }),
                (
                    "SELECT hash, id, owner, admin, created_at, revoked_at, domains FROM api_keys \
                     ORDER BY created_at, id",
                    &|r| Ok(Record::ApiKey(KeyLine::from_record(&keys::record(r)?))),
                ),
            ];
            for (sql, convert) in queries {
                if !stream_pages(&txn, sql, &tx, convert).await? {
                    return Ok(());
                }
            }
            txn.commit().await.map_err(pg)?;
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = result {
            let _ = tx.send(Err(e));
        }
    });
    let seq = seq_rx.recv().map_err(|_| StoreError::ShuttingDown)?;
    for page in rx {
        for record in page? {
            out(record)?;
        }
    }
    Ok(seq)
}

fn links_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| format!("SELECT {LINK_COLUMNS} FROM links ORDER BY code"))
}

/// What the reading thread hands the import transaction.
enum Step {
    Records(Vec<Record>),
    /// Everything was read and checked: the change log's head from the `end` line.
    Done(u64),
}

/// Imports an export into the PostgreSQL store `store` connects to, in one transaction.
pub fn import<R: BufRead>(
    store: &PgStore,
    scheme: lasthop_core::CodeScheme,
    regions: u32,
    reader: &mut Reader<R>,
) -> Result<Imported, StoreError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Step>(4);
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<Result<Imported, StoreError>>(1);
    let pool = store.pool();
    store.spawn(async move {
        let result = async {
            let mut c = pool.get().await.map_err(pool_err)?;
            let txn = c.transaction().await.map_err(pg)?;
            txn.batch_execute(
                "LOCK TABLE links, counters, free_counter_ranges, changes IN EXCLUSIVE MODE",
            )
            .await
            .map_err(pg)?;
            let row = txn
                .query_one(
                    "SELECT (SELECT count(*) FROM links), (SELECT count(*) FROM counters), \
                     (SELECT count(*) FROM free_counter_ranges), (SELECT count(*) FROM changes)",
                    &[],
                )
                .await
                .map_err(pg)?;
            let (links, counters, free, changes): (i64, i64, i64, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if links + counters + free + changes > 0 {
                return Err(StoreError::Refused(format!(
                    "the database cannot take an import: it holds {links} links, {counters} \
                     leased regions and {changes} changes (import writes only into an empty store)"
                )));
            }
            let mut state = ImportState {
                scheme,
                regions,
                marks: HashMap::new(),
                claims: crate::transfer::ClaimCheck::default(),
                done: Imported::default(),
                highest: None,
                unnumbered: Vec::new(),
                max_report: 0,
            };
            loop {
                match rx.recv().await {
                    Some(Step::Records(records)) => state.write(&txn, records).await?,
                    Some(Step::Done(last_seq)) => {
                        state.finish(&txn, last_seq).await?;
                        txn.commit().await.map_err(pg)?;
                        return Ok(state.done);
                    }
                    // The reader failed: the transaction rolls back.
                    None => return Err(StoreError::NotApplied("import abandoned")),
                }
            }
        }
        .await;
        let _ = done_tx.send(result);
    });
    let mut page = Vec::with_capacity(PAGE as usize);
    let mut failed = None;
    // The transaction gave up (its error is the answer) when a send fails.
    let mut gave_up = false;
    for record in reader.by_ref() {
        match record {
            Ok(r) => {
                page.push(r);
                if page.len() == PAGE as usize
                    && tx
                        .blocking_send(Step::Records(std::mem::take(&mut page)))
                        .is_err()
                {
                    gave_up = true;
                    break;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if failed.is_none() && !gave_up {
        match reader.end() {
            Some(end) => {
                let _ = tx.blocking_send(Step::Records(page));
                let _ = tx.blocking_send(Step::Done(end.last_seq));
            }
            None => failed = Some(corrupt("import", "the file ends without its end line")),
        }
    }
    drop(tx);
    let outcome = done_rx.recv().map_err(|_| StoreError::ShuttingDown)?;
    match failed {
        Some(e) => Err(e),
        None => outcome,
    }
}

struct ImportState {
    scheme: lasthop_core::CodeScheme,
    regions: u32,
    marks: HashMap<u32, u64>,
    claims: crate::transfer::ClaimCheck,
    done: Imported,
    highest: Option<(u64, String, LinkState)>,
    unnumbered: Vec<String>,
    max_report: u64,
}

fn i64_of(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|e| corrupt("import", e))
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    Ok(serde_json::to_string(v)?)
}

impl ImportState {
    async fn write(
        &mut self,
        txn: &Transaction<'_>,
        records: Vec<Record>,
    ) -> Result<(), StoreError> {
        // Links in one statement per table; the rest a row at a time (they are few).
        let (mut codes, mut urls, mut owners, mut created, mut seqs, mut states) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let (mut ch_seqs, mut ch_texts) = (Vec::new(), Vec::new());
        let (mut deny_codes, mut deny_kinds) = (Vec::new(), Vec::new());
        let (mut idx_keys, mut idx_codes, mut idx_hashes) = (Vec::new(), Vec::new(), Vec::new());
        let (mut audit_codes, mut audit_records) = (Vec::new(), Vec::new());
        for record in records {
            match record {
                Record::Header(_) | Record::End(_) => {}
                Record::Counter { region, high_water } => {
                    lasthop_core::region_range(region, self.regions)
                        .map_err(|e| corrupt("import", format!("counter line: {e}")))?;
                    self.marks.insert(region, high_water);
                    txn.execute(
                        "INSERT INTO counters (region, next) VALUES ($1, $2)",
                        &[
                            &i32::try_from(region).map_err(|e| corrupt("import", e))?,
                            &i64_of(high_water)?,
                        ],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.other += 1;
                }
                Record::Link(l) => {
                    // A generated code's counter is checked on any domain (one counter).
                    let (_, code) = lasthop_core::split_key_str(&l.code);
                    match lasthop_core::classify_key(l.code.as_bytes()) {
                        CodeKind::Generated => {
                            let n = self.scheme.decode(code.as_bytes()).ok_or_else(|| {
                                corrupt("import", format!("link {:?} is no valid code", l.code))
                            })?;
                            self.claims.link(&l.code, n, self.regions, &self.marks)?;
                        }
                        CodeKind::Alias | CodeKind::Legacy => {}
                        CodeKind::Invalid => {
                            return Err(corrupt(
                                "import",
                                format!("link {:?} is no valid code", l.code),
                            ))
                        }
                    }
                    if let Some(kind) = l.state.deny_kind() {
                        deny_codes.push(l.code.clone());
                        deny_kinds.push(match kind {
                            lasthop_core::feed::DenyKind::Gone => super::writer::DENY_GONE,
                            lasthop_core::feed::DenyKind::Warn => super::writer::DENY_WARN,
                        });
                    }
                    if !l.state.deleted {
                        let url = l.state.destination.as_deref().unwrap_or(&l.long_url);
                        if let Some(dest) = Destination::parse(url) {
                            idx_keys.push(dest.host.index_key());
                            idx_codes.push(l.code.clone());
                            idx_hashes.push(dest.url_hash() as i64);
                        }
                    }
                    if l.seq == 0 {
                        self.unnumbered.push(l.code.clone());
                    } else {
                        if self.highest.as_ref().is_none_or(|(s, _, _)| l.seq > *s) {
                            self.highest = Some((l.seq, l.code.clone(), l.state.clone()));
                        }
                        ch_seqs.push(i64_of(l.seq)?);
                        ch_texts.push(json(&Change::LinkCreated {
                            link: lasthop_core::Link {
                                code: l.code.clone(),
                                long_url: l.long_url.clone(),
                                owner: l.owner.clone(),
                                created_at_ms: l.created_at_ms,
                            },
                            state: l.state.logged(),
                        })?);
                    }
                    states.push(json(&l.state)?);
                    codes.push(l.code);
                    urls.push(l.long_url);
                    owners.push(l.owner);
                    created.push(l.created_at_ms);
                    seqs.push(i64_of(l.seq)?);
                    self.done.links += 1;
                }
                Record::Audit(a) => {
                    audit_records.push(json(&a.record())?);
                    audit_codes.push(a.code);
                    self.done.audit += 1;
                }
                Record::CodeSet { set, code } => {
                    self.claims.code_set(&set, &code)?;
                    txn.execute(
                        "INSERT INTO code_sets (set_name, code) VALUES ($1, $2)",
                        &[&set, &code],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.other += 1;
                }
                Record::Report { report } => {
                    if report.id == 0 {
                        return Err(corrupt("import", "report id 0"));
                    }
                    self.max_report = self.max_report.max(report.id);
                    txn.execute(
                        "INSERT INTO reports (id, open, report) VALUES ($1, $2, $3)",
                        &[
                            &i64_of(report.id)?,
                            &report.resolution.is_none(),
                            &json(&report)?,
                        ],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.other += 1;
                }
                Record::Owner { record } => {
                    if record.flagged.is_some() || record.suspended.is_some() {
                        txn.execute(
                            "INSERT INTO owners (owner, record) VALUES ($1, $2)",
                            &[&record.owner, &json(&record)?],
                        )
                        .await
                        .map_err(pg)?;
                    }
                    self.done.other += 1;
                }
                Record::Domain { record } => {
                    super::bump_domains_generation(txn).await?;
                    let revision = i64_of(record.revision)?;
                    txn.execute(
                        "INSERT INTO domains (domain, revision, record) VALUES ($1, $2, $3)",
                        &[&record.domain, &revision, &json(&record)?],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.other += 1;
                }
                Record::Position { name, value } => {
                    txn.execute(
                        "INSERT INTO positions (name, value) VALUES ($1, $2)",
                        &[&name, &value],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.other += 1;
                }
                Record::ApiKey(k) => {
                    let k = k.to_record()?;
                    txn.execute(
                        "INSERT INTO api_keys (hash, id, owner, admin, created_at, revoked_at, \
                         domains) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        &[
                            &k.hash.as_slice(),
                            &k.id,
                            &k.owner,
                            &k.admin,
                            &k.created_at,
                            &k.revoked_at,
                            &crate::keys::domains_text(&k.domains),
                        ],
                    )
                    .await
                    .map_err(pg)?;
                    self.done.api_keys += 1;
                }
            }
        }
        if !codes.is_empty() {
            txn.execute(
                "INSERT INTO links (code, long_url, owner, created_at_ms, created_seq, state) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], \
                                      $5::bigint[], $6::text[])",
                &[&codes, &urls, &owners, &created, &seqs, &states],
            )
            .await
            .map_err(pg)?;
        }
        if !ch_seqs.is_empty() {
            txn.execute(
                "INSERT INTO changes (seq, change) SELECT * FROM unnest($1::bigint[], $2::text[])",
                &[&ch_seqs, &ch_texts],
            )
            .await
            .map_err(pg)?;
        }
        if !deny_codes.is_empty() {
            txn.execute(
                "INSERT INTO denied (code, kind) SELECT * FROM unnest($1::text[], $2::smallint[])",
                &[&deny_codes, &deny_kinds],
            )
            .await
            .map_err(pg)?;
        }
        if !idx_keys.is_empty() {
            txn.execute(
                "INSERT INTO dest_hosts (index_key, code, url_hash) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
                &[&idx_keys, &idx_codes, &idx_hashes],
            )
            .await
            .map_err(pg)?;
        }
        if !audit_codes.is_empty() {
            txn.execute(
                "INSERT INTO audit (code, record) SELECT * FROM unnest($1::text[], $2::text[])",
                &[&audit_codes, &audit_records],
            )
            .await
            .map_err(pg)?;
        }
        Ok(())
    }

    /// Numbers the links that had no creation number, restates the newest link at the head so
    /// the log's head stays where it was, and moves the sequences past what was imported.
    async fn finish(&mut self, txn: &Transaction<'_>, last_seq: u64) -> Result<(), StoreError> {
        self.claims.finish()?;
        let mut head = last_seq.max(self.highest.as_ref().map(|h| h.0).unwrap_or(0));
        for code in std::mem::take(&mut self.unnumbered) {
            head += 1;
            let row = txn
                .query_one(
                    &format!(
                        "UPDATE links SET created_seq = $2 WHERE code = $1 RETURNING {LINK_COLUMNS}"
                    ),
                    &[&code, &i64_of(head)?],
                )
                .await
                .map_err(pg)?;
            let s = row_link(&row)?;
            self.highest = Some((head, code, s.state.clone()));
            txn.execute(
                "INSERT INTO changes (seq, change) VALUES ($1, $2)",
                &[
                    &i64_of(head)?,
                    &json(&Change::LinkCreated {
                        link: s.link,
                        state: s.state.logged(),
                    })?,
                ],
            )
            .await
            .map_err(pg)?;
        }
        if let Some((seq, code, state)) = &self.highest {
            if *seq < head {
                txn.execute(
                    "INSERT INTO changes (seq, change) VALUES ($1, $2)",
                    &[
                        &i64_of(head)?,
                        &json(&Change::StateChanged {
                            code: code.clone(),
                            state: state.logged(),
                        })?,
                    ],
                )
                .await
                .map_err(pg)?;
            }
        } else {
            head = 0;
        }
        self.done.last_seq = head;
        txn.execute(
            "UPDATE change_seq SET next = $1 WHERE id = 1",
            &[&i64_of(head + 1)?],
        )
        .await
        .map_err(pg)?;
        if self.max_report > 0 {
            txn.execute(
                "SELECT setval('reports_id_seq', $1)",
                &[&i64_of(self.max_report)?],
            )
            .await
            .map_err(pg)?;
        }
        // Control planes already running hear of it as they hear of any commit.
        txn.execute(
            "SELECT pg_notify($1, $2)",
            &[&CHANGES_CHANNEL, &head.to_string()],
        )
        .await
        .map_err(pg)?;
        for what in ["keys", "owners"] {
            txn.execute("SELECT pg_notify($1, $2)", &[&keys::STATE_CHANNEL, &what])
                .await
                .map_err(pg)?;
        }
        Ok(())
    }
}
