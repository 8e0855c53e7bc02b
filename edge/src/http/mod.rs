//! HTTP/1.x request parsing: the first step of the request path (docs/ARCHITECTURE.md, "The request
//! path").
//!
//! [`parse`] looks at the bytes a connection has buffered and says whether they start with a
//! complete request ([`Parse::Complete`], with how many bytes it took, so the caller can loop
//! over pipelined requests), need more bytes ([`Parse::Partial`]), or can never become a request
//! we serve ([`Parse::Error`]; answer it with [`crate::answer::Answer::BadRequest`] and close).
//!
//! The head nearly every client sends (`GET`/`HEAD`, an origin-form ASCII target, HTTP/1.x,
//! CRLF, printable values) goes through `fast`, one pass with SWAR scans; every other head,
//! and every head the fast path is unsure of, through `httparse` (SIMD where the CPU has it)
//! into a stack array of header slots. Both feed one policy (`Head`), so they answer alike,
//! and the fast path is held to `httparse`'s by property tests and the `request` fuzz target.
//! Nothing here allocates. What we add on top of the syntax is policy:
//!
//! - limits on the request line, the header count and the whole head, enforced on partial input
//!   too, so a client dribbling bytes (slowloris) is cut off at a byte limit, not only by the
//!   loop's timer;
//! - no request bodies: we serve GET and HEAD only, and without reading a body we could not find
//!   where the next pipelined request starts. A request announcing one (`Content-Length` > 0 or
//!   any `Transfer-Encoding`) is an error that closes the connection: 405 when the method is
//!   not ours anyway (a POST), 400 for a GET or HEAD;
//! - HTTP/1.1 requests must carry exactly one `Host`, and no request may carry two (RFC 9112
//!   §3.2: 400);
//! - a later HTTP/1 minor version (`HTTP/1.2`) is answered as HTTP/1.1 (RFC 9110 §2.5: a
//!   recipient of a higher minor version treats it as the highest it speaks); `HTTP/2.0` and
//!   the like in a request line get 505;
//! - the path is the target up to `?` or `#`: a short URL's query string is dropped
//!   (docs/ARCHITECTURE.md, "The request path") and a fragment is the client's business. The
//!   absolute form (`GET http://host/abc`) is reduced to its path. Nothing is percent-decoded:
//!   every byte a code may hold is unreserved, so a client has no reason to encode one.

use std::mem::MaybeUninit;

mod fast;

/// Header slots on the stack: the most [`Limits::max_headers`] can usefully be.
pub const HEADER_SLOTS: usize = 128;

/// Size limits on a request head. A request over any of them is refused and the connection
/// closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line (method, target and version), in bytes. Default 8 KiB.
    pub max_request_line: usize,
    /// Most header fields. Default 64; values above [`HEADER_SLOTS`] act as [`HEADER_SLOTS`].
    pub max_headers: usize,
    /// Longest head (request line, header fields and the blank line), in bytes. Default 16 KiB.
    /// This is also the most a connection may buffer while its head is incomplete.
    pub max_header_bytes: usize,
    /// A header a trusted upstream sets to the client's country (`--country-header`),
    /// captured into [`Request::country`]; `None` captures nothing.
    pub country_header: Option<HeaderName>,
    /// HTTP/2's limits and whether the plain listener speaks h2c.
    pub h2: crate::h2::H2Limits,
}

/// Longest header name [`HeaderName`] holds.
pub const MAX_HEADER_NAME: usize = 64;

/// A header field name held inline and lower-cased (so [`Limits`] stays `Copy` and borrows
/// nothing).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HeaderName {
    len: u8,
    bytes: [u8; MAX_HEADER_NAME],
}

impl std::fmt::Debug for HeaderName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Why a header name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a header name of 1 to {MAX_HEADER_NAME} token characters: {0:?}")]
pub struct HeaderNameError(pub String);

impl HeaderName {
    /// `name`, lower-cased; a header name is 1 to [`MAX_HEADER_NAME`] token characters
    /// (RFC 9110 §5.1).
    pub fn new(name: &str) -> Result<HeaderName, HeaderNameError> {
        let b = name.as_bytes();
        let token = |c: &u8| fast::TOKEN[usize::from(*c)];
        if b.is_empty() || b.len() > MAX_HEADER_NAME || !b.iter().all(token) {
            return Err(HeaderNameError(name.to_string()));
        }
        let mut bytes = [0u8; MAX_HEADER_NAME];
        for (d, s) in bytes.iter_mut().zip(b) {
            *d = s.to_ascii_lowercase();
        }
        Ok(HeaderName {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The lower-cased name.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: 8 * 1024,
            max_headers: 64,
            max_header_bytes: 16 * 1024,
            country_header: None,
            h2: crate::h2::H2Limits::default(),
        }
    }
}

/// Request method, as far as we care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    /// Anything else; answered 405 with `Allow: GET, HEAD`.
    Other,
}

