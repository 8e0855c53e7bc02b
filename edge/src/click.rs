//! A click event from an answered redirect, without I/O: the visitor hash under the day's salt,
//! the referrer's host, the user agent cut and cleaned, the country from a trusted header, and
//! the event encoded (`core/EVENTS.md` is the contract). The engine's per-core recorder owns one
//! [`ClickBuilder`], adds what needs the machine (the peer's address, a GeoIP lookup) and puts the
//! bytes in its core's buffer.
//!
//! The client address does not leave the edge: the event carries a keyed hash of address and
//! user agent under a salt that changes every UTC day (so one visitor cannot be followed from
//! day to day in the data at rest), and the address's /24 or /48.

use std::borrow::Cow;
use std::hash::Hasher;
use std::net::IpAddr;

use lasthop_core::click::{self, ClickEvent, EventId, Method as ClickMethod, Net};
use lasthop_core::code::domain_shape;
use sha2::{Digest, Sha256};
use siphasher::sip::SipHasher13;

use crate::http::{Method, Request};

/// One core's event builder: the visitor key, this engine's PoP and event-id nonce, the next
/// sequence number, and the salt of the day last used.
#[derive(Debug, Clone)]
pub struct ClickBuilder {
    visitor_key: [u8; 32],
    nonce: u64,
    seq: u64,
    /// (day, k0, k1).
    salt: Option<(i64, u64, u64)>,
}

/// What the machine knows about a click beyond the request: the peer and its country.
#[derive(Debug, Clone, Copy, Default)]
pub struct Origin {
    /// The client's address (an IPv4-mapped IPv6 address counts as IPv4).
    pub peer: Option<IpAddr>,
    /// From a GeoIP lookup of `peer`; a trusted country header on the request wins.
    pub country: Option<[u8; 2]>,
    /// Arrived over TLS.
    pub https: bool,
    /// The HTTP version it arrived over.
    pub protocol: click::Protocol,
    /// It came in TLS or QUIC 0-RTT early data.
    pub early: bool,
}

impl ClickBuilder {
    /// A builder hashing visitors under `visitor_key`, numbering its events from 0 under
    /// `nonce` (unique per engine and core, so event ids never collide).
    pub fn new(visitor_key: [u8; 32], nonce: u64) -> ClickBuilder {
        ClickBuilder {
            visitor_key,
            nonce,
            seq: 0,
            salt: None,
        }
    }

    /// The SipHash keys of the UTC day of `now_ms`, derived once a day.
    fn salt(&mut self, now_ms: i64) -> (u64, u64) {
        let day = lasthop_core::day::of_ms(now_ms);
        match self.salt {
            Some((d, k0, k1)) if d == day => (k0, k1),
            _ => {
                let (k0, k1) = day_salt(&self.visitor_key, day);
                self.salt = Some((day, k0, k1));
                (k0, k1)
            }
        }
    }

    /// Encodes the click of a redirect of `code` on `domain` answering `req` at `now_ms` onto
    /// `out`, for PoP `pop`. `domain` is the branded domain the request named, as the link's
    /// key has it (lower case, no port, no trailing dot: [`domain_shape`]), or empty for the
    /// default domain: the event is then version 1, else version 2 (`core/EVENTS.md`). Returns
    /// false (and writes nothing) when `code` is not text or `domain` is neither empty nor a
    /// domain name, since an event the processor refuses would also cost the rest of its batch.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &mut self,
        req: &Request<'_>,
        code: &[u8],
        domain: &[u8],
        pop: &str,
        from: Origin,
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> bool {
        let Ok(code) = std::str::from_utf8(code) else {
            return false;
        };
        if !domain.is_empty() && !domain_shape(domain) {
            return false;
        }
        // `domain_shape` admits ASCII only.
        let Ok(domain) = std::str::from_utf8(domain) else {
            return false;
        };
        let peer = from.peer.map(unmapped);
        let (k0, k1) = self.salt(now_ms);
        let mut h = SipHasher13::new_with_keys(k0, k1);
        match peer {
            Some(IpAddr::V4(a)) => h.write(&a.octets()),
            Some(IpAddr::V6(a)) => h.write(&a.octets()),
            None => {}
        }
        h.write_u8(0xff);
        h.write(req.user_agent);
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        let ua = user_agent(req.user_agent);
        let mut host = [0u8; click::MAX_REFERRER_HOST];
        let country = if req.country.is_empty() {
            from.country
        } else {
            iso_country(req.country)
        };
        ClickEvent {
            id: EventId::new(self.nonce, seq),
            at_ms: now_ms.max(0) as u64,
            code,
            domain,
            pop,
            country,
            method: if req.method == Method::Head {
                ClickMethod::Head
            } else {
                ClickMethod::Get
            },
            tls: from.https,
            prefetch: req.prefetch,
            protocol: from.protocol,
            early: from.early,
            visitor: h.finish(),
            net: peer.map(Net::of),
            user_agent: &ua,
            referrer_host: referrer_host(req.referer, &mut host),
        }
        .encode(out);
        true
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// SipHash keys for `day` (days since the Unix epoch, UTC).
fn day_salt(key: &[u8; 32], day: i64) -> (u64, u64) {
    let mut h = Sha256::new();
    h.update(b"lasthop visitor salt v1\0");
    h.update(key);
    h.update(day.to_le_bytes());
    let d = h.finalize();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&d[i..i + 8]);
        u64::from_le_bytes(w)
    };
    (word(0), word(8))
}

