//! Reputation list files: the formats feeds and operators publish, detected per file from its
//! content, parsed as untrusted bytes.
//!
//! A list file comes from a third party and is reloaded while the service runs, so nothing in
//! it may stop a load: a line that is too long, not UTF-8, or no entry in the file's format is
//! counted and skipped ([`Malformed`]), never fatal, and the parser never panics. What is kept
//! is in the form the index matches on: a host entry as a [`CanonicalHost`] (covering the host
//! and its subdomains), a URL entry as a [`Destination`] match key (covering exactly that page).
//!
//! The formats, as [`parse_list`] detects them from the first data line (after a byte-order
//! mark, blank lines and `#` comments):
//!
//! - [`ListFormat::Urlhaus`]: the URLhaus CSV export. A `#` preamble ending in the commented
//!   header `# id,dateadded,url,url_status,...`, then quoted rows; the URL is the `url` column
//!   (the third). Detected by that header comment, or by a first row of nine quoted fields with
//!   a numeric id, or a quoted numeric id under a preamble that mentions URLhaus. (A mention
//!   alone is not enough: URLhaus also publishes a hosts file and a plain URL list, with the
//!   same preamble.)
//! - [`ListFormat::Phishtank`]: the PhishTank CSV, `phish_id,url,...,verified,...` header
//!   first; the columns are found by name in it, and rows not `verified` `yes` are skipped.
//! - [`ListFormat::Hosts`]: `0.0.0.0 evil.example` lines as hosts(5) writes them, several
//!   names a line, `#` comments anywhere; the machine's own names (`localhost`, ...) are
//!   skipped. Detected by a first data line that is an address followed by a name.
//! - [`ListFormat::Plain`]: one host or URL a line, `#` comments (whole-line, or trailing after
//!   whitespace, since a URL may hold a `#` fragment). A line starting `scheme://` is a URL; one
//!   without a scheme but with a `/` is a URL with `http://` prepended; anything else is a host.
//!   A leading `*.` is dropped (a host entry covers its subdomains anyway).
//! - [`ListFormat::Openphish`]: OpenPhish's URL list is plain text too; a plain file whose
//!   every entry is a URL written with its scheme is reported as this format.
//!
//! In every format a host entry must be a name DNS could resolve (or an address), and one that
//! is a public suffix (`com`, `co.uk`, `github.io`) is refused: it would block a whole
//! registry. A URL entry must be `http` or `https`; the feeds' URL columns must be absolute
//! URLs. CSV rows are one a line: a quoted field holding a line break, which no feed's URLs
//! contain, is reported as an unterminated quote.

use std::borrow::Cow;
use std::net::IpAddr;

use url::Url;

use crate::destination::Destination;
use crate::host::{CanonicalHost, HostError};

/// The longest line read, in bytes without its line break; a longer one is malformed.
pub const MAX_LINE_LEN: usize = 8 * 1024;

/// How many [`Malformed`] lines a [`ParsedList`] keeps (all are counted).
pub const MAX_MALFORMED_KEPT: usize = 100;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The names hosts files map to the machine itself, never entries.
const SELF_NAMES: &[&str] = &[
    "0.0.0.0",
    "broadcasthost",
    "ip6-allhosts",
    "ip6-allnodes",
    "ip6-allrouters",
    "ip6-localhost",
    "ip6-localnet",
    "ip6-loopback",
    "ip6-mcastprefix",
    "local",
    "localhost",
    "localhost.localdomain",
    "localhost4",
    "localhost4.localdomain4",
    "localhost6",
    "localhost6.localdomain6",
];

/// A list file's format, detected from its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListFormat {
    Plain,
    Hosts,
    Urlhaus,
    Phishtank,
    Openphish,
}

impl ListFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ListFormat::Plain => "plain",
            ListFormat::Hosts => "hosts",
            ListFormat::Urlhaus => "urlhaus",
            ListFormat::Phishtank => "phishtank",
            ListFormat::Openphish => "openphish",
        }
    }
}

