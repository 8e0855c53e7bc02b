//! QPACK (RFC 9204) with the static table only: this server announces a dynamic table
//! capacity of 0 (the default), so a field section that refers to a dynamic table is an
//! error (QPACK_DECOMPRESSION_FAILED) and no request ever waits on the encoder stream
//! (nothing is blocked). Responses are written with static-table references and literals,
//! never Huffman-coded (our fields are short, or URLs).

use std::ops::Range;

use crate::h2::hpack::{connection_specific, int, integer};
use crate::h2::huffman;

/// The static table (RFC 9204 Appendix A), checked entry by entry against an independent
/// encoder (pylsqpack) when it was written.
#[rustfmt::skip]
pub static STATIC: [(&[u8], &[u8]); 99] = [
    (b":authority", b""), (b":path", b"/"), (b"age", b"0"), (b"content-disposition", b""),
    (b"content-length", b"0"), (b"cookie", b""), (b"date", b""), (b"etag", b""),
    (b"if-modified-since", b""), (b"if-none-match", b""), (b"last-modified", b""),
    (b"link", b""), (b"location", b""), (b"referer", b""), (b"set-cookie", b""),
    (b":method", b"CONNECT"), (b":method", b"DELETE"), (b":method", b"GET"),
    (b":method", b"HEAD"), (b":method", b"OPTIONS"), (b":method", b"POST"),
    (b":method", b"PUT"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"103"), (b":status", b"200"), (b":status", b"304"), (b":status", b"404"),
    (b":status", b"503"), (b"accept", b"*/*"), (b"accept", b"application/dns-message"),
    (b"accept-encoding", b"gzip, deflate, br"), (b"accept-ranges", b"bytes"),
    (b"access-control-allow-headers", b"cache-control"),
    (b"access-control-allow-headers", b"content-type"),
    (b"access-control-allow-origin", b"*"), (b"cache-control", b"max-age=0"),
    (b"cache-control", b"max-age=2592000"), (b"cache-control", b"max-age=604800"),
    (b"cache-control", b"no-cache"), (b"cache-control", b"no-store"),
    (b"cache-control", b"public, max-age=31536000"), (b"content-encoding", b"br"),
    (b"content-encoding", b"gzip"), (b"content-type", b"application/dns-message"),
    (b"content-type", b"application/javascript"), (b"content-type", b"application/json"),
    (b"content-type", b"application/x-www-form-urlencoded"), (b"content-type", b"image/gif"),
    (b"content-type", b"image/jpeg"), (b"content-type", b"image/png"),
    (b"content-type", b"text/css"), (b"content-type", b"text/html; charset=utf-8"),
    (b"content-type", b"text/plain"), (b"content-type", b"text/plain;charset=utf-8"),
    (b"range", b"bytes=0-"), (b"strict-transport-security", b"max-age=31536000"),
    (b"strict-transport-security", b"max-age=31536000; includesubdomains"),
    (b"strict-transport-security", b"max-age=31536000; includesubdomains; preload"),
    (b"vary", b"accept-encoding"), (b"vary", b"origin"),
    (b"x-content-type-options", b"nosniff"), (b"x-xss-protection", b"1; mode=block"),
    (b":status", b"100"), (b":status", b"204"), (b":status", b"206"), (b":status", b"302"),
    (b":status", b"400"), (b":status", b"403"), (b":status", b"421"), (b":status", b"425"),
    (b":status", b"500"), (b"accept-language", b""),
    (b"access-control-allow-credentials", b"FALSE"),
    (b"access-control-allow-credentials", b"TRUE"), (b"access-control-allow-headers", b"*"),
    (b"access-control-allow-methods", b"get"),
    (b"access-control-allow-methods", b"get, post, options"),
    (b"access-control-allow-methods", b"options"),
    (b"access-control-expose-headers", b"content-length"),
    (b"access-control-request-headers", b"content-type"),
    (b"access-control-request-method", b"get"), (b"access-control-request-method", b"post"),
    (b"alt-svc", b"clear"), (b"authorization", b""),
    (b"content-security-policy", b"script-src 'none'; object-src 'none'; base-uri 'none'"),
    (b"early-data", b"1"), (b"expect-ct", b""), (b"forwarded", b""), (b"if-range", b""),
    (b"origin", b""), (b"purpose", b"prefetch"), (b"server", b""),
    (b"timing-allow-origin", b"*"), (b"upgrade-insecure-requests", b"1"),
    (b"user-agent", b""), (b"x-forwarded-for", b""), (b"x-frame-options", b"deny"),
    (b"x-frame-options", b"sameorigin"),
];

