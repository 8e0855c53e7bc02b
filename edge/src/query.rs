//! Query forwarding (a link's `forward_query`): the request's query merged into the
//! destination's, by the WHATWG URL standard's rules for `application/x-www-form-urlencoded`
//! queries, never touching the destination's scheme, host, path or fragment.
//!
//! - The destination's parameters come first, as written; the request's follow, in order.
//! - A name in both (compared after `+` → space and percent-decoding, as `URLSearchParams`
//!   does) keeps the destination's value ([`Precedence::Destination`], the default), or the
//!   request's ([`Precedence::Request`]: the destination's parameters of that name are left
//!   out, the request's kept in their place at the end).
//! - Empty pieces (`a&&b`, a trailing `&`) are dropped; the bytes of every kept piece are copied
//!   as they are, except that what the query percent-encode set names (controls, space, `"`,
//!   `#`, `<`, `>`, `'`, and anything not ASCII) is percent-encoded: a request's query can never
//!   end the query early (an encoded `#` stays encoded), and the result stays servable.
//! - With an empty request query the destination comes back unchanged.

/// Which value a name present in both queries keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precedence {
    #[default]
    Destination,
    Request,
}

/// The parts of an absolute URL around its query: everything before `?`, the query (without
/// `?`), and the fragment with its `#` (or nothing).
fn split(url: &[u8]) -> (&[u8], Option<&[u8]>, &[u8]) {
    let (before_fragment, fragment) = match url.iter().position(|&b| b == b'#') {
        Some(at) => url.split_at(at),
        None => (url, &b""[..]),
    };
    match before_fragment.iter().position(|&b| b == b'?') {
        Some(at) => (
            &before_fragment[..at],
            Some(&before_fragment[at + 1..]),
            fragment,
        ),
        None => (before_fragment, None, fragment),
    }
}

/// The pieces of a query, empty ones left out.
fn pieces(query: &[u8]) -> impl Iterator<Item = &[u8]> {
    query.split(|&b| b == b'&').filter(|p| !p.is_empty())
}

