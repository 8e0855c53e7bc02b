//! Chained shorteners: a destination on another shortener's domain, or on our own short
//! domain, hides where the link really goes (and our own short links would let one takedown be
//! dodged through another code), so creation refuses both unless told otherwise.

use std::collections::HashSet;

use url::Url;

use crate::host::{CanonicalHost, LookupName};

const SHIPPED: &str = include_str!("../data/shorteners.txt");

/// Known shortener domains.
#[derive(Debug, Clone)]
pub struct Shorteners {
    domains: HashSet<String>,
}

impl Shorteners {
    /// The shipped list (`data/shorteners.txt`).
    pub fn shipped() -> Shorteners {
        let mut s = Shorteners {
            domains: HashSet::new(),
        };
        s.add_text(SHIPPED);
        s
    }

    /// Adds the domains of a list in the same format (one a line, `#` comments); returns the
    /// lines that are no host name (1-based), which were skipped.
    pub fn add_text(&mut self, text: &str) -> Vec<usize> {
        let mut bad = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match CanonicalHost::parse(line) {
                Ok(CanonicalHost::Domain(d)) => {
                    self.domains.insert(d);
                }
                _ => bad.push(n + 1),
            }
        }
        bad
    }

    /// How many domains are listed.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether no domain is listed.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `host` is a listed shortener or one of its subdomains.
    pub fn contains(&self, host: &CanonicalHost) -> bool {
        host.lookup_names().any(|n| match n {
            LookupName::Domain(d) => self.domains.contains(d),
            LookupName::Ip(_) => false,
        })
    }
}

/// Our own short domain (`--short-base`): a destination there would be a link to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortDomain {
    host: CanonicalHost,
    /// The port, when the base names one that is not its scheme's default (test set-ups on
    /// `127.0.0.1:PORT`): then only that port is ours.
    port: Option<u16>,
}

impl ShortDomain {
    /// From the short base URL; `None` if it has no host.
    pub fn from_base(base: &str) -> Option<ShortDomain> {
        let url = Url::parse(base).ok()?;
        Some(ShortDomain {
            host: CanonicalHost::of_url(&url)?,
            port: url.port(),
        })
    }

    /// Whether `url` points at the short domain (or a subdomain of a short domain name).
    pub fn covers(&self, url: &Url, host: &CanonicalHost) -> bool {
        if self.port.is_some() && url.port_or_known_default() != self.port {
            return false;
        }
        match (&self.host, host) {
            (CanonicalHost::Domain(ours), CanonicalHost::Domain(theirs)) => {
                theirs == ours
                    || theirs
                        .strip_suffix(ours.as_str())
                        .is_some_and(|sub| sub.ends_with('.'))
            }
            (ours, theirs) => ours == theirs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> CanonicalHost {
        CanonicalHost::parse(s).unwrap()
    }

    #[test]
    fn shipped_list_is_clean_and_matches_subdomains() {
        let bad = Shorteners {
            domains: HashSet::new(),
        }
        .add_text(SHIPPED);
        assert!(bad.is_empty(), "malformed lines {bad:?}");
        let s = Shorteners::shipped();
        assert!(s.len() > 50);
        for yes in ["bit.ly", "BIT.LY.", "www.bit.ly", "tinyurl.com", "t.co"] {
            assert!(s.contains(&host(yes)), "{yes}");
        }
        for no in ["example.com", "notbit.ly", "t.com", "192.0.2.1"] {
            assert!(!s.contains(&host(no)), "{no}");
        }
    }

    #[test]
    fn own_domain() {
        let ours = ShortDomain::from_base("https://lh.example").unwrap();
        let covers = |u: &str| {
            let url = Url::parse(u).unwrap();
            ours.covers(&url, &CanonicalHost::of_url(&url).unwrap())
        };
        assert!(covers("https://lh.example/abcdefg"));
        assert!(covers("http://LH.example./x"));
        assert!(covers("https://www.lh.example/x"));
        assert!(!covers("https://notlh.example/x"));
        assert!(!covers("https://example/x"));

        let local = ShortDomain::from_base("http://127.0.0.1:8080").unwrap();
        let url = Url::parse("http://127.0.0.1:8080/abcdefg").unwrap();
        assert!(local.covers(&url, &CanonicalHost::of_url(&url).unwrap()));
        let other = Url::parse("http://127.0.0.1:9999/x").unwrap();
        assert!(!local.covers(&other, &CanonicalHost::of_url(&other).unwrap()));
    }
}
