//! Round trip (both layouts): every inserted key (codes and aliases, on the default domain and
//! on branded ones, up to the longest link key) comes back with its exact URL, expiry and
//! options, absent keys do not. Corruption: truncation, bit flips, header rewrites (with and without a
//! recomputed header checksum) never panic on open, verify, audit or lookup, and a changed file
//! never verifies.

use std::collections::BTreeMap;

use lasthop_core::{HighWater, LinkOptions};
use lasthop_snapshot::{Layout, Snapshot, SnapshotMeta, SnapshotWriter};
use proptest::prelude::*;

type Links = BTreeMap<Vec<u8>, (Vec<u8>, Option<i64>, LinkOptions)>;

/// A code: a generated code's shape or an alias's (the classifier refuses a few alias-length
/// strings, all digits for one, which the regex alone would rarely draw).
fn code() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9A-Za-z]{7}",
        "[0-9A-Za-z_-]{8,64}",
        // Legacy codes (version 5): short ones, 7 with `_`/`-`, all digits.
        "[0-9A-Za-z_-]{1,6}",
        "[0-9A-Za-z]{3}[_-][0-9A-Za-z]{3}",
        "[0-9]{8,20}",
        // A few codes shared across domains, so the same code on two domains is common.
        prop::sample::select(vec!["abcDEF1", "spring-sale", "Summer_2026"]).prop_map(String::from),
    ]
}

/// A domain: a few short ones (many keys share them), random ones of up to four labels, long
/// ones of two to four labels of 40–63 characters, or the longest: keys from 10 to 318 bytes,
/// many past the 126 that fit the entry's first byte.
fn domain() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["go.example.com", "lh.example", "a.b"]).prop_map(String::from),
        "[a-z0-9]{1,63}(\\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?){1,3}",
        proptest::collection::vec("[a-z0-9]{40,63}", 2..=4).prop_map(|labels| labels.join(".")),
        // 247–253 bytes, the longest domains.
        "[a-z0-9]{63}\\.[a-z0-9]{63}\\.[a-z0-9]{63}\\.[a-z0-9]{55,61}",
    ]
}

/// A key the writer takes: a code alone (the default domain) or `domain/code`.
fn key() -> impl Strategy<Value = Vec<u8>> {
    (proptest::option::weighted(0.5, domain()), code())
        .prop_map(|(d, c)| lasthop_core::link_key(d.as_deref(), &c).into_bytes())
        .prop_filter("a key shape the snapshot takes", |k| {
            lasthop_core::plausible_key(k)
        })
}

/// A link's options: the defaults two times in three (most links have none), else any valid
/// options (the defaults among them, now and then).
fn options() -> impl Strategy<Value = LinkOptions> {
    let any_options = (
        prop::sample::select(vec![301u16, 302, 307, 308]),
        prop_oneof![
            Just(0u32),
            Just(300),
            Just(lasthop_core::options::CACHE_SECONDS_MAX),
            0..=lasthop_core::options::CACHE_SECONDS_MAX,
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(redirect_status, cache_seconds, forward_query, request_precedence)| LinkOptions {
                redirect_status,
                cache_seconds,
                forward_query,
                request_precedence,
            },
        );
    prop_oneof![2 => Just(LinkOptions::default()), 1 => any_options]
}

fn links(max: usize) -> impl Strategy<Value = Links> {
    proptest::collection::btree_map(
        key(),
        (
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::option::of(any::<i64>()),
            options(),
        ),
        0..max,
    )
}

/// `bytes` relabelled as `version` with `branded` at offset 144, the header checksum redone.
fn relabel(bytes: &[u8], version: u32, branded: u64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[8..12].copy_from_slice(&version.to_le_bytes());
    b[144..152].copy_from_slice(&branded.to_le_bytes());
    reseal_header(&mut b);
    b
}

fn build(links: &Links, seed: u64, regions: u32, compact: bool) -> Vec<u8> {
    let mut hw = HighWater::new(regions, 77).unwrap();
    hw.raise(0, 1234).unwrap();
    let layout = if compact {
        Layout::Compact
    } else {
        Layout::Paged
    };
    let meta = SnapshotMeta::new(99, 0xfeed, hw)
        .with_hash_seed(seed)
        .with_layout(layout);
    let mut w = SnapshotWriter::in_memory(meta).unwrap();
    for (k, (url, exp, options)) in links {
        w.add_with_options(k, url, *exp, *options).unwrap();
    }
    w.seal().unwrap().1
}

/// Recomputes the header checksum the way FORMAT.md says, so a rewritten field gets past it
/// and the layout checks (and lookups on a self-consistent but lying header) are exercised.
fn reseal_header(bytes: &mut [u8]) {
    if bytes.len() < 160 {
        return;
    }
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let end = header_len.clamp(160, bytes.len());
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&bytes[..152]);
    h.update(&bytes[160..end]);
    bytes[152..160].copy_from_slice(&h.digest().to_le_bytes());
}

