//! Matching properties of `lasthop-trust`, end to end: list text through [`parse_list`] into a
//! [`ReputationIndex`], destination URLs through [`Destination::parse`] into
//! [`ReputationIndex::check`].
//!
//! - untrusted input (list bytes, URL and host strings) never panics;
//! - a listed host is matched in every spelling of a URL on it or a subdomain that a browser
//!   would fetch from there (case, trailing dot, percent-encoding, IDN either way round,
//!   userinfo tricks, default ports, the WHATWG parser's slash leniency), and a listed IPv4
//!   address in every spelling of it;
//! - look-alikes of a listed host are not matched;
//! - a URL entry matches its own page in any spelling, and nothing else on the host.

use lasthop_trust::index::HitKind;
use lasthop_trust::{parse_list, CanonicalHost, Destination, Entry, ReputationIndex};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;

const LIST: &str = "feed";

/// Public suffixes to register names under: a made-up TLD, a two-level one, common real ones.
const SUFFIXES: &[&str] = &["example", "co.uk", "com", "org", "de", "com.au"];

fn ascii_label() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{0,7}(-[a-z0-9]{1,4})?"
}

/// A Unicode label with at least one letter whose uppercase lowercases back to it.
fn unicode_label() -> impl Strategy<Value = String> {
    "[a-zäöüéñçåø]{0,4}[äöüéñçåø][a-zäöüéñçåø]{0,4}"
}

/// A registrable name in its Unicode form and its ASCII (punycode) form; equal when ASCII.
#[derive(Debug, Clone)]
struct Name {
    unicode: String,
    ascii: String,
}

fn registrable() -> impl Strategy<Value = Name> {
    let label = prop_oneof![3 => ascii_label(), 1 => unicode_label()];
    (label, select(SUFFIXES))
        .prop_map(|(label, suffix)| {
            let unicode = format!("{label}.{suffix}");
            let ascii = CanonicalHost::parse(&unicode).unwrap().to_string();
            Name { unicode, ascii }
        })
        // A few registered names are public suffixes too (`uk.com`, `us.org`); lists refuse
        // those.
        .prop_filter("a public suffix", |n| {
            !CanonicalHost::parse(&n.ascii).unwrap().is_public_suffix()
        })
}

/// Random choices for one spelling, drawn up front so proptest can shrink them.
#[derive(Debug, Clone)]
struct Choices {
    bits: Vec<u8>,
}

impl Choices {
    fn strategy() -> impl Strategy<Value = Choices> {
        proptest::collection::vec(any::<u8>(), 64).prop_map(|bits| Choices { bits })
    }

    /// A draw in `0..n` (the bytes are reused cyclically; enough for these tests).
    fn pick(&mut self, n: usize) -> usize {
        let b = self.bits.remove(0);
        self.bits.push(b.rotate_left(3) ^ 0x5a);
        usize::from(b) % n.max(1)
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.pick(one_in) == 0
    }
}

/// `host` with random letter case and some characters (dots included) percent-encoded.
fn spell_host(host: &str, c: &mut Choices) -> String {
    let mut out = String::new();
    for ch in host.chars() {
        let ch = if c.chance(2) {
            ch.to_uppercase().next().unwrap_or(ch)
        } else {
            ch
        };
        if c.chance(5) {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                if c.chance(2) {
                    out.push_str(&format!("%{b:02X}"));
                } else {
                    out.push_str(&format!("%{b:02x}"));
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

fn random_case(s: &str, c: &mut Choices) -> String {
    s.chars()
        .map(|ch| {
            if c.chance(2) {
                ch.to_ascii_uppercase()
            } else {
                ch
            }
        })
        .collect()
}

/// Userinfo that makes a URL look as if it went elsewhere; it never changes the host.
const USERINFO: &[&str] = &[
    "",
    "",
    "user:pass@",
    "paypal.com@",
    "www.paypal.com:443@",
    "admin@",
    ":@",
    "user:p%40ss@",
];

/// What may come between the scheme and the authority of an http(s) URL.
const SEPARATORS: &[&str] = &["://", "://", "://", ":///", ":\\\\", ":/\\", ":"];

/// A URL on `host` (already spelled): random scheme case, separator, userinfo, default port,
/// path (with `/` or `\`), query and fragment.
fn spell_url(host: &str, path: &str, c: &mut Choices) -> String {
    let https = c.chance(2);
    let scheme = random_case(if https { "https" } else { "http" }, c);
    let sep = SEPARATORS[c.pick(SEPARATORS.len())];
    let userinfo = USERINFO[c.pick(USERINFO.len())];
    let port = match (c.pick(4), https) {
        (0, true) => ":443",
        (1, true) => ":0443",
        (0, false) => ":80",
        (1, false) => ":080",
        _ => "",
    };
    let path = if c.chance(3) {
        path.replace('/', "\\")
    } else {
        path.to_owned()
    };
    let query = if c.chance(2) {
        "?q=evil.example&r=1"
    } else {
        ""
    };
    let fragment = if c.chance(3) { "#top" } else { "" };
    format!("{scheme}{sep}{userinfo}{host}{port}{path}{query}{fragment}")
}

fn path() -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-zA-Z0-9_~-]{1,8}", 0..4)
        .prop_map(|segments| segments.iter().map(|s| format!("/{s}")).collect::<String>())
}

fn subdomains() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        Just(vec![]),
        Just(vec!["www".to_owned()]),
        proptest::collection::vec("[a-z0-9]{1,6}", 1..4),
    ]
}