/// One list entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Entry {
    /// Covers the host and all of its subdomains (an address: only itself).
    Host(CanonicalHost),
    /// Covers exactly the destinations with this [`Destination::url_key`].
    Url(String),
}

/// A line that was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// 1-based.
    pub line: usize,
    /// A short stable reason: "not a host or url", "not http(s)", "public suffix", ...
    pub reason: &'static str,
}

/// A parsed list file.
#[derive(Debug, Clone)]
pub struct ParsedList {
    pub format: ListFormat,
    /// In file order; duplicates are kept (the index keeps one).
    pub entries: Vec<Entry>,
    /// The first [`MAX_MALFORMED_KEPT`] malformed lines.
    pub malformed: Vec<Malformed>,
    /// Every malformed line.
    pub malformed_lines: usize,
    /// Well-formed lines the format says to ignore: PhishTank rows not verified, hosts lines
    /// naming only the machine itself.
    pub skipped_lines: usize,
}

impl ParsedList {
    fn new(format: ListFormat) -> ParsedList {
        ParsedList {
            format,
            entries: Vec::new(),
            malformed: Vec::new(),
            malformed_lines: 0,
            skipped_lines: 0,
        }
    }

    fn malformed(&mut self, line: usize, reason: &'static str) {
        self.malformed_lines += 1;
        if self.malformed.len() < MAX_MALFORMED_KEPT {
            self.malformed.push(Malformed { line, reason });
        }
    }

    /// Records one line's outcome.
    fn push(&mut self, line: usize, entry: Result<Entry, &'static str>) {
        match entry {
            Ok(entry) => self.entries.push(entry),
            Err(reason) => self.malformed(line, reason),
        }
    }
}

/// Parses a list file, detecting its format (see the module docs).
pub fn parse_list(text: &[u8]) -> ParsedList {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    match detect(text) {
        Detected::Plain => parse_plain(text),
        Detected::Hosts => parse_hosts(text),
        Detected::Urlhaus { header } => parse_urlhaus(text, header),
        Detected::Phishtank => parse_phishtank(text),
    }
}

/// A line of the file: its number, and its text or why it cannot be read.
type Line<'a> = (usize, Result<&'a str, &'static str>);

/// The lines of `text`, numbered from 1, without their `\n` or `\r\n`.
fn lines(text: &[u8]) -> impl Iterator<Item = Line<'_>> {
    text.split(|&b| b == b'\n').enumerate().map(|(i, raw)| {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = if raw.len() > MAX_LINE_LEN {
            Err("line too long")
        } else {
            std::str::from_utf8(raw).map_err(|_| "not utf-8")
        };
        (i + 1, line)
    })
}

fn is_comment(line: &str) -> bool {
    line.starts_with('#')
}

/// A line's content once `clean` (comment stripping, trimming) went over it: `None` for a
/// blank or comment line, and for one that is no line at all (counted as malformed in `out`).
fn content<'a>(
    out: &mut ParsedList,
    n: usize,
    line: Result<&'a str, &'static str>,
    clean: impl Fn(&'a str) -> &'a str,
) -> Option<&'a str> {
    match line {
        Ok(line) => Some(clean(line)).filter(|l| !l.is_empty() && !is_comment(l)),
        Err(reason) => {
            out.malformed(n, reason);
            None
        }
    }
}

enum Detected<'a> {
    Plain,
    Hosts,
    /// With URLhaus's commented column header, if the file has one.
    Urlhaus {
        header: Option<&'a str>,
    },
    Phishtank,
}

