//! The fast path of [`super::parse`]: the head every client sends nearly always (`GET` or
//! `HEAD` of an origin-form target, `HTTP/1.1` or `HTTP/1.0`, CRLF line ends, printable
//! header values), parsed in one pass with no second look at any byte; header values are
//! scanned eight bytes at a time.
//!
//! It answers only when it is sure: the moment a byte leaves that shape (another method, a
//! non-ASCII or absolute target, a bare LF, a tab in a value, a leading blank line, more
//! fields than the limits allow, a head over a limit, or the end of the buffer) it says
//! `None`, and `httparse` parses the request from the start. So it never accepts what
//! `httparse` refuses, and what it accepts it reads the same way: the property tests below
//! and the `request` fuzz target hold it to [`super::parse_general`] on every input.
//!
//! Why a hand-written parser beside a well-kept crate: callgrind put an 80-byte curl request
//! at ~1,430 instructions with `httparse` (~1,000 of them its, ~100 a UTF-8 check of the
//! target), 45 % of a whole hit on the pure path (`benches/examples/serve_loop.rs`); see
//! `engine/DESIGN.md` for the figures after.

use super::{Limits, Method, Parse, HEADER_SLOTS};

/// RFC 9110 §5.6.2 token characters (a header name), as `httparse` has them.
pub(super) const TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

const LOW: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// A mark (0x80) on each byte of `w` below 0x20 or equal to 0x7f; bytes from 0x80 up
/// (obs-text, which `httparse` allows in a value) are never marked. With each byte's top bit
/// set aside first, no addition carries out of its byte, so every mark is exact.
#[inline(always)]
fn controls(w: u64) -> u64 {
    let low = w & !HIGH;
    // v + 0x60 reaches 0x80 exactly when v >= 0x20.
    let below_space = low.wrapping_add(LOW * (0x80 - 0x20)) ^ HIGH;
    // (v ^ 0x7f) + 0x7f reaches 0x80 exactly when v != 0x7f.
    let del = (low ^ (LOW * 0x7f)).wrapping_add(LOW * 0x7f) ^ HIGH;
    (below_space | del) & !w & HIGH
}

/// A mark (0x80) on each byte of `w` outside `!`..=`~` (a space, a control byte, DEL or any
/// byte from 0x80 up), exactly as [`controls`] marks its bytes.
#[inline(always)]
fn invisible(w: u64) -> u64 {
    let low = w & !HIGH;
    // v + 0x5f reaches 0x80 exactly when v >= 0x21.
    let below_bang = low.wrapping_add(LOW * (0x80 - 0x21)) ^ HIGH;
    let del = (low ^ (LOW * 0x7f)).wrapping_add(LOW * 0x7f) ^ HIGH;
    (below_bang | del | w) & HIGH
}

/// A mark (0x80) on the first zero byte of `w` (and perhaps on bytes after it, never before).
#[inline(always)]
fn zeros(w: u64) -> u64 {
    w.wrapping_sub(LOW) & !w & HIGH
}

