//! `lasthop-control export` and `import`: the whole record as NDJSON, one JSON object per line,
//! streamed both ways in constant memory, so an operator moves between the embedded store and
//! PostgreSQL (either way) and keeps logical backups.
//!
//! A file is, in this order (each line's `type` says which):
//!
//! | `type` | what | |
//! |---|---|---|
//! | `header` | `format` (`lasthop-export`), `version` (1), `key_id` (the permutation key's id, hex), `regions`, `source`, `exported_at_ms` | one, first |
//! | `counter` | `region`, `high_water`: every counter ever leased there is below it | one per region |
//! | `link` | `code`, `long_url` (empty once deleted), `owner`, `created_at_ms`, `seq` (its creation's change-log number), `state` | every link, deleted ones included |
//! | `audit` | `code` and the record's fields (`at_ms`, `actor`, `action`, `reason`, `undid`, `origin`) | oldest first per link |
//! | `code_set` | `set`, `code`: the scan queue and suspensions' takedowns | |
//! | `report` | `report`: a report or appeal with its id and resolution | |
//! | `owner` | `record`: an owner's flag or suspension | |
//! | `domain` | `record`: a branded domain (owner, settings, suspension, its certificate and private key: an export is as secret as the store) | |
//! | `position` | `name`, `value`: where the scanner's walks are | |
//! | `api_key` | `id`, `hash` (SHA-256 of the secret, hex; never the secret), `owner`, `admin`, `created_at`, `revoked_at` | |
//! | `end` | `last_seq` (the change log's head), `links`, `records` (lines between header and end) | one, last |
//!
//! What is not carried, and why: idempotency keys (they live a day; a retry across a move makes
//! a new link rather than risk a wrong replay), the change log itself (import writes one entry
//! per link at its creation's number, carrying the link as it is now, and keeps the head where
//! it was: an engine that reconnects gets the full denylist and the next snapshot, and numbers
//! never go backwards), free ranges below a high-water mark (those counters are skipped, never
//! issued twice), the denylist, the owner and destination indexes (rebuilt from the links),
//! published snapshots and the fleet (rebuilt and re-reported), and secrets (the edge token).
//!
//! Import refuses a file made under another permutation key or for another region count, one
//! that is truncated (no `end`, or counts that disagree) or malformed (a clear error naming the
//! line), a generated code at or above its region's high-water mark, and a store that already
//! holds links or has leased counters. On PostgreSQL it is one transaction; on the embedded
//! store it writes a new file beside the old and renames it into place at the end: either way a
//! failed import leaves the target as it was.

use std::io::{BufRead, Write};

use lasthop_core::LinkState;
use serde::{Deserialize, Serialize};

use super::{AuditRecord, DomainRecord, OwnerRecord, Report, StoreError};
use crate::keys::KeyRecord;

/// The header's `format`.
pub const FORMAT: &str = "lasthop-export";
/// The header's `version`.
pub const VERSION: u32 = 1;
/// Longest line import reads (a link's URL is at most a few KiB).
pub const MAX_LINE: usize = 1 << 20;

/// One line of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    Header(Header),
    Counter { region: u32, high_water: u64 },
    Link(LinkRecord),
    Audit(AuditLine),
    CodeSet { set: String, code: String },
    Report { report: Report },
    Owner { record: OwnerRecord },
    Domain { record: DomainRecord },
    Position { name: String, value: String },
    ApiKey(KeyLine),
    End(End),
}

/// The first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: String,
    pub version: u32,
    /// [`lasthop_core::CodeScheme::key_id`], as 8 hex digits.
    pub key_id: String,
    pub regions: u32,
    /// `embedded` or `postgres`.
    pub source: String,
    pub exported_at_ms: i64,
}

/// A link, deleted or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRecord {
    pub code: String,
    pub long_url: String,
    pub owner: String,
    pub created_at_ms: i64,
    pub seq: u64,
    pub state: LinkState,
}

/// An audit record and the code it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditLine {
    pub code: String,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<super::Origin>,
}

