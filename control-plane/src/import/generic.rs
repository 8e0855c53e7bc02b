//! lasthop's own CSV: what `GET /v1/exports/links?format=csv` writes and `--from csv` reads.
//!
//! ```text
//! code,long_url,created_at,tags,expires_at
//! 3kTmZ9q,https://shop.example/spring,2024-05-01T10:00:00Z,spring|shop,
//! sale_2024,"https://shop.example/search?q=a,b",2024-05-01T10:00:00.250Z,,2025-01-01T00:00:00Z
//! ```
//!
//! RFC 4180 quoting (a field with `,`, `"` or a line break is quoted, `"` doubled), `,` between
//! fields, `\n` after each record. Times are RFC 3339 in UTC, with milliseconds only when there
//! are some; on reading, plain Unix seconds and the other spellings in `timestamp.rs` are
//! accepted too. Tags are separated by `|`: a tag is `[a-z0-9_-]`, so `|` never occurs in one,
//! and unlike `,` it needs no quoting. No domain column: an export is of one deployment, and a
//! branded link's domain is the caller's to give.
//!
//! The header is optional on reading: a file whose first record starts `code,long_url` has one,
//! and its columns are then found by name (any order, others ignored); without it the columns
//! are the five above in that order, trailing ones optional. A person can write
//! `abc,https://a.example` on a line and import it.

use std::io::Read;

use super::fields;
use super::short_link;
use super::source::Source;
use super::table::{key, Delimiter, Table};
use super::{timestamp, Emit, Refused, Row};

/// The header lasthop's CSV starts with.
pub const CSV_HEADER: &str = "code,long_url,created_at,tags,expires_at";

/// What separates tags in lasthop's CSV.
const TAG_SEPARATOR: char = '|';

/// One record of lasthop's CSV, quoted where needed, with its trailing `\n`: times RFC 3339 in
/// UTC (`2024-05-01T10:00:00Z`, or `2024-05-01T10:00:00.250Z`), tags joined with `|`.
pub fn csv_record(
    code: &str,
    long_url: &str,
    created_at_ms: Option<i64>,
    tags: &[String],
    expires_at_ms: Option<i64>,
) -> String {
    let created = created_at_ms.map(timestamp::format).unwrap_or_default();
    let expires = expires_at_ms.map(timestamp::format).unwrap_or_default();
    let tags = tags.join(&TAG_SEPARATOR.to_string());
    let mut line = String::with_capacity(code.len() + long_url.len() + tags.len() + 64);
    for (i, field) in [code, long_url, &created, &tags, &expires]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            line.push(',');
        }
        if field.contains([',', '"', '\r', '\n']) {
            line.push('"');
            line.push_str(&field.replace('"', "\"\""));
            line.push('"');
        } else {
            line.push_str(field);
        }
    }
    line.push('\n');
    line
}

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    let has_header = is_header(source.first_line());
    let mut table = Table::open(source, Delimiter::Fixed(b','));
    let [code, long_url, created_at, tags, expires_at] = if has_header {
        let header = table.header()?;
        [
            Some(header.require("lasthop", &["code"])?),
            Some(header.require("lasthop", &["long_url"])?),
            header.find(&["created_at"]),
            header.find(&["tags"]),
            header.find(&["expires_at"]),
        ]
    } else {
        [Some(0), Some(1), Some(2), Some(3), Some(4)]
    };
    while let Some((line, cells)) = table.next()? {
        let item = cells.and_then(|cells| {
            let code = short_link::code(cells.get(code)).map_err(|bad| bad.at(line))?;
            let refuse = |reason| Refused {
                line,
                code: Some(code.clone()),
                reason,
            };
            Ok(Row {
                line,
                domain: None,
                long_url: fields::long_url(cells.get(long_url)).map_err(&refuse)?,
                title: None,
                created_at_ms: fields::time(cells.get(created_at), "created_at")
                    .map_err(&refuse)?,
                tags: fields::tags(cells.get(tags), &[TAG_SEPARATOR]),
                expires_at_ms: fields::time(cells.get(expires_at), "expires_at")
                    .map_err(&refuse)?,
                clicks: None,
                archived: false,
                code,
            })
        });
        sink.emit(item)?;
    }
    Ok(())
}