/// A piece's name as `URLSearchParams` reads it: up to the first `=`, `+` as space,
/// percent-decoded (an invalid escape kept as it is).
fn name_of(piece: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let raw = piece.split(|&b| b == b'=').next().unwrap_or_default();
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < raw.len() => match (hex(raw[i + 1]), hex(raw[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `b` is in the WHATWG query percent-encode set (or not ASCII).
fn must_encode(b: u8) -> bool {
    b <= 0x20 || b >= 0x7f || matches!(b, b'"' | b'#' | b'<' | b'>' | b'\'')
}

fn push_piece(out: &mut Vec<u8>, piece: &[u8]) {
    for &b in piece {
        if must_encode(b) {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.push(b);
        }
    }
}

/// Writes `destination` with `request_query` (the request target's query, without `?`)
/// merged into its query, appended to `out`.
pub fn merge(destination: &[u8], request_query: &[u8], precedence: Precedence, out: &mut Vec<u8>) {
    if pieces(request_query).next().is_none() {
        out.extend_from_slice(destination);
        return;
    }
    let (base, query, fragment) = split(destination);
    out.extend_from_slice(base);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Whether any piece of `query` has the name `name`.
    let has = |query: &[u8], name: &[u8], scratch: &mut Vec<u8>| {
        pieces(query).any(|p| {
            name_of(p, scratch);
            scratch == name
        })
    };
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        out.push(if first { b'?' } else { b'&' });
        first = false;
    };
    for p in pieces(query.unwrap_or_default()) {
        if precedence == Precedence::Request {
            name_of(p, &mut a);
            if has(request_query, &a, &mut b) {
                continue;
            }
        }
        sep(out);
        out.extend_from_slice(p);
    }
    for p in pieces(request_query) {
        if precedence == Precedence::Destination {
            name_of(p, &mut a);
            if has(query.unwrap_or_default(), &a, &mut b) {
                continue;
            }
        }
        sep(out);
        push_piece(out, p);
    }
    if first && query.is_some() {
        // A destination whose query was only empty pieces, and nothing forwarded: keep its `?`.
        out.push(b'?');
    }
    out.extend_from_slice(fragment);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(dest: &str, q: &str, p: Precedence) -> String {
        let mut out = Vec::new();
        merge(dest.as_bytes(), q.as_bytes(), p, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn merges_by_the_url_standards_rules() {
        use Precedence::{Destination as D, Request as R};
        assert_eq!(m("https://a.example/p", "", D), "https://a.example/p");
        assert_eq!(
            m("https://a.example/p?x=1", "", D),
            "https://a.example/p?x=1"
        );
        assert_eq!(
            m("https://a.example/p", "utm_source=tw", D),
            "https://a.example/p?utm_source=tw"
        );
        assert_eq!(
            m("https://a.example/p?x=1#top", "y=2", D),
            "https://a.example/p?x=1&y=2#top",
            "the fragment stays last"
        );
        // A name in both: the destination's value, or the request's.
        assert_eq!(
            m("https://a.example/?x=1&y=2", "x=9&z=3", D),
            "https://a.example/?x=1&y=2&z=3"
        );
        assert_eq!(
            m("https://a.example/?x=1&y=2", "x=9&z=3", R),
            "https://a.example/?y=2&x=9&z=3"
        );
        // Names compare decoded: `a+b`, `a%20b` and `a b` are one name.
        assert_eq!(
            m("https://a.example/?a+b=1", "a%20b=2", D),
            "https://a.example/?a+b=1"
        );
        // Repeated names are all kept (or all replaced).
        assert_eq!(
            m("https://a.example/?t=1", "t=2&t=3", R),
            "https://a.example/?t=2&t=3"
        );
        assert_eq!(
            m("https://a.example/", "t=2&t=3", D),
            "https://a.example/?t=2&t=3"
        );
        // Encoded `&` and `#` stay encoded; a raw `#` or a space cannot end the query.
        assert_eq!(
            m("https://a.example/", "q=a%26b%23c", D),
            "https://a.example/?q=a%26b%23c"
        );
        assert_eq!(
            m("https://a.example/#f", "q=a#b c", D),
            "https://a.example/?q=a%23b%20c#f"
        );
        // A query that tries to inject a host changes nothing but the query.
        assert_eq!(
            m("https://a.example/p", "@evil.example/x", D),
            "https://a.example/p?@evil.example/x"
        );
        // Empty pieces go.
        assert_eq!(
            m("https://a.example/?&x=1&", "&&y=2&", D),
            "https://a.example/?x=1&y=2"
        );
    }

    /// The scheme, host and path of a URL: everything before its query or fragment.
    fn base(url: &str) -> &str {
        url.split(['?', '#']).next().unwrap()
    }

    proptest! {
        #[test]
        fn never_changes_scheme_host_path_or_fragment(
            host in "[a-z]{1,10}\\.example",
            path in "(/[a-zA-Z0-9._~%-]{0,8}){0,3}",
            dq in proptest::option::of("[ -~&&[^#]]{0,30}"),
            frag in proptest::option::of("[ -~]{0,10}"),
            rq in "[ -~]{0,40}",
            request in any::<bool>(),
        ) {
            let mut dest = format!("https://{host}{path}");
            if let Some(q) = &dq { dest.push('?'); dest.push_str(q); }
            if let Some(f) = &frag { dest.push('#'); dest.push_str(f); }
            let p = if request { Precedence::Request } else { Precedence::Destination };
            let mut out = Vec::new();
            merge(dest.as_bytes(), rq.as_bytes(), p, &mut out);
            let out = String::from_utf8(out).unwrap();
            prop_assert_eq!(base(&out), base(&dest));
            if let Some(f) = &frag {
                let want = format!("#{f}");
                prop_assert!(out.ends_with(&want));
            }
            // The request adds no fragment and nothing unservable.
            prop_assert_eq!(out.matches('#').count(), dest.matches('#').count());
            prop_assert!(out.bytes().all(|b| (0x21..0x7f).contains(&b) || dest.as_bytes().contains(&b)));
            // An empty request query: the destination unchanged.
            let mut same = Vec::new();
            merge(dest.as_bytes(), b"", p, &mut same);
            prop_assert_eq!(same, dest.as_bytes());
        }

        #[test]
        fn any_bytes_never_panic(dest in proptest::collection::vec(any::<u8>(), 0..60),
                                 rq in proptest::collection::vec(any::<u8>(), 0..60)) {
            let mut out = Vec::new();
            merge(&dest, &rq, Precedence::Destination, &mut out);
            merge(&dest, &rq, Precedence::Request, &mut out);
        }
    }
}