/// Where `byte` first occurs in `hay`, eight bytes at a time. (This loop and the two in
/// [`parse`] are written out rather than shared through one helper taking the mark function
/// as a closure: that version measured 12 % more instructions on a curl head and 19 % more on
/// a browser's, callgrind over `benches/examples/parse_loop.rs`.)
#[inline]
pub(super) fn find_byte(hay: &[u8], byte: u8) -> Option<usize> {
    let pattern = LOW * u64::from(byte);
    let mut at = 0;
    while let Some(word) = hay.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
        let marks = zeros(u64::from_le_bytes(*word) ^ pattern);
        if marks != 0 {
            return Some(at + (marks.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = hay.get(at..)?;
    tail.iter().position(|&b| b == byte).map(|i| at + i)
}

/// Parses `buf` when it is the common shape; `None` hands it to `httparse`.
#[inline]
pub(super) fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Option<Parse<'a>> {
    let (method, mut at) = if buf.starts_with(b"GET /") {
        (Method::Get, 4)
    } else if buf.starts_with(b"HEAD /") {
        (Method::Head, 5)
    } else {
        return None;
    };
    // The target: printable ASCII up to the space, eight bytes at a time; the path ends at
    // its first `?` or `#`.
    let start = at;
    at = loop {
        match buf.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
            Some(word) => {
                let marks = invisible(u64::from_le_bytes(*word));
                if marks != 0 {
                    break at + (marks.trailing_zeros() / 8) as usize;
                }
                at += 8;
            }
            None => {
                let len = buf
                    .get(at..)?
                    .iter()
                    .position(|b| !(b'!'..=b'~').contains(b))?;
                break at + len;
            }
        }
    };
    let target = buf.get(start..at)?;
    let path = super::path_of(target);
    let http10 = match buf.get(at..at + 11)? {
        b" HTTP/1.1\r\n" => false,
        b" HTTP/1.0\r\n" => true,
        _ => return None,
    };
    if at + 9 > limits.max_request_line {
        return None;
    }
    at += 11;

    let mut head = super::Head::new(method, target, path, http10);
    let slots = limits.max_headers.min(HEADER_SLOTS);
    let mut fields = 0;
    // A field the policy refuses is answered only once the head is whole, as `httparse`'s
    // path answers it (until then the request is merely incomplete).
    let mut refused = None;
    loop {
        // A blank line ends the head.
        if buf.get(at..at + 2)? == b"\r\n" {
            at += 2;
            break;
        }
        if fields == slots {
            return None;
        }
        fields += 1;
        // The name: one or more token characters, then the colon.
        let name_start = at;
        at += buf
            .get(at..)?
            .iter()
            .position(|&b| !TOKEN[usize::from(b)])?;
        if at == name_start || *buf.get(at)? != b':' {
            return None;
        }
        let name = buf.get(name_start..at)?;
        at += 1;
        while *buf.get(at)? == b' ' {
            at += 1;
        }
        // The value: up to the CR, eight bytes at a time; a control byte other than the CR
        // of a CRLF (a tab included) hands the request over.
        let value_start = at;
        let cr = loop {
            match buf.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
                Some(word) => {
                    let marks = controls(u64::from_le_bytes(*word));
                    if marks != 0 {
                        break at + (marks.trailing_zeros() / 8) as usize;
                    }
                    at += 8;
                }
                None => {
                    // Fewer than eight bytes left: one at a time.
                    let b = *buf.get(at)?;
                    if b < 0x20 || b == 0x7f {
                        break at;
                    }
                    at += 1;
                }
            }
        };
        if buf.get(cr..cr + 2)? != b"\r\n" {
            return None;
        }
        let mut value = buf.get(value_start..cr)?;
        while let [rest @ .., b' '] = value {
            value = rest;
        }
        at = cr + 2;
        if refused.is_none() {
            refused = head.header(name, value, limits).err();
        }
    }
    if at > limits.max_header_bytes {
        return None;
    }
    Some(match refused {
        Some(e) => Parse::Error(e),
        None => head.finish(at),
    })
}

#[cfg(test)]
mod tests {
    use super::super::{parse_general, Limits};
    use super::*;
    use proptest::prelude::*;

    /// Held to the general path: either no answer, or the same answer.
    fn agrees(buf: &[u8], limits: &Limits) -> Result<(), TestCaseError> {
        if let Some(fast) = parse(buf, limits) {
            prop_assert_eq!(
                fast,
                parse_general(buf, limits),
                "{:?}",
                String::from_utf8_lossy(buf)
            );
        }
        Ok(())
    }

    #[test]
    fn controls_marks_exactly_the_first_control_byte() {
        for b in 0..=255u8 {
            for pos in 0..8 {
                let mut w = [b'a'; 8];
                w[pos] = b;
                let marks = controls(u64::from_le_bytes(w));
                let control = b < 0x20 || b == 0x7f;
                assert_eq!(
                    marks,
                    u64::from(control) << (pos * 8 + 7),
                    "byte {b:#x} at {pos}"
                );
            }
        }
        // High bytes never hide a later control byte, nor look like one.
        let w = u64::from_le_bytes([0xff, 0x80, 0xa0, b'\r', 0x81, 0, 0x7f, 0xfe]);
        assert_eq!(controls(w).trailing_zeros() / 8, 3);
    }