/// An index of one list file holding `entry_line` (and some unrelated entries).
fn index_of(list_text: &str) -> ReputationIndex {
    let list = parse_list(list_text.as_bytes());
    assert_eq!(list.malformed, [], "{list_text:?}");
    ReputationIndex::build([(LIST, &list.entries[..])])
}

/// A list file naming `entry`: a plain list or a hosts file.
fn list_text(entry: &str, hosts_file: bool) -> String {
    if hosts_file {
        format!("# blocked\n0.0.0.0 unrelated.test {entry}\n0.0.0.0 other.test\n")
    } else {
        format!("unrelated.test\n{entry}\nhttps://other.test/x\n")
    }
}

fn hit(index: &ReputationIndex, url: &str) -> Option<(String, HitKind)> {
    let dest = Destination::parse(url)?;
    let hit = index.check(&dest)?;
    assert_eq!(hit.list, LIST);
    Some((hit.entry.to_owned(), hit.kind))
}

/// The spellings of one IPv4 address the WHATWG parser (and so a browser) accepts.
fn ipv4_spellings(ip: u32, c: &mut Choices) -> Vec<String> {
    let [a, b, cc, d] = ip.to_be_bytes();
    let part = |v: u32, c: &mut Choices| match c.pick(3) {
        0 => v.to_string(),
        1 => random_case(&format!("0x{v:x}"), c),
        _ => format!("0{v:o}"),
    };
    let mixed = [a, b, cc, d]
        .iter()
        .map(|&p| part(u32::from(p), c))
        .collect::<Vec<_>>()
        .join(".");
    let low16 = u32::from(cc) << 8 | u32::from(d);
    let low24 = u32::from(b) << 16 | low16;
    vec![
        format!("{a}.{b}.{cc}.{d}"),
        format!("{a}.{b}.{cc}.{d}."),
        ip.to_string(),
        random_case(&format!("0x{ip:08x}"), c),
        format!("0{ip:o}"),
        format!("0{a:o}.0{b:o}.0{cc:o}.0{d:o}"),
        mixed,
        format!("{a}.{b}.{low16}"),
        format!("{a}.{}", part(low24, c)),
        format!("[::ffff:{a}.{b}.{cc}.{d}]"),
        random_case(&format!("[::ffff:{:x}:{:x}]", ip >> 16, ip & 0xffff), c),
        format!("[0:0:0:0:0:ffff:{a}.{b}.{cc}.{d}]"),
    ]
}