impl AuditLine {
    pub fn record_of(code: String, r: AuditRecord) -> Record {
        Record::Audit(AuditLine {
            code,
            at_ms: r.at_ms,
            actor: r.actor,
            action: r.action,
            reason: r.reason,
            undid: r.undid,
            origin: r.origin,
        })
    }

    pub fn record(&self) -> AuditRecord {
        AuditRecord {
            at_ms: self.at_ms,
            actor: self.actor.clone(),
            action: self.action.clone(),
            reason: self.reason.clone(),
            undid: self.undid.clone(),
            origin: self.origin,
        }
    }
}

/// An API key as its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLine {
    pub id: String,
    pub hash: String,
    pub owner: String,
    pub admin: bool,
    pub created_at: String,
    #[serde(default)]
    pub revoked_at: Option<String>,
    /// The domains the key may act on (absent: every domain).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
}

impl KeyLine {
    pub fn from_record(r: &KeyRecord) -> KeyLine {
        KeyLine {
            id: r.id.clone(),
            hash: hex::encode(r.hash),
            owner: r.owner.clone(),
            admin: r.admin,
            created_at: r.created_at.clone(),
            revoked_at: r.revoked_at.clone(),
            domains: r.domains.clone(),
        }
    }

    pub fn to_record(&self) -> Result<KeyRecord, StoreError> {
        let hash = hex::decode(&self.hash)
            .ok()
            .and_then(|h| <[u8; 32]>::try_from(h).ok())
            .ok_or_else(|| bad(format!("api key {}: hash is not 64 hex digits", self.id)))?;
        if !super::keys::valid_key_id(&self.id) || !super::keys::valid_owner(&self.owner) {
            return Err(bad(format!("api key {:?}: bad id or owner", self.id)));
        }
        Ok(KeyRecord {
            hash,
            id: self.id.clone(),
            owner: self.owner.clone(),
            admin: self.admin,
            created_at: self.created_at.clone(),
            revoked_at: self.revoked_at.clone(),
            domains: self.domains.clone(),
        })
    }
}

/// The last line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    pub last_seq: u64,
    pub links: u64,
    pub records: u64,
}

fn bad(detail: String) -> StoreError {
    StoreError::Corrupt {
        what: "import".to_string(),
        detail,
    }
}

/// The permutation key id as the header writes it.
pub fn key_id_text(key_id: u32) -> String {
    format!("{key_id:08x}")
}

/// Writes records as NDJSON lines, counting them for the `end` line.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    pub links: u64,
    pub records: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer {
            out,
            links: 0,
            records: 0,
        }
    }

    /// One line (header and end lines are not counted).
    pub fn write(&mut self, record: &Record) -> Result<(), StoreError> {
        match record {
            Record::Header(_) | Record::End(_) => {}
            Record::Link(_) => {
                self.links += 1;
                self.records += 1;
            }
            _ => self.records += 1,
        }
        serde_json::to_writer(&mut self.out, record).map_err(|e| StoreError::File {
            what: "writing the export",
            cause: Box::new(e),
        })?;
        self.out.write_all(b"\n").map_err(|e| StoreError::File {
            what: "writing the export",
            cause: Box::new(e),
        })
    }

    /// The `end` line, then a flush.
    pub fn finish(mut self, last_seq: u64) -> Result<End, StoreError> {
        let end = End {
            last_seq,
            links: self.links,
            records: self.records,
        };
        self.write(&Record::End(end.clone()))?;
        self.out.flush().map_err(|e| StoreError::File {
            what: "writing the export",
            cause: Box::new(e),
        })?;
        Ok(end)
    }
}

/// Where the sections of a file must come in order.
fn section(record: &Record) -> u8 {
    match record {
        Record::Header(_) => 0,
        Record::Counter { .. } => 1,
        Record::Link(_) => 2,
        Record::Audit(_) => 3,
        Record::CodeSet { .. } => 4,
        Record::Report { .. } => 5,
        Record::Owner { .. } => 6,
        Record::Domain { .. } => 7,
        Record::Position { .. } => 8,
        Record::ApiKey(_) => 9,
        Record::End(_) => 10,
    }
}

