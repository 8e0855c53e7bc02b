//! HPACK (RFC 7541) both ways, as a server needs it.
//!
//! - **Decoding** is ours ([`Decoder`], with [`super::huffman`]), checked against the `hpack`
//!   crate as an oracle. `loona-hpack`, the maintained crate that fits a pure crate, came first
//!   and was measured out: its Huffman decoder builds a hash map of the code for every string,
//!   ~80 % of the engine's CPU under `h2load -m 10` (the `h2` crate's codec is not public and
//!   brings tokio's traits). Each field is handed to a callback as a borrow of the block, the
//!   dynamic table or one reused buffer, so a header list is checked, counted and mostly
//!   dropped as it is decoded: memory stays bounded by what we keep (the handful of fields the
//!   decision and the click record read), whatever the block expands to (the HPACK bomb). The
//!   dynamic table we advertise (4,096 bytes, the default) is kept, as browsers index.
//! - **Encoding** is ours, a few lines: responses use the static table where it names a field
//!   and literals without indexing otherwise (no dynamic table state on our side, so nothing
//!   to keep in sync and nothing a client can make us store). It transcodes the HTTP/1.1
//!   answer the shared render path wrote, so both protocols send the same fields.

use std::ops::Range;

use std::collections::VecDeque;

use super::huffman;
use crate::http::{Limits, Method, Request};

/// The dynamic table size we allow the peer's encoder (SETTINGS_HEADER_TABLE_SIZE's default).
pub const TABLE_SIZE: usize = 4096;

/// The static table (RFC 7541 Appendix A), index 1 first.
#[rustfmt::skip]
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"200"), (b":status", b"204"), (b":status", b"206"), (b":status", b"304"),
    (b":status", b"400"), (b":status", b"404"), (b":status", b"500"), (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"), (b"accept-language", b""), (b"accept-ranges", b""),
    (b"accept", b""), (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""),
    (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""),
    (b"cookie", b""), (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""),
    (b"from", b""), (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""),
    (b"if-none-match", b""), (b"if-range", b""), (b"if-unmodified-since", b""),
    (b"last-modified", b""), (b"link", b""), (b"location", b""), (b"max-forwards", b""),
    (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""),
    (b"set-cookie", b""), (b"strict-transport-security", b""), (b"transfer-encoding", b""),
    (b"user-agent", b""), (b"vary", b""), (b"via", b""), (b"www-authenticate", b""),
];

/// Why a header block is not HPACK (a connection error: the table is out of step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// An integer that runs past the block or past 2^21.
    Integer,
    /// A string longer than the block, or bad Huffman code.
    String,
    /// Index 0, or past both tables.
    Index,
    /// A table size update past what we allow, or after a field.
    TableSize,
}

/// The dynamic table's entries (name, value), newest first.
type Entries = VecDeque<(Box<[u8]>, Box<[u8]>)>;

/// A connection's HPACK decoder: the dynamic table and two reused buffers.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is `table[0]`.
    table: Entries,
    size: usize,
    max: usize,
    allowed: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: TABLE_SIZE,
            allowed: TABLE_SIZE,
            name: Vec::new(),
            value: Vec::new(),
        }
    }
}

/// An HPACK integer with an `n`-bit prefix at the start of `b`: (value, bytes used).
pub(crate) fn int(b: &[u8], n: u8) -> Result<(usize, usize), DecodeError> {
    let max = (1usize << n) - 1;
    let first = usize::from(*b.first().ok_or(DecodeError::Integer)?) & max;
    if first < max {
        return Ok((first, 1));
    }
    let mut value = max;
    for (i, &byte) in b.iter().enumerate().skip(1).take(4) {
        value += usize::from(byte & 0x7f) << (7 * (i - 1));
        if byte & 0x80 == 0 {
            return if value <= 1 << 21 {
                Ok((value, i + 1))
            } else {
                Err(DecodeError::Integer)
            };
        }
    }
    Err(DecodeError::Integer)
}

