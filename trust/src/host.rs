//! Canonical hosts: the one spelling every reputation match, index key and velocity count is
//! made on.
//!
//! A host reaches us in many spellings that all name the same machine: any letter case, a
//! trailing dot, percent-encoded bytes, Unicode or punycode labels, and for IPv4 the decimal,
//! hex and octal forms browsers still accept, or an IPv4-mapped IPv6 address. Parsing goes
//! through the WHATWG host parser of the `url` crate (percent-decoding, UTS #46 mapping to
//! lowercase punycode, the IPv4 number forms), then drops trailing dots and unwraps mapped
//! addresses, so every spelling of one host ends as one [`CanonicalHost`].

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Longest host name (RFC 1035: 253 characters without the trailing dot).
pub const MAX_HOST_LEN: usize = 253;

/// A host in its one canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CanonicalHost {
    /// Lowercase ASCII (IDN labels as punycode), no trailing dot, never empty.
    Domain(String),
    V4(Ipv4Addr),
    /// Never IPv4-mapped (`::ffff:a.b.c.d` is [`CanonicalHost::V4`]).
    V6(Ipv6Addr),
}

/// Why a host entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the host is longer than {MAX_HOST_LEN} characters")]
    TooLong,
    #[error("not a valid host name")]
    Invalid,
}

impl CanonicalHost {
    /// The canonical form of a parsed URL host.
    pub fn from_host<S: AsRef<str>>(host: &Host<S>) -> Option<CanonicalHost> {
        match host {
            Host::Domain(d) => {
                let d = d.as_ref().trim_end_matches('.');
                if d.is_empty() || d.len() > MAX_HOST_LEN {
                    None
                } else {
                    // The WHATWG parser already lowercased and punycoded it; lowercase again
                    // for hosts built by hand.
                    Some(CanonicalHost::Domain(d.to_ascii_lowercase()))
                }
            }
            Host::Ipv4(ip) => Some(CanonicalHost::V4(*ip)),
            Host::Ipv6(ip) => Some(match ip.to_ipv4_mapped() {
                Some(v4) => CanonicalHost::V4(v4),
                None => CanonicalHost::V6(*ip),
            }),
        }
    }

    /// The canonical host of `url`, if it has one.
    pub fn of_url(url: &Url) -> Option<CanonicalHost> {
        CanonicalHost::from_host(&url.host()?)
    }