#[derive(Debug, Clone)]
enum Corruption {
    Truncate(prop::sample::Index),
    Extend(Vec<u8>),
    FlipBits(Vec<(prop::sample::Index, u8)>),
    /// Overwrite 8 bytes at a header offset, optionally fixing the header checksum after.
    Header {
        at: usize,
        value: u64,
        reseal: bool,
    },
    /// Overwrite bytes past the header (index, arena or padding).
    Body(prop::sample::Index, Vec<u8>),
    /// Overwrite bytes past the header with an escaped entry head (byte 0's length bits 127,
    /// its expiry bit, byte 1: often version 4's options mark) and what follows it.
    Escape(prop::sample::Index, bool, u8, Vec<u8>),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        any::<prop::sample::Index>().prop_map(Corruption::Truncate),
        proptest::collection::vec(any::<u8>(), 1..64).prop_map(Corruption::Extend),
        proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)
            .prop_map(Corruption::FlipBits),
        (0usize..20, any::<u64>(), any::<bool>(), 0u8..4).prop_map(
            |(slot, value, reseal, kind)| {
                // Mostly small or nearby values: random u64s are almost always rejected at once.
                let value = match kind {
                    0 => value,
                    1 => value % 4096,
                    2 => value % 64,
                    _ => value & 0xffff_ffff,
                };
                Corruption::Header {
                    at: slot * 8,
                    value,
                    reseal,
                }
            }
        ),
        (
            any::<prop::sample::Index>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, b)| Corruption::Body(i, b)),
        (
            any::<prop::sample::Index>(),
            any::<bool>(),
            prop_oneof![Just(0xffu8), 0xc0u8..=0xfe, any::<u8>()],
            proptest::collection::vec(any::<u8>(), 0..24)
        )
            .prop_map(|(i, expiry, second, rest)| Corruption::Escape(i, expiry, second, rest)),
    ]
}

