//! A format is a promise: the current reader must read every released version's fixture.
//! `fixtures/v1.snap` was built by format version 1's writer from `fixtures/v1.tsv` and
//! `fixtures/v1.key` (the command is in the TSV's second line); `fixtures/v2.snap` by version
//! 2's from the same input and command with `--out v2.snap --layout paged`; `fixtures/v3.snap`
//! by version 3's from `fixtures/v3.tsv` (v1's links plus branded ones) and the same key, with
//! the command in that TSV's second line; `fixtures/v4.snap` by version 4's from
//! `fixtures/v4.tsv` (v3's links plus links with options) the same way. Never regenerate one
//! to make this test pass; add a `v5.snap` beside them when the format changes.

use std::path::PathBuf;

use lasthop_core::{region_range, split_key, CodeScheme, HighWater, LinkOptions, PermutationKey};
use lasthop_snapshot::{
    parse_line, Layout, Snapshot, SnapshotMeta, SnapshotWriter, FORMAT_VERSION,
};

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

/// What the v1 and v2 fixtures say alike: the same input, key, sequence, seed and marks.
fn common_header(s: &Snapshot) {
    fixture_header(s, 30);
    assert_eq!(
        (s.links(), s.aliases(), s.expiring(), s.url_bytes()),
        (36, 6, 5, 1419)
    );
    assert_eq!(s.branded(), 0);
}