/// The field at `index` of the static table and `table`.
fn lookup(table: &Entries, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
    match index {
        0 => Err(DecodeError::Index),
        1..=61 => Ok(STATIC[index - 1]),
        _ => table
            .get(index - 62)
            .map(|(n, v)| (&n[..], &v[..]))
            .ok_or(DecodeError::Index),
    }
}

/// A string literal at the start of `b`, appended to `out`; returns the bytes used.
fn string(b: &[u8], out: &mut Vec<u8>) -> Result<usize, DecodeError> {
    let huffman = b.first().is_some_and(|&h| h & 0x80 != 0);
    let (len, n) = int(b, 7)?;
    let raw = b.get(n..n + len).ok_or(DecodeError::String)?;
    if huffman {
        huffman::decode(raw, out).map_err(|_| DecodeError::String)?;
    } else {
        out.extend_from_slice(raw);
    }
    Ok(n + len)
}

impl Decoder {
    /// The field at `index` of the static and dynamic tables.
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        lookup(&self.table, index)
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    /// Adds the field in `self.name` / `self.value` (§4.4: one larger than the table empties it).
    fn insert(&mut self) {
        let size = self.name.len() + self.value.len() + 32;
        if size > self.max {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.table
            .push_front((self.name.as_slice().into(), self.value.as_slice().into()));
        self.size += size;
    }

    /// Decodes one whole header block, handing each field to `field` as it goes.
    pub fn decode_with(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let mut at = 0;
        let mut fields = 0usize;
        while let Some(&b) = block.get(at) {
            let rest = &block[at..];
            if b & 0x80 != 0 {
                let (index, n) = int(rest, 7)?;
                at += n;
                let (name, value) = self.get(index)?;
                field(name, value);
            } else if b & 0xe0 == 0x20 {
                // A table size update: only before the block's first field (§4.2).
                if fields > 0 {
                    return Err(DecodeError::TableSize);
                }
                let (size, n) = int(rest, 5)?;
                at += n;
                if size > self.allowed {
                    return Err(DecodeError::TableSize);
                }
                self.max = size;
                self.evict_to(size);
                continue;
            } else {
                // Literals: with incremental indexing (01), without (0000) or never (0001).
                let indexing = b & 0x40 != 0;
                let (index, n) = int(rest, if indexing { 6 } else { 4 })?;
                at += n;
                self.name.clear();
                if index == 0 {
                    at += string(&block[at..], &mut self.name)?;
                }
                self.value.clear();
                at += string(&block[at..], &mut self.value)?;
                if index == 0 {
                    field(&self.name, &self.value);
                } else if indexing {
                    self.name.extend_from_slice(lookup(&self.table, index)?.0);
                    field(&self.name, &self.value);
                } else {
                    field(lookup(&self.table, index)?.0, &self.value);
                }
                if indexing {
                    self.insert();
                }
            }
            fields += 1;
        }
        Ok(())
    }
}

/// Why a decoded header block is not a request we answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Not HPACK: a connection error (COMPRESSION_ERROR), the table is out of step.
    Compression,
    /// A malformed request (RFC 9113 §8.1.1): a stream error (PROTOCOL_ERROR).
    Malformed,
    /// Over the header list size or field count: answered 431.
    TooLarge,
}

/// The fields of one request (or trailer) block that we keep, in one buffer.
#[derive(Debug, Default, Clone)]
pub struct Fields {
    buf: Vec<u8>,
    method: Option<Range<u32>>,
    scheme: Option<Range<u32>>,
    authority: Option<Range<u32>>,
    path: Option<Range<u32>>,
    host: Option<Range<u32>>,
    /// Regular fields the decision or the click record reads (name, value).
    kept: Vec<(Range<u32>, Range<u32>)>,
    /// `content-length`, when sent.
    pub content_length: Option<u64>,
}