/// A parsed request head, borrowed from the connection's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub method: Method,
    /// The target's path, up to but excluding the first `?` or `#` (for the absolute form, the
    /// path after the authority). A sub-slice of the parsed buffer.
    pub path: &'a [u8],
    /// `Accept` names `application/json` (preview pages answer in JSON then).
    pub accept_json: bool,
    /// Whether the connection stays open after the answer: HTTP/1.1 unless `Connection: close`,
    /// HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// `User-Agent`, empty when absent (for click records).
    pub user_agent: &'a [u8],
    /// `Referer`, empty when absent (for click records).
    pub referer: &'a [u8],
    /// The [`Limits::country_header`] value, empty when absent or not configured.
    pub country: &'a [u8],
    /// The request says it fetches ahead of a person: `Sec-Purpose` or `Purpose` naming
    /// `prefetch` (Chromium, Safari, Firefox's prefetch and prerender), `X-Moz: prefetch`
    /// (older Firefox), or `X-Purpose: preview` (Safari's Top Sites). Its click counts as a bot.
    pub prefetch: bool,
    /// The request said HTTP/1.0 (an HTTP/1.0 keep-alive answer must say `Connection:
    /// keep-alive`, which [`crate::render::render_for`] does).
    pub http10: bool,
    /// The `Host` value, empty when absent (an HTTP/1.0 request may omit it).
    pub host: &'a [u8],
    /// The whole request target as sent (path and query), for a redirect to HTTPS.
    pub target: &'a [u8],
}

/// Why bytes can never become a request we serve. Every variant closes the connection: after
/// any of them we cannot tell where a next request would start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// Not HTTP/1.x syntax, a bad `Content-Length`, or HTTP/1.1 without `Host`: 400.
    #[error("malformed request")]
    Malformed,
    /// A GET or HEAD with a body: 400.
    #[error("request has a body")]
    BodyNotAllowed,
    /// Another method with a body: 405 with `Allow` (it is not ours either way, and its body
    /// leaves the stream unusable).
    #[error("method not allowed, and the request has a body")]
    MethodWithBody,
    /// The request line is over [`Limits::max_request_line`]: 414.
    #[error("request line too long")]
    UriTooLong,
    /// Too many header fields, or a head over [`Limits::max_header_bytes`]: 431.
    #[error("request header fields too large")]
    HeadersTooLarge,
    /// An HTTP version other than 1.0 or 1.1: 505.
    #[error("HTTP version not supported")]
    VersionNotSupported,
}

impl HttpError {
    /// The status code the error is answered with.
    pub fn status(self) -> u16 {
        match self {
            HttpError::Malformed | HttpError::BodyNotAllowed => 400,
            HttpError::MethodWithBody => 405,
            HttpError::UriTooLong => 414,
            HttpError::HeadersTooLarge => 431,
            HttpError::VersionNotSupported => 505,
        }
    }

    /// Whether the connection closes after the answer: always, see the type's docs.
    pub fn closes(self) -> bool {
        true
    }
}

/// What the buffered bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse<'a> {
    /// A whole request head; `consumed` bytes of the buffer belong to it (there is never a
    /// body), the rest is the next pipelined request, if any.
    Complete { req: Request<'a>, consumed: usize },
    /// A prefix of a request that is still within the limits: read more.
    Partial,
    /// Answer the error and close.
    Error(HttpError),
}

/// Parses the request at the start of `buf`. Never panics; allocates only for a request line
/// that says `HTTP/1.2` or later (a copy that says 1.1, parsed in its place).
#[inline]
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    if let Some(done) = fast::parse(buf, limits) {
        return done;
    }
    parse_general(buf, limits)
}

/// [`parse`] without the fast path: `httparse` for the syntax of every request. Public so
/// that the fuzz target and the property tests can hold the fast path to it.
#[doc(hidden)]
pub fn parse_general<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    match parse_exact(buf, limits) {
        Parse::Error(HttpError::VersionNotSupported) => match later_minor(buf) {
            Some(at) => {
                let mut copy = buf.to_vec();
                copy[at] = b'1';
                match parse_exact(&copy, limits) {
                    Parse::Complete { req, consumed } => Parse::Complete {
                        req: rebase(buf, &copy, req),
                        consumed,
                    },
                    Parse::Partial => Parse::Partial,
                    Parse::Error(e) => Parse::Error(e),
                }
            }
            None => Parse::Error(HttpError::VersionNotSupported),
        },
        other => other,
    }
}