/// Reads and checks an export: the header first (checked against the key and region count
/// the target uses), sections in order, lines at most [`MAX_LINE`], the `end` line last with
/// counts that match. Yields the records between header and end; the `end` is kept for
/// [`Reader::end`], and an error is yielded (then nothing) for the first problem found.
pub struct Reader<R: BufRead> {
    input: R,
    line_no: u64,
    section: u8,
    links: u64,
    records: u64,
    end: Option<End>,
    failed: bool,
    buf: Vec<u8>,
}

impl<R: BufRead> Reader<R> {
    /// Reads the header and checks it.
    pub fn open(input: R, key_id: u32, regions: u32) -> Result<(Self, Header), StoreError> {
        let mut reader = Reader {
            input,
            line_no: 0,
            section: 0,
            links: 0,
            records: 0,
            end: None,
            failed: false,
            buf: Vec::new(),
        };
        let header = match reader.next_line()? {
            Some(Record::Header(h)) => h,
            Some(_) => return Err(bad("line 1 is not the header".into())),
            None => return Err(bad("the file is empty".into())),
        };
        if header.format != FORMAT {
            return Err(bad(format!(
                "not a lasthop export: format {:?}",
                header.format
            )));
        }
        if header.version != VERSION {
            return Err(bad(format!(
                "export format version {} (this build reads {VERSION})",
                header.version
            )));
        }
        if header.key_id != key_id_text(key_id) {
            return Err(bad(format!(
                "the file was made under permutation key {}, this store uses {}: its codes \
                 would decode to other counters, so it is refused",
                header.key_id,
                key_id_text(key_id)
            )));
        }
        if header.regions != regions {
            return Err(bad(format!(
                "the file was made with {} regions, this store has {regions}",
                header.regions
            )));
        }
        Ok((reader, header))
    }

    fn next_line(&mut self) -> Result<Option<Record>, StoreError> {
        self.buf.clear();
        let n = std::io::Read::take(self.input.by_ref(), MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| StoreError::File {
                what: "reading the export",
                cause: Box::new(e),
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        if self.end.is_some() {
            return Err(bad(format!("line {}: lines after the end", self.line_no)));
        }
        if self.buf.len() > MAX_LINE {
            return Err(bad(format!(
                "line {} is longer than {MAX_LINE} bytes",
                self.line_no
            )));
        }
        if self.buf.last() != Some(&b'\n') {
            return Err(bad(format!(
                "line {} is cut short (the file is truncated)",
                self.line_no
            )));
        }
        let record: Record = serde_json::from_slice(&self.buf)
            .map_err(|e| bad(format!("line {}: {e}", self.line_no)))?;
        let s = section(&record);
        if s < self.section || (s == 0 && self.line_no > 1) {
            return Err(bad(format!(
                "line {}: a {} line out of order",
                self.line_no,
                type_name(&record)
            )));
        }
        self.section = s;
        Ok(Some(record))
    }

    fn step(&mut self) -> Result<Option<Record>, StoreError> {
        if self.end.is_some() {
            if self.next_line()?.is_some() {
                return Err(bad(format!("line {}: lines after the end", self.line_no)));
            }
            return Ok(None);
        }
        match self.next_line()? {
            None => Err(bad(
                "the file ends without its end line (it is truncated)".into()
            )),
            Some(Record::End(end)) => {
                if end.links != self.links || end.records != self.records {
                    return Err(bad(format!(
                        "the end line counts {} links and {} records, the file holds {} and {}",
                        end.links, end.records, self.links, self.records
                    )));
                }
                self.end = Some(end);
                self.step()
            }
            Some(record) => {
                if matches!(record, Record::Link(_)) {
                    self.links += 1;
                }
                self.records += 1;
                Ok(Some(record))
            }
        }
    }

    /// The `end` line, once every record was read.
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }
}

fn type_name(record: &Record) -> &'static str {
    match record {
        Record::Header(_) => "header",
        Record::Counter { .. } => "counter",
        Record::Link(_) => "link",
        Record::Audit(_) => "audit",
        Record::CodeSet { .. } => "code_set",
        Record::Report { .. } => "report",
        Record::Owner { .. } => "owner",
        Record::Domain { .. } => "domain",
        Record::Position { .. } => "position",
        Record::ApiKey(_) => "api_key",
        Record::End(_) => "end",
    }
}