impl Fields {
    /// Whether its buffers hold no allocation (it was moved into a stream).
    pub fn is_unallocated(&self) -> bool {
        self.buf.capacity() == 0
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.method = None;
        self.scheme = None;
        self.authority = None;
        self.path = None;
        self.host = None;
        self.kept.clear();
        self.content_length = None;
    }

    fn put(&mut self, b: &[u8]) -> Range<u32> {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(b);
        start..self.buf.len() as u32
    }

    fn get(&self, r: &Option<Range<u32>>) -> Option<&[u8]> {
        r.as_ref()
            .and_then(|r| self.buf.get(r.start as usize..r.end as usize))
    }

    /// The request's method.
    pub fn method(&self) -> Method {
        match self.get(&self.method) {
            Some(b"GET") => Method::Get,
            Some(b"HEAD") => Method::Head,
            _ => Method::Other,
        }
    }

    /// The request these fields make, for the shared decision path.
    pub fn request<'a>(&'a self, limits: &Limits) -> Request<'a> {
        let target = self.get(&self.path).unwrap_or(b"/");
        let authority = self
            .get(&self.authority)
            .or_else(|| self.get(&self.host))
            .unwrap_or(b"");
        let fields = self.kept.iter().map(|(n, v)| {
            (
                &self.buf[n.start as usize..n.end as usize],
                &self.buf[v.start as usize..v.end as usize],
            )
        });
        crate::http::request_from_fields(self.method(), target, authority, fields, limits)
    }

    /// The `:path` as sent (empty when absent).
    pub fn path(&self) -> &[u8] {
        self.get(&self.path).unwrap_or(b"")
    }

    /// The `:authority` (or `Host`) the request named, without a port.
    pub fn authority(&self) -> &[u8] {
        let a = self
            .get(&self.authority)
            .or_else(|| self.get(&self.host))
            .unwrap_or(b"");
        strip_port(a)
    }
}

/// `host[:port]` or `[v6]:port` without the port.
fn strip_port(a: &[u8]) -> &[u8] {
    if a.first() == Some(&b'[') {
        return match a.iter().position(|&b| b == b']') {
            Some(end) => &a[..=end],
            None => a,
        };
    }
    match a.iter().rposition(|&b| b == b':') {
        Some(i) => &a[..i],
        None => a,
    }
}

/// Limits a header block is decoded under.
#[derive(Debug, Clone, Copy)]
pub struct BlockLimits {
    /// SETTINGS_MAX_HEADER_LIST_SIZE: name + value + 32 per field (RFC 9113 §6.5.2).
    pub max_list: usize,
    pub max_fields: usize,
}

/// Decodes one complete header block into `f`, checking it as a request (`trailers`: as a
/// trailer section). The block is decoded whole even after a problem, so the dynamic table
/// stays in step with the peer's encoder.
pub fn decode(
    d: &mut Decoder,
    block: &[u8],
    trailers: bool,
    lim: BlockLimits,
    limits: &Limits,
    f: &mut Fields,
    on_path: impl FnMut(&[u8]),
) -> Result<(), Problem> {
    collect(
        |field| d.decode_with(block, field).is_ok(),
        trailers,
        lim,
        limits,
        f,
        on_path,
    )
}