/// Two ASCII letters as an upper-case ISO 3166-1 alpha-2 code; the "unknown" and "Tor" codes
/// some CDNs send (`XX`, `T1`) and anything else give `None`.
pub fn iso_country(v: &[u8]) -> Option<[u8; 2]> {
    match v {
        [a, b] if a.is_ascii_alphabetic() && b.is_ascii_alphabetic() => {
            let c = [a.to_ascii_uppercase(), b.to_ascii_uppercase()];
            (c != *b"XX").then_some(c)
        }
        _ => None,
    }
}

/// The host of a `Referer` value, lower-cased into `buf`; empty when there is none or it is not
/// a plain host name or address.
pub fn referrer_host<'b>(referer: &[u8], buf: &'b mut [u8; click::MAX_REFERRER_HOST]) -> &'b str {
    let Some(at) = referer.windows(3).position(|w| w == b"://") else {
        return "";
    };
    let rest = &referer[at + 3..];
    let end = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let mut authority = &rest[..end];
    if let Some(i) = authority.iter().rposition(|&b| b == b'@') {
        authority = &authority[i + 1..];
    }
    let host = if authority.first() == Some(&b'[') {
        match authority.iter().position(|&b| b == b']') {
            Some(i) => &authority[..=i],
            None => return "",
        }
    } else {
        match authority.iter().position(|&b| b == b':') {
            Some(i) => &authority[..i],
            None => authority,
        }
    };
    if host.is_empty() || host.len() > buf.len() {
        return "";
    }
    for (d, s) in buf.iter_mut().zip(host) {
        *d = s.to_ascii_lowercase();
    }
    match std::str::from_utf8(&buf[..host.len()]) {
        Ok(h) if click::valid_referrer_host(h) => h,
        _ => "",
    }
}