impl<R: BufRead> std::fmt::Debug for Reader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("line_no", &self.line_no)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Record, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// What an import wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    pub links: u64,
    pub audit: u64,
    pub other: u64,
    pub api_keys: u64,
    pub last_seq: u64,
}

/// Checks a generated code against the high-water marks read so far: import never lets a store
/// hand out a counter a link already has.
pub fn check_counter(
    code: &str,
    n: u64,
    regions: u32,
    marks: &std::collections::HashMap<u32, u64>,
) -> Result<(), StoreError> {
    let region = (0..regions)
        .find(|r| lasthop_core::region_range(*r, regions).is_ok_and(|range| range.contains(&n)))
        .ok_or_else(|| bad(format!("link {code}: counter {n} is in no region")))?;
    match marks.get(&region) {
        Some(mark) if n < *mark => Ok(()),
        Some(mark) => Err(bad(format!(
            "link {code}: counter {n} is at or above region {region}'s high-water mark {mark}"
        ))),
        None => Err(bad(format!(
            "link {code}: region {region} has no counter line"
        ))),
    }
}

/// The claimed 7-character codes of an import ([`crate::Imported`]): a generated code's
/// counter at or above its region's mark is valid only when the record claims it in
/// [`crate::CLAIMED_SET`], which comes after the links.
#[derive(Debug, Default)]
pub struct ClaimCheck {
    above: Vec<(String, u64)>,
    claimed: std::collections::HashSet<u64>,
}

impl ClaimCheck {
    /// A link's generated code with counter `n`: [`check_counter`], or kept to be found claimed.
    pub fn link(
        &mut self,
        code: &str,
        n: u64,
        regions: u32,
        marks: &std::collections::HashMap<u32, u64>,
    ) -> Result<(), StoreError> {
        // At or above its region's mark: valid only if the record claims it (checked at the end).
        let above_mark = lasthop_core::region::region_of(n, regions)
            .and_then(|r| marks.get(&r))
            .is_some_and(|&mark| n >= mark);
        match check_counter(code, n, regions, marks) {
            Err(_) if above_mark => {
                self.above.push((code.to_string(), n));
                Ok(())
            }
            checked => checked,
        }
    }

    /// A code-set record: the counter it claims, for [`crate::CLAIMED_SET`].
    pub fn code_set(&mut self, set: &str, code: &str) -> Result<Option<u64>, StoreError> {
        if set != crate::CLAIMED_SET {
            return Ok(None);
        }
        let n = code
            .parse::<u64>()
            .ok()
            .filter(|&n| code == crate::claimed_entry(n))
            .ok_or_else(|| bad(format!("code set {set}: {code:?} is no claimed counter")))?;
        self.claimed.insert(n);
        Ok(Some(n))
    }