/// Checks the fields `source` hands over (false: not decodable, [`Problem::Compression`]) as
/// one request or trailer section into `f`: HPACK's blocks and QPACK's field sections both.
pub(crate) fn collect(
    source: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])) -> bool,
    trailers: bool,
    lim: BlockLimits,
    limits: &Limits,
    f: &mut Fields,
    mut on_path: impl FnMut(&[u8]),
) -> Result<(), Problem> {
    f.clear();
    let mut size = 0usize;
    let mut count = 0usize;
    let mut problem: Option<Problem> = None;
    let mut regular_seen = false;
    let decodable = source(&mut |name, value| {
        size = size.saturating_add(name.len() + value.len() + 32);
        count += 1;
        if problem.is_some() {
            return;
        }
        if size > lim.max_list || count > lim.max_fields {
            problem = Some(Problem::TooLarge);
            return;
        }
        if let Err(p) = field(name, value, trailers, &mut regular_seen, limits, f) {
            problem = Some(p);
        } else if name == b":path" {
            // As soon as it is known: the rest of the block decodes while the caller's
            // memory fetch for it is on its way.
            on_path(value);
        }
    });
    if !decodable {
        return Err(Problem::Compression);
    }
    if let Some(p) = problem {
        return Err(p);
    }
    if trailers {
        return Ok(());
    }
    // RFC 9113 §8.3.1: :method, :scheme and :path once each (CONNECT: :authority instead);
    // an empty :path is malformed for http and https.
    let method = f.get(&f.method).ok_or(Problem::Malformed)?;
    if method == b"CONNECT" {
        if f.authority.is_none() || f.scheme.is_some() || f.path.is_some() {
            return Err(Problem::Malformed);
        }
    } else {
        let (Some(_), Some(path)) = (f.get(&f.scheme), f.get(&f.path)) else {
            return Err(Problem::Malformed);
        };
        if path.is_empty() || !(path[0] == b'/' || (path == b"*" && method == b"OPTIONS")) {
            return Err(Problem::Malformed);
        }
    }
    // §8.3.1: a Host that names another entity than :authority.
    if let (Some(a), Some(h)) = (f.get(&f.authority), f.get(&f.host)) {
        if a != h {
            return Err(Problem::Malformed);
        }
    }
    Ok(())
}

/// Checks and keeps one field (RFC 9113 §8.2, §8.3).
fn field(
    name: &[u8],
    value: &[u8],
    trailers: bool,
    regular_seen: &mut bool,
    limits: &Limits,
    f: &mut Fields,
) -> Result<(), Problem> {
    if !valid_value(value) {
        return Err(Problem::Malformed);
    }
    if let Some(pseudo) = name.strip_prefix(b":") {
        if *regular_seen || trailers {
            return Err(Problem::Malformed);
        }
        let v = f.put(value);
        let slot = match pseudo {
            b"method" => &mut f.method,
            b"scheme" => &mut f.scheme,
            b"authority" => &mut f.authority,
            b"path" => &mut f.path,
            _ => return Err(Problem::Malformed),
        };
        if slot.is_some() {
            return Err(Problem::Malformed);
        }
        *slot = Some(v);
        return Ok(());
    }
    *regular_seen = true;
    if name.is_empty() || !name.iter().all(|&b| LOWER_TOKEN[usize::from(b)]) {
        return Err(Problem::Malformed);
    }
    match name {
        // Connection-specific fields (§8.2.2).
        b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding" | b"upgrade" => {
            return Err(Problem::Malformed)
        }
        b"te" if value != b"trailers" => return Err(Problem::Malformed),
        b"content-length" => {
            let n = parse_length(value).ok_or(Problem::Malformed)?;
            if f.content_length.is_some_and(|m| m != n) {
                return Err(Problem::Malformed);
            }
            f.content_length = Some(n);
        }
        b"host" => {
            if f.host.is_some() {
                return Err(Problem::Malformed);
            }
            f.host = Some(f.put(value));
        }
        b"user-agent" | b"referer" | b"accept" | b"sec-purpose" | b"purpose" | b"x-purpose"
        | b"x-moz" => {
            let n = f.put(name);
            let v = f.put(value);
            f.kept.push((n, v));
        }
        _ if limits
            .country_header
            .as_ref()
            .is_some_and(|c| c.as_bytes() == name) =>
        {
            let n = f.put(name);
            let v = f.put(value);
            f.kept.push((n, v));
        }
        _ => {}
    }
    Ok(())
}

