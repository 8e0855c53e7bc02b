//! The scanner's own signals: what a destination's URL says about it before anyone has
//! listed it. Each is a reason for the warning interstitial, not for a takedown (a list or the
//! verdict service decides that): a real page may sit on an IP address, and a real company may
//! use a deep subdomain.
//!
//! - an IP-literal host (malware downloads and throwaway phishing kits use them; real sites
//!   have names);
//! - credentials in the URL (`https://paypal.com@evil.example/`: the part before `@` only
//!   dresses the link up; creation already refuses these, the re-scan still checks old links);
//! - an IDN host whose registrable label renders like a brand (UTS #39 confusable skeletons:
//!   `аpple.example` with a Cyrillic `а`), or mixes scripts within one label;
//! - a brand as a subdomain label of someone else's domain (`paypal.com.evil.example`);
//! - excessive subdomain depth (five or more labels before the registrable domain).

use std::collections::HashMap;

use unicode_security::{skeleton, MixedScript};
use url::Url;

use crate::destination::Destination;
use crate::host::CanonicalHost;

/// Labels before the registrable domain from which a host counts as excessively deep.
pub const DEEP_SUBDOMAINS: usize = 5;

/// One signal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    IpLiteral,
    Credentials,
    /// The host's registrable label renders like `brand`.
    LookalikeIdn {
        brand: String,
    },
    /// A label of the host mixes scripts (Latin with Cyrillic, say).
    MixedScript,
    /// `brand` appears as a subdomain label of a domain that is not the brand's.
    BrandInSubdomain {
        brand: String,
    },
    /// This many labels before the registrable domain.
    DeepSubdomains {
        depth: usize,
    },
}

impl Signal {
    /// A stable, short reason (`heuristic:<name>`, with the brand where there is one).
    pub fn reason(&self) -> String {
        match self {
            Signal::IpLiteral => "heuristic:ip_literal".into(),
            Signal::Credentials => "heuristic:credentials".into(),
            Signal::LookalikeIdn { brand } => format!("heuristic:lookalike_idn:{brand}"),
            Signal::MixedScript => "heuristic:mixed_script".into(),
            Signal::BrandInSubdomain { brand } => format!("heuristic:brand_in_subdomain:{brand}"),
            Signal::DeepSubdomains { depth } => format!("heuristic:deep_subdomains:{depth}"),
        }
    }
}

/// The brands to compare hosts with, as skeletons.
#[derive(Debug, Clone)]
pub struct Heuristics {
    /// skeleton → brand.
    brands: HashMap<String, String>,
}

fn skeleton_of(s: &str) -> String {
    skeleton(s).collect::<String>().to_lowercase()
}

impl Heuristics {
    /// Compares hosts with `brands` (lowercase ASCII names, e.g. `paypal`).
    pub fn new<'a>(brands: impl IntoIterator<Item = &'a str>) -> Heuristics {
        Heuristics {
            brands: brands
                .into_iter()
                .filter(|b| b.len() >= 4)
                .map(|b| (skeleton_of(b), b.to_string()))
                .collect(),
        }
    }

    /// Every signal `url` (whose destination is `dest`) raises, strongest first.
    pub fn check(&self, url: &Url, dest: &Destination) -> Vec<Signal> {
        let mut out = Vec::new();
        if !url.username().is_empty() || url.password().is_some() {
            out.push(Signal::Credentials);
        }
        let CanonicalHost::Domain(domain) = &dest.host else {
            out.insert(0, Signal::IpLiteral);
            return out;
        };
        let registrable = dest.host.registrable_domain().unwrap_or(domain);
        let subdomain = domain
            .strip_suffix(registrable)
            .map(|s| s.trim_end_matches('.'))
            .unwrap_or_default();
        let registrable_label = registrable.split('.').next().unwrap_or_default();
        if domain.split('.').any(|l| l.starts_with("xn--")) {
            let (unicode, _) = idna::domain_to_unicode(domain);
            let unicode_registrable = unicode
                .rsplit('.')
                .nth(registrable.split('.').count().saturating_sub(1))
                .unwrap_or_default();
            if unicode_registrable != registrable_label {
                // The registrable label itself is an IDN: does it render like a brand?
                if let Some(brand) = self.brands.get(&skeleton_of(unicode_registrable)) {
                    out.insert(
                        0,
                        Signal::LookalikeIdn {
                            brand: brand.clone(),
                        },
                    );
                }
            }
            if unicode.split('.').any(|l| !l.is_single_script()) {
                out.push(Signal::MixedScript);
            }
        }
        if !subdomain.is_empty() {
            let own = self.brands.get(&skeleton_of(registrable_label));
            for label in subdomain.split('.') {
                if let Some(brand) = self.brands.get(&skeleton_of(label)) {
                    if own != Some(brand) {
                        out.push(Signal::BrandInSubdomain {
                            brand: brand.clone(),
                        });
                        break;
                    }
                }
            }
            let depth = subdomain.split('.').count();
            if depth >= DEEP_SUBDOMAINS {
                out.push(Signal::DeepSubdomains { depth });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(u: &str) -> Vec<String> {
        let h = Heuristics::new(["paypal", "apple", "google", "dhl"]);
        let url = Url::parse(u).unwrap();
        let dest = Destination::of_url(&url).unwrap();
        h.check(&url, &dest).iter().map(Signal::reason).collect()
    }

    #[test]
    fn clean_urls_raise_nothing() {
        for u in [
            "https://example.com/",
            "https://www.paypal.com/signin",
            "https://mail.google.com/x",
            "https://bücher.example/",
            "https://a.b.c.example.co.uk/",
            "https://applesauce.example/",
        ] {
            assert_eq!(signals(u), Vec::<String>::new(), "{u}");
        }
    }

    #[test]
    fn each_signal() {
        assert_eq!(signals("http://192.0.2.7/x.sh"), ["heuristic:ip_literal"]);
        assert_eq!(signals("http://[2001:db8::1]/"), ["heuristic:ip_literal"]);
        assert_eq!(
            signals("https://user:pw@example.com/"),
            ["heuristic:credentials"]
        );
        // Cyrillic а (U+0430) in "аpple", written in Unicode and in punycode.
        assert_eq!(
            signals("https://\u{430}pple.example/"),
            ["heuristic:lookalike_idn:apple", "heuristic:mixed_script"]
        );
        let puny = Url::parse("https://\u{430}pple.example/").unwrap();
        assert!(puny.host_str().unwrap().starts_with("xn--"));
        assert_eq!(
            signals(puny.as_str()),
            ["heuristic:lookalike_idn:apple", "heuristic:mixed_script"]
        );
        // All-Cyrillic look-alike: one script, still a look-alike.
        assert_eq!(
            signals("https://\u{440}\u{430}\u{443}\u{440}\u{430}\u{04cf}.example/"),
            ["heuristic:lookalike_idn:paypal"]
        );
        assert_eq!(
            signals("https://paypal.com.evil.example/login"),
            ["heuristic:brand_in_subdomain:paypal"]
        );
        assert_eq!(
            signals("https://a.b.c.d.e.evil.example/"),
            ["heuristic:deep_subdomains:5"]
        );
    }
}
