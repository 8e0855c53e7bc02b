//! YOURLS: the `yourls_url` table dumped as CSV with its header.
//!
//! The table (YOURLS `includes/functions-install.php`) has `keyword` (the code), `url`, `title`,
//! `timestamp` (a MySQL `timestamp`, `2020-01-02 03:04:05`), `ip` and `clicks`. Dumps differ in
//! which columns they keep and in what order (phpMyAdmin's CSV export keeps them all, quoted;
//! `SELECT keyword, url, ...` keeps what was named), so columns are found by name and the rest
//! ignored; `keyword` and `url` are required. SQL's NULL, spelled `NULL` by phpMyAdmin and `\N`
//! by `SELECT ... INTO OUTFILE`, is an empty cell. The timestamp has no zone and is read as UTC;
//! MySQL's zero date is no date. YOURLS has one domain per install, so rows carry none.

use std::io::Read;

use super::fields;
use super::short_link;
use super::source::Source;
use super::table::{Delimiter, Table};
use super::{Emit, Refused, Row};

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    let mut table = Table::open(source, Delimiter::Sniffed);
    let header = table.header()?;
    let keyword = header.require("YOURLS", &["keyword"])?;
    let url = header.require("YOURLS", &["url"])?;
    let title = header.find(&["title"]);
    let timestamp = header.find(&["timestamp"]);
    let clicks = header.find(&["clicks"]);
    while let Some((line, cells)) = table.next()? {
        let item = cells.and_then(|cells| {
            let cell = |column| sql_null(cells.get(column));
            let code = short_link::code(cell(Some(keyword))).map_err(|bad| bad.at(line))?;
            let refuse = |reason| Refused {
                line,
                code: Some(code.clone()),
                reason,
            };
            Ok(Row {
                line,
                domain: None,
                long_url: fields::long_url(cell(Some(url))).map_err(&refuse)?,
                title: fields::text(cell(title)),
                created_at_ms: fields::time(cell(timestamp), "timestamp").map_err(&refuse)?,
                tags: Vec::new(),
                expires_at_ms: None,
                clicks: fields::clicks(cell(clicks)).map_err(&refuse)?,
                archived: false,
                code,
            })
        });
        sink.emit(item)?;
    }
    Ok(())
}

fn sql_null(cell: &str) -> &str {
    match cell {
        "NULL" | "\\N" => "",
        cell => cell,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::Format;

    #[test]
    fn columns_are_found_by_name_and_the_others_ignored() {
        let (rows, refused, _) = collect(
            Format::Yourls,
            b"\"ip\",\"clicks\",\"timestamp\",\"title\",\"url\",\"keyword\"\n\
              \"127.0.0.1\",\"12\",\"2020-01-02 03:04:05\",\"Caf\xc3\xa9\",\"https://a.example/x\",\"abc\"\n\
              \"::1\",\"NULL\",\"0000-00-00 00:00:00\",\"NULL\",\"https://a.example/y\",\"2b\"\n",
        );
        assert_eq!(
            rows,
            [
                row(1, None, "abc", "https://a.example/x")
                    .title("Café")
                    .created(1_577_934_245_000)
                    .clicks(12),
                row(2, None, "2b", "https://a.example/y"),
            ]
        );
        assert!(refused.is_empty());
    }

    #[test]
    fn a_dump_without_keyword_or_url_is_not_yourls() {
        let err = super::super::read(
            Format::Yourls,
            &b"code,long_url\nabc,https://a.example\n"[..],
            |_| Ok(()),
        )
        .expect_err("not yourls");
        assert!(
            err.to_string()
                .starts_with("not a YOURLS export: the header has no keyword column"),
            "{err}"
        );
    }

    #[test]
    fn the_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Yourls, &fixture("yourls.csv"));
        assert_eq!((counts.records, counts.rows, counts.refused), (31, 27, 4));
        assert_eq!(
            rows[0],
            row(
                1,
                None,
                "1",
                "https://docs.example/guide/getting-started#install"
            )
            .title("Getting started")
            .created(1_578_020_705_000)
            .clicks(1)
        );
        let codes: Vec<_> = rows[..9].iter().map(|r| r.code.as_str()).collect();
        assert_eq!(codes, ["1", "2", "a", "z", "10", "2s", "zz", "100", "zzz"]);
        assert_eq!(
            on(&rows, 8)[0].title.as_deref(),
            Some("Ünïcödé \"quoted\", title")
        );
        assert_eq!(
            on(&rows, 20),
            [row(20, None, "old-link", "https://blog.example/old")]
        );
        assert_eq!(on(&rows, 22)[0].code, "1", "the duplicate");
        assert_eq!(
            on(&rows, 24)[0].long_url,
            "https://listed.example/promo/free-gift"
        );
        assert_eq!(
            refusals(&refused),
            [
                (21, Some("my link"), "malformed code: 'my link'"),
                (23, Some("nourl"), "malformed row: missing long_url"),
                (
                    25,
                    Some(&*"x".repeat(65)),
                    &*format!("malformed code: '{}'", "x".repeat(65))
                ),
                (26, Some("badtime"), "malformed timestamp: '02/01/2020'"),
            ]
        );
    }
}