/// The format, from the comments before the first data line and that line. Unreadable lines
/// are passed over here (the parse counts them).
fn detect(text: &[u8]) -> Detected<'_> {
    let mut mentions_urlhaus = false;
    for (_, line) in lines(text) {
        let Ok(line) = line.map(str::trim) else {
            continue;
        };
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim();
            if starts_with_ignore_case(comment, "id,dateadded,url") {
                return Detected::Urlhaus {
                    header: Some(comment),
                };
            }
            mentions_urlhaus |= contains_ignore_case(comment, "urlhaus");
            continue;
        }
        let mut fields = Vec::new();
        if split_csv(line, &mut fields).is_ok() {
            let first = fields.first().map_or("", |f| f.trim());
            if first.eq_ignore_ascii_case("phish_id")
                && fields.iter().any(|f| f.trim().eq_ignore_ascii_case("url"))
            {
                return Detected::Phishtank;
            }
            let numeric_id = !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit());
            if line.starts_with('"') && numeric_id && (fields.len() == 9 || mentions_urlhaus) {
                return Detected::Urlhaus { header: None };
            }
        }
        return if hosts_line(line.split('#').next().unwrap_or("")).is_some() {
            Detected::Hosts
        } else {
            Detected::Plain
        };
    }
    Detected::Plain
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

fn contains_ignore_case(s: &str, needle: &str) -> bool {
    s.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

// ---- plain and OpenPhish ----

fn parse_plain(text: &[u8]) -> ParsedList {
    let mut out = ParsedList::new(ListFormat::Plain);
    let mut all_with_scheme = true;
    for (n, line) in lines(text) {
        let Some(line) = content(&mut out, n, line, |l| strip_trailing_comment(l).trim()) else {
            continue;
        };
        let with_scheme = has_scheme(line);
        let entry = if with_scheme || line.contains('/') {
            plain_url_entry(line)
        } else {
            host_entry(line.strip_prefix("*.").unwrap_or(line))
        };
        if entry.is_ok() {
            all_with_scheme &= with_scheme;
        }
        out.push(n, entry);
    }
    if all_with_scheme && !out.entries.is_empty() {
        out.format = ListFormat::Openphish;
    }
    out
}

/// `line` up to a `#` that follows whitespace (a `#` right after other text is a URL's
/// fragment).
fn strip_trailing_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let cut = bytes
        .windows(2)
        .position(|w| w[0].is_ascii_whitespace() && w[1] == b'#');
    match cut {
        Some(i) => line.get(..i).unwrap_or(line),
        None => line,
    }
}

/// Whether `s` starts with `scheme://` (RFC 3986: a letter, then letters, digits, `+-.`).
fn has_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

// ---- hosts files ----

fn parse_hosts(text: &[u8]) -> ParsedList {
    let mut out = ParsedList::new(ListFormat::Hosts);
    for (n, line) in lines(text) {
        // hosts(5): a `#` starts a comment anywhere.
        let Some(line) = content(&mut out, n, line, |l| {
            l.split('#').next().unwrap_or("").trim()
        }) else {
            continue;
        };
        let Some(names) = hosts_line(line) else {
            out.malformed(n, "not a hosts line");
            continue;
        };
        let (mut listed, mut refused) = (0usize, None);
        for name in names.filter(|name| !is_self_name(name)) {
            match host_entry(name) {
                Ok(entry) => {
                    out.entries.push(entry);
                    listed += 1;
                }
                Err(reason) => refused = refused.or(Some(reason)),
            }
        }
        match refused {
            // One bad name makes the line malformed; its good names are still listed.
            Some(reason) => out.malformed(n, reason),
            None if listed == 0 => out.skipped_lines += 1,
            None => {}
        }
    }
    out
}

/// The names of a hosts line (its comment already cut off): an address, then at least one
/// name; `None` for anything else.
fn hosts_line(line: &str) -> Option<impl Iterator<Item = &str>> {
    let mut tokens = line.split_whitespace();
    let address = tokens.next()?;
    // A zone index (`fe80::1%lo0`) is part of an address in hosts files.
    let address = address.split_once('%').map_or(address, |(a, _)| a);
    address.parse::<IpAddr>().ok()?;
    let mut names = tokens.peekable();
    names.peek()?;
    Some(names)
}

fn is_self_name(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    SELF_NAMES.iter().any(|s| s.eq_ignore_ascii_case(name))
}