    /// Every link above its mark was claimed.
    pub fn finish(&self) -> Result<(), StoreError> {
        match self.above.iter().find(|(_, n)| !self.claimed.contains(n)) {
            Some((code, n)) => Err(bad(format!(
                "link {code}: counter {n} is at or above its region's high-water mark and not \
                 claimed"
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(lines: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
        out
    }

    const HEADER: &str = r#"{"type":"header","format":"lasthop-export","version":1,"key_id":"0000abcd","regions":1,"source":"embedded","exported_at_ms":1}"#;
    const LINK: &str = r#"{"type":"link","code":"abc","long_url":"https://a.example/","owner":"o","created_at_ms":1,"seq":1,"state":{}}"#;

    fn read_all(bytes: &[u8]) -> Result<Vec<Record>, StoreError> {
        let (reader, _) = Reader::open(bytes, 0xabcd, 1)?;
        reader.collect()
    }

    #[test]
    fn a_whole_file_reads_back_what_was_written() {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.write(&Record::Header(Header {
            format: FORMAT.into(),
            version: VERSION,
            key_id: key_id_text(0xabcd),
            regions: 1,
            source: "embedded".into(),
            exported_at_ms: 1,
        }))
        .unwrap();
        let records = vec![
            Record::Counter {
                region: 0,
                high_water: 10,
            },
            serde_json::from_str(LINK).unwrap(),
            AuditLine::record_of(
                "abc".into(),
                AuditRecord {
                    at_ms: 2,
                    actor: "scanner".into(),
                    action: "takedown".into(),
                    reason: Some("phishing".into()),
                    undid: None,
                    origin: None,
                },
            ),
        ];
        for r in &records {
            w.write(r).unwrap();
        }
        w.finish(7).unwrap();
        let (reader, header) = Reader::open(out.as_slice(), 0xabcd, 1).unwrap();
        assert_eq!(header.regions, 1);
        let mut reader = reader;
        let read: Vec<Record> = reader.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(read, records);
        assert_eq!(reader.end().unwrap().last_seq, 7);
    }

    #[test]
    fn another_key_or_region_count_is_refused() {
        let bytes = file(&[
            HEADER,
            r#"{"type":"end","last_seq":0,"links":0,"records":0}"#,
        ]);
        let e = Reader::open(bytes.as_slice(), 0x1234, 1).err().unwrap();
        assert!(e.to_string().contains("permutation key 0000abcd"), "{e}");
        let e = Reader::open(bytes.as_slice(), 0xabcd, 2).err().unwrap();
        assert!(e.to_string().contains("regions"), "{e}");
        assert!(read_all(&bytes).unwrap().is_empty());
    }

    #[test]
    fn truncation_is_found() {
        // No end line.
        let e = read_all(&file(&[HEADER, LINK])).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        // A last line without its newline.
        let mut cut = file(&[HEADER, LINK]);
        cut.pop();
        let e = read_all(&cut).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
        // Counts that disagree (a lost line in the middle).
        let e = read_all(&file(&[
            HEADER,
            LINK,
            r#"{"type":"end","last_seq":1,"links":2,"records":2}"#,
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("counts"), "{e}");
        // Lines after the end.
        let e = read_all(&file(&[
            HEADER,
            r#"{"type":"end","last_seq":0,"links":0,"records":0}"#,
            LINK,
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("after the end"), "{e}");
    }

    #[test]
    fn garbage_and_disorder_are_refused_with_the_line() {
        for (lines, want) in [
            (vec!["not json"], "line 1"),
            (vec![LINK], "not the header"),
            (vec![HEADER, "{\"type\":\"link\"}"], "line 2"),
            (vec![HEADER, r#"{"type":"nope"}"#], "line 2"),
            (
                vec![
                    HEADER,
                    LINK,
                    r#"{"type":"counter","region":0,"high_water":1}"#,
                ],
                "out of order",
            ),
            (vec![HEADER, HEADER], "out of order"),
            (
                vec![
                    HEADER,
                    r#"{"type":"counter","region":0,"high_water":1,"extra":1}"#,
                ],
                "unknown field",
            ),
        ] {
            let bytes = file(&lines);
            let e = Reader::open(bytes.as_slice(), 0xabcd, 1)
                .and_then(|(r, _)| r.collect::<Result<Vec<_>, _>>())
                .unwrap_err();
            assert!(e.to_string().contains(want), "{lines:?}: {e}");
        }
        let long = format!("{}\n", "x".repeat(MAX_LINE + 10));
        let mut bytes = file(&[HEADER]);
        bytes.extend_from_slice(long.as_bytes());
        let e = read_all(&bytes).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    #[test]
    fn counters_are_checked_against_their_regions_mark() {
        let marks = std::collections::HashMap::from([(0u32, 100u64)]);
        assert!(check_counter("a", 99, 1, &marks).is_ok());
        assert!(check_counter("a", 100, 1, &marks).is_err());
        let r1 = lasthop_core::region_range(1, 2).unwrap().start;
        assert!(check_counter("a", r1, 2, &marks)
            .unwrap_err()
            .to_string()
            .contains("no counter line"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut input = file(&[HEADER]);
            input.extend_from_slice(&bytes);
            if let Ok((reader, _)) = Reader::open(input.as_slice(), 0xabcd, 1) {
                for r in reader {
                    let _ = r;
                }
            }
        }
    }
}