/// Where the minor digit of an `HTTP/1.d` version with d > 1 sits in the request line.
fn later_minor(buf: &[u8]) -> Option<usize> {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let start = line.len().checked_sub(8)?;
    match &line[start..] {
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', d] if d.is_ascii_digit() && *d > b'1' => {
            Some(start + 7)
        }
        _ => None,
    }
}

/// `req`, parsed from `copy` (a copy of `buf` differing in one byte), with its slices moved to
/// the same places in `buf`.
fn rebase<'a>(buf: &'a [u8], copy: &[u8], req: Request<'_>) -> Request<'a> {
    let at = |s: &[u8]| -> &'a [u8] {
        let start = offset_in(copy, s);
        buf.get(start..start + s.len()).unwrap_or(b"")
    };
    Request {
        method: req.method,
        path: at(req.path),
        accept_json: req.accept_json,
        keep_alive: req.keep_alive,
        user_agent: at(req.user_agent),
        referer: at(req.referer),
        country: at(req.country),
        prefetch: req.prefetch,
        http10: req.http10,
        host: at(req.host),
        target: at(req.target),
    }
}

/// [`parse`] of exactly the bytes given (`HTTP/1.2` is a 505 here).
#[inline]
fn parse_exact<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    let mut slots = [MaybeUninit::<httparse::Header<'a>>::uninit(); HEADER_SLOTS];
    let slots = &mut slots[..limits.max_headers.min(HEADER_SLOTS)];
    let mut req = httparse::Request::new(&mut []);
    let consumed = match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return partial(buf, limits),
        Err(httparse::Error::TooManyHeaders) => return Parse::Error(HttpError::HeadersTooLarge),
        Err(httparse::Error::Version) => return Parse::Error(version_error(buf, limits)),
        Err(_) => return Parse::Error(line_error(buf, limits, HttpError::Malformed)),
    };
    // httparse fills method, path and version before it reports Complete.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parse::Error(HttpError::Malformed);
    };
    let target = target.as_bytes();
    // The line ends 9 bytes (" HTTP/1.x") after the target; leading blank lines count too,
    // which only ever makes the check stricter.
    let line_len = offset_in(buf, target).saturating_add(target.len() + 9);
    if line_len > limits.max_request_line {
        return Parse::Error(HttpError::UriTooLong);
    }
    if consumed > limits.max_header_bytes {
        return Parse::Error(HttpError::HeadersTooLarge);
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => Method::Other,
    };
    let mut head = Head::new(method, target, path_of(target), version == 0);
    for h in req.headers.iter() {
        if let Err(e) = head.header(h.name.as_bytes(), h.value, limits) {
            return Parse::Error(e);
        }
    }
    head.finish(consumed)
}

/// The request an HTTP/2 (or HTTP/3) header list makes, through the same field policy as
/// HTTP/1: `target` is `:path`, `authority` is `:authority` (or `Host`), `fields` are the
/// regular fields the policy reads. Length and body rules are the caller's (frames, not
/// headers, carry a body there).
pub fn request_from_fields<'a>(
    method: Method,
    target: &'a [u8],
    authority: &'a [u8],
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    limits: &Limits,
) -> Request<'a> {
    let mut head = Head::new(method, target, path_of(target), false);
    for (name, value) in fields {
        // Only `content-length` can refuse, and the caller checked it.
        let _ = head.header(name, value, limits);
    }
    let mut req = head.req;
    req.host = authority;
    req.keep_alive = true;
    req
}

/// Whether a purpose header's value has a token `prefetch` or `preview` (`prefetch`,
/// `prefetch;prerender`, `preview`), case-insensitively; `no-prefetch` is not one.
fn prefetch(value: &[u8]) -> bool {
    value
        .split(|&b| matches!(b, b';' | b',' | b' ' | b'\t'))
        .any(|t| t.eq_ignore_ascii_case(b"prefetch") || t.eq_ignore_ascii_case(b"preview"))
}

/// What the header fields of a request head say, gathered one field at a time: the policy on
/// top of the syntax, shared by [`fast`] and `httparse`'s path so both answer alike.
struct Head<'a> {
    req: Request<'a>,
    hosts: u32,
    body: bool,
    close: bool,
    keep: bool,
}

