//! A destination as reputation checks see it: its canonical host, and the match key of the
//! whole URL.
//!
//! The match key is what a URL entry must equal: the canonical host, the port when it is not
//! the scheme's default, the path and the query, with percent-encoding normalised the RFC 3986
//! way (escapes of unreserved characters decoded, the hex digits of the others uppercased).
//! The scheme, user info and fragment are left out: a phishing page is as bad over `https` as
//! over `http`, `user:pass@` never changes which page is fetched, and a fragment never reaches
//! the server.

use sha2::{Digest, Sha256};
use url::Url;

use crate::host::CanonicalHost;

/// What the checks match a destination on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub host: CanonicalHost,
    /// See the module docs; [`url_key_hash`] of it keys the store's URL index.
    pub url_key: String,
}

impl Destination {
    /// Parses an `http`/`https` URL with a host; `None` for anything else.
    pub fn parse(raw: &str) -> Option<Destination> {
        Destination::of_url(&Url::parse(raw).ok()?)
    }

    /// The destination of a parsed `http`/`https` URL; `None` for another scheme or no host.
    pub fn of_url(url: &Url) -> Option<Destination> {
        if !matches!(url.scheme(), "http" | "https") {
            return None;
        }
        let host = CanonicalHost::of_url(url)?;
        let url_key = url_key(url, &host);
        Some(Destination { host, url_key })
    }

    /// The stable 64-bit hash of [`Destination::url_key`].
    pub fn url_hash(&self) -> u64 {
        url_key_hash(&self.url_key)
    }
}

/// The match key of `url`, whose canonical host is `host`.
pub fn url_key(url: &Url, host: &CanonicalHost) -> String {
    let mut key = String::with_capacity(url.as_str().len());
    match host {
        CanonicalHost::V6(ip) => {
            key.push('[');
            key.push_str(&ip.to_string());
            key.push(']');
        }
        other => key.push_str(&other.to_string()),
    }
    // `port()` is None for the scheme's default port: the parser already dropped it.
    if let Some(port) = url.port() {
        key.push(':');
        key.push_str(&port.to_string());
    }
    normalise_escapes(url.path(), &mut key);
    if let Some(q) = url.query() {
        key.push('?');
        normalise_escapes(q, &mut key);
    }
    key
}

/// The canonical host a match key starts with (a URL entry's host, to find the links it may
/// match through the destination index).
pub fn host_of_key(key: &str) -> Option<CanonicalHost> {
    let url = Url::parse(&format!("http://{key}")).ok()?;
    CanonicalHost::of_url(&url)
}

/// The first 8 bytes of SHA-256 of a match key, big-endian: stored in the index, so it must
/// never change between versions (a fast non-cryptographic hash would also do, but none is
/// promised to be stable).
pub fn url_key_hash(key: &str) -> u64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Appends `s` with `%XX` escapes of unreserved characters decoded and every other escape's
/// hex digits uppercased (RFC 3986 section 6.2.2). The parsed URL's path and query are ASCII.
fn normalise_escapes(s: &str, out: &mut String) {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hi = bytes.get(i + 1).copied();
            let lo = bytes.get(i + 2).copied();
            if let (Some(h), Some(l)) = (hi, lo) {
                if let (Some(hv), Some(lv)) = (hex_value(h), hex_value(l)) {
                    let decoded = hv << 4 | lv;
                    if unreserved(decoded) {
                        out.push(char::from(decoded));
                    } else {
                        out.push('%');
                        out.push(char::from(h.to_ascii_uppercase()));
                        out.push(char::from(l.to_ascii_uppercase()));
                    }
                    i += 3;
                    continue;
                }
            }
        }
        out.push(char::from(b));
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> String {
        Destination::parse(s).unwrap().url_key
    }

    #[test]
    fn one_key_for_one_page() {
        let k = "evil.example/login?x=1";
        for s in [
            "http://evil.example/login?x=1",
            "https://evil.example/login?x=1",
            "HTTPS://EVIL.EXAMPLE./login?x=1",
            "https://evil.example:443/login?x=1",
            "http://evil.example:80/login?x=1",
            "https://user:pass@evil.example/login?x=1",
            "https://paypal.com@evil.example/login?x=1#top",
            "https://evil.example/%6Cogin?x=%31",
            "https://%65vil.example/login?x=1",
        ] {
            assert_eq!(key(s), k, "{s}");
        }
        assert_eq!(key("https://evil.example:8443/a"), "evil.example:8443/a");
        assert_eq!(key("https://evil.example"), "evil.example/");
        assert_eq!(key("https://evil.example/a%2fb"), "evil.example/a%2Fb");
        assert_eq!(key("https://evil.example/a b"), "evil.example/a%20b");
        assert_eq!(key("http://3221225985/x"), "192.0.2.1/x");
        assert_eq!(key("http://[::ffff:192.0.2.1]/x"), "192.0.2.1/x");
        assert_eq!(key("http://[2001:db8::1]:8080/x"), "[2001:db8::1]:8080/x");
        assert_ne!(
            key("https://evil.example/Login"),
            key("https://evil.example/login")
        );
    }

    #[test]
    fn a_key_names_its_host() {
        for u in [
            "https://EVIL.example:8443/a?b",
            "http://[2001:db8::1]/x",
            "http://3221225985/",
            "https://b\u{fc}cher.example/",
        ] {
            let d = Destination::parse(u).unwrap();
            assert_eq!(host_of_key(&d.url_key), Some(d.host), "{u}");
        }
    }

    #[test]
    fn only_web_urls() {
        for s in [
            "ftp://evil.example/",
            "javascript:alert(1)",
            "not a url",
            "data:,x",
        ] {
            assert_eq!(Destination::parse(s), None, "{s}");
        }
    }

    #[test]
    fn escapes_at_the_end_are_kept() {
        let mut out = String::new();
        normalise_escapes("a%4", &mut out);
        assert_eq!(out, "a%4");
        out.clear();
        normalise_escapes("%zz%41%", &mut out);
        assert_eq!(out, "%zzA%");
    }

    /// SHA-256("evil.example/")'s first 8 bytes, computed with `sha256sum`.
    const STABLE_HASH: u64 = 0xf001_957c_833d_a353;

    #[test]
    fn hash_is_stable() {
        // Stored in the index: a change here would orphan every stored entry.
        assert_eq!(url_key_hash("evil.example/"), STABLE_HASH);
        assert_ne!(
            url_key_hash("evil.example/"),
            url_key_hash("evil.example/a")
        );
    }
}
