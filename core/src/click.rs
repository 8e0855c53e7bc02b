//! Click events: what an edge records per answered redirect, and the spool's frames.
//!
//! The contract is `core/EVENTS.md`. An event travels in a compact, versioned binary form: one
//! Kafka message value (keyed by the link's key: its code, or `domain/code` on a branded domain),
//! or one record in a spool frame. The processor parses it as untrusted bytes
//! ([`ClickEvent::decode`] never panics, rejects anything out of bounds, and every string it
//! hands back is checked). The archive holds the same fields as NDJSON ([`ArchivedClick`]).
//!
//! Version 1 is a click on the default domain, version 2 one on a branded domain (version 1's
//! layout with the domain after the code); [`ClickEvent::encode`] picks the version from the
//! domain, so the default domain's events are byte for byte what they were before domains.
//!
//! Privacy: the client address never leaves the edge. An event carries a salted keyed hash of
//! address and user agent ([`ClickEvent::visitor`], the salt rotates daily) and the address's network
//! truncated to /24 (IPv4) or /48 (IPv6), which is enough to match published crawler ranges.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::code::{classify, domain_shape, CodeKind, DOMAIN_MAX, KEY_SEPARATOR};
use crate::cursor::{Cursor, Truncated};
use crate::feed::valid_name;

/// The newest event format version this build writes and reads: 2, version 1 with the link's
/// branded domain after its code. Readers take both.
pub const EVENT_VERSION: u8 = 2;
/// The version an event of the default domain is written as: 1, byte for byte what builds
/// before branded domains wrote (so a processor that reads version 1 only keeps counting the
/// default domain's clicks). An event with a domain is [`EVENT_VERSION`].
pub const EVENT_VERSION_DEFAULT_DOMAIN: u8 = 1;
/// The version of a click on a legacy code (issue 44: an imported code of another shortener's
/// shape, `lasthop_core::code::CodeKind::Legacy`): version 2's layout, whose domain may be
/// empty (the default domain), with a code of 1–64 of `[A-Za-z0-9_-]`. Versions 1 and 2 carry
/// generated codes and aliases only, as before; an older reader refuses a version-3 event.
pub const EVENT_VERSION_LEGACY: u8 = 3;
/// Longest user agent an event carries; the edge truncates (on a character boundary).
pub const MAX_USER_AGENT: usize = 256;
/// Longest referrer host an event carries (a DNS name is at most 253).
pub const MAX_REFERRER_HOST: usize = 253;
/// Fixed part of an encoded event: version, flags, id, time, visitor, country, network.
const FIXED_LEN: usize = 1 + 1 + 16 + 8 + 8 + 2 + 6;
/// Largest encoded event (a version 2 one, with the longest domain).
pub const MAX_EVENT_LEN: usize =
    FIXED_LEN + 1 + 64 + 1 + DOMAIN_MAX + 1 + 64 + 1 + MAX_REFERRER_HOST + 2 + MAX_USER_AGENT;

const FLAG_HEAD: u8 = 1;
const FLAG_TLS: u8 = 2;
const FLAG_NET4: u8 = 4;
const FLAG_NET6: u8 = 8;
const FLAG_PREFETCH: u8 = 16;
/// Bits 5 and 6: the HTTP version (0 HTTP/1.x, 1 HTTP/2, 2 HTTP/3; 3 is refused).
const PROTOCOL_SHIFT: u8 = 5;
const FLAG_PROTOCOL: u8 = 3 << PROTOCOL_SHIFT;
/// Bit 7: the request came in TLS or QUIC 0-RTT early data (a replay of it is possible).
const FLAG_EARLY: u8 = 128;
const KNOWN_FLAGS: u8 =
    FLAG_HEAD | FLAG_TLS | FLAG_NET4 | FLAG_NET6 | FLAG_PREFETCH | FLAG_PROTOCOL | FLAG_EARLY;
// Every bit of the flags byte now means something: a new flag needs a new format version.
const _: () = assert!(KNOWN_FLAGS == u8::MAX);

/// An edge-assigned event id: the engine instance's random 64-bit nonce, then its own counter.
/// Unique without coordination; a duplicate id means the same event delivered twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u128);

impl EventId {
    /// The id of the `seq`-th event of the engine instance `nonce`.
    pub fn new(nonce: u64, seq: u64) -> EventId {
        EventId((u128::from(nonce) << 64) | u128::from(seq))
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The client's network, truncated at the edge: IPv4 /24 or IPv6 /48. Never the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Net {
    /// The first three octets of an IPv4 address.
    V4([u8; 3]),
    /// The first six octets of an IPv6 address.
    V6([u8; 6]),
}

impl Net {
    /// The network `ip` belongs to (IPv4-mapped IPv6 counts as IPv4).
    pub fn of(ip: IpAddr) -> Net {
        match ip {
            IpAddr::V4(v4) => Net::from_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Net::from_v4(v4),
                None => {
                    let o = v6.octets();
                    Net::V6([o[0], o[1], o[2], o[3], o[4], o[5]])
                }
            },
        }
    }

    fn from_v4(v4: Ipv4Addr) -> Net {
        let o = v4.octets();
        Net::V4([o[0], o[1], o[2]])
    }

    /// The network's first address (host bits zero).
    pub fn base(&self) -> IpAddr {
        match *self {
            Net::V4([a, b, c]) => IpAddr::V4(Ipv4Addr::new(a, b, c, 0)),
            Net::V6(p) => {
                let mut o = [0u8; 16];
                o[..6].copy_from_slice(&p);
                IpAddr::V6(Ipv6Addr::from(o))
            }
        }
    }