/// Pieces of every format, for lists that get deep into the parsers.
const FRAGMENTS: &[&str] = &[
    "\n",
    "\r\n",
    "\r",
    ",",
    "\"",
    "\"\"",
    "#",
    " # ",
    "://",
    "http",
    "https://",
    "/",
    "0.0.0.0 ",
    "127.0.0.1\t",
    "::1 ",
    "localhost",
    "phish_id,url,verified\n",
    "# id,dateadded,url,url_status\n",
    "# URLhaus\n",
    "\"1\",",
    "yes",
    "%",
    "%2e",
    "[",
    "]",
    "::",
    "xn--",
    "ü",
    "\u{feff}",
    "\u{0}",
    "\u{fffd}",
    "evil.example",
    "com",
    "co.uk",
    "*.",
    ".",
    "..",
    "@",
    "\\",
    "0x",
    "4294967296",
    "\t",
];

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // Beside this file: an integration test has no `lib.rs` above it for the default.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    // ---- (a) untrusted input never panics ----

    #[test]
    fn garbage_lists_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let list = parse_list(&bytes);
        prop_assert!(list.malformed.len() <= list.malformed_lines);
        prop_assert!(list.malformed.len() <= 100);
    }

    #[test]
    fn lists_of_tricky_fragments_never_panic(
        parts in proptest::collection::vec(select(FRAGMENTS), 0..200)
    ) {
        let text: String = parts.concat();
        let list = parse_list(text.as_bytes());
        for entry in &list.entries {
            if let Entry::Host(h) = entry {
                prop_assert!(!h.is_public_suffix(), "{h}");
            }
        }
        let index = ReputationIndex::build([(LIST, &list.entries[..])]);
        prop_assert!(index.len() <= list.entries.len());
        let _ = index.added(&ReputationIndex::default());
    }

    #[test]
    fn garbage_urls_and_hosts_never_panic(
        s in prop_oneof![
            any::<String>(),
            "[a-zA-Z]{0,6}:[/\\\\]{0,3}\\PC{0,40}",
            "https?://[\\[\\]:%.@a-f0-9xX/\\\\]{0,40}",
        ]
    ) {
        let index = ReputationIndex::build([(LIST, &[Entry::Host(
            CanonicalHost::parse("evil.example").unwrap())][..])]);
        if let Some(dest) = Destination::parse(&s) {
            let _ = index.check(&dest);
            let _ = dest.url_hash();
        }
        if let Ok(host) = CanonicalHost::parse(&s) {
            let _ = (host.index_key(), host.registrable_domain(), host.is_public_suffix());
            let _ = host.lookup_names().count();
        }
    }

    // ---- (b) a listed host is matched in every spelling ----

    #[test]
    fn listed_host_matches_every_spelling(
        name in registrable(),
        subs in subdomains(),
        path in path(),
        entry_unicode in any::<bool>(),
        hosts_file in any::<bool>(),
        mut c in Choices::strategy(),
    ) {
        // The entry in Unicode or punycode, in any case, maybe with a trailing dot.
        let entry = if entry_unicode { &name.unicode } else { &name.ascii };
        let mut entry = spell_host(entry, &mut c);
        if c.chance(3) {
            entry.push('.');
        }
        let index = index_of(&list_text(&entry, hosts_file));
        for _ in 0..12 {
            // The URL in the other form (or either, at random), on the host or a subdomain.
            let base = if entry_unicode != c.chance(4) { &name.ascii } else { &name.unicode };
            let mut host: String = subs.iter().map(|s| format!("{s}.")).collect();
            host.push_str(base);
            if c.chance(3) {
                host.push('.');
            }
            let spelled = spell_host(&host, &mut c);
            let url = spell_url(&spelled, &path, &mut c);
            prop_assert_eq!(
                hit(&index, &url),
                Some((name.ascii.clone(), HitKind::Host)),
                "entry {:?}, url {:?}", entry, url
            );
        }
    }

    #[test]
    fn listed_ipv4_matches_every_spelling(
        ip in 1u32..,
        entry_form in 0usize..12,
        hosts_file in any::<bool>(),
        path in path(),
        mut c in Choices::strategy(),
    ) {
        let entry = ipv4_spellings(ip, &mut c).swap_remove(entry_form);
        let index = index_of(&list_text(&entry, hosts_file));
        let canonical = std::net::Ipv4Addr::from(ip).to_string();
        for spelled in ipv4_spellings(ip, &mut c) {
            let url = spell_url(&spelled, &path, &mut c);
            prop_assert_eq!(
                hit(&index, &url),
                Some((canonical.clone(), HitKind::Host)),
                "entry {:?}, url {:?}", entry, url
            );
        }
        // Only that address: not its neighbours, not a name under it.
        for other in [ip.wrapping_add(1), ip.wrapping_sub(1), ip ^ 0x0100_0000] {
            let url = format!("http://{}/", std::net::Ipv4Addr::from(other));
            prop_assert_eq!(hit(&index, &url), None, "{}", url);
        }
        prop_assert_eq!(hit(&index, &format!("http://{canonical}.example/")), None);
    }

    // ---- (c) look-alikes are not matched ----

    #[test]
    fn look_alikes_are_not_matched(
        name in registrable(),
        path in path(),
        at in any::<prop::sample::Index>(),
        letter in "[a-z0-9]",
        mut c in Choices::strategy(),
    ) {
        let index = index_of(&list_text(&name.ascii, false));
        let (label, suffix) = name.ascii.split_once('.').unwrap();
        // One character of the registered label changed.
        let chars: Vec<char> = label.chars().collect();
        let i = at.index(chars.len());
        let mut changed = chars.clone();
        changed[i] = if chars[i].to_string() == letter {
            if chars[i] == 'z' { 'y' } else { 'z' }
        } else {
            letter.chars().next().unwrap()
        };
        let changed: String = changed.into_iter().collect();
        let host = &name.ascii;
        let look_alikes = [
            format!("{changed}.{suffix}"),
            format!("not{host}"),
            format!("{label}x.{suffix}"),
            format!("{label}-{suffix}"),
            format!("{host}.attacker.test"),
            format!("{host}-attacker.test"),
            format!("www.{host}.attacker.test"),
            format!("{label}.attacker.test"),
        ];
        for look_alike in &look_alikes {
            let url = spell_url(&spell_host(look_alike, &mut c), &path, &mut c);
            prop_assert_eq!(hit(&index, &url), None, "{}", url);
        }
        // The listed name elsewhere in the URL.
        for url in [
            format!("https://{host}@attacker.test/"),
            format!("https://{host}:443@attacker.test/"),
            format!("https://attacker.test/{host}"),
            format!("https://attacker.test/?u=https://{host}/"),
            format!("https://attacker.test/#{host}"),
        ] {
            prop_assert_eq!(hit(&index, &url), None, "{}", url);
        }
    }

    // ---- (d) a URL entry matches its page only ----

    #[test]
    fn url_entry_matches_only_its_page(
        name in registrable(),
        subs in subdomains(),
        path in path(),
        query in proptest::option::of("[a-z0-9]{1,5}=[a-z0-9]{0,5}"),
        mut c in Choices::strategy(),
    ) {
        let mut host: String = subs.iter().map(|s| format!("{s}.")).collect();
        host.push_str(&name.ascii);
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        let page = format!("https://{host}{path}{query}");
        let index = index_of(&format!("listed-host.test\n{page}\n"));
        let key = Destination::parse(&page).unwrap().url_key;
        prop_assert_eq!(hit(&index, &page), Some((key.clone(), HitKind::Url)));

        for _ in 0..8 {
            // The same page: host case, trailing dot, percent-encoded host bytes and
            // unreserved path bytes, default port, userinfo, fragment, either scheme.
            let mut h = host.clone();
            if c.chance(3) {
                h.push('.');
            }
            let spelled_path: String = path
                .chars()
                .map(|ch| if ch != '/' && c.chance(4) {
                    format!("%{:02x}", u32::from(ch))
                } else {
                    ch.to_string()
                })
                .collect();
            let https = c.chance(2);
            let url = format!(
                "{}://{}{}{}{}{}{}",
                random_case(if https { "https" } else { "http" }, &mut c),
                USERINFO[c.pick(USERINFO.len())],
                spell_host(&h, &mut c),
                [if https { ":443" } else { ":80" }, ""][c.pick(2)],
                spelled_path,
                query,
                ["", "#", "#frag"][c.pick(3)],
            );
            prop_assert_eq!(hit(&index, &url), Some((key.clone(), HitKind::Url)), "{}", url);
        }

        // Not another page on the host, not the host itself, not a subdomain's same path.
        let others = [
            format!("https://{host}{path}/other{query}"),
            format!("https://{host}{path}x{query}"),
            format!("https://{host}{path}{query}&more=1"),
            format!("https://{host}/elsewhere"),
            format!("https://www2.{host}{path}{query}"),
        ];
        for other in others.iter().chain(if path.is_empty() && query.is_empty() {
            None
        } else {
            Some(format!("https://{host}/"))
        }.iter()) {
            prop_assert_eq!(hit(&index, other), None, "{}", other);
        }
        if !query.is_empty() {
            let url = format!("https://{host}{path}");
            let url = if path.is_empty() { format!("{url}/") } else { url };
            prop_assert_eq!(hit(&index, &url), None, "{}", url);
        }
    }
}