/// The user agent as printable text, cut to [`click::MAX_USER_AGENT`] bytes.
pub fn user_agent(raw: &[u8]) -> Cow<'_, str> {
    let cut = &raw[..raw.len().min(click::MAX_USER_AGENT)];
    // Nearly every user agent is printable ASCII: check bytes, skip UTF-8 decoding.
    if cut.iter().all(|&b| (0x20..0x7f).contains(&b)) {
        // Printable ASCII is UTF-8.
        return Cow::Borrowed(std::str::from_utf8(cut).unwrap_or_default());
    }
    match std::str::from_utf8(cut) {
        Ok(s) if !s.chars().any(char::is_control) => Cow::Borrowed(s),
        // A cut through a multi-byte character, or bytes no browser sends: keep what is text.
        _ => {
            let lossy = String::from_utf8_lossy(cut)
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect::<String>();
            Cow::Owned(click::truncate(&lossy, click::MAX_USER_AGENT).to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::day::DAY_MS;

    #[test]
    fn referrer_hosts() {
        let mut buf = [0u8; click::MAX_REFERRER_HOST];
        for (raw, want) in [
            (&b"https://www.Example.com/path"[..], "www.example.com"),
            (b"http://[2001:db8::1]:8080/", "[2001:db8::1]"),
            (b"android-app://com.slack/", "com.slack"),
            (b"/relative/only", ""),
            (b"https://bad host/", ""),
            (b"", ""),
        ] {
            assert_eq!(referrer_host(raw, &mut buf), want, "{raw:?}");
        }
    }

    #[test]
    fn user_agents_are_cut_and_cleaned() {
        assert_eq!(user_agent(b"curl/8.5.0"), "curl/8.5.0");
        assert_eq!(user_agent(b"a\x01b\xffc"), "a?b\u{fffd}c");
        let long = "é".repeat(300);
        let cut = user_agent(long.as_bytes());
        assert!(cut.len() <= click::MAX_USER_AGENT && long.starts_with(&*cut));
    }

    #[test]
    fn countries() {
        assert_eq!(iso_country(b"us"), Some(*b"US"));
        assert_eq!(iso_country(b"XX"), None);
        assert_eq!(iso_country(b"USA"), None);
        assert_eq!(iso_country(b"1A"), None);
    }

    #[test]
    fn events_carry_what_the_request_says_and_a_daily_visitor_hash() {
        use crate::http::{parse, Limits, Parse};
        let raw = b"GET /abc1234 HTTP/1.1\r\nHost: a\r\nUser-Agent: Mozilla/5.0 x\r\nReferer: https://News.Example.com/a\r\n\r\n";
        let Parse::Complete { req, .. } = parse(raw, &Limits::default()) else {
            panic!("parses")
        };
        let mut b = ClickBuilder::new([9; 32], 77);
        let from = Origin {
            peer: Some("::ffff:203.0.113.9".parse().unwrap()),
            country: Some(*b"DE"),
            https: true,
            protocol: click::Protocol::H2,
            early: true,
        };
        let day = 1_764_504_000_000;
        let mut out = Vec::new();
        assert!(b.encode(&req, b"abc1234", b"", "fra1", from, day, &mut out));
        assert!(b.encode(&req, b"abc1234", b"", "fra1", from, day + 1, &mut out));
        assert!(b.encode(&req, b"abc1234", b"", "fra1", from, day + DAY_MS, &mut out));
        assert!(
            !b.encode(&req, b"\xff", b"", "fra1", from, day, &mut out),
            "not text"
        );
        let events: Vec<_> = click::spool::events(&out).map(|e| e.unwrap()).collect();
        assert_eq!(events.len(), 3);
        let e = &events[0];
        assert_eq!((e.code, e.pop), ("abc1234", "fra1"));
        assert_eq!(e.referrer_host, "news.example.com");
        assert_eq!(e.country, Some(*b"DE"));
        assert!(e.tls);
        assert!(e.early);
        assert_eq!(
            e.net,
            Some(Net::of("203.0.113.9".parse().unwrap())),
            "unmapped"
        );
        assert_eq!(events[0].visitor, events[1].visitor, "same day");
        assert_ne!(events[0].visitor, events[2].visitor, "another day's salt");
        assert_ne!(events[0].id, events[1].id);
        assert!(!e.prefetch);
        let raw = b"GET /abc1234 HTTP/1.1\r\nHost: a\r\nSec-Purpose: prefetch;prerender\r\n\r\n";
        let Parse::Complete { req, .. } = parse(raw, &Limits::default()) else {
            panic!("parses")
        };
        out.clear();
        assert!(b.encode(&req, b"abc1234", b"", "fra1", from, day, &mut out));
        let (e, _) = ClickEvent::decode(&out).unwrap();
        assert!(e.prefetch, "the prefetch flag travels with the event");
    }

    #[test]
    fn a_branded_domain_travels_with_the_event() {
        use crate::http::{parse, Limits, Parse};
        let raw = b"GET /spring-sale HTTP/1.1\r\nHost: go.example.com\r\nUser-Agent: Mozilla/5.0 x\r\n\r\n";
        let Parse::Complete { req, .. } = parse(raw, &Limits::default()) else {
            panic!("parses")
        };
        let mut b = ClickBuilder::new([9; 32], 77);
        let from = Origin::default();
        let now = 1_764_504_000_000;
        let mut out = Vec::new();
        assert!(b.encode(
            &req,
            b"spring-sale",
            b"go.example.com",
            "fra1",
            from,
            now,
            &mut out
        ));
        assert!(b.encode(&req, b"spring-sale", b"", "fra1", from, now, &mut out));
        // Not a domain as a link key has it: nothing written, nothing numbered.
        for bad in [
            &b"Go.Example.com"[..],
            b"go.example.com:443",
            b"localhost",
            b"go.example.com.",
        ] {
            assert!(!b.encode(&req, b"spring-sale", bad, "fra1", from, now, &mut out));
        }
        let events: Vec<_> = click::spool::events(&out).map(|e| e.unwrap()).collect();
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].domain, events[0].code),
            ("go.example.com", "spring-sale")
        );
        assert_eq!(events[0].link_key(), "go.example.com/spring-sale");
        assert_eq!(out[0], 2, "version 2 with a domain");
        assert_eq!(
            (events[1].domain, events[1].link_key()),
            ("", "spring-sale".into())
        );
        assert_eq!(events[1].version(), 1, "version 1 on the default domain");
        assert_eq!(events[1].id.0, events[0].id.0 + 1);
    }
}