    /// A host as an operator or a feed writes it: a name in any case, Unicode or punycode,
    /// percent-encoded or with a trailing dot; an IPv4 address in any spelling the WHATWG
    /// parser accepts (dotted, decimal `3232235777`, hex `0xc0a80101`, octal `0300.0250.1.1`);
    /// or an IPv6 address with or without brackets.
    pub fn parse(s: &str) -> Result<CanonicalHost, HostError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(HostError::Empty);
        }
        // A generous bound before any work: percent-encoding can triple a name's length.
        if s.len() > 3 * MAX_HOST_LEN + 8 {
            return Err(HostError::TooLong);
        }
        let bare = s
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(s);
        if let Ok(ip) = bare.parse::<Ipv6Addr>() {
            return CanonicalHost::from_host(&Host::<&str>::Ipv6(ip)).ok_or(HostError::Invalid);
        }
        let host = Host::parse(s).map_err(|_| HostError::Invalid)?;
        match &host {
            Host::Domain(d) if d.trim_end_matches('.').is_empty() => Err(HostError::Empty),
            Host::Domain(d) if d.trim_end_matches('.').len() > MAX_HOST_LEN => {
                Err(HostError::TooLong)
            }
            Host::Domain(d) if d.split('.').any(|l| l.len() > 63) => Err(HostError::Invalid),
            _ => CanonicalHost::from_host(&host).ok_or(HostError::Invalid),
        }
    }

    /// The domain name, for a [`CanonicalHost::Domain`].
    pub fn as_domain(&self) -> Option<&str> {
        match self {
            CanonicalHost::Domain(d) => Some(d),
            _ => None,
        }
    }

    /// Whether this is an IP literal rather than a name.
    pub fn is_ip(&self) -> bool {
        !matches!(self, CanonicalHost::Domain(_))
    }

    /// The name this host is listed and looked up under in memory: the domain itself, or the
    /// address in its canonical text (`1.2.3.4`, `2001:db8::1`).
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The key of the store's destination index, ordered so that a host and all of its
    /// subdomains form one contiguous range: a domain's labels reversed (`www.evil.example`
    /// → `example.evil.www`; its subdomains all start with `example.evil.www.`), an address as
    /// `#4:1.2.3.4` or `#6:2001:db8::1` (no label starts with `#`, so the two never meet).
    pub fn index_key(&self) -> String {
        match self {
            CanonicalHost::Domain(d) => {
                let mut key = String::with_capacity(d.len());
                for (i, label) in d.rsplit('.').enumerate() {
                    if i > 0 {
                        key.push('.');
                    }
                    key.push_str(label);
                }
                key
            }
            CanonicalHost::V4(ip) => format!("#4:{ip}"),
            CanonicalHost::V6(ip) => format!("#6:{ip}"),
        }
    }

    /// The registrable domain (the Public Suffix List's "eTLD+1": `evil.example.co.uk` for
    /// `a.b.evil.example.co.uk`); `None` for an address or a name that is itself a public
    /// suffix.
    pub fn registrable_domain(&self) -> Option<&str> {
        match self {
            CanonicalHost::Domain(d) => psl::domain_str(d),
            _ => None,
        }
    }

    /// The unit creation velocity counts: the registrable domain, else the whole host (an
    /// address, or a name the Public Suffix List has no domain for).
    pub fn velocity_key(&self) -> String {
        self.registrable_domain()
            .map(str::to_owned)
            .unwrap_or_else(|| self.name())
    }

    /// Whether the host is a public suffix (`co.uk`, `github.io`, a bare TLD): a host entry
    /// naming one would cover a whole registry, so lists may not.
    pub fn is_public_suffix(&self) -> bool {
        match self {
            CanonicalHost::Domain(d) => psl::suffix_str(d).is_some_and(|s| s == d),
            _ => false,
        }
    }

    /// Every name a host entry covering this host could be listed under, most specific first:
    /// the host, then each parent domain (`a.b.evil.example`, `b.evil.example`,
    /// `evil.example`, `example`). An address is only itself.
    pub fn lookup_names(&self) -> LookupNames<'_> {
        match self {
            CanonicalHost::Domain(d) => LookupNames::Domain(Some(d)),
            _ => LookupNames::Ip(Some(self)),
        }
    }

    /// The number of labels, 1 for an address.
    pub fn labels(&self) -> usize {
        match self {
            CanonicalHost::Domain(d) => d.split('.').count(),
            _ => 1,
        }
    }
}

impl fmt::Display for CanonicalHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CanonicalHost::Domain(d) => f.write_str(d),
            CanonicalHost::V4(ip) => write!(f, "{ip}"),
            CanonicalHost::V6(ip) => write!(f, "{ip}"),
        }
    }
}

