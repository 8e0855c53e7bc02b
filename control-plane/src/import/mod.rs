//! Reading other shorteners' export files for `links import --from FORMAT FILE` (issue 44).
//!
//! This is the parsing layer only: [`read`] turns a file into [`Row`]s, one call of a callback per
//! row, and knows nothing of the store, the alias rules or the reputation lists. The caller
//! checks each row as it would a create (destination, alias shape, reserved words, listed hosts,
//! collisions) and writes the report.
//!
//! Why a callback, not a `Vec`: exports run to millions of links, and a file is never held whole.
//! CSV is read a record at a time (the `csv` crate); JSON arrays are walked element by element
//! with a `serde` visitor over `serde_json::Deserializer::from_reader`, holding one link object
//! at a time; NDJSON is read a line at a time. The callback's own error stops the read and is
//! returned as is, so the caller can abort on, say, a closed database.
//!
//! Two kinds of failure, kept apart on purpose:
//!
//! - a record that cannot become a row (no destination, a code outside `[A-Za-z0-9_-]{1,64}`, an
//!   unreadable date, an NDJSON line that is not JSON) is a [`Refused`] passed to the callback in
//!   its place, and the read goes on: one bad row in a million must not cost the other rows;
//! - input that is not the format at all (a CSV header without the format's columns, JSON whose
//!   top level is not an array or object, a syntax error inside a JSON array, where the parser
//!   cannot find the next element again) or that cannot be read is the `Err` that [`read`]
//!   returns, and the rows already passed stay passed.
//!
//! What every format shares (`fields.rs`, `short_link.rs`, `timestamp.rs`):
//!
//! - a UTF-8 byte order mark at the start of the file is skipped;
//! - every text field is trimmed; an empty optional field is absent;
//! - a code is the old short URL's path: a leading `/` and a full URL's scheme and host are
//!   stripped, and what is left must be 1–64 characters of `[A-Za-z0-9_-]` ("malformed code");
//!   a domain is the old short URL's host, lower-cased, without port;
//! - times are read leniently, into Unix milliseconds: RFC 3339, the offset with or without its
//!   colon (`+0000`, Bitly), a space for the `T` and no offset at all (read as UTC: YOURLS, SQL
//!   dumps), a bare date (midnight UTC), plain Unix seconds; MySQL's zero date
//!   `0000-00-00 00:00:00` is no date;
//! - [`Row::line`] is the record's 1-based number among the file's records: CSV records after
//!   the header; link objects in JSON, counted on across pages and NDJSON lines (an NDJSON line
//!   that is not JSON counts as one). One Bitly record gives several rows (its custom
//!   bitlinks), all with its number.
//!
//! The formats, each in its own module with its sources: [`Format::Bitly`] (`bitly.rs`),
//! [`Format::Yourls`] (`yourls.rs`), [`Format::Kutt`] (`kutt.rs`), [`Format::Shlink`]
//! (`shlink.rs`), [`Format::Dub`] (`dub.rs`), and [`Format::Csv`], lasthop's own
//! ([`CSV_HEADER`], [`csv_record`], `generic.rs`).

mod bitly;
mod dub;
mod fields;
mod generic;
mod json;
mod kutt;
mod shlink;
mod short_link;
mod source;
mod table;
mod timestamp;
mod yourls;

use std::fmt;
use std::io::Read;
use std::str::FromStr;

pub use generic::{csv_record, CSV_HEADER};

use source::Source;

/// The export formats `links import --from` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Bitly API v4 bitlinks: JSON (`{"links": [...]}` pages, a bare array, NDJSON) or CSV.
    Bitly,
    /// A YOURLS `yourls_url` table dumped as CSV with a header.
    Yourls,
    /// Kutt API v2 links: `{"data": [...]}` pages or a bare array (or NDJSON).
    Kutt,
    /// Shlink's CSV export (its web client's "Export" button).
    Shlink,
    /// Dub's CSV export of links.
    Dub,
    /// lasthop's own CSV: `code,long_url[,created_at,tags,expires_at]` ([`CSV_HEADER`]).
    Csv,
}

impl Format {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [Format; 6] = [
        Format::Bitly,
        Format::Yourls,
        Format::Kutt,
        Format::Shlink,
        Format::Dub,
        Format::Csv,
    ];