/// What every fixture says alike: the key, sequence, seed and regions; region 0's mark.
fn fixture_header(s: &Snapshot, mark: u64) {
    let key = fixture_key();
    assert_eq!(s.sequence(), 4242);
    assert_eq!(s.key_id(), 0x5d81_299f);
    assert_eq!(s.key_id(), key.id());
    assert_eq!(s.hash_seed(), 7);
    let hw = s.high_water();
    assert_eq!(hw.regions(), 2);
    assert_eq!(hw.reserve(), 1000);
    assert_eq!(hw.marks(), &[mark, region_range(1, 2).unwrap().start]);
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

/// The v3 fixture's geometry (from `lasthop-snapshot inspect fixtures/v3.snap`).
const V3_FILE_LEN: u64 = 4896;
const V3_BUCKETS: (u64, u64, u32) = (9, 9, 0);
const V3_PAGE_LEN: u32 = 512;
const V3_URL_BYTES: u64 = 1623;

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
fn v3_header() {
    let s = Snapshot::open(fixture("v3.snap")).unwrap();
    assert_eq!(s.format_version(), 3);
    assert_eq!(s.file_len(), V3_FILE_LEN);
    assert_eq!(s.buckets(), V3_BUCKETS);
    assert_eq!(s.page_len(), V3_PAGE_LEN);
    // v1's 36 links and 7 branded: 2 generated codes (counters 30 and 31, so region 0's
    // mark is 32) and 5 aliases.
    fixture_header(&s, 32);
    assert_eq!(
        (s.links(), s.aliases(), s.expiring(), s.branded()),
        (43, 11, 7, 7)
    );
    assert_eq!(s.url_bytes(), V3_URL_BYTES);
}

/// The v4 fixture's geometry (from `lasthop-snapshot inspect fixtures/v4.snap`).
const V4_FILE_LEN: u64 = 6157;
const V4_BUCKETS: (u64, u64, u32) = (11, 11, 0);
const V4_PAGE_LEN: u32 = 512;
const V4_URL_BYTES: u64 = 1921;

#[test]
fn v4_header() {
    let s = Snapshot::open(fixture("v4.snap")).unwrap();
    assert_eq!(s.format_version(), 4);
    assert_eq!(s.file_len(), V4_FILE_LEN);
    assert_eq!(s.buckets(), V4_BUCKETS);
    assert_eq!(s.page_len(), V4_PAGE_LEN);
    assert_eq!((s.index_len(), s.arena_len()), (11 * 512, 333));
    // v3's 43 links and 8 more: 2 generated codes (counters 32 and 33, so region 0's mark is
    // 34; one branded) and 6 aliases (2 branded), 7 of the 8 with options.
    fixture_header(&s, 34);
    assert_eq!(
        (s.links(), s.aliases(), s.expiring(), s.branded()),
        (51, 17, 8, 10)
    );
    assert_eq!(s.url_bytes(), V4_URL_BYTES);
}

#[test]
fn exact_answers() {
    for name in ["v1.snap", "v2.snap", "v3.snap"] {
        exact_answers_of(&Snapshot::open(fixture(name)).unwrap());
    }
    for name in ["v1.snap", "v2.snap"] {
        let s = Snapshot::open(fixture(name)).unwrap();
        for (key, _, _) in branded_links() {
            assert_eq!(s.lookup(key.as_bytes()), None, "{name}: {key}");
        }
    }
}

/// A domain name of exactly `len` bytes, each label as long as it may be.
fn long_domain(len: usize) -> String {
    let mut labels = Vec::new();
    let mut left = len - ".example".len();
    for c in ['l', 'o', 'n', 'g'] {
        if left == 0 {
            break;
        }
        let n = left.min(63);
        labels.push(c.to_string().repeat(n));
        left -= n;
        left = left.saturating_sub(1); // the dot before the next label
    }
    labels.push("example".to_string());
    let d = labels.join(".");
    assert_eq!(d.len(), len, "{d}");
    d
}

/// The branded links of `v3.tsv`: key, URL, expiry.
fn branded_links() -> Vec<(String, &'static str, Option<i64>)> {
    vec![
        (
            "go.example.com/spring-sale".into(),
            "https://go.example.com/landing/spring",
            None,
        ),
        (
            "go.example.com/Summer_2026".into(),
            "https://go.example.com/landing/summer",
            Some(1_790_000_000_000),
        ),
        (
            "go.example.com/uWZ2lUy".into(),
            "https://go.example.com/landing/30",
            None,
        ),
        (
            "links.example.org/6955Gfu".into(),
            "https://links.example.org/31",
            Some(1_800_000_000_000),
        ),
        (
            format!("{}/long-key", long_domain(117)),
            "https://example.net/126",
            None,
        ),
        (
            format!("{}/long-key", long_domain(118)),
            "https://example.net/127",
            None,
        ),
        (
            format!("{}/{}", long_domain(253), "y".repeat(64)),
            "https://example.net/318",
            None,
        ),
    ]
}

/// The branded keys, around the escape and the longest, and their neighbours.
#[test]
fn v3_branded_answers() {
    v3_branded_answers_of(&Snapshot::open(fixture("v3.snap")).unwrap());
}

fn v3_branded_answers_of(s: &Snapshot) {
    let links = branded_links();
    let lens: Vec<usize> = links.iter().map(|(k, _, _)| k.len()).collect();
    assert_eq!(&lens[4..], &[126, 127, 318]);
    for (key, url, expires) in &links {
        let e = s
            .lookup(key.as_bytes())
            .unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(e.url(), url.as_bytes(), "{key}");
        assert_eq!(e.expires_at_ms(), *expires, "{key}");
        assert_eq!(
            s.lookup_probe(key.as_bytes(), s.prefetch(key.as_bytes())),
            Some(e)
        );
    }
    // The same alias on the default domain is another link.
    assert_eq!(
        s.lookup(b"spring-sale").unwrap().url(),
        b"https://shop.example.com/spring?ref=alias"
    );
    for absent in [
        "go.example.com/a1234567".to_string(),
        "go.example.com/JV3bd8V".into(),
        "links.example.org/spring-sale".into(),
        "go.example.com".into(),
        "go.example.com/".into(),
        "uWZ2lUy".into(),
        format!("{}/long-key", long_domain(119)),
        format!("{}/{}", long_domain(253), "y".repeat(63)),
        format!("{}/{}y", long_domain(253), "y".repeat(64)),
    ] {
        assert_eq!(s.lookup(absent.as_bytes()), None, "{absent}");
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

/// The links of `v4.tsv` with options (and one that spells out the defaults): key, URL,
/// expiry, options.
fn options_links() -> Vec<(String, &'static str, Option<i64>, LinkOptions)> {
    let d = LinkOptions::default();
    vec![
        (
            "3xdMIMJ".into(),
            "https://example.com/options/permanent",
            None,
            LinkOptions {
                redirect_status: 301,
                cache_seconds: 86_400,
                ..d
            },
        ),
        (
            "go.example.com/SR1712e".into(),
            "https://go.example.com/landing/moved",
            None,
            LinkOptions {
                redirect_status: 308,
                ..d
            },
        ),
        (
            "no-store-link".into(),
            "https://example.com/options/no-store",
            None,
            LinkOptions {
                redirect_status: 307,
                cache_seconds: 0,
                ..d
            },
        ),
        (
            "forward-request".into(),
            "https://example.com/options/forward?src=link&a=1",
            None,
            LinkOptions {
                forward_query: true,
                request_precedence: true,
                ..d
            },
        ),
        (
            "options-expiring".into(),
            "https://example.com/options/expiring",
            Some(1_798_761_600_000),
            LinkOptions {
                redirect_status: 301,
                cache_seconds: 3_600,
                forward_query: true,
                ..d
            },
        ),
        (
            "go.example.com/forward-only".into(),
            "https://go.example.com/landing/forward",
            None,
            LinkOptions {
                forward_query: true,
                ..d
            },
        ),
        (
            format!("{}/options-long-key", long_domain(180)),
            "https://example.net/options-197",
            None,
            LinkOptions {
                redirect_status: 308,
                cache_seconds: 600,
                forward_query: true,
                ..d
            },
        ),
        (
            "explicit-defaults".into(),
            "https://example.com/options/defaults",
            None,
            d,
        ),
    ]
}

/// Version 4: v3's answers (every plain link with the default options), and each link with
/// options answers with exactly them, on short and long keys, generated codes and aliases.
#[test]
fn v4_exact_answers() {
    let s = Snapshot::open(fixture("v4.snap")).unwrap();
    exact_answers_of(&s);
    v3_branded_answers_of(&s);
    let links = options_links();
    assert_eq!(links[6].0.len(), 197, "a long key, past the escape");
    for (key, url, expires, options) in &links {
        let e = s
            .lookup(key.as_bytes())
            .unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(e.url(), url.as_bytes(), "{key}");
        assert_eq!(e.expires_at_ms(), *expires, "{key}");
        assert_eq!(e.options(), *options, "{key}");
        assert_eq!(
            s.lookup_probe(key.as_bytes(), s.prefetch(key.as_bytes())),
            Some(e)
        );
    }
    for plain in ["JV3bd8V", "spring-sale", "go.example.com/spring-sale"] {
        assert!(s.lookup(plain.as_bytes()).unwrap().options().is_default());
    }
    for absent in [
        "3xdMIMj",
        "SR1712e",
        "no-store-lin",
        "go.example.com/3xdMIMJ",
        "forward-only",
    ] {
        assert_eq!(s.lookup(absent.as_bytes()), None, "{absent}");
    }
    // The older fixtures hold none of them.
    for name in ["v1.snap", "v2.snap", "v3.snap"] {
        let old = Snapshot::open(fixture(name)).unwrap();
        for (key, _, _, _) in &links {
            assert_eq!(old.lookup(key.as_bytes()), None, "{name}: {key}");
        }
    }
}

/// Every fixture with its input's line count and region 0's mark.
const FIXTURES: [(&str, &str, usize, u64); 5] = [
    ("v1.snap", "v1.tsv", 36, 30),
    ("v2.snap", "v1.tsv", 36, 30),
    ("v3.snap", "v3.tsv", 43, 32),
    ("v4.snap", "v4.tsv", 51, 34),
    ("v5.snap", "v5.tsv", 58, 34),
];

#[test]
fn every_tsv_line() {
    for (snap, tsv, lines, mark) in FIXTURES {
        every_tsv_line_of(&Snapshot::open(fixture(snap)).unwrap(), tsv, lines, mark);
    }
}

fn every_tsv_line_of(s: &Snapshot, tsv: &str, lines: usize, mark: u64) {
    let key = fixture_key();
    let scheme = CodeScheme::new(&key).unwrap();
    let tsv = std::fs::read_to_string(fixture(tsv)).unwrap();
    let mut n = 0;
    for line in tsv.lines() {
        let Some(link) = parse_line(line).unwrap() else {
            continue;
        };
        n += 1;
        let e = s.lookup(link.key.as_bytes()).unwrap();
        assert_eq!(e.url(), link.url.as_bytes());
        assert_eq!(e.expires_at_ms(), link.expires_at_ms);
        assert_eq!(e.options(), link.options);
        if let Some(counter) = scheme.decode(split_key(link.key.as_bytes()).1) {
            assert!(counter < mark && s.high_water().may_be_issued(counter));
        }
    }
    assert_eq!(n, lines);
}

/// Today's writer given `tsv` as the fixtures' command line builds it (region 0's mark from
/// its generated codes), in the paged layout.
fn rebuild(tsv: &str, mark: u64) -> Vec<u8> {
    let key = fixture_key();
    let mut hw = HighWater::new(2, 1000).unwrap();
    hw.raise(0, mark).unwrap();
    let meta = SnapshotMeta::new(4242, key.id(), hw)
        .with_hash_seed(7)
        .with_layout(Layout::Paged);
    let mut w = SnapshotWriter::in_memory(meta).unwrap();
    let tsv = std::fs::read_to_string(fixture(tsv)).unwrap();
    for line in tsv.lines() {
        if let Some(l) = parse_line(line).unwrap() {
            w.add_with_options(
                l.key.as_bytes(),
                l.url.as_bytes(),
                l.expires_at_ms,
                l.options,
            )
            .unwrap();
        }
    }
    w.seal().unwrap().1
}

/// Today's writer, given the same input and seed, produces the newest fixture byte for byte. If
/// this fails you changed what the writer emits: if v4 readers would misread the new bytes, bump
/// the format version and add a new fixture (keeping the old ones and their tests); if not (say,
/// a different page length), point this test at a fresh build instead.
#[test]
fn v5_writer_is_stable() {
    assert_eq!(FORMAT_VERSION, 5);
    assert!(rebuild("v5.tsv", 34) == std::fs::read(fixture("v5.snap")).unwrap());
}

/// Version 5 left a file without legacy codes as version 4 wrote it: given v4's input,
/// today's writer builds `v4.snap` but for the version and the header checksum.
#[test]
fn v5_writer_keeps_v4_files() {
    let v4 = std::fs::read(fixture("v4.snap")).unwrap();
    same_but_version(&v4, 4, &rebuild("v4.tsv", 34));
}

/// The v5 fixture's legacy codes answer, are in its legacy set (with nothing else of theirs),
/// and older fixtures have no legacy set.
#[test]
fn v5_legacy_codes() {
    let s = Snapshot::open(fixture("v5.snap")).unwrap();
    s.verify().unwrap();
    s.audit().unwrap();
    assert_eq!((s.format_version(), s.legacy_keys()), (5, 7));
    for (key, url) in [
        ("a", "https://legacy.example/a"),
        ("abc-_", "https://legacy.example/abc"),
        ("xY7_z-1", "https://legacy.example/seven"),
        ("go.example.com/b2", "https://legacy.example/branded"),
    ] {
        assert_eq!(s.lookup(key.as_bytes()).unwrap().url(), url.as_bytes());
        assert!(s.legacy_may_contain(key.as_bytes()));
    }
    let e = s.lookup(b"0042").unwrap();
    assert_eq!(e.options().redirect_status, 301);
    assert_eq!(
        s.lookup(b"12345678").unwrap().expires_at_ms(),
        Some(1_893_456_000_000)
    );
    assert!(
        !s.legacy_may_contain(b"b2"),
        "the branded key, not its code"
    );
    for old in ["v1.snap", "v2.snap", "v3.snap", "v4.snap"] {
        let s = Snapshot::open(fixture(old)).unwrap();
        assert_eq!(s.legacy_keys(), 0);
        assert!(!s.legacy_may_contain(b"a"));
    }
}

/// `old` (a fixture of version `version`) and `new` (today's build of its input) are the same
/// bytes but for the version (offset 8) and the header checksum (152..160).
fn same_but_version(old: &[u8], version: u32, new: &[u8]) {
    assert_eq!(new.len(), old.len());
    let differ: Vec<usize> = (0..old.len()).filter(|&i| old[i] != new[i]).collect();
    assert_eq!(&old[8..12], &version.to_le_bytes());
    assert_eq!(&new[8..12], &FORMAT_VERSION.to_le_bytes());
    assert!(
        differ.iter().all(|&i| i == 8 || (152..160).contains(&i)),
        "bytes differ at {differ:?}"
    );
}

/// Version 4 left links without options as version 3 wrote them: given v3's input (branded
/// keys, long keys past the escape, no options), today's writer builds `v3.snap` but for the
/// version and the header checksum.
#[test]
fn v4_writer_keeps_v3_entries() {
    let v3 = std::fs::read(fixture("v3.snap")).unwrap();
    same_but_version(&v3, 3, &rebuild("v3.tsv", 32));
}

/// Versions 3 and 4 left default-domain links as version 2 wrote them: given v2's input,
/// today's writer builds `v2.snap` but for the version and the header checksum.
#[test]
fn writer_keeps_v2_entries() {
    let v2 = std::fs::read(fixture("v2.snap")).unwrap();
    same_but_version(&v2, 2, &rebuild("v1.tsv", 30));
}