// ---- CSV feeds ----

fn parse_urlhaus(text: &[u8], header: Option<&str>) -> ParsedList {
    let mut out = ParsedList::new(ListFormat::Urlhaus);
    // The export's columns: id,dateadded,url,url_status,last_online,threat,tags,urlhaus_link,
    // reporter. A header comment that names them differently wins.
    let (mut width, mut url_col) = (9, 2);
    if let Some(header) = header {
        let mut names = Vec::new();
        if split_csv(header, &mut names).is_ok() {
            if let Some(col) = column(&names, "url") {
                (width, url_col) = (names.len(), col);
            }
        }
    }
    let mut fields = Vec::new();
    for (n, line) in lines(text) {
        let Some(line) = content(&mut out, n, line, str::trim) else {
            continue;
        };
        fields.clear();
        let entry = split_csv(line, &mut fields).and_then(|()| {
            if fields.len() != width {
                return Err("wrong field count");
            }
            url_entry(fields.get(url_col).map_or("", |f| f.trim()))
        });
        out.push(n, entry);
    }
    out
}

fn parse_phishtank(text: &[u8]) -> ParsedList {
    let mut out = ParsedList::new(ListFormat::Phishtank);
    // Set from the header, the first data line (`detect` found `phish_id` and `url` in it).
    let mut columns: Option<(usize, usize, Option<usize>)> = None;
    let mut fields = Vec::new();
    for (n, line) in lines(text) {
        let Some(line) = content(&mut out, n, line, str::trim) else {
            continue;
        };
        fields.clear();
        if let Err(reason) = split_csv(line, &mut fields) {
            out.malformed(n, reason);
            continue;
        }
        let Some((width, url_col, verified_col)) = columns else {
            match column(&fields, "url") {
                Some(url_col) => {
                    columns = Some((fields.len(), url_col, column(&fields, "verified")));
                }
                None => out.malformed(n, "no url column"),
            }
            continue;
        };
        if fields.len() != width {
            out.malformed(n, "wrong field count");
            continue;
        }
        let verified = verified_col
            .and_then(|c| fields.get(c))
            .is_none_or(|v| v.trim().eq_ignore_ascii_case("yes"));
        if !verified {
            out.skipped_lines += 1;
            continue;
        }
        out.push(n, url_entry(fields.get(url_col).map_or("", |f| f.trim())));
    }
    out
}

/// The position of the column named `name` in a header.
fn column(header: &[Cow<'_, str>], name: &str) -> Option<usize> {
    header
        .iter()
        .position(|h| h.trim().eq_ignore_ascii_case(name))
}

/// Splits one CSV record (RFC 4180: comma-separated fields, optionally in double quotes, in
/// which `""` is a quote) into `fields`. Unquoted fields are taken as they are, quotes and
/// spaces included.
fn split_csv<'a>(line: &'a str, fields: &mut Vec<Cow<'a, str>>) -> Result<(), &'static str> {
    let mut rest = line;
    loop {
        let Some(quoted) = rest.strip_prefix('"') else {
            match rest.split_once(',') {
                Some((field, tail)) => {
                    fields.push(Cow::Borrowed(field));
                    rest = tail;
                    continue;
                }
                None => {
                    fields.push(Cow::Borrowed(rest));
                    return Ok(());
                }
            }
        };
        let mut value = Cow::Borrowed("");
        let mut s = quoted;
        loop {
            let (chunk, tail) = s.split_once('"').ok_or("unterminated quote")?;
            match &mut value {
                Cow::Borrowed(v) if v.is_empty() => *v = chunk,
                v => v.to_mut().push_str(chunk),
            }
            match tail.strip_prefix('"') {
                Some(after_escape) => {
                    value.to_mut().push('"');
                    s = after_escape;
                }
                None => {
                    s = tail;
                    break;
                }
            }
        }
        fields.push(value);
        if s.is_empty() {
            return Ok(());
        }
        rest = s.strip_prefix(',').ok_or("text after a closing quote")?;
    }
}

// ---- entries ----

/// A host entry: any spelling [`CanonicalHost::parse`] accepts, but only names DNS could
/// resolve (labels of letters, digits, `-` and `_` once punycoded), never a public suffix.
fn host_entry(s: &str) -> Result<Entry, &'static str> {
    let host = CanonicalHost::parse(s).map_err(|e| match e {
        HostError::TooLong => "host too long",
        _ => "not a host or url",
    })?;
    if let CanonicalHost::Domain(d) = &host {
        let dns_name = d.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        });
        if !dns_name {
            return Err("not a host or url");
        }
    }
    if host.is_public_suffix() {
        return Err("public suffix");
    }
    Ok(Entry::Host(host))
}