    /// The name `--from` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Bitly => "bitly",
            Format::Yourls => "yourls",
            Format::Kutt => "kutt",
            Format::Shlink => "shlink",
            Format::Dub => "dub",
            Format::Csv => "csv",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

/// A `--from` value that names no format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown import format {:?} (expected one of: bitly, yourls, kutt, shlink, dub, csv)",
            self.0
        )
    }
}

impl std::error::Error for UnknownFormat {}

/// One link read from an export, before any of the caller's checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The record's 1-based number in the file (see the module docs), for reports.
    pub line: u64,
    /// The old short code, the old short URL's path: 1–64 characters of `[A-Za-z0-9_-]`.
    pub code: String,
    /// The old short URL's host, lower-cased, where the format carries one.
    pub domain: Option<String>,
    /// The destination as given, trimmed (the caller checks it as it checks a create).
    pub long_url: String,
    pub title: Option<String>,
    /// Unix milliseconds.
    pub created_at_ms: Option<i64>,
    /// As given, trimmed, empty ones dropped (the caller validates them).
    pub tags: Vec<String>,
    /// Unix milliseconds.
    pub expires_at_ms: Option<i64>,
    /// The old total of clicks, where the format has one.
    pub clicks: Option<u64>,
    /// Bitly's `archived`, Dub's `Archived`.
    pub archived: bool,
}

/// A record that could not become a [`Row`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The record's 1-based number, as [`Row::line`].
    pub line: u64,
    /// The code as far as it could be read (absent when the record has none).
    pub code: Option<String>,
    /// Short human text: `malformed row: missing long_url`, `malformed code: 'a b'`.
    pub reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "record {} ({code}): {}", self.line, self.reason),
            None => write!(f, "record {}: {}", self.line, self.reason),
        }
    }
}

impl std::error::Error for Refused {}

/// What one [`read`] went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Records read (one Bitly record with custom bitlinks gives several rows).
    pub records: u64,
    /// Rows passed as `Ok`.
    pub rows: u64,
    /// Records or rows passed as `Err`.
    pub refused: u64,
}

/// Streams `input` in `format`, calling `each` once per row in file order, with `Ok(row)` or
/// `Err(refused)`.
///
/// A fatal error, unreadable input or input that is not the format at all (a CSV header without
/// the format's columns, JSON whose top level is neither array nor object, a syntax error inside
/// a JSON array), is the `Err` this returns; so is the first error `each` returns, which stops
/// the read.
pub fn read(
    format: Format,
    input: impl Read,
    each: impl FnMut(Result<Row, Refused>) -> anyhow::Result<()>,
) -> anyhow::Result<ImportCounts> {
    let mut sink = Sink {
        each,
        counts: ImportCounts::default(),
        last_line: 0,
    };
    let source = Source::open(input).map_err(|e| anyhow::anyhow!("reading the input: {e}"))?;
    match format {
        Format::Bitly => bitly::read(source, &mut sink)?,
        Format::Yourls => yourls::read(source, &mut sink)?,
        Format::Kutt => kutt::read(source, &mut sink)?,
        Format::Shlink => shlink::read(source, &mut sink)?,
        Format::Dub => dub::read(source, &mut sink)?,
        Format::Csv => generic::read(source, &mut sink)?,
    }
    Ok(sink.counts)
}

/// Where the formats put their rows: the caller's callback, with the counting done once.
struct Sink<F> {
    each: F,
    counts: ImportCounts,
    last_line: u64,
}

/// The sink as the formats see it (object-safe, so the JSON visitors need no type parameter).
trait Emit {
    fn emit(&mut self, item: Result<Row, Refused>) -> anyhow::Result<()>;
}

impl<F: FnMut(Result<Row, Refused>) -> anyhow::Result<()>> Emit for Sink<F> {
    fn emit(&mut self, item: Result<Row, Refused>) -> anyhow::Result<()> {
        let line = match &item {
            Ok(row) => row.line,
            Err(refused) => refused.line,
        };
        // Lines only grow, and every record gives at least one item.
        if line != self.last_line {
            self.counts.records += 1;
            self.last_line = line;
        }
        match item {
            Ok(_) => self.counts.rows += 1,
            Err(_) => self.counts.refused += 1,
        }
        (self.each)(item)
    }
}

#[cfg(test)]
mod tests;