/// A field value without NUL, CR or LF and without leading or trailing whitespace (§8.2.1).
fn valid_value(v: &[u8]) -> bool {
    // No early exit and a byte-wide accumulator: the loop vectorises, and values are short
    // (a call to memchr3 cost more).
    let bad = v
        .iter()
        .map(|&b| u8::from(b == 0) | u8::from(b == b'\r') | u8::from(b == b'\n'))
        .fold(0u8, |bad, x| bad | x);
    bad == 0
        && !v.first().is_some_and(|&b| b == b' ' || b == b'\t')
        && !v.last().is_some_and(|&b| b == b' ' || b == b'\t')
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Token characters without upper case (RFC 9110 §5.6.2; RFC 9113 §8.2.1).
static LOWER_TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = matches!(c,
            b'a'..=b'z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*'
            | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~');
        i += 1;
    }
    t
};

/// Appends an HPACK integer with an `n`-bit prefix, `first` holding the bits above it.
pub(crate) fn integer(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends a string literal (never Huffman-coded: our fields are short or URLs).
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// The static table's index for a response field name we send.
fn static_name(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"allow" => 22,
        b"cache-control" => 24,
        b"content-length" => 28,
        b"content-type" => 31,
        b"date" => 33,
        b"location" => 46,
        b"retry-after" => 53,
        b"server" => 54,
        b"strict-transport-security" => 56,
        b"vary" => 59,
        _ => return None,
    })
}

/// Appends the `:status` field.
fn status(out: &mut Vec<u8>, code: &[u8; 3]) {
    let indexed = match code {
        b"200" => 8,
        b"204" => 9,
        b"206" => 10,
        b"304" => 11,
        b"400" => 12,
        b"404" => 13,
        b"500" => 14,
        _ => 0,
    };
    if indexed != 0 {
        integer(out, 0x80, 7, indexed);
    } else {
        integer(out, 0, 4, 8);
        put_string(out, code);
    }
}

/// Lines of an HTTP/1.1 response that have no place in HTTP/2 (RFC 9113 §8.2.2).
pub(crate) fn connection_specific(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"connection")
        || name.eq_ignore_ascii_case(b"keep-alive")
        || name.eq_ignore_ascii_case(b"transfer-encoding")
        || name.eq_ignore_ascii_case(b"upgrade")
        || name.eq_ignore_ascii_case(b"proxy-connection")
}

/// Transcodes one HTTP/1.1 response (as the shared render path wrote it) into an HPACK
/// header block appended to `block`; returns the body's range in `h1`, or `None` when `h1`
/// is not a response head (which the render path never writes).
pub fn transcode(h1: &[u8], block: &mut Vec<u8>) -> Option<Range<usize>> {
    let code: &[u8; 3] = h1.get(9..12)?.try_into().ok()?;
    if !h1.starts_with(b"HTTP/1.1 ") {
        return None;
    }
    status(block, code);
    let at = memchr::memchr(b'\n', h1)? + 1;
    let used = fields(h1.get(at..)?, true, block)?;
    Some(at + used..h1.len())
}

/// The block of a 302 to `url` (servable), with `extra`, the block of the header lines every
/// answer carries ([`Lines::of`]): exactly what [`transcode`] makes of the render path's
/// redirect, without rendering it first (the common answer's shortcut;
/// `redirect_is_the_transcode_of_the_render` holds the two together).
pub fn redirect(url: &[u8], extra: &[u8], block: &mut Vec<u8>) {
    // :status 302, location, cache-control and content-length 0, literals without indexing
    // on the static table's names (RFC 7541 Appendix A: 8, 46, 24, 28; 4-bit prefixes).
    const HEAD: &[u8] = b"\x08\x03302";
    const TAIL: &[u8] = b"\x0f\x09\x14private, max-age=300\x0f\x0d\x010";
    block.extend_from_slice(HEAD);
    integer(block, 0, 4, 46);
    put_string(block, url);
    block.extend_from_slice(TAIL);
    block.extend_from_slice(extra);
}

/// The header lines every answer carries (`Date`, HSTS on HTTPS), transcoded once while they
/// stay the same (they change once a second).
#[derive(Debug, Default)]
pub struct Lines {
    h1: Vec<u8>,
    block: Vec<u8>,
}

