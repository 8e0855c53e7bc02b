//! What the formats' tests share, and the properties every format holds.

use std::path::PathBuf;

use proptest::prelude::*;

use super::{read, Format, ImportCounts, Refused, Row};

/// A fixture from `control-plane/tests/fixtures/import/`.
pub(super) fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Everything `read` passes for `input`, split into rows and refusals.
pub(super) fn collect(format: Format, input: &[u8]) -> (Vec<Row>, Vec<Refused>, ImportCounts) {
    let (mut rows, mut refused) = (Vec::new(), Vec::new());
    let counts = read(format, input, |item| {
        match item {
            Ok(row) => rows.push(row),
            Err(r) => refused.push(r),
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{format}: {e:#}"));
    (rows, refused, counts)
}

/// Refusals as `(line, code, reason)`, for comparing with a literal.
pub(super) fn refusals(refused: &[Refused]) -> Vec<(u64, Option<&str>, &str)> {
    refused
        .iter()
        .map(|r| (r.line, r.code.as_deref(), r.reason.as_str()))
        .collect()
}

/// The rows of record `line`.
pub(super) fn on(rows: &[Row], line: u64) -> Vec<Row> {
    rows.iter().filter(|r| r.line == line).cloned().collect()
}

/// A row with only its code and destination; the [`Build`] methods add the rest.
pub(super) fn row(line: u64, domain: Option<&str>, code: &str, long_url: &str) -> Row {
    Row {
        line,
        code: code.to_string(),
        domain: domain.map(str::to_string),
        long_url: long_url.to_string(),
        title: None,
        created_at_ms: None,
        tags: Vec::new(),
        expires_at_ms: None,
        clicks: None,
        archived: false,
    }
}

pub(super) trait Build {
    fn title(self, title: &str) -> Self;
    fn created(self, ms: i64) -> Self;
    fn expires(self, ms: i64) -> Self;
    fn tags(self, tags: &[&str]) -> Self;
    fn clicks(self, clicks: u64) -> Self;
    fn archived(self) -> Self;
}

impl Build for Row {
    fn title(self, title: &str) -> Self {
        Row {
            title: Some(title.to_string()),
            ..self
        }
    }
    fn created(self, ms: i64) -> Self {
        Row {
            created_at_ms: Some(ms),
            ..self
        }
    }
    fn expires(self, ms: i64) -> Self {
        Row {
            expires_at_ms: Some(ms),
            ..self
        }
    }
    fn tags(self, tags: &[&str]) -> Self {
        Row {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..self
        }
    }
    fn clicks(self, clicks: u64) -> Self {
        Row {
            clicks: Some(clicks),
            ..self
        }
    }
    fn archived(self) -> Self {
        Row {
            archived: true,
            ..self
        }
    }
}

#[test]
fn formats_are_named_as_the_flag_spells_them() {
    for format in Format::ALL {
        assert_eq!(format.to_string().parse::<Format>(), Ok(format));
    }
    assert_eq!("Bitly".parse::<Format>(), Ok(Format::Bitly));
    let err = "rebrandly".parse::<Format>().expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "unknown import format \"rebrandly\" (expected one of: bitly, yourls, kutt, shlink, dub, csv)"
    );
}

#[test]
fn the_callers_error_stops_every_format() {
    let inputs: [(Format, &[u8]); 6] = [
        (Format::Bitly, b"id,long_url\nbit.ly/a,https://a.example\nbit.ly/b,https://a.example\n"),
        (Format::Yourls, b"keyword,url\na,https://a.example\nb,https://a.example\n"),
        (Format::Kutt, b"[{\"address\":\"a\",\"target\":\"https://a.example\"},{\"address\":\"b\",\"target\":\"https://a.example\"}]"),
        (Format::Shlink, b"shortCode,longUrl\na,https://a.example\nb,https://a.example\n"),
        (Format::Dub, b"Short link,Destination URL\nhttps://dub.sh/a,https://a.example\nhttps://dub.sh/b,https://a.example\n"),
        (Format::Csv, b"a,https://a.example\nb,https://a.example\n"),
    ];
    for (format, input) in inputs {
        let mut calls = 0;
        let err = read(format, input, |_| {
            calls += 1;
            Err(anyhow::anyhow!("store closed"))
        })
        .expect_err("stopped");
        assert_eq!(
            (calls, err.to_string()),
            (1, "store closed".to_string()),
            "{format}"
        );
    }
}

#[test]
fn a_byte_order_mark_is_skipped_by_every_format() {
    let inputs: [(Format, &[u8]); 6] = [
        (
            Format::Bitly,
            b"\xEF\xBB\xBFid,long_url\nbit.ly/a,https://a.example\n",
        ),
        (
            Format::Yourls,
            b"\xEF\xBB\xBFkeyword,url\na,https://a.example\n",
        ),
        (
            Format::Kutt,
            b"\xEF\xBB\xBF[{\"address\":\"a\",\"target\":\"https://a.example\"}]",
        ),
        (
            Format::Shlink,
            b"\xEF\xBB\xBFshortCode,longUrl\na,https://a.example\n",
        ),
        (Format::Dub, b"\xEF\xBB\xBFkey,url\na,https://a.example\n"),
        (
            Format::Csv,
            b"\xEF\xBB\xBFcode,long_url\na,https://a.example\n",
        ),
    ];
    for (format, input) in inputs {
        let (rows, refused, _) = collect(format, input);
        assert_eq!(
            (rows.len(), rows[0].code.as_str(), refused.len()),
            (1, "a", 0),
            "{format}"
        );
    }
}

#[test]
fn the_fixtures_readme_counts_match_the_fixtures() {
    let readme = String::from_utf8(fixture("README.md")).expect("utf-8");
    for (name, format) in [
        ("bitly.json", Format::Bitly),
        ("bitly.csv", Format::Bitly),
        ("yourls.csv", Format::Yourls),
        ("kutt.json", Format::Kutt),
        ("shlink.csv", Format::Shlink),
        ("dub.csv", Format::Dub),
        ("generic.csv", Format::Csv),
    ] {
        let (_, _, counts) = collect(format, &fixture(name));
        let line = format!(
            "| `{name}` | `{format}` | {} | {} | {} |",
            counts.records, counts.rows, counts.refused
        );
        assert!(readme.contains(&line), "README.md lacks {line:?}");
    }
}

/// Inputs that get past each format's first checks, so the fuzzing reaches the record parsers.
fn prefix(format: Format) -> impl Strategy<Value = &'static [u8]> {
    let prefixes: &'static [&'static [u8]] = match format {
        Format::Bitly => &[
            b"",
            b"{\"links\":[",
            b"[",
            b"{\"id\":",
            b"id,long_url,custom_bitlinks,tags\n",
        ],
        Format::Kutt => &[
            b"",
            b"{\"data\":[",
            b"[{\"address\":\"a\",",
            b"{\"address\":",
        ],
        Format::Yourls => &[b"", b"keyword,url,title,timestamp,clicks\n"],
        Format::Shlink => &[
            b"",
            b"createdAt,domain,shortCode,shortUrl,longUrl,title,tags,visits\n",
        ],
        Format::Dub => &[
            b"",
            b"Short link,Destination URL,Clicks,Created at,Tags,Archived\n",
        ],
        Format::Csv => &[b"", b"code,long_url,created_at,tags,expires_at\n"],
    };
    proptest::sample::select(prefixes)
}

fn any_format() -> impl Strategy<Value = Format> {
    proptest::sample::select(Format::ALL.to_vec())
}

/// Bytes the parsers care about, so random input hits their branches.
fn interesting_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            any::<u8>(),
            proptest::sample::select(b"{}[]\",:;|/\n\r\t -_.0123456789aZ:\\'\xEF\xBB\xBF".to_vec()),
        ],
        0..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic_any_format(format in any_format(), bytes in interesting_bytes()) {
        let _ = read(format, &bytes[..], |_| Ok(()));
    }

    #[test]
    fn arbitrary_records_after_a_valid_start_never_panic(
        (format, start) in any_format().prop_flat_map(|f| (Just(f), prefix(f))),
        bytes in interesting_bytes(),
    ) {
        let input = [start, &bytes[..]].concat();
        let mut lines = Vec::new();
        let result = read(format, &input[..], |item| {
            lines.push(match &item { Ok(row) => row.line, Err(r) => r.line });
            Ok(())
        });
        // Records are numbered from one, in order, with no gaps.
        let mut expected = 1;
        for line in lines {
            prop_assert!(line == expected || line + 1 == expected, "{line} after {expected}");
            if line == expected {
                expected += 1;
            }
        }
        if let Ok(counts) = result {
            prop_assert_eq!(counts.records + 1, expected);
        }
    }
}
