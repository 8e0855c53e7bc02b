//! Export and import of the embedded store ([`crate::transfer`] has the format).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use lasthop_core::{Change, CodeKind, Link, LinkState};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use super::{
    audit_key, corrupt, index_destination, owner_prefix, record_key, storage, EmbeddedStore,
    EmbeddedStoreConfig, LinkRow, RowSeq, Tables, AUDIT, CHANGES, CODE_SETS, COUNTER_PREFIX,
    DOMAINS, LINKS, META, META_AUDIT_NEXT, META_DEST_INDEX, META_KEY_ID, META_REPORT_NEXT, OWNERS,
    OWNER_LINKS, POSITIONS, REPORTS, STATES,
};
use crate::transfer::{AuditLine, Imported, LinkRecord, Reader, Record};
use crate::{DomainRecord, OwnerRecord, Report, StoreError};

/// Records written per intermediate transaction (not fsynced; the last one is).
const CHUNK: usize = 20_000;

/// The code a record key names (`0x00 ‖ counter` or `0x01 ‖ alias`).
fn code_of(store: &EmbeddedStore, key: &[u8]) -> Result<String, StoreError> {
    match key.split_first() {
        Some((0, n)) => {
            let n: [u8; 8] = n.try_into().map_err(|e| corrupt("record key", e))?;
            store
                .scheme
                .encode_string(u64::from_be_bytes(n))
                .map_err(storage)
        }
        Some((1, alias)) => String::from_utf8(alias.to_vec()).map_err(|e| corrupt("record key", e)),
        _ => Err(corrupt("record key", "neither a counter nor an alias")),
    }
}

/// [`crate::Store::export`] of the embedded store: one read transaction.
pub(super) fn export(
    store: &EmbeddedStore,
    out: &mut dyn FnMut(Record) -> Result<(), StoreError>,
) -> Result<u64, StoreError> {
    let txn = store.db.begin_read().map_err(storage)?;
    let changes = txn.open_table(CHANGES).map_err(storage)?;
    let last_seq = changes
        .last()
        .map_err(storage)?
        .map(|(k, _)| k.value())
        .unwrap_or(0);
    for (region, high_water) in super::marks(&txn.open_table(META).map_err(storage)?)? {
        out(Record::Counter { region, high_water })?;
    }
    let links = txn.open_table(LINKS).map_err(storage)?;
    let states = txn.open_table(STATES).map_err(storage)?;
    let owner_links = txn.open_table(OWNER_LINKS).map_err(storage)?;
    for item in links.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        let link: Link = serde_json::from_slice(v.value()).map_err(|e| corrupt("links", e))?;
        let row: RowSeq = serde_json::from_slice(v.value()).map_err(|e| corrupt("links", e))?;
        let seq = match row.seq.filter(|s| *s > 0) {
            Some(seq) => seq,
            // Rows from before `seq` was stored: the owner index's key ends in it, inverted.
            None => super::seq_in_owner_index(&owner_links, &link)?.unwrap_or(0),
        };
        let state: LinkState = match states.get(k.value()).map_err(storage)? {
            Some(s) => serde_json::from_slice(s.value()).map_err(|e| corrupt("link_state", e))?,
            None => LinkState::default(),
        };
        out(Record::Link(LinkRecord {
            code: link.code,
            long_url: link.long_url,
            owner: link.owner,
            created_at_ms: link.created_at_ms,
            seq,
            state,
        }))?;
    }
    let audit = txn.open_table(AUDIT).map_err(storage)?;
    for item in audit.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        let k = k.value();
        // record key ‖ 0x00 ‖ n (8 bytes)
        let record_key = k
            .get(..k.len().saturating_sub(9))
            .ok_or_else(|| corrupt("audit", "short key"))?;
        let code = code_of(store, record_key)?;
        let record = serde_json::from_slice(v.value()).map_err(|e| corrupt("audit", e))?;
        out(AuditLine::record_of(code, record))?;
    }
    let sets = txn.open_table(CODE_SETS).map_err(storage)?;
    for item in sets.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        out(Record::CodeSet {
            set: k.value().0.to_string(),
            code: v.value().to_string(),
        })?;
    }
    let reports = txn.open_table(REPORTS).map_err(storage)?;
    for item in reports.iter().map_err(storage)? {
        let (_, v) = item.map_err(storage)?;
        let report: Report =
            serde_json::from_slice(v.value()).map_err(|e| corrupt("reports", e))?;
        out(Record::Report { report })?;
    }
    let owners = txn.open_table(OWNERS).map_err(storage)?;
    for item in owners.iter().map_err(storage)? {
        let (_, v) = item.map_err(storage)?;
        let record: OwnerRecord =
            serde_json::from_slice(v.value()).map_err(|e| corrupt("owners", e))?;
        out(Record::Owner { record })?;
    }
    let domains = txn.open_table(DOMAINS).map_err(storage)?;
    for item in domains.iter().map_err(storage)? {
        let (_, v) = item.map_err(storage)?;
        let record: DomainRecord =
            serde_json::from_slice(v.value()).map_err(|e| corrupt("domains", e))?;
        out(Record::Domain { record })?;
    }
    let positions = txn.open_table(POSITIONS).map_err(storage)?;
    for item in positions.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        out(Record::Position {
            name: k.value().to_string(),
            value: v.value().to_string(),
        })?;
    }
    Ok(last_seq)
}

