//! A format is a promise: the current reader must read every released version's fixture.
//! `fixtures/v1.snap` was built by format version 1's writer from `fixtures/v1.tsv` and
//! `fixtures/v1.key` (the command is in the TSV's second line); `fixtures/v2.snap` by version
//! 2's from the same input and command with `--out v2.snap --layout paged`. Never
//! regenerate one to make this test pass; add a `v3.snap` beside them when the format changes.

use std::path::PathBuf;

use lasthop_core::{region_range, CodeScheme, HighWater, PermutationKey};
use lasthop_snapshot::{parse_line, Layout, Snapshot, SnapshotMeta, SnapshotWriter};

/// The fixtures' key. Parsed from its text: a checkout makes files 0644, which the loader of a
/// secret file refuses (`lasthop_core::secret`).
fn fixture_key() -> PermutationKey {
    let path = fixture("v1.key");
    let text = std::fs::read_to_string(&path).unwrap();
    PermutationKey::parse(&text, &path.display().to_string()).unwrap()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// What both fixtures say alike: the same input, key, sequence, seed and marks.
fn common_header(s: &Snapshot) {
    let key = fixture_key();
    assert_eq!(s.sequence(), 4242);
    assert_eq!(s.key_id(), 0x5d81_299f);
    assert_eq!(s.key_id(), key.id());
    assert_eq!(s.hash_seed(), 7);
    assert_eq!(
        (s.links(), s.aliases(), s.expiring(), s.url_bytes()),
        (36, 6, 5, 1419)
    );
    let hw = s.high_water();
    assert_eq!(hw.regions(), 2);
    assert_eq!(hw.reserve(), 1000);
    assert_eq!(hw.marks(), &[30, region_range(1, 2).unwrap().start]);
    s.verify().unwrap();
    s.audit().unwrap();
}

#[test]
fn v1_header() {
    let s = Snapshot::open(fixture("v1.snap")).unwrap();
    assert_eq!(s.format_version(), 1);
    assert_eq!(s.file_len(), 2432);
    assert_eq!(s.buckets(), (6, 6, 0));
    assert_eq!(s.page_len(), 0);
    common_header(&s);
}

#[test]
fn v2_header() {
    let s = Snapshot::open(fixture("v2.snap")).unwrap();
    assert_eq!(s.format_version(), 2);
    assert_eq!(s.file_len(), 3632);
    assert_eq!(s.buckets(), (8, 8, 0));
    assert_eq!(s.page_len(), 384);
    assert_eq!((s.index_len(), s.arena_len()), (8 * 384, 368));
    common_header(&s);
}

#[test]
fn exact_answers() {
    for name in ["v1.snap", "v2.snap"] {
        exact_answers_of(&Snapshot::open(fixture(name)).unwrap());
    }
}

fn exact_answers_of(s: &Snapshot) {
    let long = format!(
        "https://example.org/{}end?utm_source=fixture&utm_medium=test",
        "long/".repeat(60)
    );
    let x64 = "x".repeat(64);
    let expected: &[(&str, &str, Option<i64>)] = &[
        ("JV3bd8V", "https://example.com/fixture/0", None),
        (
            "uSIqq1V",
            "https://example.com/fixture/3",
            Some(1_800_000_000_000),
        ),
        (
            "6Mf6Bah",
            "https://example.com/fixture/7",
            Some(1_799_996_400_000),
        ),
        ("qNULjq1", &long, None),
        (
            "2ea35Jv",
            "https://例え.jp/%E3%83%86%E3%82%B9%E3%83%88?q=a%20b",
            None,
        ),
        ("7GGB7Bv", "https://example.com/fixture/13", Some(-1000)),
        ("6srr46M", "https://example.com/fixture/29", None),
        (
            "spring-sale",
            "https://shop.example.com/spring?ref=alias",
            None,
        ),
        (
            "Summer_2026",
            "https://shop.example.com/summer",
            Some(1_790_000_000_000),
        ),
        ("a1234567", "https://a.example/", None),
        (&x64, "https://longest-alias.example/", None),
        (
            "team-offsite-q3",
            "https://wiki.example/offsite",
            Some(1_790_812_799_000),
        ),
    ];
    for &(key, url, expires) in expected {
        let e = s
            .lookup(key.as_bytes())
            .unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(e.url(), url.as_bytes(), "{key}");
        assert_eq!(e.expires_at_ms(), expires, "{key}");
    }
    for absent in [
        "zzzzzzz",
        "JV3bd8v",
        "spring-sal",
        "spring-sale2",
        "Spring-sale",
        "",
        "a",
    ] {
        assert_eq!(s.lookup(absent.as_bytes()), None, "{absent}");
    }
    assert_eq!(s.lookup(&[b'x'; 65]), None);
}

#[test]
fn every_tsv_line() {
    for name in ["v1.snap", "v2.snap"] {
        every_tsv_line_of(&Snapshot::open(fixture(name)).unwrap());
    }
}

fn every_tsv_line_of(s: &Snapshot) {
    let key = fixture_key();
    let scheme = CodeScheme::new(&key).unwrap();
    let tsv = std::fs::read_to_string(fixture("v1.tsv")).unwrap();
    let mut n = 0;
    for line in tsv.lines() {
        let Some(link) = parse_line(line).unwrap() else {
            continue;
        };
        n += 1;
        let e = s.lookup(link.key.as_bytes()).unwrap();
        assert_eq!(e.url(), link.url.as_bytes());
        assert_eq!(e.expires_at_ms(), link.expires_at_ms);
        if let Some(counter) = scheme.decode(link.key.as_bytes()) {
            assert!(counter < 30 && s.high_water().may_be_issued(counter));
        }
    }
    assert_eq!(n, 36);
}

/// Today's writer, given the same input and seed, produces the newest fixture byte for byte. If
/// this fails you changed what the writer emits: if v2 readers would misread the new bytes, bump
/// the format version and add a new fixture (keeping the old ones and their tests); if not (say,
/// a different page length), point this test at a fresh build instead.
#[test]
fn v2_writer_is_stable() {
    let key = fixture_key();
    let mut hw = HighWater::new(2, 1000).unwrap();
    hw.raise(0, 30).unwrap();
    let meta = SnapshotMeta::new(4242, key.id(), hw)
        .with_hash_seed(7)
        .with_layout(Layout::Paged);
    let mut w = SnapshotWriter::in_memory(meta).unwrap();
    let tsv = std::fs::read_to_string(fixture("v1.tsv")).unwrap();
    for line in tsv.lines() {
        if let Some(l) = parse_line(line).unwrap() {
            w.add(l.key.as_bytes(), l.url.as_bytes(), l.expires_at_ms)
                .unwrap();
        }
    }
    let (_, bytes) = w.seal().unwrap();
    assert!(bytes == std::fs::read(fixture("v2.snap")).unwrap());
}