/// The iterator of [`CanonicalHost::lookup_names`].
#[derive(Debug, Clone)]
pub enum LookupNames<'a> {
    Domain(Option<&'a str>),
    Ip(Option<&'a CanonicalHost>),
}

/// A name [`LookupNames`] yields: a slice of the domain, or an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupName<'a> {
    Domain(&'a str),
    Ip(&'a CanonicalHost),
}

impl<'a> Iterator for LookupNames<'a> {
    type Item = LookupName<'a>;

    fn next(&mut self) -> Option<LookupName<'a>> {
        match self {
            LookupNames::Domain(rest) => {
                let current = rest.take()?;
                *rest = current.split_once('.').map(|(_, parent)| parent);
                Some(LookupName::Domain(current))
            }
            LookupNames::Ip(ip) => ip.take().map(LookupName::Ip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        CanonicalHost::parse(s).unwrap().to_string()
    }

    #[test]
    fn spellings_of_one_name_agree() {
        for s in [
            "evil.example",
            "EVIL.Example",
            "evil.example.",
            "evil.example..",
            "%65vil.example",
            "evil%2Eexample",
            " evil.example ",
        ] {
            assert_eq!(canon(s), "evil.example", "{s:?}");
        }
        assert_eq!(canon("bücher.example"), "xn--bcher-kva.example");
        assert_eq!(canon("XN--BCHER-KVA.example"), "xn--bcher-kva.example");
    }

    #[test]
    fn ipv4_spellings_agree() {
        for s in [
            "192.0.2.1",
            "3221225985",
            "0xc0000201",
            "0xC0.0.2.1",
            "0300.0.2.1",
            "0300.0.0002.01",
            "192.0.2.1.",
            "::ffff:192.0.2.1",
            "[::ffff:192.0.2.1]",
            "[::ffff:c000:201]",
        ] {
            assert_eq!(canon(s), "192.0.2.1", "{s:?}");
        }
        assert_eq!(canon("[2001:DB8::1]"), "2001:db8::1");
        assert_eq!(canon("2001:db8:0::1"), "2001:db8::1");
    }

    #[test]
    fn refusals() {
        assert_eq!(CanonicalHost::parse(""), Err(HostError::Empty));
        assert_eq!(CanonicalHost::parse("..."), Err(HostError::Empty));
        assert!(CanonicalHost::parse("a b.example").is_err());
        assert!(CanonicalHost::parse("evil/.example").is_err());
        assert!(CanonicalHost::parse(&"a".repeat(70)).is_err());
        assert!(CanonicalHost::parse(&format!("{}.example", "a.".repeat(200))).is_err());
        assert!(CanonicalHost::parse("256.256.256.256").is_err());
    }

    #[test]
    fn index_keys_keep_subdomains_together() {
        let h = CanonicalHost::parse("www.evil.example").unwrap();
        assert_eq!(h.index_key(), "example.evil.www");
        assert_eq!(
            CanonicalHost::parse("192.0.2.1").unwrap().index_key(),
            "#4:192.0.2.1"
        );
        assert_eq!(
            CanonicalHost::parse("2001:db8::1").unwrap().index_key(),
            "#6:2001:db8::1"
        );
        let parent = CanonicalHost::parse("evil.example").unwrap().index_key();
        assert!(h.index_key().starts_with(&format!("{parent}.")));
    }

    #[test]
    fn public_suffixes_and_registrable_domains() {
        for s in ["co.uk", "github.io", "com", "example"] {
            assert!(CanonicalHost::parse(s).unwrap().is_public_suffix(), "{s}");
        }
        for s in ["evil.co.uk", "someone.github.io", "evil.example"] {
            assert!(!CanonicalHost::parse(s).unwrap().is_public_suffix(), "{s}");
        }
        let h = CanonicalHost::parse("a.b.evil.co.uk").unwrap();
        assert_eq!(h.registrable_domain(), Some("evil.co.uk"));
        assert_eq!(h.velocity_key(), "evil.co.uk");
        let ip = CanonicalHost::parse("192.0.2.1").unwrap();
        assert_eq!(
            (ip.registrable_domain(), ip.velocity_key()),
            (None, "192.0.2.1".into())
        );
    }

    #[test]
    fn lookup_names_walk_up() {
        let h = CanonicalHost::parse("a.b.evil.example").unwrap();
        let names: Vec<_> = h.lookup_names().collect();
        assert_eq!(
            names,
            [
                LookupName::Domain("a.b.evil.example"),
                LookupName::Domain("b.evil.example"),
                LookupName::Domain("evil.example"),
                LookupName::Domain("example"),
            ]
        );
        let ip = CanonicalHost::parse("192.0.2.1").unwrap();
        assert_eq!(ip.lookup_names().collect::<Vec<_>>(), [LookupName::Ip(&ip)]);
    }
}
