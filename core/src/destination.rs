//! Destination URL rules, at create time ([`normalize_destination`]) and again at serve time
//! ([`is_servable`]).
//!
//! The stored string is exactly what the edge will put in `Location`: parsed and normalised by the
//! `url` crate (WHATWG), so the host is lowercase ASCII (IDN as punycode), default ports are
//! gone, and every byte outside the URL code points is percent-encoded.

use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Default longest destination, in bytes, after normalisation.
pub const DEFAULT_MAX_URL_LEN: usize = 4096;

/// What destinations are allowed.
#[derive(Debug, Clone)]
pub struct UrlPolicy {
    /// Longest accepted URL in bytes, raw and normalised.
    pub max_len: usize,
    /// Allow loopback, private, link-local and unspecified IP literals and `localhost`.
    pub allow_private_hosts: bool,
}

impl Default for UrlPolicy {
    fn default() -> Self {
        UrlPolicy {
            max_len: DEFAULT_MAX_URL_LEN,
            allow_private_hosts: false,
        }
    }
}

/// Why a destination was rejected; [`UrlError::code`] is the API's machine code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    #[error("url is empty")]
    Empty,
    #[error("url is longer than {max} bytes")]
    TooLong { max: usize },
    #[error("url contains whitespace or a control character")]
    ForbiddenChar,
    #[error("url does not parse: {reason}")]
    Invalid { reason: String },
    #[error("only http and https urls can be shortened")]
    Scheme,
    #[error("url has no host")]
    NoHost,
    #[error("url may not carry a user name or password")]
    Credentials,
    #[error("url points at a loopback, private, link-local or unspecified address")]
    ForbiddenHost,
}

impl UrlError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            UrlError::Empty => "url_empty",
            UrlError::TooLong { .. } => "url_too_long",
            UrlError::ForbiddenChar => "url_forbidden_char",
            UrlError::Invalid { .. } => "url_invalid",
            UrlError::Scheme => "url_scheme",
            UrlError::NoHost => "url_no_host",
            UrlError::Credentials => "url_credentials",
            UrlError::ForbiddenHost => "url_forbidden_host",
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        // 100.64.0.0/10, carrier-grade NAT: as internal as RFC 1918 space.
        || (ip.octets()[0] == 100 && (ip.octets()[1] & 0xc0) == 64)
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
}

fn forbidden_host(host: &Host<&str>) -> bool {
    match host {
        Host::Ipv4(ip) => forbidden_v4(*ip),
        Host::Ipv6(ip) => forbidden_v6(*ip),
        Host::Domain(name) => {
            let name = name.trim_end_matches('.');
            name == "localhost" || name.ends_with(".localhost")
        }
    }
}

/// Validates and normalises a destination; the result is what gets stored and served.
pub fn normalize_destination(raw: &str, policy: &UrlPolicy) -> Result<String, UrlError> {
    if raw.is_empty() {
        return Err(UrlError::Empty);
    }
    if raw.len() > policy.max_len {
        return Err(UrlError::TooLong {
            max: policy.max_len,
        });
    }
    // The WHATWG parser silently strips tabs and newlines and trims spaces; we refuse them instead,
    // so what the owner typed and what we store never differ in a way they cannot see.
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(UrlError::ForbiddenChar);
    }
    let url = Url::parse(raw).map_err(|e| UrlError::Invalid {
        reason: e.to_string(),
    })?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(UrlError::Scheme);
    }
    let host = url.host().ok_or(UrlError::NoHost)?;
    if matches!(&host, Host::Domain(d) if d.is_empty()) {
        return Err(UrlError::NoHost);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    if !policy.allow_private_hosts && forbidden_host(&host) {
        return Err(UrlError::ForbiddenHost);
    }
    let normalized = String::from(url);
    if normalized.len() > policy.max_len {
        return Err(UrlError::TooLong {
            max: policy.max_len,
        });
    }
    if !is_servable(normalized.as_bytes()) {
        // The url crate percent-encodes every byte we would refuse; this guards the invariant.
        return Err(UrlError::ForbiddenChar);
    }
    Ok(normalized)
}

/// Serve-time check: only `http://` or `https://` URLs made of visible ASCII may reach a
/// `Location` header. Cheap enough for every redirect.
#[inline]
pub fn is_servable(url: &[u8]) -> bool {
    (url.starts_with(b"https://") || url.starts_with(b"http://")) && visible_ascii(url)
}