impl<'a> Head<'a> {
    #[inline]
    fn new(method: Method, target: &'a [u8], path: &'a [u8], http10: bool) -> Head<'a> {
        Head {
            req: Request {
                method,
                path,
                accept_json: false,
                keep_alive: !http10,
                user_agent: b"",
                referer: b"",
                country: b"",
                prefetch: false,
                http10,
                host: b"",
                target,
            },
            hosts: 0,
            body: false,
            close: false,
            keep: false,
        }
    }

    /// One header field; `name` is token characters, `value` trimmed as `httparse` trims it.
    #[inline]
    fn header(&mut self, name: &[u8], value: &'a [u8], limits: &Limits) -> Result<(), HttpError> {
        let out = &mut self.req;
        // Dispatch on length first: one compare rules out most names.
        match name.len() {
            5 if eq_lower(name, b"x-moz") => out.prefetch |= prefetch(value),
            7 if eq_lower(name, b"purpose") => out.prefetch |= prefetch(value),
            9 if eq_lower(name, b"x-purpose") => out.prefetch |= prefetch(value),
            11 if eq_lower(name, b"sec-purpose") => out.prefetch |= prefetch(value),
            4 if eq_lower(name, b"host") => {
                self.hosts += 1;
                out.host = value;
            }
            6 if eq_lower(name, b"accept") => {
                out.accept_json |= names_json(value);
            }
            7 if eq_lower(name, b"referer") => out.referer = value,
            10 if eq_lower(name, b"connection") => {
                for token in value.split(|&b| b == b',') {
                    let token = trim(token);
                    self.close |= token.eq_ignore_ascii_case(b"close");
                    self.keep |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            10 if eq_lower(name, b"user-agent") => out.user_agent = value,
            14 if eq_lower(name, b"content-length") => match parse_length(value) {
                Some(0) => {}
                Some(_) => self.body = true,
                None => return Err(HttpError::Malformed),
            },
            17 if eq_lower(name, b"transfer-encoding") => self.body = true,
            n if limits.country_header.as_ref().is_some_and(|want| {
                let want = want.as_bytes();
                want.len() == n && name.eq_ignore_ascii_case(want)
            }) =>
            {
                out.country = value
            }
            _ => {}
        }
        Ok(())
    }

    /// The head ended after `consumed` bytes.
    #[inline]
    fn finish(self, consumed: usize) -> Parse<'a> {
        let mut req = self.req;
        if self.body {
            return Parse::Error(match req.method {
                Method::Other => HttpError::MethodWithBody,
                Method::Get | Method::Head => HttpError::BodyNotAllowed,
            });
        }
        if self.hosts > 1 || (!req.http10 && self.hosts == 0) {
            return Parse::Error(HttpError::Malformed);
        }
        req.keep_alive = !self.close && (self.keep || !req.http10);
        Parse::Complete { req, consumed }
    }
}

/// An incomplete head: fine while it is within the limits.
fn partial<'a>(buf: &[u8], limits: &Limits) -> Parse<'a> {
    // The line may be up to the limit long, so its '\n' sits at index <= the limit.
    let line_ended = buf
        .iter()
        .take(limits.max_request_line.saturating_add(1))
        .any(|&b| b == b'\n');
    if !line_ended && buf.len() > limits.max_request_line {
        Parse::Error(HttpError::UriTooLong)
    } else if buf.len() > limits.max_header_bytes {
        Parse::Error(HttpError::HeadersTooLarge)
    } else {
        Parse::Partial
    }
}

/// A syntax error: 414 rather than 400 when the line was already too long (the client gets
/// the more useful of the two answers).
fn line_error(buf: &[u8], limits: &Limits, otherwise: HttpError) -> HttpError {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(buf);
    if line.len() > limits.max_request_line {
        HttpError::UriTooLong
    } else {
        otherwise
    }
}

/// httparse says `Version` for any bad byte where the version goes: 505 only for a
/// well-formed `HTTP/d.d` that is not 1.0 or 1.1.
fn version_error(buf: &[u8], limits: &Limits) -> HttpError {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let version = parts.nth(2).unwrap_or(b"");
    let well_formed = parts.next().is_none()
        && matches!(version, [b'H', b'T', b'T', b'P', b'/', d1, b'.', d2]
            if d1.is_ascii_digit() && d2.is_ascii_digit());
    line_error(
        buf,
        limits,
        if well_formed {
            HttpError::VersionNotSupported
        } else {
            HttpError::Malformed
        },
    )
}

/// Where `inner` starts within `outer` (both from the same buffer).
fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize)
}

/// The path of a request target: up to `?` or `#`, and past the authority of the absolute form.
#[inline]
fn path_of(target: &[u8]) -> &[u8] {
    let end = target
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(target.len());
    let path = &target[..end];
    if path.first() == Some(&b'/') {
        return path; // the origin form, which is nearly every request
    }
    let after_scheme = if starts_with_ignore_case(path, b"http://") {
        &path[7..]
    } else if starts_with_ignore_case(path, b"https://") {
        &path[8..]
    } else {
        return path;
    };
    let slash = after_scheme
        .iter()
        .position(|&b| b == b'/')
        .unwrap_or(after_scheme.len());
    &after_scheme[slash..]
}