fn apply(bytes: &mut Vec<u8>, c: &Corruption) -> bool {
    let mut resealed = false;
    match c {
        Corruption::Truncate(i) => {
            let len = i.index(bytes.len().max(1));
            bytes.truncate(len);
        }
        Corruption::Extend(extra) => bytes.extend_from_slice(extra),
        Corruption::FlipBits(_) | Corruption::Header { .. } if bytes.len() < 8 => {}
        Corruption::FlipBits(flips) => {
            for (i, bit) in flips {
                let at = i.index(bytes.len());
                bytes[at] ^= 1 << bit;
            }
        }
        Corruption::Header { at, value, reseal } => {
            let at = (*at).min(bytes.len().saturating_sub(8));
            // The checksum field itself (152..160) is left alone when resealing.
            if !(*reseal && at == 152) {
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            if *reseal {
                reseal_header(bytes);
                resealed = true;
            }
        }
        Corruption::Body(i, patch) => {
            let body = bytes.len().saturating_sub(160).max(1);
            let at = 160 + i.index(body);
            for (k, b) in patch.iter().enumerate() {
                if let Some(dst) = bytes.get_mut(at + k) {
                    *dst = *b;
                }
            }
        }
        Corruption::Escape(i, expiry, second, rest) => {
            let body = bytes.len().saturating_sub(160).max(1);
            let at = 160 + i.index(body);
            let head = [0x7f | if *expiry { 0x80 } else { 0 }, *second];
            for (k, b) in head.iter().chain(rest).enumerate() {
                if let Some(dst) = bytes.get_mut(at + k) {
                    *dst = *b;
                }
            }
        }
    }
    resealed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip(
        links in links(400),
        absent in proptest::collection::vec(key(), 0..50),
        seed in any::<u64>(),
        regions in 1u32..5,
        compact in any::<bool>(),
    ) {
        let bytes = build(&links, seed, regions, compact);
        let s = Snapshot::from_vec(bytes.clone()).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        prop_assert_eq!(s.format_version(), 5);
        prop_assert_eq!(s.links(), links.len() as u64);
        let branded = links.keys().filter(|k| k.contains(&b'/')).count() as u64;
        // Legacy codes count as aliases (names, not counters), and are in the legacy set.
        let aliases = links
            .keys()
            .filter(|k| {
                matches!(
                    lasthop_core::classify_key(k),
                    lasthop_core::CodeKind::Alias | lasthop_core::CodeKind::Legacy
                )
            })
            .count() as u64;
        for k in links.keys() {
            if lasthop_core::classify_key(k) == lasthop_core::CodeKind::Legacy {
                prop_assert!(s.legacy_may_contain(k));
            }
        }
        prop_assert_eq!((s.branded(), s.aliases()), (branded, aliases));
        prop_assert_eq!(s.sequence(), 99);
        prop_assert_eq!(s.key_id(), 0xfeed);
        prop_assert_eq!(s.high_water().regions(), regions);
        prop_assert_eq!(s.high_water().marks()[0], 1234);
        for (k, (url, exp, options)) in &links {
            // The two-step hint (bucket, then the entry's lines) changes no answer.
            let probe = s.prefetch(k);
            s.prefetch_entry(probe);
            prop_assert_eq!(s.lookup_probe(k, probe), s.lookup(k));
            let e = s.lookup(k);
            prop_assert!(e.is_some(), "missing {:?}", k);
            let e = e.unwrap();
            prop_assert_eq!(e.url(), &url[..]);
            prop_assert_eq!(e.expires_at_ms(), *exp);
            prop_assert_eq!(e.options(), *options);
        }
        for k in absent.iter().filter(|k| !links.contains_key(*k)) {
            prop_assert_eq!(s.lookup(k), None);
        }
        // Each key's code on another domain (or on none) is another key.
        for k in links.keys() {
            let (d, c) = lasthop_core::split_key(k);
            let c = std::str::from_utf8(c).unwrap();
            for other in [None, Some("other.example"), Some("go.example.com")] {
                let moved = lasthop_core::link_key(other, c).into_bytes();
                if d != other.map(str::as_bytes) && !links.contains_key(&moved) {
                    prop_assert_eq!(s.lookup(&moved), None);
                }
            }
        }
        // Labelled version 3: the same bytes without options entries are what a version-3
        // writer wrote, and read as before; an options entry in them fails audit.
        let with_options = links.values().filter(|(_, _, o)| !o.is_default()).count();
        // A file with a legacy set (version 5) is no older version's: refused at open.
        if s.legacy_keys() > 0 {
            prop_assert!(Snapshot::from_vec(relabel(&bytes, 4, branded)).is_err());
            return Ok(());
        }
        let s3 = Snapshot::from_vec(relabel(&bytes, 3, branded)).unwrap();
        s3.verify().unwrap();
        if with_options == 0 {
            s3.audit().unwrap();
            for k in links.keys() {
                prop_assert_eq!(s3.lookup(k), s.lookup(k));
            }
        } else {
            prop_assert!(s3.audit().is_err());
        }
        // Labelled version 2: the same bytes with only default-domain keys and no options are
        // what a version-2 writer wrote, and read as before; a branded key or an options entry
        // in them fails audit (and a nonzero offset 144 fails open).
        if branded == 0 && with_options == 0 {
            let s2 = Snapshot::from_vec(relabel(&bytes, 2, 0)).unwrap();
            s2.verify().unwrap();
            s2.audit().unwrap();
            for k in links.keys() {
                prop_assert_eq!(s2.lookup(k), s.lookup(k));
            }
        } else {
            if branded > 0 {
                prop_assert!(Snapshot::from_vec(relabel(&bytes, 2, branded)).is_err());
            }
            let s2 = Snapshot::from_vec(relabel(&bytes, 2, 0)).unwrap();
            prop_assert!(s2.audit().is_err());
        }
    }

    #[test]
    fn corruption_never_panics(
        links in links(60),
        seed in any::<u64>(),
        corruptions in proptest::collection::vec(corruption(), 1..3),
        probes in proptest::collection::vec(key(), 0..20),
        compact in any::<bool>(),
    ) {
        let original = build(&links, seed, 2, compact);
        let mut bytes = original.clone();
        let mut resealed = false;
        for c in &corruptions {
            resealed |= apply(&mut bytes, c);
        }
        let changed = bytes != original;
        match Snapshot::from_vec(bytes) {
            Err(_) => {}
            Ok(s) => {
                let verified = s.verify();
                let _ = s.audit();
                for k in links.keys().chain(&probes) {
                    // Hints over a corrupt (even resealed) index never panic.
                    s.prefetch_entry(s.prefetch(k));
                    if let Some(e) = s.lookup(k) {
                        let _ = (e.url().len(), e.expires_at_ms(), e.options());
                    }
                }
                let _ = s.high_water().may_be_issued(5);
                if changed && !resealed {
                    prop_assert!(verified.is_err(), "a changed file verified: {:?}", corruptions);
                }
            }
        }
    }
}

/// Spill buckets and continuation: many keys forced into a tiny table still all resolve, in
/// both layouts; the paged one keeps most entries in their page.
#[test]
fn large_round_trip_with_spills() {
    let mut links = Links::new();
    for i in 0..20_000u32 {
        let key = format!("alias-{i:08}").into_bytes();
        let options = LinkOptions {
            redirect_status: if i % 7 == 0 { 301 } else { 302 },
            ..LinkOptions::default()
        };
        links.insert(
            key,
            (format!("https://e.example/{i}").into_bytes(), None, options),
        );
    }
    for compact in [false, true] {
        let bytes = build(&links, 3, 1, compact);
        let s = Snapshot::from_vec(bytes).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        let (_, _, max_probe) = s.buckets();
        assert!(
            max_probe >= 1,
            "at slot loads of 0.625 and 0.8 some keys spill"
        );
        for (k, (url, _, options)) in &links {
            let e = s.lookup(k).unwrap();
            assert_eq!((e.url(), e.options()), (&url[..], *options));
        }
        assert_eq!(s.lookup(b"alias-99999999"), None);
        if compact {
            assert_eq!(s.page_len(), 64, "compact pages are the bucket line alone");
        } else {
            // The overflow holds the entries that did not fit: a small share of them.
            assert!(
                s.arena_len() * 4 < s.url_bytes(),
                "{} overflow bytes for {} URL bytes",
                s.arena_len(),
                s.url_bytes()
            );
        }
    }
}