/// A URL entry from a plain line: `http://` is assumed when the line has no scheme.
fn plain_url_entry(line: &str) -> Result<Entry, &'static str> {
    if has_scheme(line) {
        url_entry(line)
    } else {
        url_entry(&format!("http://{line}"))
    }
}

/// A URL entry: an absolute `http`/`https` URL.
fn url_entry(s: &str) -> Result<Entry, &'static str> {
    let url = Url::parse(s).map_err(|_| "not a url")?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("not http(s)");
    }
    let dest = Destination::of_url(&url).ok_or("not a url")?;
    Ok(Entry::Url(dest.url_key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Entry {
        Entry::Host(CanonicalHost::parse(s).unwrap())
    }

    fn url(s: &str) -> Entry {
        Entry::Url(Destination::parse(s).unwrap().url_key)
    }

    fn reasons(list: &ParsedList) -> Vec<(usize, &'static str)> {
        list.malformed.iter().map(|m| (m.line, m.reason)).collect()
    }

    #[test]
    fn plain_hosts_urls_and_comments() {
        let text = "\
# my blocklist
evil.example
EVIL.Example.   # trailing comment
  *.wild.example

bücher.example
xn--bcher-kva.example
192.0.2.1
0xc0000202
[2001:db8::1]
evil.example/login?next=1
https://phish.example/a#frag # comment after a fragment
HTTP://phish.example:8080/b
//scheme-relative.example/x
";
        let list = parse_list(text.as_bytes());
        assert_eq!(list.format, ListFormat::Plain);
        assert_eq!(reasons(&list), []);
        assert_eq!(
            list.entries,
            [
                host("evil.example"),
                host("evil.example"),
                host("wild.example"),
                host("xn--bcher-kva.example"),
                host("xn--bcher-kva.example"),
                host("192.0.2.1"),
                host("192.0.2.2"),
                host("2001:db8::1"),
                url("http://evil.example/login?next=1"),
                url("https://phish.example/a"),
                url("http://phish.example:8080/b"),
                url("http://scheme-relative.example/x"),
            ]
        );
        assert_eq!(list.skipped_lines, 0);
    }

    #[test]
    fn plain_malformed_lines_are_counted_and_skipped() {
        let mut text = b"good.example\n".to_vec();
        text.extend_from_slice(b"ftp://files.example/x\n"); // 2
        text.extend_from_slice(b"javascript://alert(1)\n"); // 3
        text.extend_from_slice(b"not a host\n"); // 4
        text.extend_from_slice(b"com\n"); // 5
        text.extend_from_slice(b"co.uk\n"); // 6
        text.extend_from_slice(b"github.io.\n"); // 7
        text.extend_from_slice(b"bad\xFF.example\n"); // 8
        text.extend_from_slice(&[b'a'; MAX_LINE_LEN + 1]); // 9
        text.extend_from_slice(b"\nhttp://[::1/x\n"); // 10
        text.extend_from_slice(b"||adblock.example^\n"); // 11
        text.extend_from_slice(b"a..b.example\n"); // 12
        text.extend_from_slice(b"ev!l.example\n"); // 13
        text.extend_from_slice(b"also-good.example\n"); // 14
        let list = parse_list(&text);
        assert_eq!(
            reasons(&list),
            [
                (2, "not http(s)"),
                (3, "not http(s)"),
                (4, "not a host or url"),
                (5, "public suffix"),
                (6, "public suffix"),
                (7, "public suffix"),
                (8, "not utf-8"),
                (9, "line too long"),
                (10, "not a url"),
                (11, "not a host or url"),
                (12, "not a host or url"),
                (13, "not a host or url"),
            ]
        );
        assert_eq!(list.malformed_lines, 12);
        assert_eq!(
            list.entries,
            [host("good.example"), host("also-good.example")]
        );
    }

    #[test]
    fn a_line_of_exactly_the_limit_is_read() {
        let name = format!("{}.example", "a".repeat(60));
        let line = format!(
            "https://{name}/{}",
            "p".repeat(MAX_LINE_LEN - name.len() - 9)
        );
        assert_eq!(line.len(), MAX_LINE_LEN);
        let list = parse_list(line.as_bytes());
        assert_eq!((list.entries.len(), list.malformed_lines), (1, 0));
    }

    #[test]
    fn only_the_first_malformed_lines_are_kept() {
        let text = "nope nope\n".repeat(250);
        let list = parse_list(text.as_bytes());
        assert_eq!(list.malformed.len(), MAX_MALFORMED_KEPT);
        assert_eq!(list.malformed_lines, 250);
        assert_eq!(list.malformed[99].line, 100);
    }

    #[test]
    fn bom_and_crlf() {
        let text = b"\xEF\xBB\xBFevil.example\r\n# comment\r\nhttps://phish.example/x\r\n\r\n";
        let list = parse_list(text);
        assert_eq!(reasons(&list), []);
        assert_eq!(
            list.entries,
            [host("evil.example"), url("https://phish.example/x")]
        );

        let text = b"\xEF\xBB\xBF0.0.0.0 evil.example\r\n0.0.0.0 other.example\r\n";
        let list = parse_list(text);
        assert_eq!(list.format, ListFormat::Hosts);
        assert_eq!(list.entries, [host("evil.example"), host("other.example")]);
    }

    #[test]
    fn openphish_is_a_list_of_urls_with_schemes() {
        let text = "\
https://secure-login.paypa1.example/signin/
http://198.51.100.23/wp-content/bank/index.php
https://sub.phish.example/account?id=123
";
        let list = parse_list(text.as_bytes());
        assert_eq!(list.format, ListFormat::Openphish);
        assert_eq!(list.format.as_str(), "openphish");
        assert_eq!(list.entries.len(), 3);
        assert_eq!(
            list.entries[1],
            Entry::Url("198.51.100.23/wp-content/bank/index.php".into())
        );
        // One host, or one scheme-less URL, makes it a plain list.
        for extra in ["evil.example", "evil.example/x"] {
            let list = parse_list(format!("{text}{extra}\n").as_bytes());
            assert_eq!(list.format, ListFormat::Plain, "{extra}");
        }
        // Malformed lines do not count either way.
        let list = parse_list(format!("{text}not a host\n").as_bytes());
        assert_eq!(list.format, ListFormat::Openphish);
        assert_eq!(parse_list(b"").format, ListFormat::Plain);
        assert_eq!(parse_list(b"# only a comment\n").format, ListFormat::Plain);
    }

    #[test]
    fn hosts_file() {
        let text = "\
# Title: StevenBlack/hosts
#
127.0.0.1 localhost
127.0.0.1 localhost.localdomain
127.0.0.1 local
255.255.255.255 broadcasthost
::1 localhost ip6-localhost ip6-loopback
fe80::1%lo0 localhost
ff02::1 ip6-allnodes
0.0.0.0 0.0.0.0

# Start of the blocked hosts
0.0.0.0 evil.example
127.0.0.1\ta.example  b.example\t# two names
0.0.0.0 EVIL2.example. # trailing dot
0.0.0.0 com
0.0.0.0 good.example bad!name.example
justaname.example
0.0.0.0
";
        let list = parse_list(text.as_bytes());
        assert_eq!(list.format, ListFormat::Hosts);
        assert_eq!(
            list.entries,
            [
                host("evil.example"),
                host("a.example"),
                host("b.example"),
                host("evil2.example"),
                host("good.example"),
            ]
        );
        assert_eq!(
            reasons(&list),
            [
                (16, "public suffix"),
                (17, "not a host or url"),
                (18, "not a hosts line"),
                (19, "not a hosts line"),
            ]
        );
        assert_eq!(list.skipped_lines, 8);
    }

    #[test]
    fn hosts_detection_needs_an_address_and_a_name() {
        assert_eq!(
            parse_list(b"0.0.0.0 evil.example\n").format,
            ListFormat::Hosts
        );
        assert_eq!(parse_list(b"::1 localhost\n").format, ListFormat::Hosts);
        assert_eq!(parse_list(b"192.0.2.1\n").format, ListFormat::Plain);
        assert_eq!(
            parse_list(b"3221225985 a.example\n").format,
            ListFormat::Plain
        );
        assert_eq!(parse_list(b"evil.example\n").format, ListFormat::Plain);
        // A comment is no name.
        let list = parse_list(b"192.0.2.1 # a comment\n");
        assert_eq!(list.format, ListFormat::Plain);
        assert_eq!(list.entries, [host("192.0.2.1")]);
    }

    const URLHAUS: &str = r##"################################################################
# abuse.ch URLhaus Database Dump (CSV - recent URLs)           #
# Last updated: 2024-05-01 10:15:03 (UTC)                      #
#                                                              #
# Terms Of Use: https://urlhaus.abuse.ch/api/                  #
# For questions please contact urlhaus [at] abuse.ch           #
################################################################
#
# id,dateadded,url,url_status,last_online,threat,tags,urlhaus_link,reporter
"3012345","2024-05-01 10:11:12","http://198.51.100.7/bin.sh","online","2024-05-01 10:11:12","malware_download","elf,mozi","https://urlhaus.abuse.ch/url/3012345/","someone"
"3012344","2024-05-01 10:09:01","https://dl.evil.example/a,b/payload.exe?x=""1""","offline","","malware_download","exe","https://urlhaus.abuse.ch/url/3012344/","an ""analyst"""
"3012343","2024-05-01 10:08:00","http://198.51.100.8:8080/i","online","2024-05-01 10:08:00","malware_download","32-bit,elf,mips","https://urlhaus.abuse.ch/url/3012343/","someone"
"3012342","2024-05-01 10:07:00","http://short.example/x","online"
"3012341","2024-05-01 10:06:00","ftp://files.example/x","online","","malware_download","","https://urlhaus.abuse.ch/url/3012341/","someone"
"3012340","2024-05-01 10:05:00","http://unterminated.example/x
"##;

    #[test]
    fn urlhaus_csv() {
        let list = parse_list(URLHAUS.as_bytes());
        assert_eq!(list.format, ListFormat::Urlhaus);
        assert_eq!(
            list.entries,
            [
                Entry::Url("198.51.100.7/bin.sh".into()),
                Entry::Url("dl.evil.example/a,b/payload.exe?x=%221%22".into()),
                Entry::Url("198.51.100.8:8080/i".into()),
            ]
        );
        assert_eq!(
            reasons(&list),
            [
                (13, "wrong field count"),
                (14, "not http(s)"),
                (15, "unterminated quote"),
            ]
        );
    }

    #[test]
    fn urlhaus_without_its_header() {
        // The rows alone: nine quoted fields with a numeric id.
        let rows: String = URLHAUS
            .lines()
            .skip(9)
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect();
        let list = parse_list(rows.as_bytes());
        assert_eq!(list.format, ListFormat::Urlhaus);
        assert_eq!(list.entries.len(), 3);
        // Under a preamble that mentions URLhaus, a first row of another width still is.
        let text = "# URLhaus dump\n\"1\",\"x\",\"http://evil.example/\"\n";
        let list = parse_list(text.as_bytes());
        assert_eq!(list.format, ListFormat::Urlhaus);
        assert_eq!(reasons(&list), [(2, "wrong field count")]);
        // URLhaus's plain URL list has the same kind of preamble but is plain.
        let text = "# abuse.ch URLhaus Database Dump (plain text)\nhttp://evil.example/x\n";
        assert_eq!(parse_list(text.as_bytes()).format, ListFormat::Openphish);
    }

    const PHISHTANK: &str = "\
phish_id,url,phish_detail_url,submission_time,verified,verification_time,online,target
8512345,https://secure-paypa1.example/login.php,http://www.phishtank.com/phish_detail.php?phish_id=8512345,2024-05-01T10:11:12+00:00,yes,2024-05-01T10:20:00+00:00,yes,PayPal
8512346,\"https://bank.example.attacker.test/a,b?c=1\",http://www.phishtank.com/phish_detail.php?phish_id=8512346,2024-05-01T10:12:00+00:00,yes,2024-05-01T10:21:00+00:00,yes,Other
8512347,https://unverified.example/,http://www.phishtank.com/phish_detail.php?phish_id=8512347,2024-05-01T10:13:00+00:00,no,,yes,Other
8512348,https://short.example/
8512349,mailto:x@evil.example,http://www.phishtank.com/phish_detail.php?phish_id=8512349,2024-05-01T10:14:00+00:00,yes,2024-05-01T10:22:00+00:00,yes,Other
";

    #[test]
    fn phishtank_csv() {
        let list = parse_list(PHISHTANK.as_bytes());
        assert_eq!(list.format, ListFormat::Phishtank);
        assert_eq!(
            list.entries,
            [
                Entry::Url("secure-paypa1.example/login.php".into()),
                Entry::Url("bank.example.attacker.test/a,b?c=1".into()),
            ]
        );
        assert_eq!(list.skipped_lines, 1);
        assert_eq!(
            reasons(&list),
            [(5, "wrong field count"), (6, "not http(s)")]
        );
    }

    #[test]
    fn phishtank_columns_come_from_the_header() {
        let text = "\"phish_id\",\"verified\",\"url\"\r\n1,yes,http://a.example/\r\n2,No,http://b.example/\r\n";
        let list = parse_list(text.as_bytes());
        assert_eq!(list.format, ListFormat::Phishtank);
        assert_eq!(list.entries, [Entry::Url("a.example/".into())]);
        assert_eq!(list.skipped_lines, 1);
    }

    #[test]
    fn csv_fields() {
        let split = |s| {
            let mut v = Vec::new();
            split_csv(s, &mut v).map(|()| v.into_iter().map(Cow::into_owned).collect::<Vec<_>>())
        };
        assert_eq!(split("a,b,,c").unwrap(), ["a", "b", "", "c"]);
        assert_eq!(split("\"a,b\",\"\"").unwrap(), ["a,b", ""]);
        assert_eq!(
            split("\"say \"\"hi\"\"\",x,").unwrap(),
            ["say \"hi\"", "x", ""]
        );
        assert_eq!(split("\"\"\"\"").unwrap(), ["\""]);
        assert_eq!(split("").unwrap(), [""]);
        assert_eq!(split("\"a"), Err("unterminated quote"));
        assert_eq!(split("\"a\"b"), Err("text after a closing quote"));
    }

    #[test]
    fn trailing_comments() {
        assert_eq!(strip_trailing_comment("a.example # x"), "a.example");
        assert_eq!(strip_trailing_comment("a.example\t#x"), "a.example");
        assert_eq!(
            strip_trailing_comment("https://a.example/#x"),
            "https://a.example/#x"
        );
        assert_eq!(strip_trailing_comment("é #"), "é");
        assert_eq!(strip_trailing_comment(" # all comment"), "");
    }
}
