//! The branded domains an engine serves, by `Host`: each domain's namespace, its settings (the
//! root and not-found redirects, HSTS) and whether it is suspended.
//!
//! A request whose `Host` is a branded domain is looked up under its [link
//! key](lasthop_core::split_key) `domain/code`; any other `Host` (the fleet's own short domain,
//! an address, none) is the default domain's, looked up by its code alone, as before branded
//! domains existed. With no branded domain the request path pays one length check for this.
//!
//! The set comes with the certificates (`GET /edge/v1/certificates`, core/FEED.md), so it is
//! the same generation an engine picks certificates by SNI from.

use hashbrown::HashMap;
use lasthop_core::code::{domain_shape, DOMAIN_MAX, KEY_MAX, KEY_SEPARATOR};

/// One branded domain as the edge applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// The name, lower case (the key prefix).
    pub name: Box<[u8]>,
    /// Suspended with its links: every request on it is answered 410.
    pub suspended: bool,
    /// Where `GET /` goes (a 302), when set.
    pub root_redirect: Option<Box<[u8]>>,
    /// Where a code that is not found goes (a 302 instead of the 404), when set.
    pub not_found_redirect: Option<Box<[u8]>>,
    /// The `Strict-Transport-Security` header line (CRLF-terminated) for its HTTPS answers.
    pub hsts: Option<Box<[u8]>>,
    /// ACME HTTP-01 answers while the domain's certificate is being ordered: (token, key
    /// authorization), served at `/.well-known/acme-challenge/TOKEN` (RFC 8555 §8.3).
    pub acme_http: Box<[AcmeAnswer]>,
    /// An old shortener stands behind the domain (issue 44's lazy fallback): a legacy-shaped
    /// code that no table has is read through the origin, which asks it, instead of a 404.
    pub legacy_fallback: bool,
}

/// An ACME HTTP-01 answer: the token and its key authorization.
pub type AcmeAnswer = (Box<[u8]>, Box<[u8]>);

impl Domain {
    /// A domain with no settings.
    pub fn new(name: &str) -> Domain {
        Domain {
            name: name.as_bytes().into(),
            suspended: false,
            root_redirect: None,
            not_found_redirect: None,
            hsts: None,
            acme_http: Box::new([]),
            legacy_fallback: false,
        }
    }

    /// The key authorization for HTTP-01 `token`, while one is published.
    pub fn acme_answer(&self, token: &[u8]) -> Option<&[u8]> {
        self.acme_http
            .iter()
            .find(|(t, _)| **t == *token)
            .map(|(_, answer)| &**answer)
    }

    /// The HSTS header line for `max-age` seconds, with `includeSubDomains` and `preload`
    /// when asked (the control plane requires the first with the second, as the preload list
    /// does).
    pub fn hsts_line(max_age: u32, include_subdomains: bool, preload: bool) -> Box<[u8]> {
        let mut line = format!("Strict-Transport-Security: max-age={max_age}");
        if include_subdomains {
            line.push_str("; includeSubDomains");
        }
        if preload {
            line.push_str("; preload");
        }
        line.push_str("\r\n");
        line.into_bytes().into_boxed_slice()
    }
}

/// Every branded domain, by name. Immutable: a change builds a new set.
#[derive(Debug, Clone, Default)]
pub struct Domains {
    by_name: HashMap<Box<[u8]>, Domain>,
    /// The default domain has a lazy fallback ([`Domain::legacy_fallback`]).
    default_legacy_fallback: bool,
}

impl Domains {
    /// No branded domain: every request is the default domain's.
    pub fn empty() -> Domains {
        Domains::default()
    }

    /// The set of `domains` (names that are no domain are left out; the last of a repeated
    /// name wins).
    pub fn new(domains: impl IntoIterator<Item = Domain>) -> Domains {
        let by_name = domains
            .into_iter()
            .filter(|d| domain_shape(&d.name))
            .map(|d| (d.name.clone(), d))
            .collect();
        Domains {
            by_name,
            default_legacy_fallback: false,
        }
    }

    /// This set with the default domain's lazy fallback on or off.
    pub fn with_default_legacy_fallback(mut self, on: bool) -> Domains {
        self.default_legacy_fallback = on;
        self
    }