#[test]
fn realistic_feeds_end_to_end() {
    let urlhaus = "# abuse.ch URLhaus Database Dump (CSV - recent URLs)\n\
        # id,dateadded,url,url_status,last_online,threat,tags,urlhaus_link,reporter\n\
        \"3012345\",\"2024-05-01 10:11:12\",\"http://198.51.100.7/bin.sh\",\"online\",\"2024-05-01 10:11:12\",\"malware_download\",\"elf,mozi\",\"https://urlhaus.abuse.ch/url/3012345/\",\"someone\"\n";
    let hosts = "0.0.0.0 evil.example\n0.0.0.0 bücher.example\n";
    let lists = [parse_list(urlhaus.as_bytes()), parse_list(hosts.as_bytes())];
    let index = ReputationIndex::build([
        ("urlhaus", &lists[0].entries[..]),
        ("hosts", &lists[1].entries[..]),
    ]);
    let check = |url: &str| {
        index
            .check(&Destination::parse(url).unwrap())
            .map(|h| (h.list, h.entry, h.kind))
    };
    assert_eq!(
        check("HTTP://0xC6336407:80/bin.sh#x"),
        Some(("urlhaus", "198.51.100.7/bin.sh", HitKind::Url))
    );
    assert_eq!(check("http://198.51.100.7/other.sh"), None);
    assert_eq!(
        check("https://paypal.com@WWW.Evil.Example./login"),
        Some(("hosts", "evil.example", HitKind::Host))
    );
    assert_eq!(
        check("https://shop.xn--bcher-kva.example/"),
        Some(("hosts", "xn--bcher-kva.example", HitKind::Host))
    );
}