/// Why a field section is not decodable (QPACK_DECOMPRESSION_FAILED, a connection error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// A truncated prefix, integer or string, or bad Huffman code.
    Malformed,
    /// A reference to the dynamic table, which this server never lets exist.
    Dynamic,
    /// A static index past the table.
    Index,
}

/// A string literal whose Huffman flag is bit `prefix` of its first byte and whose length has
/// a `prefix`-bit integer prefix; appended to `out`, returns the bytes used.
fn string(b: &[u8], prefix: u8, out: &mut Vec<u8>) -> Result<usize, DecodeError> {
    let huffman = b.first().is_some_and(|&h| h & (1 << prefix) != 0);
    let (len, n) = int(b, prefix).map_err(|_| DecodeError::Malformed)?;
    let raw = n
        .checked_add(len)
        .and_then(|end| b.get(n..end))
        .ok_or(DecodeError::Malformed)?;
    if huffman {
        huffman::decode(raw, out).map_err(|_| DecodeError::Malformed)?;
    } else {
        out.extend_from_slice(raw);
    }
    Ok(n + len)
}

fn entry(index: usize) -> Result<(&'static [u8], &'static [u8]), DecodeError> {
    STATIC.get(index).copied().ok_or(DecodeError::Index)
}

/// Decodes one encoded field section (RFC 9204 §4.5), handing each field to `field`.
pub fn decode(block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), DecodeError> {
    // Required Insert Count (8-bit prefix): 0, nothing from a dynamic table. Then the sign
    // and Delta Base (7-bit prefix), meaningless without one.
    let (ric, n) = int(block, 8).map_err(|_| DecodeError::Malformed)?;
    if ric != 0 {
        return Err(DecodeError::Dynamic);
    }
    let (_, m) = int(&block[n..], 7).map_err(|_| DecodeError::Malformed)?;
    let mut at = n + m;
    let (mut name, mut value) = (Vec::new(), Vec::new());
    while let Some(&b) = block.get(at) {
        let rest = &block[at..];
        if b & 0x80 != 0 {
            // Indexed field line: 1 T index(6).
            if b & 0x40 == 0 {
                return Err(DecodeError::Dynamic);
            }
            let (index, n) = int(rest, 6).map_err(|_| DecodeError::Malformed)?;
            at += n;
            let (nm, v) = entry(index)?;
            field(nm, v);
        } else if b & 0x40 != 0 {
            // Literal with name reference: 0 1 N T index(4), then the value.
            if b & 0x10 == 0 {
                return Err(DecodeError::Dynamic);
            }
            let (index, n) = int(rest, 4).map_err(|_| DecodeError::Malformed)?;
            at += n;
            let (nm, _) = entry(index)?;
            value.clear();
            at += string(&block[at..], 7, &mut value)?;
            field(nm, &value);
        } else if b & 0x20 != 0 {
            // Literal with literal name: 0 0 1 N H length(3), the name, then the value.
            name.clear();
            at += string(rest, 3, &mut name)?;
            value.clear();
            at += string(&block[at..], 7, &mut value)?;
            field(&name, &value);
        } else {
            // Post-base forms (0001, 0000): the dynamic table.
            return Err(DecodeError::Dynamic);
        }
    }
    Ok(())
}

/// The field section prefix of a section that uses no dynamic table.
const PREFIX: [u8; 2] = [0, 0];

/// The static table's entries by name (an answer's every field is looked up: a hash and the
/// few entries of its name, rather than two scans of 99 entries; profiled under h3 load).
fn by_name() -> &'static hashbrown::HashMap<&'static [u8], Vec<u8>> {
    static BY_NAME: std::sync::OnceLock<hashbrown::HashMap<&'static [u8], Vec<u8>>> =
        std::sync::OnceLock::new();
    BY_NAME.get_or_init(|| {
        let mut m: hashbrown::HashMap<&'static [u8], Vec<u8>> = hashbrown::HashMap::new();
        for (i, &(n, _)) in STATIC.iter().enumerate() {
            m.entry(n).or_default().push(i as u8);
        }
        m
    })
}