    /// The prefix length: 24 or 48.
    pub fn prefix_len(&self) -> u8 {
        match self {
            Net::V4(_) => 24,
            Net::V6(_) => 48,
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base(), self.prefix_len())
    }
}

impl std::str::FromStr for Net {
    type Err = EventError;
    /// Parses the form [`Net`]'s `Display` writes: `a.b.c.0/24` or `x:y:z::/48`.
    fn from_str(s: &str) -> Result<Net, EventError> {
        let (addr, len) = s.split_once('/').ok_or(EventError::Field("net"))?;
        let ip: IpAddr = addr.parse().map_err(|_| EventError::Field("net"))?;
        let net = Net::of(ip);
        if len != net.prefix_len().to_string() || net.base() != ip {
            return Err(EventError::Field("net"));
        }
        Ok(net)
    }
}

/// The HTTP method of the request that was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Method {
    /// GET.
    #[serde(rename = "GET")]
    Get,
    /// HEAD: answered like GET, classed as a bot by the processor.
    #[serde(rename = "HEAD")]
    Head,
}

/// The HTTP version a redirect was answered over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// HTTP/1.0 or HTTP/1.1.
    #[default]
    #[serde(rename = "h1")]
    H1,
    #[serde(rename = "h2")]
    H2,
    #[serde(rename = "h3")]
    H3,
}

impl Protocol {
    fn bits(self) -> u8 {
        (match self {
            Protocol::H1 => 0,
            Protocol::H2 => 1,
            Protocol::H3 => 2,
        }) << PROTOCOL_SHIFT
    }

    fn from_flags(flags: u8) -> Option<Protocol> {
        match (flags & FLAG_PROTOCOL) >> PROTOCOL_SHIFT {
            0 => Some(Protocol::H1),
            1 => Some(Protocol::H2),
            2 => Some(Protocol::H3),
            _ => None,
        }
    }
}

/// One answered redirect, borrowing its strings from the buffer it was decoded from (or from the
/// request it describes, at the edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClickEvent<'a> {
    /// Edge-assigned unique id.
    pub id: EventId,
    /// When the edge answered, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The code that was redirected.
    pub code: &'a str,
    /// The branded domain the code was redirected on ([`domain_shape`]), empty for the default
    /// domain. The same code on two domains is two links: [`link_key`](Self::link_key).
    pub domain: &'a str,
    /// The engine's PoP name.
    pub pop: &'a str,
    /// ISO 3166-1 alpha-2 country, upper case; `None` when unknown.
    pub country: Option<[u8; 2]>,
    /// GET or HEAD.
    pub method: Method,
    /// Whether the request came over HTTPS.
    pub tls: bool,
    /// The request said it was a prefetch or a preview (a `prefetch` or `preview` token in
    /// `Sec-Purpose`, `Purpose`, `X-Purpose` or `X-Moz`): a browser or an app fetching ahead of
    /// a person who may never click.
    pub prefetch: bool,
    /// The HTTP version it was answered over (flag bits 5-6; rollups ignore it).
    pub protocol: Protocol,
    /// The request came in 0-RTT early data (flag bit 7), which an attacker who saw it can
    /// replay: the processor counts one early click per visitor, code and minute.
    pub early: bool,
    /// Keyed hash of client address and user agent under the day's salt.
    pub visitor: u64,
    /// The client's truncated network, when the edge knew the peer address.
    pub net: Option<Net>,
    /// The user agent, at most [`MAX_USER_AGENT`] bytes of printable text (may be empty).
    pub user_agent: &'a str,
    /// The referrer's host, lower case (empty when none).
    pub referrer_host: &'a str,
}

/// Why bytes are not a click event (or a spool frame).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// Fewer bytes than the format needs.
    #[error("event truncated")]
    Truncated,
    /// A version this build does not read.
    #[error("event version {0} is not supported")]
    Version(u8),
    /// Flags this build does not know.
    #[error("unknown event flags {0:#x}")]
    Flags(u8),
    /// A field out of its rules.
    #[error("event field `{0}` is invalid")]
    Field(&'static str),
    /// A spool frame's checksum does not match its bytes.
    #[error("spool frame checksum mismatch")]
    Checksum,
    /// A spool frame (or segment header) is malformed.
    #[error("spool frame malformed: {0}")]
    Frame(&'static str),
}

impl From<Truncated> for EventError {
    fn from(_: Truncated) -> Self {
        EventError::Truncated
    }
}

/// A UTF-8 string after its one-byte length.
fn str8<'a>(c: &mut Cursor<'a>, field: &'static str) -> Result<&'a str, EventError> {
    let len = usize::from(c.u8()?);
    std::str::from_utf8(c.take(len)?).map_err(|_| EventError::Field(field))
}

/// A UTF-8 string after its two-byte length.
fn str16<'a>(c: &mut Cursor<'a>, field: &'static str) -> Result<&'a str, EventError> {
    let len = usize::from(c.u16()?);
    std::str::from_utf8(c.take(len)?).map_err(|_| EventError::Field(field))
}

/// Printable text: no control characters (so it is safe in logs, JSON and a terminal).
fn printable(s: &str) -> bool {
    // The common case, printable ASCII, without decoding characters.
    s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(char::is_control)
}

/// A referrer host: lower-case DNS characters, or a bracketed IPv6 literal's characters.
pub fn valid_referrer_host(s: &str) -> bool {
    s.len() <= MAX_REFERRER_HOST
        && s.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_')
        })
}

fn valid_country(c: [u8; 2]) -> bool {
    c.iter().all(u8::is_ascii_uppercase)
}