/// Every byte is visible ASCII (0x21..=0x7e), so no CR, LF, space or control byte can reach a
/// header. A fold without early exit, so the byte check vectorises (it runs on every redirect;
/// `all` short-circuits byte by byte and cost ~70 ns on an 80-byte URL).
#[inline]
pub fn visible_ascii(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .fold(true, |ok, &b| ok & (b.wrapping_sub(0x21) < 0x7f - 0x21))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The vectorised check says what a short-circuiting one says, at every length and
        /// with the odd byte anywhere.
        #[test]
        fn visible_ascii_is_the_byte_check(
            len in 0usize..80,
            at in 0usize..80,
            byte in proptest::prelude::any::<u8>(),
        ) {
            let mut bytes = vec![b'a'; len];
            if let Some(b) = bytes.get_mut(at) {
                *b = byte;
            }
            let plain = bytes.iter().all(|b| (0x21..=0x7e).contains(b));
            proptest::prop_assert_eq!(visible_ascii(&bytes), plain);
            let url = [b"https://".as_slice(), &bytes].concat();
            proptest::prop_assert_eq!(is_servable(&url), plain);
        }
    }

    fn norm(s: &str) -> Result<String, &'static str> {
        normalize_destination(s, &UrlPolicy::default()).map_err(|e| e.code())
    }

    #[test]
    fn normalises() {
        assert_eq!(
            norm("HTTPS://Example.COM:443/a b").unwrap_err(),
            "url_forbidden_char"
        );
        assert_eq!(
            norm("HTTPS://Example.COM:443/a%20b").unwrap(),
            "https://example.com/a%20b"
        );
        assert_eq!(
            norm("http://bücher.example/").unwrap(),
            "http://xn--bcher-kva.example/"
        );
        assert_eq!(norm("https://example.com").unwrap(), "https://example.com/");
        assert_eq!(
            norm("https://example.com/p?q=1#frag").unwrap(),
            "https://example.com/p?q=1#frag"
        );
        assert_eq!(
            norm("https://example.com/\u{e9}").unwrap(),
            "https://example.com/%C3%A9"
        );
    }

    #[test]
    fn rejects_with_codes() {
        let cases = [
            ("", "url_empty"),
            ("ftp://example.com/", "url_scheme"),
            ("javascript:alert(1)", "url_scheme"),
            ("data:text/html,hi", "url_scheme"),
            ("https://user:pw@example.com/", "url_credentials"),
            ("https://user@example.com/", "url_credentials"),
            (
                "https://example.com/\r\nSet-Cookie: x",
                "url_forbidden_char",
            ),
            ("https://example.com/\tx", "url_forbidden_char"),
            ("https://exa\u{0}mple.com/", "url_forbidden_char"),
            ("not a url", "url_forbidden_char"),
            ("example.com/path", "url_invalid"),
            ("https://", "url_invalid"),
            ("http://localhost:8080/", "url_forbidden_host"),
            ("http://api.localhost/", "url_forbidden_host"),
            ("http://127.0.0.1/", "url_forbidden_host"),
            ("http://2130706433/", "url_forbidden_host"),
            ("http://10.1.2.3/", "url_forbidden_host"),
            ("http://192.168.0.1/", "url_forbidden_host"),
            (
                "http://169.254.169.254/latest/meta-data",
                "url_forbidden_host",
            ),
            ("http://0.0.0.0/", "url_forbidden_host"),
            ("http://[::1]/", "url_forbidden_host"),
            ("http://[fe80::1]/", "url_forbidden_host"),
            ("http://[fd00::1]/", "url_forbidden_host"),
            ("http://[::ffff:10.0.0.1]/", "url_forbidden_host"),
        ];
        for (input, code) in cases {
            assert_eq!(norm(input).unwrap_err(), code, "{input:?}");
        }
        let long = format!("https://example.com/{}", "a".repeat(5000));
        assert_eq!(norm(&long).unwrap_err(), "url_too_long");
    }

    #[test]
    fn private_hosts_allowed_by_policy() {
        let policy = UrlPolicy {
            allow_private_hosts: true,
            ..UrlPolicy::default()
        };
        assert_eq!(
            normalize_destination("http://127.0.0.1:8080/x", &policy).unwrap(),
            "http://127.0.0.1:8080/x"
        );
    }

    #[test]
    fn servable() {
        assert!(is_servable(b"https://example.com/"));
        assert!(is_servable(b"http://example.com/"));
        assert!(!is_servable(b"javascript:alert(1)"));
        assert!(!is_servable(b"https://example.com/\r\nx"));
        assert!(!is_servable(b"https://example.com/ x"));
        assert!(!is_servable(b"HTTPS://example.com/"));
    }

    proptest::proptest! {
        /// The vectorised byte check is exactly "visible ASCII", on any bytes.
        #[test]
        fn servable_is_visible_ascii(tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let mut url = b"https://".to_vec();
            url.extend_from_slice(&tail);
            let naive = tail.iter().all(|&b| (0x21..0x7f).contains(&b));
            proptest::prop_assert_eq!(is_servable(&url), naive);
        }

        /// Whatever the input, an accepted URL is servable and stable under re-normalisation.
        #[test]
        fn accepted_urls_are_servable(s in "\\PC{0,80}", path in "[ -~]{0,40}") {
            for input in [s.clone(), format!("https://example.com/{path}"), format!("http://{s}")] {
                if let Ok(out) = normalize_destination(&input, &UrlPolicy::default()) {
                    proptest::prop_assert!(is_servable(out.as_bytes()));
                    proptest::prop_assert_eq!(
                        normalize_destination(&out, &UrlPolicy::default()).ok(),
                        Some(out.clone())
                    );
                }
            }
        }
    }
}
