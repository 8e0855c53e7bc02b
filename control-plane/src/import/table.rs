//! CSV exports, read a record at a time, their columns found by header name.
//!
//! Columns are looked up by name, never by position, and names are compared by their letters
//! and digits only, case folded (`Short link`, `short_link` and `shortLink` are one name): the
//! exports add, drop and reorder columns between versions (Shlink's gained `domain` and
//! `shortCode`, Dub's labels were its field names before), and a user may have opened the file
//! in a spreadsheet on the way. Records may have fewer or more cells than the header (a missing
//! cell is empty). The field delimiter is `,` unless the header line has more `;` or tabs (a
//! spreadsheet's "CSV" in locales whose decimal mark is the comma).

use anyhow::Context;
use std::io::Read;

use super::source::{Input, Source};
use super::Refused;

pub(super) struct Table<R> {
    reader: csv::Reader<R>,
    record: csv::ByteRecord,
    line: u64,
}

/// How the delimiter is chosen.
#[derive(Debug, Clone, Copy)]
pub(super) enum Delimiter {
    /// This one.
    Fixed(u8),
    /// The most frequent of `,`, `;` and tab on the first line.
    Sniffed,
}

impl<R: Read> Table<Input<R>> {
    pub(super) fn open(source: Source<R>, delimiter: Delimiter) -> Self {
        let delimiter = match delimiter {
            Delimiter::Fixed(b) => b,
            Delimiter::Sniffed => sniff(source.first_line()),
        };
        let reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .delimiter(delimiter)
            .from_reader(source.into_reader());
        Table {
            reader,
            record: csv::ByteRecord::new(),
            line: 0,
        }
    }
}

impl<R: Read> Table<R> {
    /// The first record as a header (names folded as [`key`]); not counted as a record.
    pub(super) fn header(&mut self) -> anyhow::Result<Header> {
        let mut names = Vec::new();
        if self.read()? {
            names = self
                .record
                .iter()
                .map(|name| key(&String::from_utf8_lossy(name)))
                .collect();
        }
        Ok(Header { names })
    }

    /// The next record and its number, or `None` at the end. A record that is not UTF-8 is
    /// refused.
    pub(super) fn next(&mut self) -> anyhow::Result<Option<(u64, Result<Cells<'_>, Refused>)>> {
        if !self.read()? {
            return Ok(None);
        }
        self.line += 1;
        let cells = self
            .record
            .iter()
            .map(std::str::from_utf8)
            .collect::<Result<Vec<_>, _>>()
            .map(|cells| Cells { cells })
            .map_err(|_| Refused {
                line: self.line,
                code: None,
                reason: "malformed row: not UTF-8".to_string(),
            });
        Ok(Some((self.line, cells)))
    }

    fn read(&mut self) -> anyhow::Result<bool> {
        self.reader
            .read_byte_record(&mut self.record)
            .with_context(|| format!("reading the CSV after record {}", self.line))
    }
}

/// A header's column names, folded as [`key`].
#[derive(Debug)]
pub(super) struct Header {
    names: Vec<String>,
}

impl Header {
    /// The first column with any of `names` (folded), trying them in order.
    pub(super) fn find(&self, names: &[&str]) -> Option<usize> {
        names
            .iter()
            .find_map(|want| self.names.iter().position(|name| name == &key(want)))
    }

    /// [`Header::find`], or the error that says this is not a `format` export.
    pub(super) fn require(&self, format: &str, names: &[&str]) -> anyhow::Result<usize> {
        let want = names.first().copied().unwrap_or_default();
        self.find(names).ok_or_else(|| match self.names.as_slice() {
            [] => anyhow::anyhow!("not a {format} export: the file is empty, with no header"),
            names => anyhow::anyhow!(
                "not a {format} export: the header has no {want} column (it has: {})",
                names.join(", ")
            ),
        })
    }
}

/// One record's cells.
#[derive(Debug)]
pub(super) struct Cells<'a> {
    cells: Vec<&'a str>,
}

impl<'a> Cells<'a> {
    /// The cell in `column`, trimmed; empty when there is no such column or cell.
    pub(super) fn get(&self, column: Option<usize>) -> &'a str {
        column
            .and_then(|i| self.cells.get(i))
            .map_or("", |cell| cell.trim())
    }
}

/// A column name with only its letters and digits, lower-cased.
pub(super) fn key(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

fn sniff(line: &[u8]) -> u8 {
    let count = |d: u8| line.iter().filter(|&&b| b == d).count();
    let (comma, semicolon, tab) = (count(b','), count(b';'), count(b'\t'));
    if tab > comma.max(semicolon) {
        b'\t'
    } else if semicolon > comma {
        b';'
    } else {
        b','
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(input: &[u8]) -> Table<Input<&[u8]>> {
        Table::open(Source::open(input).expect("in memory"), Delimiter::Sniffed)
    }

    #[test]
    fn columns_are_found_by_folded_name_whatever_the_order() {
        let mut t = table(b"\"Short link\",Destination URL,clicks\nx,y,1\n");
        let header = t.header().expect("header");
        assert_eq!(header.find(&["short_link"]), Some(0));
        assert_eq!(header.find(&["nope", "DestinationUrl"]), Some(1));
        assert_eq!(header.find(&["title"]), None);
        let err = header.require("dub", &["tags"]).expect_err("no tags");
        assert_eq!(
            err.to_string(),
            "not a dub export: the header has no tags column (it has: shortlink, destinationurl, clicks)"
        );
        let empty = table(b"").header().expect("nothing to read");
        let err = empty.require("YOURLS", &["keyword"]).expect_err("empty");
        assert_eq!(
            err.to_string(),
            "not a YOURLS export: the file is empty, with no header"
        );
    }

    #[test]
    fn records_are_numbered_after_the_header_and_short_ones_read_as_empty() {
        let mut t = table(b"a,b,c\n1,2,3\n\n4\n");
        t.header().expect("header");
        let (line, cells) = t.next().expect("read").expect("one");
        let cells = cells.expect("utf-8");
        assert_eq!((line, cells.get(Some(2))), (1, "3"));
        let (line, cells) = t.next().expect("read").expect("two");
        let cells = cells.expect("utf-8");
        assert_eq!(
            (
                line,
                cells.get(Some(0)),
                cells.get(Some(2)),
                cells.get(None)
            ),
            (2, "4", "", "")
        );
        assert!(t.next().expect("read").is_none());
    }

    #[test]
    fn a_record_that_is_not_utf8_is_refused_and_the_next_read() {
        let mut t = table(b"a,b\n\xff,1\nx,2\n");
        t.header().expect("header");
        let (_, first) = t.next().expect("read").expect("one");
        assert_eq!(
            first.expect_err("latin-1").reason,
            "malformed row: not UTF-8"
        );
        let (line, second) = t.next().expect("read").expect("two");
        assert_eq!((line, second.expect("utf-8").get(Some(0))), (2, "x"));
    }

    #[test]
    fn the_delimiter_is_sniffed_from_the_header_line() {
        assert_eq!(sniff(b"a,b,c"), b',');
        assert_eq!(sniff(b"a;b;c"), b';');
        assert_eq!(sniff(b"a\tb\tc"), b'\t');
        assert_eq!(sniff(b"abc"), b',');
        let mut t = table(b"keyword;url\nabc;https://a.example/x,y\n");
        let header = t.header().expect("header");
        let (_, cells) = t.next().expect("read").expect("one");
        assert_eq!(
            cells.expect("utf-8").get(header.find(&["url"])),
            "https://a.example/x,y"
        );
    }
}