/// Whether header name `name` is `lower`, ignoring ASCII case, a word at a time. `lower` is
/// lower-case letters, digits and `-` only; `name` is token characters only (httparse refuses
/// anything else), and OR-ing 0x20 into a token character lower-cases a letter and maps nothing
/// else onto a letter, a digit or `-` (only CR, 0x0D, would become `-`, and it is no token
/// character). Measured: the header loop's name matching fell from ~140 to ~40 instructions
/// per curl request (`benches/examples/parse_loop.rs` under callgrind).
#[inline]
fn eq_lower(name: &[u8], lower: &[u8]) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    if name.len() != lower.len() {
        return false;
    }
    let (mut a, mut b) = (name, lower);
    while let (Some((x, a_rest)), Some((y, b_rest))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if u64::from_le_bytes(*x) | CASE != u64::from_le_bytes(*y) {
            return false;
        }
        (a, b) = (a_rest, b_rest);
    }
    a.iter().zip(b).all(|(&x, &y)| x | 0x20 == y)
}

fn starts_with_ignore_case(s: &[u8], prefix: &[u8]) -> bool {
    s.get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// An `Accept` value names the media type `application/json` (any case, any parameters; a
/// `q=0` is not honoured: nobody sends one for JSON). Jumps from `/` to `/` (found eight bytes
/// at a time) and looks for `json` after one before `application` in front of it: a
/// browser's `Accept` is ~100 bytes with five slashes.
fn names_json(value: &[u8]) -> bool {
    const TYPE: &[u8] = b"application";
    let mut from = 0;
    while let Some(slash) = value
        .get(from..)
        .and_then(|rest| fast::find_byte(rest, b'/'))
        .map(|i| from + i)
    {
        from = slash + 1;
        let json = value
            .get(slash + 1..)
            .and_then(|rest| rest.first_chunk::<4>())
            // OR-ing 0x20 lower-cases a letter and maps no other byte onto one of these.
            .is_some_and(|s| u32::from_le_bytes(*s) | 0x2020_2020 == u32::from_le_bytes(*b"json"));
        if json
            && value
                .get(slash + 5)
                .is_none_or(|&end| matches!(end, b';' | b',' | b' ' | b'\t'))
            && slash
                .checked_sub(TYPE.len())
                .and_then(|start| value.get(start..slash))
                .is_some_and(|t| t.eq_ignore_ascii_case(TYPE))
        {
            return true;
        }
    }
    false
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

/// A `Content-Length` value: digits only (a list of equal values, which RFC 9112 lets a
/// recipient accept, is refused; nobody sends one to a redirector).
fn parse_length(value: &[u8]) -> Option<u64> {
    let digits = trim(value);
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn complete(buf: &[u8]) -> (Request<'_>, usize) {
        match parse(buf, &Limits::default()) {
            Parse::Complete { req, consumed } => (req, consumed),
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(buf)),
        }
    }

    fn error(buf: &[u8]) -> HttpError {
        error_with(buf, &Limits::default())
    }

    fn error_with(buf: &[u8], limits: &Limits) -> HttpError {
        match parse(buf, limits) {
            Parse::Error(e) => e,
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(buf)),
        }
    }

    const CURL: &[u8] =
        b"GET /abcDEF1 HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";

    #[test]
    fn curl_request() {
        let (req, consumed) = complete(CURL);
        assert_eq!(consumed, CURL.len());
        assert_eq!(req.method, Method::Get);
        assert_eq!(req.path, b"/abcDEF1");
        assert!(req.keep_alive);
        assert!(!req.accept_json);
        assert!(!req.http10);
        assert_eq!(req.user_agent, b"curl/8.5.0");
        assert_eq!(req.referer, b"");
    }

    #[test]
    fn prefetch_and_preview_requests_say_so() {
        let with = |header: &str| {
            let buf = format!("GET /abcDEF1 HTTP/1.1\r\nHost: lh.example\r\n{header}\r\n\r\n");
            let (req, _) = complete(buf.as_bytes());
            req.prefetch
        };
        for header in [
            "Sec-Purpose: prefetch",
            "sec-purpose: prefetch;prerender",
            "Sec-Purpose: prefetch;anonymous-client-ip",
            "Purpose: prefetch",
            "X-Moz: prefetch",
            "X-Purpose: preview",
            "X-Purpose: Preview",
        ] {
            assert!(with(header), "{header}");
        }
        for header in [
            "Sec-Purpose: x",
            "Purpose: navigate",
            "X-Moz: x",
            "Sec-Fetch-Mode: navigate",
        ] {
            assert!(!with(header), "{header}");
        }
        let (req, _) = complete(CURL);
        assert!(!req.prefetch);
    }

    #[test]
    fn browser_request() {
        let buf = b"GET /my-alias-1+?utm_source=x#frag HTTP/1.1\r\nHost: lh.example\r\n\
            User-Agent: Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0\r\n\
            Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n\
            Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n\
            Referer: https://news.example/\r\nConnection: keep-alive\r\n\
            Upgrade-Insecure-Requests: 1\r\n\r\n";
        let (req, _) = complete(buf);
        assert_eq!(req.path, b"/my-alias-1+");
        assert_eq!(req.referer, b"https://news.example/");
        assert!(req.keep_alive);
        assert!(!req.accept_json);
    }

    #[test]
    fn head_json_and_other_methods() {
        let (req, _) = complete(
            b"HEAD /x HTTP/1.1\r\nhost: a\r\naccept: Application/JSON; charset=utf-8\r\n\r\n",
        );
        assert_eq!(req.method, Method::Head);
        assert!(req.accept_json);
        let (req, _) = complete(b"DELETE /x HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(req.method, Method::Other);
        let (req, _) = complete(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(req.method, Method::Other);
    }

    proptest! {
        #[test]
        fn names_json_agrees_with_a_plain_scan(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("application/json"), Just("APPLICATION/JSON"), Just("application/jsonp"),
                    Just("/json"), Just("text/html"), Just(";q=0.9"), Just(","), Just(" "),
                    Just("\t"), Just("*/*"), Just("/"), Just("application"), Just("json"),
                ],
                0..8,
            ),
        ) {
            let value = parts.concat();
            let v = value.as_bytes();
            const WANT: &[u8] = b"application/json";
            let plain = (0..v.len()).any(|i| {
                v.get(i..i + WANT.len()).is_some_and(|s| s.eq_ignore_ascii_case(WANT))
                    && v.get(i + WANT.len()).is_none_or(|e| matches!(e, b';' | b',' | b' ' | b'\t'))
            });
            prop_assert_eq!(names_json(v), plain, "{:?}", value);
        }
    }

    #[test]
    fn accept_json() {
        let json = |accept: &str| {
            let buf = format!("GET / HTTP/1.1\r\nHost: a\r\nAccept: {accept}\r\n\r\n");
            complete(buf.as_bytes()).0.accept_json
        };
        assert!(json("application/json"));
        assert!(json("APPLICATION/Json;q=0.9, */*"));
        assert!(json("text/plain,application/json"));
        assert!(json("text/html, application/json ,*/*"));
        assert!(!json("*/*"));
        assert!(!json(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(!json("application/jsonp"));
        assert!(!json("application/json-seq"));
        assert!(!json("/json"));
    }

    #[test]
    fn keep_alive_rules() {
        let ka = |buf: &[u8]| complete(buf).0.keep_alive;
        assert!(ka(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(!ka(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, Close\r\n\r\n"
        ));
        assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(!ka(
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"
        ));
        assert!(complete(b"GET / HTTP/1.0\r\n\r\n").0.http10);
    }

    #[test]
    fn paths() {
        let path = |buf: &'static [u8]| complete(buf).0.path;
        assert_eq!(path(b"GET /abc?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"), b"/abc");
        assert_eq!(path(b"GET /abc#f HTTP/1.1\r\nHost: a\r\n\r\n"), b"/abc");
        assert_eq!(
            path(b"GET http://a.example/abc?q HTTP/1.1\r\nHost: a\r\n\r\n"),
            b"/abc"
        );
        assert_eq!(
            path(b"GET HTTPS://a.example HTTP/1.1\r\nHost: a\r\n\r\n"),
            b""
        );
        assert_eq!(path(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), b"*");
        // Leading blank lines are tolerated (RFC 9112 §2.2).
        assert_eq!(path(b"\r\nGET /z HTTP/1.1\r\nHost: a\r\n\r\n"), b"/z");
    }

    #[test]
    fn pipelined() {
        let mut buf = Vec::new();
        buf.extend_from_slice(CURL);
        buf.extend_from_slice(b"HEAD /two HTTP/1.1\r\nHost: a\r\n\r\n");
        buf.extend_from_slice(b"GET /thr");
        let (first, n1) = complete(&buf);
        assert_eq!(first.path, b"/abcDEF1");
        let (second, n2) = complete(&buf[n1..]);
        assert_eq!(second.path, b"/two");
        assert_eq!(second.method, Method::Head);
        assert_eq!(parse(&buf[n1 + n2..], &Limits::default()), Parse::Partial);
    }

    #[test]
    fn partial_then_complete() {
        for cut in 0..CURL.len() {
            assert_eq!(
                parse(&CURL[..cut], &Limits::default()),
                Parse::Partial,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn bodies_are_refused() {
        assert_eq!(
            error(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"),
            HttpError::MethodWithBody
        );
        assert_eq!(
            error(b"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HttpError::MethodWithBody
        );
        assert_eq!(
            error(b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx"),
            HttpError::BodyNotAllowed
        );
        assert_eq!(
            error(b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"),
            HttpError::Malformed
        );
        assert_eq!(
            error(b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1,1\r\n\r\n"),
            HttpError::Malformed
        );
        assert_eq!(HttpError::MethodWithBody.status(), 405);
    }

    #[test]
    fn malformed() {
        assert_eq!(
            error(b"GET /x HTTP/1.1\r\n\r\n"),
            HttpError::Malformed,
            "no Host"
        );
        assert_eq!(error(b"GET /x\r\n\r\n"), HttpError::Malformed);
        assert_eq!(
            error(b"\x16\x03\x01\x02\x00\x01\x00"),
            HttpError::Malformed,
            "TLS hello"
        );
        assert_eq!(
            error(b"GET /x HTTP/2.0\r\n\r\n"),
            HttpError::VersionNotSupported
        );
        assert_eq!(
            error(b"GET /x HTTP/1.1\r\nBad Header: x\r\n\r\n"),
            HttpError::Malformed
        );
        assert_eq!(
            error(b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"),
            HttpError::Malformed
        );
    }

    #[test]
    fn one_host_and_later_minor_versions() {
        let limits = Limits::default();
        // Two Host headers: 400 (RFC 9112 §3.2), whatever they say.
        for raw in [
            &b"GET /x HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"[..],
            b"GET /x HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n",
        ] {
            assert_eq!(parse(raw, &limits), Parse::Error(HttpError::Malformed));
        }
        // HTTP/1.2 is answered as HTTP/1.1 (RFC 9110 §2.5); its slices are of the input.
        let raw = b"GET /abc1234?q HTTP/1.2\r\nHost: lh.example\r\nUser-Agent: t\r\n\r\nGET";
        let Parse::Complete { req, consumed } = parse(raw, &limits) else {
            panic!("HTTP/1.2 refused");
        };
        assert_eq!(consumed, raw.len() - 3);
        assert!(!req.http10 && req.keep_alive);
        assert_eq!(
            (req.path, req.host, req.target),
            (&b"/abc1234"[..], &b"lh.example"[..], &b"/abc1234?q"[..])
        );
        assert_eq!(req.user_agent, b"t");
        let inside = |s: &[u8]| {
            let (a, b) = (raw.as_ptr() as usize, s.as_ptr() as usize);
            b >= a && b + s.len() <= a + raw.len()
        };
        assert!(inside(req.path) && inside(req.host) && inside(req.user_agent));
        assert_eq!(
            parse(b"GET / HTTP/1.9\r\n\r\n", &limits),
            Parse::Error(HttpError::Malformed),
            "HTTP/1.9 is HTTP/1.1, which needs a Host"
        );
        for raw in [
            &b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/0.9\r\n\r\n",
        ] {
            assert_eq!(
                parse(raw, &limits),
                Parse::Error(HttpError::VersionNotSupported)
            );
        }
    }

    #[test]
    fn names_match_their_lower_case_form_and_nothing_else() {
        for (name, want) in [
            (&b"Host"[..], &b"host"[..]),
            (b"HOST", b"host"),
            (b"User-Agent", b"user-agent"),
            (b"TRANSFER-ENCODING", b"transfer-encoding"),
            (b"content-Length", b"content-length"),
        ] {
            assert!(eq_lower(name, want), "{name:?}");
        }
        for (name, want) in [
            (&b"Hosts"[..], &b"host"[..]),
            (b"Hist", b"host"),
            (b"User_Agent", b"user-agent"),
            (b"user-agenT1", b"user-agent"),
            (b"Content-Lengtx", b"content-length"),
            (b"Conn~ction", b"connection"),
        ] {
            assert!(!eq_lower(name, want), "{name:?}");
        }
    }

    proptest::proptest! {
        /// Over every token name, the word-at-a-time compare agrees with the plain one.
        #[test]
        fn eq_lower_agrees_with_eq_ignore_ascii_case(
            name in "[!#$%&'*+.^_`|~0-9A-Za-z-]{0,20}",
            which in 0usize..7,
        ) {
            let want = [&b"host"[..], b"accept", b"referer", b"connection", b"user-agent",
                b"content-length", b"transfer-encoding"][which];
            proptest::prop_assert_eq!(
                eq_lower(name.as_bytes(), want),
                name.as_bytes().eq_ignore_ascii_case(want)
            );
            let cased: String = std::str::from_utf8(want).unwrap().chars()
                .enumerate()
                .map(|(i, c)| if i % 2 == 0 { c.to_ascii_uppercase() } else { c })
                .collect();
            proptest::prop_assert!(eq_lower(cased.as_bytes(), want));
        }
    }

    #[test]
    fn header_names_are_tokens_kept_lower_case() {
        let n = HeaderName::new("CF-IPCountry").unwrap();
        assert_eq!(n.as_bytes(), b"cf-ipcountry");
        for bad in ["", "a b", "x:y", "é", &"a".repeat(MAX_HEADER_NAME + 1)] {
            assert!(HeaderName::new(bad).is_err(), "{bad:?}");
        }
        assert!(HeaderName::new(&"a".repeat(MAX_HEADER_NAME)).is_ok());
    }

    #[test]
    fn captures_the_configured_country_header_only() {
        let buf = b"GET /x HTTP/1.1\r\nHost: a\r\nCF-IPCountry: DE\r\nCountry: FR\r\n\r\n";
        let (req, _) = complete(buf);
        assert_eq!(req.country, b"");
        let limits = Limits {
            country_header: Some(HeaderName::new("CF-IPCountry").unwrap()),
            ..Limits::default()
        };
        let Parse::Complete { req, .. } = parse(buf, &limits) else {
            panic!("complete")
        };
        assert_eq!(req.country, b"DE");
    }

    #[test]
    fn limits() {
        let small = Limits {
            max_request_line: 32,
            max_headers: 2,
            max_header_bytes: 64,
            country_header: None,
            ..Limits::default()
        };
        let long_path = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(40));
        assert_eq!(
            error_with(long_path.as_bytes(), &small),
            HttpError::UriTooLong
        );
        // Still incomplete but already over the line limit: cut off now.
        assert_eq!(
            error_with(&long_path.as_bytes()[..36], &small),
            HttpError::UriTooLong
        );
        assert_eq!(
            error_with(b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n", &small),
            HttpError::HeadersTooLarge
        );
        // Slowloris: a head that never ends is refused once it passes the byte limit.
        let mut dribble = b"GET / HTTP/1.1\r\nHost: a\r\nX-A: ".to_vec();
        while dribble.len() <= 64 {
            assert_eq!(parse(&dribble, &small), Parse::Partial);
            dribble.push(b'a');
        }
        assert_eq!(error_with(&dribble, &small), HttpError::HeadersTooLarge);
        let big_head = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n", "b".repeat(60));
        assert_eq!(
            error_with(big_head.as_bytes(), &small),
            HttpError::HeadersTooLarge
        );
        let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..70 {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(error(&many), HttpError::HeadersTooLarge);
    }

    fn arb_path() -> impl Strategy<Value = String> {
        "/[A-Za-z0-9_+-]{0,20}(\\?[a-z=&]{0,10})?"
    }

    proptest! {
        #[test]
        fn never_panics(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&buf, &Limits::default());
        }

        /// Mostly-valid input exercises the deeper branches better than noise.
        #[test]
        fn never_panics_near_valid(
            cut in 0usize..200,
            flip in 0usize..200,
            byte in any::<u8>(),
            path in arb_path(),
        ) {
            let mut buf = format!(
                "GET {path} HTTP/1.1\r\nHost: a\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
            ).into_bytes();
            if let Some(b) = buf.get_mut(flip) {
                *b = byte;
            }
            buf.truncate(cut);
            let _ = parse(&buf, &Limits::default());
        }

        #[test]
        fn path_is_a_slice_of_the_input(buf in proptest::collection::vec(any::<u8>(), 0..300), path in arb_path()) {
            let mut input = format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes();
            input.extend_from_slice(&buf);
            for b in [&input[..], &buf[..]] {
                if let Parse::Complete { req, consumed } = parse(b, &Limits::default()) {
                    prop_assert!(consumed <= b.len());
                    let start = offset_in(b, req.path);
                    prop_assert!(start + req.path.len() <= consumed);
                    prop_assert_eq!(&b[start..start + req.path.len()], req.path);
                }
            }
        }

        #[test]
        fn pipelined_parse_back_in_order(paths in proptest::collection::vec(arb_path(), 1..8), head in any::<bool>()) {
            let mut buf = Vec::new();
            for p in &paths {
                let method = if head { "HEAD" } else { "GET" };
                buf.extend_from_slice(format!("{method} {p} HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n").as_bytes());
            }
            let mut at = 0;
            for p in &paths {
                match parse(&buf[at..], &Limits::default()) {
                    Parse::Complete { req, consumed } => {
                        let want = p.split('?').next().unwrap_or("");
                        prop_assert_eq!(req.path, want.as_bytes());
                        at += consumed;
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            prop_assert_eq!(at, buf.len());
        }
    }
}