/// Appends the representation of one field.
fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let entries = by_name().get(name).map_or(&[][..], Vec::as_slice);
    if let Some(&i) = entries.iter().find(|&&i| STATIC[i as usize].1 == value) {
        integer(out, 0xc0, 6, usize::from(i));
        return;
    }
    match entries.first() {
        Some(&i) => integer(out, 0x50, 4, usize::from(i)),
        None => {
            integer(out, 0x20, 3, name.len());
            out.extend_from_slice(name);
        }
    }
    integer(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// Transcodes one HTTP/1.1 response as the shared render path wrote it into an encoded field
/// section appended to `block` (`:status`, then its fields lower-cased, HTTP/1's
/// connection-specific ones dropped); returns the body's range in `h1`, or `None` when `h1` is
/// not a response head (which the render path never writes).
pub fn transcode(h1: &[u8], block: &mut Vec<u8>) -> Option<Range<usize>> {
    if !h1.starts_with(b"HTTP/1.1 ") {
        return None;
    }
    let code = h1.get(9..12)?;
    block.extend_from_slice(&PREFIX);
    put_field(block, b":status", code);
    let mut at = memchr::memchr(b'\n', h1)? + 1;
    loop {
        let rest = h1.get(at..)?;
        let end = memchr::memchr(b'\n', rest)?;
        let line = &rest[..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += end + 1;
        if line.is_empty() {
            return Some(at..h1.len());
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
        put_field(block, lower, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fields(block: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
        let mut out = Vec::new();
        decode(block, |n, v| {
            out.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ))
        })?;
        Ok(out)
    }

    #[test]
    fn a_response_transcodes_and_decodes_back() {
        let h1 = b"HTTP/1.1 302 Found\r\nLocation: https://example.com/a?b=1\r\nCache-Control: private, max-age=300\r\nContent-Length: 0\r\nConnection: close\r\nX-Odd-Name: 1\r\n\r\n";
        let mut block = Vec::new();
        let body = transcode(h1, &mut block).unwrap();
        assert!(body.is_empty());
        assert_eq!(
            fields(&block).unwrap(),
            [
                (":status", "302"),
                ("location", "https://example.com/a?b=1"),
                ("cache-control", "private, max-age=300"),
                ("content-length", "0"),
                ("x-odd-name", "1"),
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
        // :status 302 and content-length 0 are whole static entries (66 and 4).
        assert_eq!(&block[..3], &[0, 0, 0xc0 | 63]);
        let with_body = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
        let mut block = Vec::new();
        let body = transcode(with_body, &mut block).unwrap();
        assert_eq!(&with_body[body], b"hi");
    }

    #[test]
    fn rfc_9204_b_1_literal_with_name_reference() {
        // Appendix B.1: ":path /index.html" against the static table.
        let block = [
            0x00, 0x00, 0x51, 0x0b, 0x2f, 0x69, 0x6e, 0x64, 0x65, 0x78, 0x2e, 0x68, 0x74, 0x6d,
            0x6c,
        ];
        assert_eq!(
            fields(&block).unwrap(),
            [(":path".to_string(), "/index.html".to_string())]
        );
    }

    #[test]
    fn dynamic_references_are_refused() {
        // Required Insert Count 2 (B.2's second section).
        assert_eq!(fields(&[0x03, 0x81, 0x10, 0x11]), Err(DecodeError::Dynamic));
        // An indexed line into the dynamic table (T = 0).
        assert_eq!(fields(&[0x00, 0x00, 0x80]), Err(DecodeError::Dynamic));
        // Post-base index.
        assert_eq!(fields(&[0x00, 0x00, 0x10]), Err(DecodeError::Dynamic));
        assert_eq!(fields(&[0x00, 0x00, 0xff, 0x30]), Err(DecodeError::Index));
        assert_eq!(fields(&[0x00]), Err(DecodeError::Malformed));
    }

    #[test]
    fn huffman_literals_decode() {
        // "www.example.com" Huffman-coded (RFC 7541 C.4.1) as :authority's value.
        let mut block = vec![0x00, 0x00, 0x50];
        let code = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        block.push(0x80 | code.len() as u8);
        block.extend_from_slice(&code);
        assert_eq!(
            fields(&block).unwrap(),
            [(":authority".to_string(), "www.example.com".to_string())]
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = fields(&b);
        }

        #[test]
        fn any_fields_round_trip(
            pairs in proptest::collection::vec(("[a-z][a-z0-9-]{0,20}", "[ -~]{0,40}"), 0..12),
        ) {
            let mut block = PREFIX.to_vec();
            for (n, v) in &pairs {
                put_field(&mut block, n.as_bytes(), v.as_bytes());
            }
            let back = fields(&block).unwrap();
            let want: Vec<(String, String)> = pairs.clone();
            prop_assert_eq!(back, want);
        }
    }
}