/// Why a store file cannot take an import, if it cannot: it holds links or leased counters.
fn not_empty(path: &Path) -> Result<Option<String>, StoreError> {
    if !path.exists() {
        return Ok(None);
    }
    let db = Database::create(path).map_err(storage)?;
    let txn = db.begin_read().map_err(storage)?;
    let links = match txn.open_table(LINKS) {
        Ok(t) => redb::ReadableTableMetadata::len(&t).map_err(storage)?,
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(storage(e)),
    };
    if links > 0 {
        return Ok(Some(format!("it holds {links} links")));
    }
    if let Ok(meta) = txn.open_table(META) {
        if meta
            .range(COUNTER_PREFIX.."counter_next0")
            .map_err(storage)?
            .next()
            .is_some()
        {
            return Ok(Some("it has leased counters".into()));
        }
    }
    Ok(None)
}

/// Imports an export into the embedded store at `config.path`, which must be empty or absent:
/// everything is written to a new file beside it and renamed into place once the whole file
/// read back complete (a failure leaves the old file as it was). API keys are returned for the
/// caller to add to the keys file.
pub fn import<R: BufRead>(
    config: &EmbeddedStoreConfig,
    reader: &mut Reader<R>,
) -> Result<(Imported, Vec<crate::keys::KeyRecord>), StoreError> {
    if let Some(why) = not_empty(&config.path)? {
        return Err(StoreError::Refused(format!(
            "{} cannot take an import: {why} (import writes only into an empty store)",
            config.path.display()
        )));
    }
    let temp = sibling(&config.path, "importing");
    let _ = std::fs::remove_file(&temp);
    let result = write_all(config, &temp, reader);
    match result {
        Ok(done) => {
            std::fs::rename(&temp, &config.path).map_err(storage)?;
            if let Some(dir) = config.path.parent() {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(storage)?;
            }
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

fn sibling(path: &Path, what: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{what}"));
    path.with_file_name(name)
}

fn write_all<R: BufRead>(
    config: &EmbeddedStoreConfig,
    path: &Path,
    reader: &mut Reader<R>,
) -> Result<(Imported, Vec<crate::keys::KeyRecord>), StoreError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(storage)?;
    }
    let db = Database::create(path).map_err(storage)?;
    let scheme = &config.scheme;
    let mut done = Imported::default();
    let mut keys = Vec::new();
    let mut marks: HashMap<u32, u64> = HashMap::new();
    let mut claims = crate::transfer::ClaimCheck::default();
    let mut next_audit = 1u64;
    let mut next_report = 1u64;
    // The link with the highest creation number and its state: restated at the head.
    let mut highest: Option<(u64, String, LinkState)> = None;
    let mut unnumbered: Vec<Vec<u8>> = Vec::new();
    let mut first = true;
    let mut finished = false;
    loop {
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::None).map_err(storage)?;
        {
            let mut t = Tables::open(&txn)?;
            if first {
                t.meta
                    .insert(META_KEY_ID, u64::from(scheme.key_id()))
                    .map_err(storage)?;
                t.meta.insert(META_DEST_INDEX, 1).map_err(storage)?;
                first = false;
            }
            for _ in 0..CHUNK {
                let Some(record) = reader.next() else {
                    finished = true;
                    break;
                };
                match record? {
                    Record::Header(_) | Record::End(_) => {}
                    Record::Counter { region, high_water } => {
                        lasthop_core::region_range(region, config.regions)
                            .map_err(|e| corrupt("import", format!("counter line: {e}")))?;
                        marks.insert(region, high_water);
                        t.meta
                            .insert(format!("{COUNTER_PREFIX}{region}").as_str(), high_water)
                            .map_err(storage)?;
                        done.other += 1;
                    }
                    Record::Link(l) => {
                        let key = record_key(scheme, &l.code).ok_or_else(|| {
                            corrupt("import", format!("link {:?} is no valid code", l.code))
                        })?;
                        // A generated code's counter is checked on any domain (one counter).
                        let (_, code) = lasthop_core::split_key_str(&l.code);
                        if lasthop_core::classify(code.as_bytes()) == CodeKind::Generated {
                            let n = scheme.decode(code.as_bytes()).unwrap_or(u64::MAX);
                            claims.link(&l.code, n, config.regions, &marks)?;
                        }
                        if t.links.get(key.as_slice()).map_err(storage)?.is_some() {
                            return Err(corrupt("import", format!("link {} twice", l.code)));
                        }
                        let link = Link {
                            code: l.code.clone(),
                            long_url: l.long_url,
                            owner: l.owner,
                            created_at_ms: l.created_at_ms,
                        };
                        let row = serde_json::to_vec(&LinkRow {
                            link: &link,
                            seq: l.seq,
                        })?;
                        t.links
                            .insert(key.as_slice(), row.as_slice())
                            .map_err(storage)?;
                        let state = serde_json::to_vec(&l.state)?;
                        t.states
                            .insert(key.as_slice(), state.as_slice())
                            .map_err(storage)?;
                        super::write_denied(&mut t, &l.code, &l.state)?;
                        if !l.state.deleted {
                            index_destination(
                                &mut t.dest_hosts,
                                &key,
                                &link.code,
                                l.state.url(&link),
                                true,
                            )?;
                        }
                        if l.seq == 0 {
                            unnumbered.push(key);
                        } else {
                            let mut index_key = owner_prefix(&link.owner);
                            index_key.extend_from_slice(&(!l.seq).to_be_bytes());
                            t.owner_links
                                .insert(index_key.as_slice(), link.code.as_str())
                                .map_err(storage)?;
                            if t.changes.get(l.seq).map_err(storage)?.is_some() {
                                return Err(corrupt(
                                    "import",
                                    format!("link {}: creation number {} twice", link.code, l.seq),
                                ));
                            }
                            if highest.as_ref().is_none_or(|(s, _, _)| l.seq > *s) {
                                highest = Some((l.seq, link.code.clone(), l.state.clone()));
                            }
                            let change = serde_json::to_vec(&Change::LinkCreated {
                                link,
                                state: l.state.logged(),
                            })?;
                            t.changes
                                .insert(l.seq, change.as_slice())
                                .map_err(storage)?;
                        }
                        done.links += 1;
                    }
                    Record::Audit(a) => {
                        let key = record_key(scheme, &a.code).ok_or_else(|| {
                            corrupt("import", format!("audit of {:?}: no valid code", a.code))
                        })?;
                        let json = serde_json::to_vec(&a.record())?;
                        t.audit
                            .insert(audit_key(&key, next_audit).as_slice(), json.as_slice())
                            .map_err(storage)?;
                        next_audit += 1;
                        done.audit += 1;
                    }
                    Record::CodeSet { set, code } => {
                        let key = match claims.code_set(&set, &code)? {
                            Some(n) => super::counter_key(n),
                            None => record_key(scheme, &code).ok_or_else(|| {
                                corrupt(
                                    "import",
                                    format!("code set {set}: {code:?} is no valid code"),
                                )
                            })?,
                        };
                        t.code_sets
                            .insert((set.as_str(), key.as_slice()), code.as_str())
                            .map_err(storage)?;
                        done.other += 1;
                    }
                    Record::Report { report } => {
                        if report.id == 0 || t.reports.get(report.id).map_err(storage)?.is_some() {
                            return Err(corrupt(
                                "import",
                                format!("report id {} is 0 or twice", report.id),
                            ));
                        }
                        let json = serde_json::to_vec(&report)?;
                        t.reports
                            .insert(report.id, json.as_slice())
                            .map_err(storage)?;
                        if report.resolution.is_none() {
                            t.reports_open.insert(report.id, ()).map_err(storage)?;
                        }
                        next_report = next_report.max(report.id + 1);
                        done.other += 1;
                    }
                    Record::Owner { record } => {
                        super::writer::apply_put_owner(&mut t, &record)?;
                        done.other += 1;
                    }
                    Record::Domain { record } => {
                        super::writer::bump_domains_generation(&mut t)?;
                        let json = serde_json::to_vec(&record)?;
                        t.domains
                            .insert(record.domain.as_str(), json.as_slice())
                            .map_err(storage)?;
                        done.other += 1;
                    }
                    Record::Position { name, value } => {
                        t.positions
                            .insert(name.as_str(), value.as_str())
                            .map_err(storage)?;
                        done.other += 1;
                    }
                    Record::ApiKey(k) => {
                        keys.push(k.to_record()?);
                        done.api_keys += 1;
                    }
                }
            }
        }
        if finished {
            claims.finish()?;
            // The whole file read back complete (the reader checked the end line): number the
            // links that had no creation number, restate the newest link at the head so the
            // log's head stays where it was, and make it all durable.
            let end = reader
                .end()
                .cloned()
                .ok_or_else(|| corrupt("import", "the file ends without its end line"))?;
            {
                let mut t = Tables::open(&txn)?;
                let mut head = end.last_seq.max(highest.as_ref().map(|h| h.0).unwrap_or(0));
                for key in unnumbered.drain(..) {
                    head += 1;
                    let raw = t
                        .links
                        .get(key.as_slice())
                        .map_err(storage)?
                        .map(|g| g.value().to_vec())
                        .ok_or_else(|| corrupt("import", "a link vanished"))?;
                    let link: Link =
                        serde_json::from_slice(&raw).map_err(|e| corrupt("links", e))?;
                    let state: LinkState = t
                        .states
                        .get(key.as_slice())
                        .map_err(storage)?
                        .map(|g| serde_json::from_slice(g.value()))
                        .transpose()
                        .map_err(|e| corrupt("link_state", e))?
                        .unwrap_or_default();
                    let row = serde_json::to_vec(&LinkRow {
                        link: &link,
                        seq: head,
                    })?;
                    t.links
                        .insert(key.as_slice(), row.as_slice())
                        .map_err(storage)?;
                    let mut index_key = owner_prefix(&link.owner);
                    index_key.extend_from_slice(&(!head).to_be_bytes());
                    t.owner_links
                        .insert(index_key.as_slice(), link.code.as_str())
                        .map_err(storage)?;
                    highest = Some((head, link.code.clone(), state.clone()));
                    let change = serde_json::to_vec(&Change::LinkCreated {
                        link,
                        state: state.logged(),
                    })?;
                    t.changes.insert(head, change.as_slice()).map_err(storage)?;
                }
                if let Some((seq, code, state)) = &highest {
                    if *seq < head {
                        let change = serde_json::to_vec(&Change::StateChanged {
                            code: code.clone(),
                            state: state.logged(),
                        })?;
                        t.changes.insert(head, change.as_slice()).map_err(storage)?;
                    }
                }
                done.last_seq = if highest.is_some() { head } else { 0 };
                t.meta
                    .insert(META_AUDIT_NEXT, next_audit)
                    .map_err(storage)?;
                t.meta
                    .insert(META_REPORT_NEXT, next_report)
                    .map_err(storage)?;
            }
            txn.set_durability(Durability::Immediate).map_err(storage)?;
            txn.commit().map_err(storage)?;
            break;
        }
        txn.commit().map_err(storage)?;
    }
    Ok((done, keys))
}