/// Whether a first line is a header: its first two fields are `code` and `long_url`.
fn is_header(line: &[u8]) -> bool {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(line);
    let mut record = csv::ByteRecord::new();
    if !reader.read_byte_record(&mut record).unwrap_or(false) {
        return false;
    }
    let field = |i| record.get(i).map(|f| key(&String::from_utf8_lossy(f)));
    field(0).as_deref() == Some("code") && field(1).as_deref() == Some("longurl")
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::{read, Format, Row};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_record_is_quoted_where_it_must_be() {
        assert_eq!(
            csv_record("abc", "https://a.example/x", None, &[], None),
            "abc,https://a.example/x,,,\n"
        );
        assert_eq!(
            csv_record(
                "abc",
                "https://a.example/?q=a,b&t=\"x\"",
                Some(1_714_557_600_000),
                &["a".to_string(), "b-c".to_string()],
                Some(1_714_557_600_250),
            ),
            "abc,\"https://a.example/?q=a,b&t=\"\"x\"\"\",2024-05-01T10:00:00Z,a|b-c,2024-05-01T10:00:00.250Z\n"
        );
    }

    #[test]
    fn the_header_is_optional_and_columns_follow_it_when_present() {
        let (rows, _, _) = collect(
            Format::Csv,
            b"abc,https://a.example/x\ndef,https://a.example/y,1714557600,a|b\n",
        );
        assert_eq!(
            rows,
            [
                row(1, None, "abc", "https://a.example/x"),
                row(2, None, "def", "https://a.example/y")
                    .created(1_714_557_600_000)
                    .tags(&["a", "b"]),
            ]
        );
        let (rows, _, _) = collect(Format::Csv, b"\"code\",\"long_url\",\"expires_at\",\"note\"\nabc,https://a.example/x,2024-05-01T10:00:00Z,hi\n");
        assert_eq!(
            rows,
            [row(1, None, "abc", "https://a.example/x").expires(1_714_557_600_000)]
        );
    }

    #[test]
    fn the_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Csv, &fixture("generic.csv"));
        assert_eq!((counts.records, counts.rows, counts.refused), (34, 30, 4));
        assert_eq!(
            on(&rows, 17),
            [row(
                17,
                None,
                "quoted",
                "https://shop.example/search?q=a,b&t=\"x\""
            )
            .created(1_714_644_000_250)
            .expires(1_735_689_600_000)]
        );
        assert_eq!(
            on(&rows, 18)[0].created_at_ms,
            Some(1_714_557_600_000),
            "Unix seconds"
        );
        assert_eq!(on(&rows, 26)[0].code, "slash");
        assert_eq!(
            on(&rows, 26)[0].long_url,
            "https://docs.example/multi\nline"
        );
        assert_eq!(on(&rows, 27)[0].code, "full_url");
        assert_eq!(
            on(&rows, 28)[0].long_url,
            "https://café.example/menu/été?q=日本"
        );
        assert_eq!(
            on(&rows, 29),
            [row(
                29,
                None,
                "0ielGRx",
                "https://app.example/signup?ref=newsletter&plan=pro"
            )
            .created(1_717_063_200_000)
            .tags(&["bulk"])
            .expires(1_749_117_600_000)]
        );
        assert_eq!(on(&rows, 20)[0].code, "ncKjAQg", "the duplicate");
        let lengths: Vec<_> = (7..=16).map(|l| on(&rows, l)[0].code.len()).collect();
        assert_eq!(lengths, (55..=64).collect::<Vec<_>>());
        assert_eq!(
            refusals(&refused),
            [
                (19, Some("two words"), "malformed code: 'two words'"),
                (21, Some("empty"), "malformed row: missing long_url"),
                (
                    23,
                    Some(&*"G".repeat(65)),
                    &*format!("malformed code: '{}'", "G".repeat(65))
                ),
                (24, Some("expired"), "malformed expires_at: 'soon'"),
            ]
        );
    }

    fn reread(text: &str) -> Vec<Row> {
        let mut rows = Vec::new();
        read(Format::Csv, text.as_bytes(), |item| {
            rows.push(item.map_err(|r| anyhow::anyhow!("{r}"))?);
            Ok(())
        })
        .expect("reads back");
        rows
    }

    proptest! {
        #[test]
        fn a_record_reads_back_as_written(
            code in "[A-Za-z0-9_-]{1,64}",
            long_url in "\\PC[\\PC\\s,\"]{0,60}\\PC|\\PC",
            created in proptest::option::of(-2_208_988_800_000i64..253_402_300_799_999),
            tags in proptest::collection::vec("[a-z0-9_-]{1,20}", 0..5),
            expires in proptest::option::of(0i64..4_102_444_800_000),
            with_header in any::<bool>(),
        ) {
            prop_assume!(long_url.trim() == long_url);
            // Without a header, a first record that reads like one is taken for one.
            prop_assume!(with_header || !(key(&code) == "code" && key(&long_url) == "longurl"));
            let record = csv_record(&code, &long_url, created, &tags, expires);
            let text = if with_header { format!("{CSV_HEADER}\n{record}") } else { record };
            let rows = reread(&text);
            prop_assert_eq!(rows.len(), 1);
            let row = &rows[0];
            prop_assert_eq!(&row.code, &code);
            prop_assert_eq!(&row.long_url, &long_url);
            prop_assert_eq!(row.created_at_ms, created);
            prop_assert_eq!(&row.tags, &tags);
            prop_assert_eq!(row.expires_at_ms, expires);
        }
    }
}