    #[test]
    fn invisible_marks_exactly_the_bytes_outside_the_visible_range() {
        for b in 0..=255u8 {
            for pos in 0..8 {
                let mut w = [b'a'; 8];
                w[pos] = b;
                let marks = invisible(u64::from_le_bytes(w));
                let outside = !(b'!'..=b'~').contains(&b);
                assert_eq!(
                    marks,
                    u64::from(outside) << (pos * 8 + 7),
                    "byte {b:#x} at {pos}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn find_byte_finds_the_first(hay in proptest::collection::vec(any::<u8>(), 0..40), byte in any::<u8>()) {
            prop_assert_eq!(find_byte(&hay, byte), hay.iter().position(|&b| b == byte));
        }
    }

    #[test]
    fn answers_the_common_shapes() {
        let limits = Limits::default();
        for buf in [
            &b"GET /abcDEF1 HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n"[..],
            b"HEAD /x?y#z HTTP/1.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost:    spaced   \r\nX-Empty:\r\nX-Blank:   \r\n\r\nGET /b",
        ] {
            assert!(parse(buf, &limits).is_some(), "{:?}", String::from_utf8_lossy(buf));
            agrees(buf, &limits).expect("agrees");
        }
    }

    #[test]
    fn hands_over_everything_else() {
        let limits = Limits::default();
        for buf in [
            &b"POST / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET http://a/b HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\nHost: a\n\n",
            b"GET / HTTP/1.1\r\nHost: a\tb\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n\r",
            b"GET /",
        ] {
            assert_eq!(
                parse(buf, &limits),
                None,
                "{:?}",
                String::from_utf8_lossy(buf)
            );
        }
        let tight = Limits {
            max_headers: 1,
            ..Limits::default()
        };
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\n", &tight),
            None
        );
    }

    fn arb_line() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"Host: lh.example".to_vec()),
            Just(b"host:x".to_vec()),
            Just(b"Connection: close, keep-alive ".to_vec()),
            Just(b"Content-Length: 0".to_vec()),
            Just(b"Content-Length: 12".to_vec()),
            Just(b"Content-Length: x".to_vec()),
            Just(b"Transfer-Encoding: chunked".to_vec()),
            Just(b"Accept: application/json; q=1".to_vec()),
            Just(b"X-Country: DE".to_vec()),
            Just(b"Sec-Purpose: prefetch;prerender".to_vec()),
            Just(b"X-Purpose:preview ".to_vec()),
            "[!-~]{0,12}:[ \t]{0,3}[ -~\t\x7f\u{80}-\u{ff}]{0,40}".prop_map(|s| s.into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..30),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn agrees_with_the_general_path_on_near_valid_heads(
            method in prop_oneof![Just("GET"), Just("HEAD"), Just("POST"), Just("get")],
            target in "/[!-~]{0,20}",
            version in prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0"), Just("HTTP/1.2"), Just("HTTP/2.0")],
            lines in proptest::collection::vec(arb_line(), 0..8),
            cut in 0usize..400,
            flip in 0usize..400,
            byte in any::<u8>(),
            max_headers in 0usize..10,
            max_request_line in 0usize..40,
            max_header_bytes in 0usize..300,
        ) {
            let mut buf = format!("{method} {target} {version}\r\n").into_bytes();
            for l in &lines {
                buf.extend_from_slice(l);
                buf.extend_from_slice(b"\r\n");
            }
            buf.extend_from_slice(b"\r\nGET /next HTTP/1.1\r\n");
            if let Some(b) = buf.get_mut(flip) {
                *b = byte;
            }
            let country = super::super::HeaderName::new("x-country").ok();
            agrees(&buf, &Limits { country_header: country, ..Limits::default() })?;
            agrees(&buf[..cut.min(buf.len())], &Limits::default())?;
            agrees(&buf, &Limits { max_headers, max_request_line, max_header_bytes, country_header: None, ..Limits::default() })?;
        }

        #[test]
        fn agrees_with_the_general_path_on_noise(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut with_start = b"GET /".to_vec();
            with_start.extend_from_slice(&buf);
            agrees(&buf, &Limits::default())?;
            agrees(&with_start, &Limits::default())?;
        }
    }
}