impl Lines {
    /// The block of `h1`, header lines each ending in CRLF.
    pub fn of(&mut self, h1: &[u8]) -> &[u8] {
        if self.h1 != h1 {
            self.h1.clear();
            self.h1.extend_from_slice(h1);
            self.block.clear();
            if fields(h1, false, &mut self.block).is_none() {
                self.block.clear();
            }
        }
        &self.block
    }
}

/// Header lines (`Name: value` CRLF) into `block`; with `head`, up to and including the blank
/// line that ends a head. Returns the bytes used, `None` for a line without a colon or a
/// head without its end.
fn fields(text: &[u8], head: bool, block: &mut Vec<u8>) -> Option<usize> {
    let mut at = 0;
    loop {
        let rest = text.get(at..)?;
        // SIMD search: a line can carry a long URL, and a byte loop was half the transcode.
        let Some(end) = memchr::memchr(b'\n', rest) else {
            return (!head && rest.is_empty()).then_some(at);
        };
        let line = &rest[..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += end + 1;
        if line.is_empty() {
            return head.then_some(at);
        }
        let colon = memchr::memchr(b':', line)?;
        let name = &line[..colon];
        let value = line[colon + 1..].trim_ascii_start();
        if connection_specific(name) {
            continue;
        }
        let mut lower = [0u8; 64];
        let lower = lower.get_mut(..name.len())?;
        for (d, s) in lower.iter_mut().zip(name) {
            *d = s.to_ascii_lowercase();
        }
        match static_name(lower) {
            Some(i) => integer(block, 0, 4, i),
            None => {
                block.push(0);
                put_string(block, lower);
            }
        }
        put_string(block, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> BlockLimits {
        BlockLimits {
            max_list: 16384,
            max_fields: 100,
        }
    }

    /// A block encoded by the `hpack` crate (an independent implementation).
    fn enc(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut e = hpack::Encoder::new();
        e.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn req() -> Vec<(&'static str, &'static str)> {
        vec![
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "lh.example"),
            (":path", "/abc1234?x=1"),
            ("user-agent", "curl/8"),
            ("accept", "application/json"),
        ]
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn rfc_7541_c4_requests_with_huffman_and_the_dynamic_table() {
        let mut d = Decoder::default();
        let mut all = Vec::new();
        for block in [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ] {
            let mut fields = Vec::new();
            d.decode_with(&hex(block), |n, v| {
                fields.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                ))
            })
            .unwrap();
            all.push(fields.join(", "));
        }
        assert_eq!(
            all,
            [
                ":method: GET, :scheme: http, :path: /, :authority: www.example.com",
                ":method: GET, :scheme: http, :path: /, :authority: www.example.com, cache-control: no-cache",
                ":method: GET, :scheme: https, :path: /index.html, :authority: www.example.com, custom-key: custom-value",
            ]
        );
        // C.4.3's table: three entries, 164 bytes.
        assert_eq!((d.table.len(), d.size), (3, 164));
        // A size update after a field, or past what we allow, is refused.
        let mut d = Decoder::default();
        assert_eq!(
            d.decode_with(&[0x82, 0x20], |_, _| {}),
            Err(DecodeError::TableSize)
        );
        assert_eq!(
            d.decode_with(&[0x3f, 0xe2, 0x1f], |_, _| {}),
            Err(DecodeError::TableSize)
        );
        // A smaller table evicts; zero empties it.
        let mut d = Decoder::default();
        d.decode_with(
            &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
            |_, _| {},
        )
        .unwrap();
        assert_eq!(d.table.len(), 1);
        d.decode_with(&[0x20, 0x82], |_, _| {}).unwrap();
        assert_eq!((d.table.len(), d.size), (0, 0));
    }

    #[test]
    fn a_request_decodes_into_the_shared_request() {
        let mut d = Decoder::default();
        let mut f = Fields::default();
        let limits = Limits::default();
        decode(&mut d, &enc(&req()), false, lim(), &limits, &mut f, |_| {}).unwrap();
        let r = f.request(&limits);
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.path, b"/abc1234");
        assert_eq!(r.target, b"/abc1234?x=1");
        assert_eq!(r.host, b"lh.example");
        assert_eq!(r.user_agent, b"curl/8");
        assert!(r.accept_json && r.keep_alive && !r.http10);
    }

    #[test]
    fn malformed_requests_are_told_apart_from_bad_hpack() {
        let limits = Limits::default();
        let cases: Vec<Vec<(&str, &str)>> = vec![
            vec![(":method", "GET"), (":scheme", "https")], // no :path
            vec![(":method", "GET"), (":scheme", "https"), (":path", "")],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                (":path", "/"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                (":x", "1"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                (":status", "200"),
            ],
            vec![
                (":method", "GET"),
                ("a", "b"),
                (":scheme", "https"),
                (":path", "/"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("UPPER", "1"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("connection", "x"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("te", "gzip"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("x", " lead"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("content-length", "x"),
            ],
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "a"),
                (":path", "/"),
                ("host", "b"),
            ],
        ];
        for c in cases {
            let mut d = Decoder::default();
            let mut f = Fields::default();
            assert_eq!(
                decode(&mut d, &enc(&c), false, lim(), &limits, &mut f, |_| {}),
                Err(Problem::Malformed),
                "{c:?}"
            );
        }
        let ok = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/"),
            ("te", "trailers"),
        ];
        let mut d = Decoder::default();
        let mut f = Fields::default();
        assert!(decode(&mut d, &enc(&ok), false, lim(), &limits, &mut f, |_| {}).is_ok());
        // Trailers carry no pseudo-header.
        assert_eq!(
            decode(
                &mut d,
                &enc(&[(":path", "/")]),
                true,
                lim(),
                &limits,
                &mut f,
                |_| {}
            ),
            Err(Problem::Malformed)
        );
        // Index 0 and an index past both tables are not HPACK.
        for bad in [&[0x80u8][..], &[0xff, 0x7f]] {
            let mut d = Decoder::default();
            assert_eq!(
                decode(&mut d, bad, false, lim(), &limits, &mut f, |_| {}),
                Err(Problem::Compression)
            );
        }
    }

    #[test]
    fn the_hpack_bomb_is_refused_with_bounded_memory() {
        // One 4 KiB field into the dynamic table, then referenced 16,000 times: 64 MB decoded.
        let big = "x".repeat(4000);
        let mut block = Vec::new();
        block.push(0x40); // literal with incremental indexing, new name
        put_string(&mut block, b"bomb");
        put_string(&mut block, big.as_bytes());
        block.extend(std::iter::repeat_n(0xbe, 16_000)); // indexed 62: the newest entry
        let mut d = Decoder::default();
        let mut f = Fields::default();
        let r = decode(
            &mut d,
            &block,
            false,
            lim(),
            &Limits::default(),
            &mut f,
            |_| {},
        );
        assert_eq!(r, Err(Problem::TooLarge));
        assert!(f.buf.capacity() < 64 * 1024, "{}", f.buf.capacity());
        // The field count alone, too.
        let mut many = vec![(":method", "GET"), (":scheme", "https"), (":path", "/")];
        many.extend(std::iter::repeat_n(("x", "1"), 200));
        let mut d = Decoder::default();
        assert_eq!(
            decode(
                &mut d,
                &enc(&many),
                false,
                lim(),
                &Limits::default(),
                &mut f,
                |_| {}
            ),
            Err(Problem::TooLarge)
        );
    }

    #[test]
    fn responses_transcode_to_blocks_an_independent_decoder_reads() {
        let h1 = b"HTTP/1.1 302 Found\r\nLocation: https://example.com/x\r\n\
Cache-Control: private, max-age=300\r\nContent-Length: 0\r\nConnection: close\r\n\
Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nX-Content-Type-Options: nosniff\r\n\r\n";
        let mut block = Vec::new();
        let body = transcode(h1, &mut block).unwrap();
        assert_eq!(body, h1.len()..h1.len());
        let fields = hpack::Decoder::new().decode(&block).unwrap();
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        let want = [
            (":status", "302"),
            ("location", "https://example.com/x"),
            ("cache-control", "private, max-age=300"),
            ("content-length", "0"),
            ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
            ("x-content-type-options", "nosniff"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(fields, want);
        // A body, and statuses from the static table.
        let h1 = b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno\n";
        block.clear();
        let body = transcode(h1, &mut block).unwrap();
        assert_eq!(&h1[body], b"no\n");
        assert_eq!(block[0], 0x80 | 13);
        assert_eq!(transcode(b"garbage", &mut block), None);
    }

    proptest::proptest! {
        #[test]
        fn redirect_is_the_transcode_of_the_render(
            url in "https://[a-z0-9.-]{1,30}/[!-~]{0,200}",
            hsts in proptest::bool::ANY,
        ) {
            let extra: &[u8] = if hsts {
                b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nStrict-Transport-Security: max-age=60\r\n"
            } else {
                b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n"
            };
            let answer = crate::answer::Answer::Redirect { url: url.as_bytes() };
            let mut h1 = Vec::new();
            crate::render::render_with(&answer, &get_request(), extra, &crate::render::NO_PAGES, &mut h1);
            let mut via_render = Vec::new();
            let body = transcode(&h1, &mut via_render).unwrap();
            proptest::prop_assert!(body.is_empty());
            let mut direct = Vec::new();
            let mut lines = Lines::default();
            redirect(url.as_bytes(), lines.of(extra), &mut direct);
            proptest::prop_assert_eq!(direct, via_render);
        }
    }

    fn get_request() -> Request<'static> {
        crate::http::request_from_fields(
            Method::Get,
            b"/abc1234",
            b"lh.example",
            std::iter::empty(),
            &Limits::default(),
        )
    }

    #[test]
    fn long_integers_round_trip_through_the_oracle() {
        let long = "v".repeat(70_000);
        let mut block = Vec::new();
        block.push(0);
        put_string(&mut block, b"x-long");
        put_string(&mut block, long.as_bytes());
        let fields = hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(fields[0].1.len(), 70_000);
    }

    proptest::proptest! {
        #[test]
        fn garbage_blocks_never_panic(block in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut d = Decoder::default();
            let mut f = Fields::default();
            let _ = decode(&mut d, &block, false, lim(), &Limits::default(), &mut f, |_| {});
            let _ = decode(&mut d, &block, true, lim(), &Limits::default(), &mut f, |_| {});
        }

        #[test]
        fn what_the_oracle_encodes_we_decode(
            fields in proptest::collection::vec(("[a-z][a-z0-9-]{0,20}", "[!-~]([ -~]{0,40}[!-~])?"), 0..20)
        ) {
            let mut all: Vec<(String, String)> = vec![
                (":method".into(), "GET".into()), (":scheme".into(), "https".into()),
                (":path".into(), "/p".into())];
            all.extend(fields.into_iter().filter(|(n, _)| !matches!(n.as_str(),
                "connection" | "proxy-connection" | "keep-alive" | "transfer-encoding"
                | "upgrade" | "te" | "content-length" | "host")));
            let mut e = hpack::Encoder::new();
            let block = e.encode(all.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
            let mut d = Decoder::default();
            let mut f = Fields::default();
            let decoded = decode(&mut d, &block, false, lim(), &Limits::default(), &mut f, |_| {});
            proptest::prop_assert!(decoded.is_ok());
            let ua = all.iter().rev().find(|(n, _)| n == "user-agent").map(|(_, v)| v.clone()).unwrap_or_default();
            let limits = Limits::default();
            let r = f.request(&limits);
            // The last user-agent wins, as in HTTP/1.
            proptest::prop_assert_eq!(r.user_agent, ua.as_bytes());
        }
    }
}