impl<'a> ClickEvent<'a> {
    /// Appends the binary form to `out`: version 1 for the default domain, 2 with a domain. The
    /// fields must satisfy the rules [`decode`](Self::decode) checks (the edge builds them so);
    /// lengths are clamped, never overflowed.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = 0;
        if self.method == Method::Head {
            flags |= FLAG_HEAD;
        }
        if self.tls {
            flags |= FLAG_TLS;
        }
        if self.prefetch {
            flags |= FLAG_PREFETCH;
        }
        flags |= self.protocol.bits();
        if self.early {
            flags |= FLAG_EARLY;
        }
        let mut net = [0u8; 6];
        match self.net {
            Some(Net::V4(p)) => {
                flags |= FLAG_NET4;
                net[..3].copy_from_slice(&p);
            }
            Some(Net::V6(p)) => {
                flags |= FLAG_NET6;
                net = p;
            }
            None => {}
        }
        let version = self.version();
        out.push(version);
        out.push(flags);
        out.extend_from_slice(&self.id.0.to_le_bytes());
        out.extend_from_slice(&self.at_ms.to_le_bytes());
        out.extend_from_slice(&self.visitor.to_le_bytes());
        out.extend_from_slice(&self.country.unwrap_or([0, 0]));
        out.extend_from_slice(&net);
        put_str8(out, self.code, 64);
        if version != EVENT_VERSION_DEFAULT_DOMAIN {
            put_str8(out, self.domain, DOMAIN_MAX);
        }
        put_str8(out, self.pop, 64);
        put_str8(out, self.referrer_host, MAX_REFERRER_HOST);
        let ua = truncate(self.user_agent, MAX_USER_AGENT);
        out.extend_from_slice(&(ua.len() as u16).to_le_bytes());
        out.extend_from_slice(ua.as_bytes());
    }

    /// Parses one event from the front of `buf`; returns it and the bytes it used.
    pub fn decode(buf: &'a [u8]) -> Result<(ClickEvent<'a>, usize), EventError> {
        let mut c = Cursor::new(buf);
        let version = c.u8()?;
        if !matches!(
            version,
            EVENT_VERSION_DEFAULT_DOMAIN | EVENT_VERSION | EVENT_VERSION_LEGACY
        ) {
            return Err(EventError::Version(version));
        }
        let flags = c.u8()?;
        if flags & (FLAG_NET4 | FLAG_NET6) == FLAG_NET4 | FLAG_NET6
            || Protocol::from_flags(flags).is_none()
        {
            return Err(EventError::Flags(flags));
        }
        let id = EventId(u128::from_le_bytes(c.array()?));
        let at_ms = c.u64()?;
        let visitor = c.u64()?;
        let country = match c.array::<2>()? {
            [0, 0] => None,
            cc if valid_country(cc) => Some(cc),
            _ => return Err(EventError::Field("country")),
        };
        let raw_net = c.array::<6>()?;
        let net = if flags & FLAG_NET4 != 0 {
            if raw_net[3..] != [0, 0, 0] {
                return Err(EventError::Field("net"));
            }
            Some(Net::V4([raw_net[0], raw_net[1], raw_net[2]]))
        } else if flags & FLAG_NET6 != 0 {
            Some(Net::V6(raw_net))
        } else if raw_net != [0; 6] {
            return Err(EventError::Field("net"));
        } else {
            None
        };
        let code = str8(&mut c, "code")?;
        // Each version has one form: a legacy code only in version 3, and only there.
        let kind = classify(code.as_bytes());
        if kind == CodeKind::Invalid
            || (kind == CodeKind::Legacy) != (version == EVENT_VERSION_LEGACY)
        {
            return Err(EventError::Field("code"));
        }
        let domain = match version {
            EVENT_VERSION_DEFAULT_DOMAIN => "",
            _ => {
                let domain = str8(&mut c, "domain")?;
                let empty_ok = version == EVENT_VERSION_LEGACY && domain.is_empty();
                if !empty_ok && !domain_shape(domain.as_bytes()) {
                    return Err(EventError::Field("domain"));
                }
                domain
            }
        };
        let pop = str8(&mut c, "pop")?;
        if !pop.is_empty() && !valid_name(pop) {
            return Err(EventError::Field("pop"));
        }
        let referrer_host = str8(&mut c, "referrer_host")?;
        if !valid_referrer_host(referrer_host) {
            return Err(EventError::Field("referrer_host"));
        }
        let user_agent = str16(&mut c, "user_agent")?;
        if user_agent.len() > MAX_USER_AGENT || !printable(user_agent) {
            return Err(EventError::Field("user_agent"));
        }
        let event = ClickEvent {
            id,
            at_ms,
            code,
            domain,
            pop,
            country,
            method: if flags & FLAG_HEAD != 0 {
                Method::Head
            } else {
                Method::Get
            },
            tls: flags & FLAG_TLS != 0,
            prefetch: flags & FLAG_PREFETCH != 0,
            protocol: Protocol::from_flags(flags).unwrap_or_default(),
            early: flags & FLAG_EARLY != 0,
            visitor,
            net,
            user_agent,
            referrer_host,
        };
        Ok((event, buf.len() - c.remaining()))
    }

    /// The format version this event is written as: [`EVENT_VERSION_DEFAULT_DOMAIN`] (1) on the
    /// default domain, [`EVENT_VERSION`] (2) with a domain, [`EVENT_VERSION_LEGACY`] (3) for a
    /// legacy code on either.
    #[inline]
    pub fn version(&self) -> u8 {
        if classify(self.code.as_bytes()) == CodeKind::Legacy {
            EVENT_VERSION_LEGACY
        } else if self.domain.is_empty() {
            EVENT_VERSION_DEFAULT_DOMAIN
        } else {
            EVENT_VERSION
        }
    }

    /// The branded domain, `None` on the default domain.
    pub fn branded(&self) -> Option<&'a str> {
        Some(self.domain).filter(|d| !d.is_empty())
    }

    /// The key of the link this click is of ([`crate::code::link_key`]): its code on the default
    /// domain, `domain/code` on a branded one. What the processor's rollups, dedup keys and
    /// rules, and the Kafka message key, go by. Allocates only for a branded domain.
    pub fn link_key(&self) -> std::borrow::Cow<'a, str> {
        match self.branded() {
            None => std::borrow::Cow::Borrowed(self.code),
            Some(d) => std::borrow::Cow::Owned(crate::code::link_key(Some(d), self.code)),
        }
    }

    /// [`link_key`](Self::link_key) without allocating: the code itself on the default domain,
    /// else `domain/code` written into `buf` (cleared first; it keeps its capacity for the next).
    pub fn link_key_in<'b>(&self, buf: &'b mut String) -> &'b str
    where
        'a: 'b,
    {
        match self.branded() {
            None => self.code,
            Some(d) => {
                buf.clear();
                buf.push_str(d);
                buf.push(char::from(KEY_SEPARATOR));
                buf.push_str(self.code);
                buf
            }
        }
    }

    /// The link key's bytes as three parts (`domain`, `/`, `code`; the first two empty on the
    /// default domain), for a hash over the key that neither allocates nor copies.
    pub fn link_key_parts(&self) -> [&'a [u8]; 3] {
        match self.branded() {
            None => [b"", b"", self.code.as_bytes()],
            Some(d) => [
                d.as_bytes(),
                std::slice::from_ref(&KEY_SEPARATOR),
                self.code.as_bytes(),
            ],
        }
    }

    /// The country as text, `None` when unknown.
    pub fn country_str(&self) -> Option<&str> {
        self.country
            .as_ref()
            .and_then(|c| std::str::from_utf8(c).ok())
    }

    /// The archive (NDJSON) form of this event.
    pub fn archived(&self) -> ArchivedClick {
        ArchivedClick {
            v: self.version(),
            id: self.id.to_string(),
            t: self.at_ms,
            code: self.code.to_owned(),
            d: self.branded().map(str::to_owned),
            pop: self.pop.to_owned(),
            cc: self.country_str().map(str::to_owned),
            m: self.method,
            tls: self.tls,
            pf: self.prefetch,
            proto: self.protocol,
            early: self.early,
            vis: format!("{:016x}", self.visitor),
            net: self.net.map(|n| n.to_string()),
            ua: self.user_agent.to_owned(),
            rh: self.referrer_host.to_owned(),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn put_str8(out: &mut Vec<u8>, s: &str, max: usize) {
    let s = truncate(s, max.min(255));
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// `s` cut to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One event as a line of the day archive (zstd-compressed NDJSON). Field names are short because
/// there are billions of lines; `core/EVENTS.md` documents them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedClick {
    /// Event format version: 1 on the default domain, 2 with a domain (`d`).
    pub v: u8,
    /// Event id, 32 hex digits.
    pub id: String,
    /// Time at the edge, Unix milliseconds.
    pub t: u64,
    /// Code.
    pub code: String,
    /// The branded domain (absent on the default domain, and in lines written before domains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d: Option<String>,
    /// PoP.
    pub pop: String,
    /// Country, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc: Option<String>,
    /// Method.
    pub m: Method,
    /// Over HTTPS.
    pub tls: bool,
    /// A prefetch or preview (absent when not).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pf: bool,
    /// The HTTP version (absent for HTTP/1.x, and in lines written before it was recorded).
    #[serde(default, skip_serializing_if = "is_h1")]
    pub proto: Protocol,
    /// Came in 0-RTT early data (absent when not).
    #[serde(default, skip_serializing_if = "is_false")]
    pub early: bool,
    /// Visitor hash, 16 hex digits.
    pub vis: String,
    /// Truncated network, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<String>,
    /// User agent.
    pub ua: String,
    /// Referrer host.
    pub rh: String,
}

fn is_h1(p: &Protocol) -> bool {
    *p == Protocol::H1
}

impl ArchivedClick {
    /// Checks an archive line back into an event (the archive is read as untrusted bytes too).
    pub fn event(&self) -> Result<ClickEvent<'_>, EventError> {
        let domain = match (self.v, self.d.as_deref()) {
            (EVENT_VERSION_DEFAULT_DOMAIN, None) | (EVENT_VERSION_LEGACY, None) => "",
            (EVENT_VERSION | EVENT_VERSION_LEGACY, Some(d)) if !d.is_empty() => d,
            (EVENT_VERSION_DEFAULT_DOMAIN | EVENT_VERSION | EVENT_VERSION_LEGACY, _) => {
                return Err(EventError::Field("domain"))
            }
            (v, _) => return Err(EventError::Version(v)),
        };
        let id = u128::from_str_radix(&self.id, 16)
            .ok()
            .filter(|_| self.id.len() == 32)
            .ok_or(EventError::Field("id"))?;
        let visitor = u64::from_str_radix(&self.vis, 16)
            .ok()
            .filter(|_| self.vis.len() == 16)
            .ok_or(EventError::Field("vis"))?;
        let country = match &self.cc {
            None => None,
            Some(cc) => {
                let b: [u8; 2] = cc
                    .as_bytes()
                    .try_into()
                    .map_err(|_| EventError::Field("cc"))?;
                if !valid_country(b) {
                    return Err(EventError::Field("cc"));
                }
                Some(b)
            }
        };
        let net = self.net.as_deref().map(str::parse).transpose()?;
        let event = ClickEvent {
            id: EventId(id),
            at_ms: self.t,
            code: &self.code,
            domain,
            pop: &self.pop,
            country,
            method: self.m,
            tls: self.tls,
            prefetch: self.pf,
            protocol: self.proto,
            early: self.early,
            visitor,
            net,
            user_agent: &self.ua,
            referrer_host: &self.rh,
        };
        // A version has one form: a legacy code in version 3 only, and only a legacy code.
        if event.version() != self.v {
            return Err(EventError::Field("code"));
        }
        // One set of rules: re-encode and decode to run every field check.
        let mut buf = Vec::with_capacity(MAX_EVENT_LEN);
        event.encode(&mut buf);
        let (checked, _) = ClickEvent::decode(&buf)?;
        if checked.user_agent.len() != self.ua.len()
            || checked.code.len() != self.code.len()
            || checked.domain.len() != domain.len()
            || checked.pop.len() != self.pop.len()
            || checked.referrer_host.len() != self.rh.len()
        {
            return Err(EventError::Field("length"));
        }
        Ok(event)
    }
}

/// The librdkafka producer settings every click producer starts from (the engine's sink,
/// `lasthop-clicks synth`; core/EVENTS.md, "Kafka"): the leader's acknowledgement only (so no
/// idempotence, which needs every replica's), lz4, batches of up to 10,000 events lingering up to
/// 20 ms. Each producer adds its brokers and local queue bound and may override any of these.
pub const KAFKA_PRODUCER: &[(&str, &str)] = &[
    ("acks", "1"),
    ("enable.idempotence", "false"),
    ("compression.type", "lz4"),
    ("linger.ms", "20"),
    ("batch.num.messages", "10000"),
];

/// The spool: append-only segment files of checksummed frames, each frame a batch of events.
///
/// Segment: the 8-byte magic [`SEGMENT_MAGIC`], then frames. Frame: `len: u32 LE` (payload bytes),
/// `crc32: u32 LE` (IEEE, of the payload), `count: u32 LE`, then the payload: `count` events back to
/// back. A writer appends whole frames and fsyncs on its own schedule; a reader stops at a frame
/// that is not yet whole (the writer may be mid-append) and rejects a bad checksum.
pub mod spool {
    use super::{ClickEvent, EventError};

    /// First bytes of every segment file (format version 1).
    pub const SEGMENT_MAGIC: &[u8; 8] = b"LHSPOOL1";
    /// Frame header: length, checksum, event count.
    pub const FRAME_HEADER: usize = 12;
    /// Largest frame payload a reader accepts.
    pub const MAX_FRAME_PAYLOAD: usize = 16 << 20;

    /// A spool file name's parts.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SegmentName {
        /// The writer.
        pub writer: String,
        /// Its file number.
        pub n: u64,
        /// `.seg` (true) or `.open`.
        pub sealed: bool,
    }

    impl SegmentName {
        /// Parses `<writer>.<n:010>.open|seg`.
        pub fn parse(name: &str) -> Option<SegmentName> {
            let (stem, sealed) = if let Some(s) = name.strip_suffix(".seg") {
                (s, true)
            } else {
                (name.strip_suffix(".open")?, false)
            };
            let (writer, n) = stem.rsplit_once('.')?;
            let writer_ok = (1..=96).contains(&writer.len())
                && writer
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !writer_ok || n.len() != 10 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(SegmentName {
                writer: writer.to_owned(),
                n: n.parse().ok()?,
                sealed,
            })
        }

        /// `<writer>.<n:010>`: the file's identity across the rename.
        pub fn stem(&self) -> String {
            stem(&self.writer, self.n)
        }

        /// The file name.
        pub fn file_name(&self) -> String {
            format!(
                "{}.{}",
                self.stem(),
                if self.sealed { "seg" } else { "open" }
            )
        }
    }

    /// `<writer>.<n:010>`: a segment's identity across its rename from `.open` to `.seg`.
    pub fn stem(writer: &str, n: u64) -> String {
        format!("{writer}.{n:010}")
    }

    /// `<writer>.<n:010>` back to its parts.
    pub fn parse_stem(stem: &str) -> Option<(String, u64)> {
        let name = SegmentName::parse(&format!("{stem}.seg"))?;
        Some((name.writer, name.n))
    }

    /// Appends one frame holding `payload` (events already encoded back to back, `count` of them).
    pub fn encode_frame(out: &mut Vec<u8>, payload: &[u8], count: u32) {
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(payload);
    }

    /// What the front of a buffer holds.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Next<'a> {
        /// A whole, checked frame: its payload, event count and total length in bytes.
        Frame {
            /// The events, back to back.
            payload: &'a [u8],
            /// How many events the writer put in it.
            count: u32,
            /// Header plus payload.
            len: usize,
        },
        /// Not enough bytes yet for a whole frame (a writer may be appending).
        Incomplete,
    }

    /// Reads the frame at the front of `buf`.
    pub fn next_frame(buf: &[u8]) -> Result<Next<'_>, EventError> {
        if buf.len() < FRAME_HEADER {
            return Ok(Next::Incomplete);
        }
        let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let len = word(0) as usize;
        let crc = word(4);
        let count = word(8);
        if len > MAX_FRAME_PAYLOAD {
            return Err(EventError::Frame("payload too long"));
        }
        if buf.len() < FRAME_HEADER + len {
            return Ok(Next::Incomplete);
        }
        let payload = &buf[FRAME_HEADER..FRAME_HEADER + len];
        if crc32fast::hash(payload) != crc {
            return Err(EventError::Checksum);
        }
        Ok(Next::Frame {
            payload,
            count,
            len: FRAME_HEADER + len,
        })
    }

    /// The events of a frame payload, each checked; stops at the first bad one.
    pub fn events(payload: &[u8]) -> impl Iterator<Item = Result<ClickEvent<'_>, EventError>> {
        let mut rest = payload;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            match ClickEvent::decode(rest) {
                Ok((event, used)) => {
                    rest = &rest[used..];
                    Some(Ok(event))
                }
                Err(e) => {
                    rest = &[];
                    Some(Err(e))
                }
            }
        })
    }

    /// Checks a segment's header; returns the bytes after it.
    pub fn segment_body(file: &[u8]) -> Result<&[u8], EventError> {
        if file.len() < SEGMENT_MAGIC.len() {
            return Err(EventError::Truncated);
        }
        if &file[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
            return Err(EventError::Frame("not a spool segment"));
        }
        Ok(&file[SEGMENT_MAGIC.len()..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> ClickEvent<'static> {
        ClickEvent {
            id: EventId::new(0xdead_beef, 7),
            at_ms: 1_764_504_000_123,
            code: "Ab3dE9x",
            domain: "",
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor: 0x0123_4567_89ab_cdef,
            net: Some(Net::V4([203, 0, 113])),
            user_agent: "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0",
            referrer_host: "news.example.com",
        }
    }

    #[test]
    fn round_trips_binary_and_archive() {
        let e = sample();
        let mut buf = Vec::new();
        e.encode(&mut buf);
        let (back, used) = ClickEvent::decode(&buf).unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(back, e);
        let line = serde_json::to_string(&e.archived()).unwrap();
        let parsed: ArchivedClick = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed.event().unwrap(), e);
    }

    /// The same click on a branded domain.
    fn branded() -> ClickEvent<'static> {
        ClickEvent {
            code: "spring-sale",
            domain: "go.example.com",
            ..sample()
        }
    }

    /// Version 1's layout, field by field, as builds before branded domains wrote it.
    fn v1_bytes(e: &ClickEvent<'_>) -> Vec<u8> {
        let mut b = vec![1, 0b10 | 0b100]; // HTTPS, IPv4 network
        b.extend_from_slice(&e.id.0.to_le_bytes());
        b.extend_from_slice(&e.at_ms.to_le_bytes());
        b.extend_from_slice(&e.visitor.to_le_bytes());
        b.extend_from_slice(b"DE");
        b.extend_from_slice(&[203, 0, 113, 0, 0, 0]);
        for s in [e.code, e.pop, e.referrer_host] {
            b.push(s.len() as u8);
            b.extend_from_slice(s.as_bytes());
        }
        b.extend_from_slice(&(e.user_agent.len() as u16).to_le_bytes());
        b.extend_from_slice(e.user_agent.as_bytes());
        b
    }

    #[test]
    fn the_default_domain_is_version_1_byte_for_byte() {
        let e = sample();
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(buf, v1_bytes(&e));
        assert_eq!((e.version(), e.branded()), (1, None));
        assert_eq!(e.link_key(), "Ab3dE9x");
        let mut scratch = String::new();
        assert_eq!(e.link_key_in(&mut scratch), "Ab3dE9x");
        assert!(scratch.is_empty(), "nothing written for the default domain");
        assert_eq!(e.link_key_parts().concat(), b"Ab3dE9x");
        let line = serde_json::to_string(&e.archived()).unwrap();
        assert!(
            line.starts_with(r#"{"v":1,"#) && !line.contains(r#""d":"#),
            "{line}"
        );
    }

    /// Version 3's bytes, written out field by field as `core/EVENTS.md` lays them: version
    /// 2's layout (the domain after the code, here empty for the default domain) with a legacy
    /// code.
    #[test]
    fn a_legacy_code_is_version_3_byte_for_byte() {
        for domain in ["", "go.example.com"] {
            let e = ClickEvent {
                code: "ab-1",
                domain,
                ..sample()
            };
            let mut want = vec![3, 0b10 | 0b100];
            want.extend_from_slice(&e.id.0.to_le_bytes());
            want.extend_from_slice(&e.at_ms.to_le_bytes());
            want.extend_from_slice(&e.visitor.to_le_bytes());
            want.extend_from_slice(b"DE");
            want.extend_from_slice(&[203, 0, 113, 0, 0, 0]);
            for s in [e.code, e.domain, e.pop, e.referrer_host] {
                want.push(s.len() as u8);
                want.extend_from_slice(s.as_bytes());
            }
            want.extend_from_slice(&(e.user_agent.len() as u16).to_le_bytes());
            want.extend_from_slice(e.user_agent.as_bytes());
            let mut buf = Vec::new();
            e.encode(&mut buf);
            assert_eq!(buf, want);
            assert_eq!(e.branded(), Some(domain).filter(|d| !d.is_empty()));
            let line = serde_json::to_string(&e.archived()).unwrap();
            assert!(line.starts_with(r#"{"v":3,"#), "{line}");
            let back: ArchivedClick = serde_json::from_str(&line).unwrap();
            assert_eq!(back.event().unwrap(), e);
        }
    }

    #[test]
    fn a_branded_domain_is_version_2_with_the_domain_after_the_code() {
        let e = branded();
        let mut buf = Vec::new();
        e.encode(&mut buf);
        // Version 1's layout with `1 + n` domain bytes right after the code.
        let mut want = v1_bytes(&e);
        want[0] = 2;
        let after_code = FIXED_LEN + 1 + e.code.len();
        let domain = [&[e.domain.len() as u8][..], e.domain.as_bytes()].concat();
        want.splice(after_code..after_code, domain);
        assert_eq!(buf, want);
        let (back, used) = ClickEvent::decode(&buf).unwrap();
        assert_eq!((back, used), (e, buf.len()));
        assert_eq!(
            (back.version(), back.branded()),
            (2, Some("go.example.com"))
        );
        assert_eq!(back.link_key(), "go.example.com/spring-sale");
        assert_eq!(
            back.link_key(),
            crate::code::link_key(Some("go.example.com"), "spring-sale")
        );
        let mut scratch = String::from("left over");
        assert_eq!(back.link_key_in(&mut scratch), "go.example.com/spring-sale");
        assert_eq!(
            back.link_key_parts().concat(),
            b"go.example.com/spring-sale"
        );
        // The archive line says the domain and the version, and reads back.
        let line = serde_json::to_string(&e.archived()).unwrap();
        assert!(
            line.starts_with(r#"{"v":2,"#)
                && line.contains(r#""code":"spring-sale","d":"go.example.com","pop""#),
            "{line}"
        );
        let parsed: ArchivedClick = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed.event().unwrap(), e);
        // Two domains' `spring-sale` are two keys; the default domain's is the alias alone.
        let default = ClickEvent {
            domain: "",
            ..branded()
        };
        assert_ne!(default.link_key(), back.link_key());
        assert_eq!(default.link_key(), "spring-sale");
    }

    #[test]
    fn a_version_2_domain_must_be_one() {
        // Empty, upper case, one label, a trailing dot, bytes that are no text.
        for bad in [
            &b""[..],
            b"Go.Example.com",
            b"localhost",
            b"go.example.com.",
            b"\xff.example",
        ] {
            let mut buf = Vec::new();
            sample().encode(&mut buf);
            buf[0] = 2;
            let at = FIXED_LEN + 1 + sample().code.len();
            let field = [&[bad.len() as u8][..], bad].concat();
            buf.splice(at..at, field);
            assert_eq!(
                ClickEvent::decode(&buf).unwrap_err(),
                EventError::Field("domain"),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A version 1 event read as version 2 takes its PoP for the domain: `fra1` is none.
        let mut buf = Vec::new();
        sample().encode(&mut buf);
        buf[0] = 2;
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Field("domain")
        );
        // Version 3 carries a legacy code only: a branded alias's event relabelled 3 is
        // refused for its code; a legacy code's event is 3, with or without a domain, and
        // refused relabelled 2; version 4 is refused.
        buf.clear();
        branded().encode(&mut buf);
        buf[0] = 3;
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Field("code")
        );
        for domain in ["", "go.example.com"] {
            let legacy = ClickEvent {
                code: "ab-1",
                domain,
                ..sample()
            };
            buf.clear();
            legacy.encode(&mut buf);
            assert_eq!(buf[0], EVENT_VERSION_LEGACY);
            let (back, used) = ClickEvent::decode(&buf).unwrap();
            assert_eq!((back.code, back.domain, used), ("ab-1", domain, buf.len()));
            assert_eq!(legacy.archived().event().unwrap().code, "ab-1");
            buf[0] = 2;
            assert!(ClickEvent::decode(&buf).is_err());
        }
        buf[0] = 4;
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Version(4)
        );
        // An archive line's version and domain must agree.
        let line = |e: &ClickEvent<'_>, f: fn(&mut ArchivedClick)| {
            let mut a = e.archived();
            f(&mut a);
            a.event().map(|_| ())
        };
        let domain = Err(EventError::Field("domain"));
        assert_eq!(
            line(&sample(), |a| a.d = Some("go.example.com".into())),
            domain
        );
        assert_eq!(line(&branded(), |a| a.v = 1), domain);
        assert_eq!(line(&branded(), |a| a.d = None), domain);
        assert_eq!(line(&branded(), |a| a.d = Some(String::new())), domain);
        assert_eq!(line(&sample(), |a| a.v = 2), domain);
        assert_eq!(
            line(&branded(), |a| a.d = Some("Go.Example.com".into())),
            domain
        );
        assert_eq!(
            line(&branded(), |a| a.d =
                Some(format!("{}.example", "a.".repeat(130)))),
            Err(EventError::Field("length")),
            "cut to 253 bytes on the wire"
        );
        assert_eq!(
            line(&branded(), |a| a.v = 3),
            Err(EventError::Field("code"))
        );
        assert_eq!(line(&branded(), |a| a.v = 4), Err(EventError::Version(4)));
        assert_eq!(line(&sample(), |_| {}), Ok(()));
        assert_eq!(line(&branded(), |_| {}), Ok(()));
    }

    #[test]
    fn early_data_is_flag_bit_seven_and_an_archive_field() {
        let mut e = sample();
        e.early = true;
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(buf[1] & 0x80, 0x80);
        assert_eq!(ClickEvent::decode(&buf).unwrap().0, e);
        let line = serde_json::to_string(&e.archived()).unwrap();
        assert!(line.contains(r#""early":true"#), "{line}");
        let plain = serde_json::to_string(&sample().archived()).unwrap();
        assert!(!plain.contains("early"), "absent when not: {plain}");
        // Bits 5-6 at 3 are still refused, early or not.
        buf[1] |= 0x60;
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Flags(buf[1])
        );
    }

    #[test]
    fn net_forms() {
        let v6: Net = "2001:db8:1::/48".parse().unwrap();
        assert_eq!(v6, Net::of("2001:db8:1:2::9".parse().unwrap()));
        assert_eq!(
            Net::of("::ffff:192.0.2.7".parse().unwrap()),
            Net::V4([192, 0, 2])
        );
        assert_eq!(Net::V4([192, 0, 2]).to_string(), "192.0.2.0/24");
        assert!("192.0.2.1/24".parse::<Net>().is_err());
        assert!("192.0.2.0/16".parse::<Net>().is_err());
    }

    #[test]
    fn rejects_bad_fields() {
        let mut e = sample();
        e.referrer_host = "Evil.Example";
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Field("referrer_host")
        );
        let mut e = sample();
        e.user_agent = "a\r\nb";
        buf.clear();
        e.encode(&mut buf);
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Field("user_agent")
        );
        buf.clear();
        sample().encode(&mut buf);
        buf[0] = 9;
        assert_eq!(
            ClickEvent::decode(&buf).unwrap_err(),
            EventError::Version(9)
        );
    }

    #[test]
    fn truncates_on_char_boundary() {
        let ua = "é".repeat(200);
        let mut e = sample();
        e.user_agent = &ua;
        let mut buf = Vec::new();
        e.encode(&mut buf);
        let (back, _) = ClickEvent::decode(&buf).unwrap();
        assert_eq!(back.user_agent.len(), MAX_USER_AGENT);
        assert!(ua.starts_with(back.user_agent));
    }

    #[test]
    fn spool_frames() {
        let mut payload = Vec::new();
        sample().encode(&mut payload);
        branded().encode(&mut payload);
        let mut seg = spool::SEGMENT_MAGIC.to_vec();
        spool::encode_frame(&mut seg, &payload, 2);
        let body = spool::segment_body(&seg).unwrap();
        for cut in 0..body.len() {
            assert_eq!(
                spool::next_frame(&body[..cut]).unwrap(),
                spool::Next::Incomplete
            );
        }
        let spool::Next::Frame {
            payload: p,
            count,
            len,
        } = spool::next_frame(body).unwrap()
        else {
            panic!("a whole frame")
        };
        assert_eq!((count, len), (2, body.len()));
        let events: Vec<_> = spool::events(p).map(Result::unwrap).collect();
        assert_eq!(events, [sample(), branded()]);
        let mut bad = body.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(spool::next_frame(&bad).unwrap_err(), EventError::Checksum);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = ClickEvent::decode(&bytes);
            let _ = spool::next_frame(&bytes);
            for e in spool::events(&bytes) {
                let _ = e;
            }
        }

        #[test]
        fn mangled_events_never_panic(
            pos in 0usize..220, byte in any::<u8>(), cut in 0usize..220, with_domain in any::<bool>(),
        ) {
            let mut buf = Vec::new();
            if with_domain { branded() } else { sample() }.encode(&mut buf);
            let i = pos % buf.len();
            buf[i] = byte;
            buf.truncate(cut.max(1).min(buf.len()));
            if let Ok((e, used)) = ClickEvent::decode(&buf) {
                prop_assert!(used <= buf.len());
                prop_assert!(crate::code::plausible(e.code.as_bytes()));
                prop_assert!(e.domain.is_empty() || domain_shape(e.domain.as_bytes()));
                prop_assert!(crate::code::plausible_key(e.link_key().as_bytes()));
                prop_assert_eq!(e.version(), buf[0]);
                prop_assert!(valid_referrer_host(e.referrer_host));
                let mut again = Vec::new();
                e.encode(&mut again);
                prop_assert_eq!(&again[..], &buf[..used]);
            }
        }

        #[test]
        fn any_valid_event_round_trips(
            seq in any::<u64>(), at in any::<u64>(), vis in any::<u64>(),
            code in "[A-Za-z0-9]{7}|[a-z][A-Za-z0-9_-]{7,63}", pop in "[a-z0-9]{0,12}",
            domain in "|[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]{1,10}){1,4}",
            ua in "[ -~]{0,300}", rh in "[a-z0-9.-]{0,60}", head in any::<bool>(), v6 in any::<bool>(),
            proto in 0u8..3, early in any::<bool>(),
        ) {
            let protocol = [Protocol::H1, Protocol::H2, Protocol::H3][usize::from(proto)];
            let net = if v6 { Net::V6([0x20, 1, 0xd, 0xb8, 0, 1]) } else { Net::V4([10, 1, 2]) };
            let e = ClickEvent {
                id: EventId::new(42, seq), at_ms: at, code: &code, domain: &domain, pop: &pop, country: None,
                method: if head { Method::Head } else { Method::Get }, tls: head, prefetch: !head, visitor: vis,
                net: Some(net), user_agent: &ua, referrer_host: &rh, protocol, early,
            };
            let mut buf = Vec::new();
            e.encode(&mut buf);
            let (back, used) = ClickEvent::decode(&buf).unwrap();
            prop_assert_eq!(used, buf.len());
            prop_assert_eq!(back.user_agent, truncate(&ua, MAX_USER_AGENT));
            prop_assert_eq!(back.code, &code[..]);
            prop_assert_eq!(back.domain, &domain[..]);
            prop_assert_eq!(buf[0], if domain.is_empty() { 1 } else { 2 });
            prop_assert_eq!(back.link_key(), crate::code::link_key(back.branded(), &code));
            prop_assert_eq!(back.protocol, protocol);
            prop_assert_eq!(back.early, early);
            let line = serde_json::to_string(&back.archived()).unwrap();
            let parsed: ArchivedClick = serde_json::from_str(&line).unwrap();
            prop_assert_eq!(parsed.event().unwrap(), back);
        }
    }
}