    /// Whether a legacy-shaped code unknown on `domain` (`None`: the default domain) is read
    /// through the origin (its old shortener may have it) rather than answered 404.
    #[inline]
    pub fn legacy_fallback(&self, domain: Option<&Domain>) -> bool {
        match domain {
            Some(d) => d.legacy_fallback,
            None => self.default_legacy_fallback,
        }
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The branded domain a `Host` value names (any case, a port and a trailing dot allowed),
    /// if it is one. Allocates nothing.
    #[inline]
    pub fn find(&self, host: &[u8]) -> Option<&Domain> {
        if self.by_name.is_empty() {
            return None;
        }
        self.find_in(host)
    }

    #[inline(never)]
    fn find_in(&self, host: &[u8]) -> Option<&Domain> {
        // An IPv6 literal is `[…]`, never a domain; a port follows the last colon otherwise.
        let name = match host.iter().rposition(|&b| b == b':') {
            Some(at) if host.first() != Some(&b'[') => host.get(..at)?,
            _ => host,
        };
        let name = name.strip_suffix(b".").unwrap_or(name);
        if name.is_empty() || name.len() > DOMAIN_MAX {
            return None;
        }
        if name.iter().any(u8::is_ascii_uppercase) {
            let mut lower = [0u8; DOMAIN_MAX];
            let lower = lower.get_mut(..name.len())?;
            lower.copy_from_slice(name);
            lower.make_ascii_lowercase();
            return self.by_name.get(&*lower);
        }
        self.by_name.get(name)
    }

    /// Every domain, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Domain> {
        self.by_name.values()
    }
}

/// A link key built for a lookup: `domain/code` on a branded domain, without allocating.
#[derive(Debug, Clone)]
pub struct KeyBuf {
    buf: [u8; KEY_MAX],
    len: usize,
}

impl Default for KeyBuf {
    fn default() -> Self {
        KeyBuf {
            buf: [0; KEY_MAX],
            len: 0,
        }
    }
}

/// The link key of `code` on `domain`: the code itself on the default domain (`None`; nothing
/// is built, so the default domain's requests never touch `slot`), `domain/code` built in
/// `slot` on a branded one.
#[inline]
pub fn link_key<'k>(
    slot: &'k mut Option<KeyBuf>,
    domain: Option<&Domain>,
    code: &'k [u8],
) -> &'k [u8] {
    match domain {
        None => code,
        Some(domain) => slot.insert(KeyBuf::default()).key(domain, code),
    }
}

impl KeyBuf {
    /// The key of `code` on `domain`. A code too long for any key gives an empty key, which
    /// nothing holds.
    #[inline]
    pub fn key<'k>(&'k mut self, domain: &Domain, code: &[u8]) -> &'k [u8] {
        let len = domain.name.len() + 1 + code.len();
        let Some(out) = self.buf.get_mut(..len) else {
            return &[];
        };
        let (name, rest) = out.split_at_mut(domain.name.len());
        name.copy_from_slice(&domain.name);
        if let Some((sep, tail)) = rest.split_first_mut() {
            *sep = KEY_SEPARATOR;
            tail.copy_from_slice(code);
        }
        self.len = len;
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_host_in_any_form() {
        let d = Domains::new([Domain::new("go.example.com"), Domain::new("not a domain")]);
        assert_eq!(d.len(), 1);
        for host in [
            &b"go.example.com"[..],
            b"GO.Example.com",
            b"go.example.com:443",
            b"go.example.com.",
            b"Go.Example.Com.:8443",
        ] {
            assert_eq!(
                d.find(host).map(|d| &*d.name),
                Some(&b"go.example.com"[..]),
                "{}",
                String::from_utf8_lossy(host)
            );
        }
        for host in [
            &b""[..],
            b"example.com",
            b"[::1]:443",
            b"127.0.0.1:8080",
            b"x.go.example.com",
            &[b'a'; 300][..],
        ] {
            assert!(d.find(host).is_none(), "{}", String::from_utf8_lossy(host));
        }
        assert!(Domains::empty().find(b"go.example.com").is_none());
    }

    #[test]
    fn keys() {
        let mut slot = None;
        let d = Domain::new("lh.example");
        assert_eq!(
            link_key(&mut slot, Some(&d), b"spring-sale"),
            b"lh.example/spring-sale"
        );
        let mut slot = None;
        assert_eq!(link_key(&mut slot, None, b"spring-sale"), b"spring-sale");
        assert!(slot.is_none(), "nothing built for the default domain");
        let long = [b'a'; KEY_MAX];
        assert_eq!(link_key(&mut slot, Some(&d), &long), b"");
    }

    #[test]
    fn hsts() {
        assert_eq!(
            &*Domain::hsts_line(31_536_000, true, true),
            b"Strict-Transport-Security: max-age=31536000; includeSubDomains; preload\r\n"
        );
        assert_eq!(
            &*Domain::hsts_line(600, false, false),
            b"Strict-Transport-Security: max-age=600\r\n"
        );
    }
}
