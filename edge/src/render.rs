//! Writes an [`Answer`] as HTTP/1.1 response bytes, appended to the connection's output buffer.
//! Nothing is allocated beyond that buffer's growth.
//!
//! The 302 is the hot path and carries exactly `Location`, `Cache-Control: private,
//! max-age=300` and `Content-Length: 0` (docs/ARCHITECTURE.md, "The request path", step 7), plus
//! `Connection: close` when the connection closes after it (or `Connection: keep-alive` for an
//! HTTP/1.0 client that asked to keep it, through [`render_for`]). No `Date` and no `Server`:
//! neither is needed by a client, and `Date` would put a clock into a pure function.
//!
//! Error answers are short `text/plain` bodies with `Cache-Control: no-store` on 404 and 410 (a
//! code may come into existence later, and a takedown may be lifted; neither should stick in a
//! cache). The preview and the warning interstitial are small self-contained pages (or JSON for a
//! preview asked with `Accept: application/json`) under `Cache-Control: no-store` and a
//! Content-Security-Policy that allows no scripts and no loads at all; the destination is shown
//! HTML- or JSON-escaped.
//!
//! A URL reaches a header only if it is servable (`http(s)://` and visible ASCII), checked again
//! here (one branch-free pass the compiler vectorises) even though [`crate::answer::decide`]
//! only hands out servable URLs: a CR or LF in `Location` would let a stored URL write headers
//! of its own, and no other scheme may be redirected to. An unservable URL renders as 410.

use lasthop_core::{is_servable, visible_ascii};

use crate::answer::Answer;
use crate::http::{HttpError, Request};

/// The headers every page (preview, interstitial) carries when no report form is configured:
/// nothing may load and no form may be sent.
const PAGE_HEADERS: &[u8] = b"Cache-Control: no-store\r\n\
Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; form-action 'none'\r\n\
X-Content-Type-Options: nosniff\r\n\
Referrer-Policy: no-referrer\r\n";

/// How the preview and interstitial pages look beyond the answer: the "report this link" form
/// (`--report-url`), which posts to the control plane's public `POST /v1/reports`.
#[derive(Debug, Clone, Default)]
pub struct Pages {
    /// The form's `action`, HTML-safe (checked by [`Pages::with_report_url`]).
    report_action: Option<Box<[u8]>>,
    /// [`PAGE_HEADERS`] with `form-action` allowing the report origin.
    headers: Option<Box<[u8]>>,
}

/// Why a `--report-url` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--report-url must be an http:// or https:// URL of visible ASCII without quotes or angle brackets: {0:?}")]
pub struct ReportUrlError(pub String);

impl Pages {
    /// Pages with the report form posting to `url`: the API's public address
    /// (`https://api.example`, the form then posts to `/v1/reports` there) or the full
    /// endpoint (`…/v1/reports`).
    pub fn with_report_url(url: &str) -> Result<Pages, ReportUrlError> {
        let bad = || ReportUrlError(url.to_string());
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(bad)?;
        if rest.is_empty()
            || !url
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'<' | b'>' | b'\\'))
        {
            return Err(bad());
        }
        let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if authority_len == 0 || rest[..authority_len].contains('@') {
            return Err(bad());
        }
        let origin = &url[..url.len() - rest.len() + authority_len];
        let base = url
            .split(['?', '#'])
            .next()
            .unwrap_or(url)
            .trim_end_matches('/');
        let action = if base.ends_with("/v1/reports") {
            base.to_string()
        } else {
            format!("{base}/v1/reports")
        };
        let headers = format!(
            "Cache-Control: no-store\r\n\
Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; form-action {origin}\r\n\
X-Content-Type-Options: nosniff\r\n\
Referrer-Policy: no-referrer\r\n"
        );
        Ok(Pages {
            report_action: Some(action.into_bytes().into_boxed_slice()),
            headers: Some(headers.into_bytes().into_boxed_slice()),
        })
    }

    fn headers(&self) -> &[u8] {
        self.headers.as_deref().unwrap_or(PAGE_HEADERS)
    }
}

/// Pages without a report form (tests and benches).
pub static NO_PAGES: Pages = Pages {
    report_action: None,
    headers: None,
};

const TEXT: &[u8] = b"text/plain; charset=utf-8";
const HTML: &[u8] = b"text/html; charset=utf-8";
const JSON: &[u8] = b"application/json";
/// HTTP-01 answers: RFC 8555 §8.3's example type.
const OCTETS: &[u8] = b"application/octet-stream";

/// The 302 that [`render_fixed`] writes: the benchmark floor, the same shape as a real redirect.
pub const FIXED_RESPONSE: &[u8] = b"HTTP/1.1 302 Found\r\n\
Location: https://example.com/\r\n\
Cache-Control: private, max-age=300\r\n\
Content-Length: 0\r\n\r\n";

/// How to shape a response, from the request.
#[derive(Debug, Clone, Copy)]
struct Shape<'h> {
    head: bool,
    keep_alive: bool,
    json: bool,
    http10: bool,
    /// Extra header lines (each ending in CRLF) for every response, e.g.
    /// `Strict-Transport-Security` on HTTPS.
    extra: &'h [u8],
    pages: &'h Pages,
    /// The request target, whose query a link that forwards it merges (found only then).
    target: &'h [u8],
}

/// Appends the response to `answer` to `out`: no body when `req_head` (HEAD), `Connection:
/// close` when `!keep_alive` or the answer closes anyway, JSON pages when `accept_json`.
/// Returns whether the connection must close once the bytes are sent. Assumes an HTTP/1.1
/// client; use [`render_for`] to get HTTP/1.0 keep-alive right too.
pub fn render(
    answer: &Answer<'_>,
    req_head: bool,
    keep_alive: bool,
    accept_json: bool,
    out: &mut Vec<u8>,
) -> bool {
    write(
        answer,
        Shape {
            head: req_head,
            keep_alive,
            json: accept_json,
            http10: false,
            extra: b"",
            pages: &NO_PAGES,
            target: b"",
        },
        out,
    )
}

/// [`render`] with the shape taken from `req` (method, keep-alive, `Accept`, HTTP version).
/// Returns whether the connection must close once the bytes are sent.
pub fn render_for(answer: &Answer<'_>, req: &Request<'_>, out: &mut Vec<u8>) -> bool {
    render_with(answer, req, b"", &NO_PAGES, out)
}

/// [`render_for`] with `extra` header lines (each ending in CRLF) on the response (the HTTPS
/// listener's `Strict-Transport-Security`), and pages shaped by `pages`.
pub fn render_with(
    answer: &Answer<'_>,
    req: &Request<'_>,
    extra: &[u8],
    pages: &Pages,
    out: &mut Vec<u8>,
) -> bool {
    write(
        answer,
        Shape {
            head: req.method == crate::http::Method::Head,
            keep_alive: req.keep_alive,
            json: req.accept_json,
            http10: req.http10,
            extra,
            pages,
            target: req.target,
        },
        out,
    )
}

/// Appends [`FIXED_RESPONSE`]: the floor the request path is measured against.
#[inline]
pub fn render_fixed(out: &mut Vec<u8>) {
    out.extend_from_slice(FIXED_RESPONSE);
}

/// [`render_fixed`] with `extra` header lines (the `Date` every answer carries), so the floor
/// keeps the shape of a real redirect.
#[inline]
pub fn render_fixed_with(extra: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&FIXED_RESPONSE[..FIXED_RESPONSE.len() - 2]);
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
}

/// The answer to bytes that are no request ([`HttpError`]), with `extra` header lines; the
/// connection closes after it (returns true).
pub fn render_error(e: HttpError, extra: &[u8], out: &mut Vec<u8>) -> bool {
    write(
        &Answer::BadRequest(e),
        Shape {
            head: false,
            keep_alive: false,
            json: false,
            http10: false,
            extra,
            pages: &NO_PAGES,
            target: b"",
        },
        out,
    )
}

/// `421 Misdirected Request` (RFC 9110 §15.5.20): HTTP/2's answer on a connection reused for
/// a name it may not serve; the client retries on a connection of its own.
pub fn render_misdirected(extra: &[u8], out: &mut Vec<u8>) {
    const BODY: &[u8] = b"misdirected request\n";
    out.extend_from_slice(b"HTTP/1.1 421 Misdirected Request\r\nContent-Type: ");
    out.extend_from_slice(TEXT);
    out.extend_from_slice(b"\r\nCache-Control: no-store\r\nContent-Length: ");
    write_decimal(out, BODY.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(BODY);
}

/// `--redirect-http-to-https`: a `301` to the same target on HTTPS (`https://HOST[:port]TARGET`,
/// the port left out when it is 443), what HSTS preload requires of the plain listener. A
/// request without a usable `Host` gets 400 and the connection closes; returns whether it
/// closes and the status sent.
pub fn render_https_redirect(
    req: &Request<'_>,
    https_port: u16,
    extra: &[u8],
    out: &mut Vec<u8>,
) -> (bool, u16) {
    let host = host_without_port(req.host);
    let target_ok = req.target.starts_with(b"/") && visible_ascii(req.target);
    if host.is_empty() || !target_ok {
        return (render_error(HttpError::Malformed, extra, out), 400);
    }
    let shape = Shape {
        head: req.method == crate::http::Method::Head,
        keep_alive: req.keep_alive,
        json: false,
        http10: req.http10,
        extra,
        pages: &NO_PAGES,
        target: req.target,
    };
    out.extend_from_slice(b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://");
    out.extend_from_slice(host);
    if https_port != 443 {
        out.push(b':');
        write_decimal(out, usize::from(https_port));
    }
    out.extend_from_slice(req.target);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
    connection(shape, out);
    out.extend_from_slice(b"\r\n");
    (!req.keep_alive, 301)
}

/// The host of a `Host` value without its port (`[v6]:port` and `name:port`); empty when it is
/// not a plausible host (a name of letters, digits, `-`, `.` and `_`, or a bracketed IPv6
/// literal), so nothing else reaches a `Location`.
fn host_without_port(value: &[u8]) -> &[u8] {
    let host = match value.first() {
        Some(b'[') => match value.iter().position(|&b| b == b']') {
            Some(end) => {
                let rest = &value[end + 1..];
                let port_ok = rest.is_empty()
                    || (rest[0] == b':' && rest[1..].iter().all(u8::is_ascii_digit));
                if !port_ok
                    || !value[1..end]
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
                {
                    return b"";
                }
                &value[..=end]
            }
            None => return b"",
        },
        _ => {
            let (name, port) = match value.iter().rposition(|&b| b == b':') {
                Some(colon) => (&value[..colon], &value[colon + 1..]),
                None => (value, &b""[..]),
            };
            if !port.iter().all(u8::is_ascii_digit)
                || !name
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            {
                return b"";
            }
            name
        }
    };
    if host.len() > 255 {
        return b"";
    }
    host
}

fn write(answer: &Answer<'_>, shape: Shape, out: &mut Vec<u8>) -> bool {
    let close = !shape.keep_alive || answer.closes();
    let shape = Shape {
        keep_alive: !close,
        ..shape
    };
    match *answer {
        Answer::Redirect { url } | Answer::DomainRedirect { url } if is_servable(url) => {
            out.extend_from_slice(b"HTTP/1.1 302 Found\r\nLocation: ");
            out.extend_from_slice(url);
            out.extend_from_slice(
                b"\r\nCache-Control: private, max-age=300\r\nContent-Length: 0\r\n",
            );
            connection(shape, out);
            out.extend_from_slice(b"\r\n");
        }
        Answer::Redirect { .. } | Answer::DomainRedirect { .. } => gone(shape, out),
        Answer::RedirectWith { url, options } if is_servable(url) => {
            out.extend_from_slice(match options.redirect_status {
                301 => b"HTTP/1.1 301 Moved Permanently\r\nLocation: ",
                307 => b"HTTP/1.1 307 Temporary Redirect\r\nLocation: ",
                308 => b"HTTP/1.1 308 Permanent Redirect\r\nLocation: ",
                _ => b"HTTP/1.1 302 Found\r\nLocation: ",
            });
            let query = shape
                .target
                .iter()
                .position(|&b| b == b'?')
                .map_or(&b""[..], |at| &shape.target[at + 1..]);
            if options.forward_query && !query.is_empty() {
                let precedence = if options.request_precedence {
                    crate::query::Precedence::Request
                } else {
                    crate::query::Precedence::Destination
                };
                crate::query::merge(url, query, precedence, out);
            } else {
                out.extend_from_slice(url);
            }
            // A permanent status always says how long a browser may keep it: without a
            // max-age a browser keeps a 301 indefinitely.
            if options.cache_seconds == 0 {
                out.extend_from_slice(b"\r\nCache-Control: no-store\r\nContent-Length: 0\r\n");
            } else {
                out.extend_from_slice(b"\r\nCache-Control: private, max-age=");
                write_decimal(out, options.cache_seconds as usize);
                out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
            }
            connection(shape, out);
            out.extend_from_slice(b"\r\n");
        }
        Answer::RedirectWith { .. } => gone(shape, out),
        Answer::Preview {
            code,
            domain,
            url,
            flagged,
        } if is_servable(url) => {
            let key = Key::of(domain, code);
            if shape.json {
                page(b"200 OK", JSON, shape, out, |o| {
                    json_page(o, code, domain, url, flagged)
                });
            } else {
                let report = shape.pages.report_action.as_deref();
                page(b"200 OK", HTML, shape, out, |o| {
                    preview_page(o, code, key.get(), url, flagged, report)
                });
            }
        }
        Answer::Warn { code, domain, url } if is_servable(url) => {
            let key = Key::of(domain, code);
            if shape.json {
                page(b"200 OK", JSON, shape, out, |o| {
                    json_page(o, code, domain, url, true)
                });
            } else {
                let report = shape.pages.report_action.as_deref();
                page(b"200 OK", HTML, shape, out, |o| {
                    warn_page(o, code, key.get(), url, report)
                });
            }
        }
        Answer::Preview { .. } | Answer::Warn { .. } | Answer::Gone => gone(shape, out),
        Answer::NotFound => fixed(
            b"404 Not Found",
            b"Cache-Control: no-store\r\n",
            b"not found\n",
            shape,
            out,
        ),
        Answer::MethodNotAllowed | Answer::BadRequest(HttpError::MethodWithBody) => fixed(
            b"405 Method Not Allowed",
            b"Allow: GET, HEAD\r\n",
            b"method not allowed\n",
            shape,
            out,
        ),
        Answer::BadRequest(e) => {
            let (status, body): (&[u8], &[u8]) = match e {
                HttpError::UriTooLong => (b"414 URI Too Long", b"request line too long\n"),
                HttpError::HeadersTooLarge => (
                    b"431 Request Header Fields Too Large",
                    b"request header fields too large\n",
                ),
                HttpError::VersionNotSupported => (
                    b"505 HTTP Version Not Supported",
                    b"only HTTP/1.0 and HTTP/1.1 are served\n",
                ),
                _ => (b"400 Bad Request", b"bad request\n"),
            };
            fixed(status, b"", body, shape, out);
        }
        Answer::NeedOrigin { .. } | Answer::Unavailable => fixed(
            b"503 Service Unavailable",
            b"Cache-Control: no-store\r\nRetry-After: 1\r\n",
            b"temporarily unavailable\n",
            shape,
            out,
        ),
        Answer::TooEarly => fixed(
            b"425 Too Early",
            b"Cache-Control: no-store\r\n",
            b"retry after the TLS handshake\n",
            shape,
            out,
        ),
        Answer::AcmeChallenge { key_authorization } => {
            head(
                b"200 OK",
                b"Cache-Control: no-store\r\n",
                OCTETS,
                key_authorization.len(),
                shape,
                out,
            );
            if !shape.head {
                out.extend_from_slice(key_authorization);
            }
        }
    }
    close
}

fn gone(shape: Shape, out: &mut Vec<u8>) {
    fixed(
        b"410 Gone",
        b"Cache-Control: no-store\r\n",
        b"this link is no longer available\n",
        shape,
        out,
    );
}

fn connection(shape: Shape<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(shape.extra);
    if !shape.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if shape.http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
}

/// Status line and headers up to and including the blank line.
fn head(
    status: &[u8],
    extra: &[u8],
    content_type: &[u8],
    len: usize,
    shape: Shape,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(extra);
    out.extend_from_slice(b"Content-Type: ");
    out.extend_from_slice(content_type);
    out.extend_from_slice(b"\r\nContent-Length: ");
    write_decimal(out, len);
    out.extend_from_slice(b"\r\n");
    connection(shape, out);
    out.extend_from_slice(b"\r\n");
}

/// A response with a constant `text/plain` body.
fn fixed(status: &[u8], extra: &[u8], body: &[u8], shape: Shape, out: &mut Vec<u8>) {
    head(status, extra, TEXT, body.len(), shape, out);
    if !shape.head {
        out.extend_from_slice(body);
    }
}

/// A response whose body `body` writes. The body is written first, straight into `out`, then
/// the head (which needs its length) after it, and the two are rotated into order in place: no
/// second buffer, and one escaper per format rather than a counting twin of each.
fn page(
    status: &[u8],
    content_type: &[u8],
    shape: Shape,
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>),
) {
    let start = out.len();
    body(out);
    let len = out.len() - start;
    if shape.head {
        out.truncate(start);
    }
    let body_len = out.len() - start;
    head(status, shape.pages.headers(), content_type, len, shape, out);
    if let Some(response) = out.get_mut(start..) {
        response.rotate_left(body_len);
    }
}

const STYLE: &[u8] =
    b"<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;\
padding:0 1em;color:#222}code{word-break:break-all;background:#f3f3f3;padding:.1em .3em}\
.warn{border-left:4px solid #c60;padding-left:1em}</style>";

fn page_start(out: &mut Vec<u8>, title: &[u8]) {
    out.extend_from_slice(
        b"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<meta name=\"robots\" content=\"noindex\"><title>",
    );
    out.extend_from_slice(title);
    out.extend_from_slice(b"</title>");
    out.extend_from_slice(STYLE);
    out.extend_from_slice(b"</head>\n<body><main>\n");
}

/// The destination as text, a plain link to it (never followed on its own), the report form
/// when there is one, and the page's end.
fn destination(
    out: &mut Vec<u8>,
    code: &[u8],
    url: &[u8],
    link_text: &[u8],
    report: Option<&[u8]>,
) {
    out.extend_from_slice(b"<p><code>");
    write_html(out, url);
    out.extend_from_slice(b"</code></p>\n<p><a href=\"");
    write_html(out, url);
    out.extend_from_slice(b"\" rel=\"noreferrer noopener nofollow\">");
    out.extend_from_slice(link_text);
    out.extend_from_slice(b"</a></p>\n");
    if let Some(action) = report {
        report_form(out, code, action);
    }
    out.extend_from_slice(b"</main></body></html>\n");
}

/// "Report this link": a plain form (no script) posting to the control plane's
/// `POST /v1/reports`, which answers with a 303 to its thank-you page.
fn report_form(out: &mut Vec<u8>, code: &[u8], action: &[u8]) {
    out.extend_from_slice(b"<form method=\"post\" action=\"");
    write_html(out, action);
    out.extend_from_slice(
        b"\"><h2>Report this link</h2>\n<input type=\"hidden\" name=\"code\" value=\"",
    );
    write_html(out, code);
    out.extend_from_slice(
        b"\">\n<p><label>What is wrong with it? <select name=\"reason\">\
<option value=\"phishing\">Phishing or fraud</option>\
<option value=\"malware\">Malware</option>\
<option value=\"spam\">Spam</option>\
<option value=\"other\">Something else</option></select></label></p>\n\
<p><label>Details (optional)<br><textarea name=\"details\" rows=\"3\" cols=\"40\" \
maxlength=\"2000\"></textarea></label></p>\n<p><button type=\"submit\">Report</button></p>\
</form>\n",
    );
}

/// What a report form names a link by: its code, or `domain/code` on a branded domain (built
/// only for these pages).
struct Key<'a> {
    code: &'a [u8],
    branded: Option<Vec<u8>>,
}

impl<'a> Key<'a> {
    fn of(domain: Option<&[u8]>, code: &'a [u8]) -> Key<'a> {
        Key {
            code,
            branded: domain.map(|d| [d, b"/", code].concat()),
        }
    }

    fn get(&self) -> &[u8] {
        self.branded.as_deref().unwrap_or(self.code)
    }
}

fn preview_page(
    out: &mut Vec<u8>,
    code: &[u8],
    key: &[u8],
    url: &[u8],
    flagged: bool,
    report: Option<&[u8]>,
) {
    page_start(out, b"Link preview");
    out.extend_from_slice(b"<h1>Link preview</h1>\n<p>The short link <code>/");
    write_html(out, code);
    out.extend_from_slice(b"</code> leads to:</p>\n");
    if flagged {
        out.extend_from_slice(
            b"<p class=\"warn\">This link has been flagged as possibly harmful, or has not \
finished its safety check.</p>\n",
        );
    }
    destination(out, key, url, b"Go to this address", report);
}

/// The interstitial: for a flagged link, and for a held one (new and not yet checked, or from
/// an account under review); the engine is not told which, so the words fit both.
fn warn_page(out: &mut Vec<u8>, code: &[u8], key: &[u8], url: &[u8], report: Option<&[u8]>) {
    page_start(out, b"Check this link before you continue");
    out.extend_from_slice(
        b"<h1>Check this link before you continue</h1>\n<p class=\"warn\">The short link <code>/",
    );
    write_html(out, code);
    out.extend_from_slice(
        b"</code> has been flagged as possibly harmful (phishing, malware or spam), or has not \
finished its safety check yet. Continue only if you trust where it leads.</p>\n\
<p>It leads to:</p>\n",
    );
    destination(out, key, url, b"Continue to this address", report);
}

fn json_page(out: &mut Vec<u8>, code: &[u8], domain: Option<&[u8]>, url: &[u8], flagged: bool) {
    out.extend_from_slice(b"{\"code\":\"");
    write_json(out, code);
    if let Some(domain) = domain {
        out.extend_from_slice(b"\",\"domain\":\"");
        write_json(out, domain);
    }
    out.extend_from_slice(b"\",\"url\":\"");
    write_json(out, url);
    out.extend_from_slice(if flagged {
        b"\",\"flagged\":true}\n"
    } else {
        b"\",\"flagged\":false}\n"
    });
}

/// Appends `s` HTML-escaped for text and double- or single-quoted attributes. Bytes outside
/// printable ASCII (which a servable URL never has) become U+FFFD, so the page is always valid
/// UTF-8 whatever it is given.
fn write_html(out: &mut Vec<u8>, s: &[u8]) {
    let mut run = 0;
    for (i, &b) in s.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'&' => b"&amp;",
            b'<' => b"&lt;",
            b'>' => b"&gt;",
            b'"' => b"&quot;",
            b'\'' => b"&#39;",
            0x20..=0x7e => continue,
            _ => b"&#xfffd;",
        };
        out.extend_from_slice(s.get(run..i).unwrap_or_default());
        out.extend_from_slice(escaped);
        run = i + 1;
    }
    out.extend_from_slice(s.get(run..).unwrap_or_default());
}

/// Appends `s` escaped for the inside of a JSON string. `<`, `>` and `&` are escaped too (a
/// JSON body sniffed as HTML stays inert); bytes outside printable ASCII become `\u00XX`, so
/// the output is valid JSON whatever it is given.
fn write_json(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut run = 0;
    for (i, &b) in s.iter().enumerate() {
        if matches!(b, 0x20..=0x7e) && !matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&') {
            continue;
        }
        out.extend_from_slice(s.get(run..i).unwrap_or_default());
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
        run = i + 1;
    }
    out.extend_from_slice(s.get(run..).unwrap_or_default());
}

fn write_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // usize::MAX has 20 digits, so `at` never underflows; `n % 10` < 10 fits a u8.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(at..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::decide;
    use crate::answer::tests::fixture;
    use crate::http::{parse, Limits, Parse};
    use proptest::prelude::*;

    fn rendered(answer: &Answer<'_>, head: bool, keep_alive: bool, json: bool) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let close = render(answer, head, keep_alive, json, &mut out);
        (out, close)
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// A parsed response: status, headers (lowercased names), body.
    struct Response {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    }

    impl Response {
        fn header(&self, name: &str) -> Option<&[u8]> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
        }
    }

    /// Parses `bytes` as exactly one response and checks its framing; `head` responses carry
    /// the GET body's Content-Length but no body.
    fn parse_response(bytes: &[u8], head: bool) -> Response {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!("{other:?}: {:?}", String::from_utf8_lossy(bytes)),
        };
        assert_eq!(resp.version, Some(1));
        let headers: Vec<(String, Vec<u8>)> = resp
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        for (name, value) in &headers {
            assert!(
                value.iter().all(|&b| b >= 0x20 && b != 0x7f),
                "{name}: {value:?}"
            );
        }
        let names: Vec<_> = headers.iter().map(|(n, _)| n.as_str()).collect();
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "duplicate header in {names:?}");
        let response = Response {
            status: resp.code.unwrap(),
            body: bytes[n..].to_vec(),
            headers,
        };
        let len: usize = text(response.header("content-length").expect("Content-Length"))
            .parse()
            .unwrap();
        if head {
            assert!(response.body.is_empty());
        } else {
            assert_eq!(len, response.body.len());
        }
        response
    }

    #[test]
    fn a_domain_redirect_is_a_302_to_its_url_and_an_unservable_one_is_gone() {
        let a = Answer::DomainRedirect {
            url: b"https://brand.example/",
        };
        let (out, close) = rendered(&a, false, true, false);
        assert!(!close);
        assert_eq!(
            text(&out),
            "HTTP/1.1 302 Found\r\nLocation: https://brand.example/\r\nCache-Control: \
             private, max-age=300\r\nContent-Length: 0\r\n\r\n"
        );
        let (out, _) = rendered(
            &Answer::DomainRedirect {
                url: b"javascript:alert(1)",
            },
            false,
            true,
            false,
        );
        assert!(text(&out).starts_with("HTTP/1.1 410"), "{}", text(&out));
    }

    #[test]
    fn redirect_exact_bytes() {
        let a = Answer::Redirect {
            url: b"https://example.com/x?y=1",
        };
        let (out, close) = rendered(&a, false, true, false);
        assert!(!close);
        assert_eq!(
            text(&out),
            "HTTP/1.1 302 Found\r\nLocation: https://example.com/x?y=1\r\n\
             Cache-Control: private, max-age=300\r\nContent-Length: 0\r\n\r\n"
        );
        let (out, close) = rendered(&a, true, false, false);
        assert!(close);
        assert_eq!(
            text(&out),
            "HTTP/1.1 302 Found\r\nLocation: https://example.com/x?y=1\r\n\
             Cache-Control: private, max-age=300\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut fixed = Vec::new();
        render_fixed(&mut fixed);
        assert_eq!(parse_response(&fixed, false).status, 302);
    }

    #[test]
    fn extra_lines_go_on_errors_and_the_floor_too() {
        let date = b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n";
        let mut out = Vec::new();
        assert!(render_error(HttpError::Malformed, date, &mut out));
        let t = text(&out);
        assert!(t.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{t}");
        assert!(
            t.contains("\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n"),
            "{t}"
        );
        assert!(t.contains("Connection: close\r\n"), "{t}");
        let mut fixed = Vec::new();
        render_fixed_with(date, &mut fixed);
        let t = text(&fixed);
        assert!(t.ends_with("Content-Length: 0\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\n"));
        assert_eq!(parse_response(&fixed, false).status, 302);
    }

    fn redirect_of(raw: &[u8], port: u16) -> (String, bool, u16) {
        let crate::http::Parse::Complete { req, .. } =
            crate::http::parse(raw, &crate::http::Limits::default())
        else {
            panic!("not a request: {raw:?}");
        };
        let mut out = Vec::new();
        let (close, status) = render_https_redirect(&req, port, b"", &mut out);
        (text(&out), close, status)
    }

    #[test]
    fn http_is_sent_to_the_same_target_on_https() {
        let (t, close, status) = redirect_of(
            b"GET /abc1234?utm=x HTTP/1.1\r\nHost: lh.example\r\n\r\n",
            443,
        );
        assert_eq!((close, status), (false, 301));
        assert_eq!(
            t,
            "HTTP/1.1 301 Moved Permanently\r\nLocation: https://lh.example/abc1234?utm=x\r\n\
             Content-Length: 0\r\n\r\n"
        );
        let (t, _, _) = redirect_of(b"HEAD /x HTTP/1.1\r\nHost: lh.example:8080\r\n\r\n", 8443);
        assert!(t.contains("Location: https://lh.example:8443/x\r\n"), "{t}");
        let (t, _, _) = redirect_of(b"GET /x HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", 443);
        assert!(t.contains("Location: https://[2001:db8::1]/x\r\n"), "{t}");
        let (_, close, _) = redirect_of(
            b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            443,
        );
        assert!(close);
        // Nothing but a host reaches the Location.
        for bad in [
            &b"GET /x HTTP/1.1\r\nHost: evil.example/path\r\n\r\n"[..],
            b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: a:80x\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: [zz]\r\n\r\n",
            b"GET /x HTTP/1.0\r\n\r\n",
            b"GET http://other.example/x HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            let (t, close, status) = redirect_of(bad, 443);
            assert_eq!((status, close), (400, true), "{bad:?}: {t}");
        }
    }

    #[test]
    fn appends_to_existing_output() {
        let mut out = b"previous".to_vec();
        render(&Answer::NotFound, false, true, false, &mut out);
        let preview = Answer::Preview {
            domain: None,
            code: b"abcDEF1",
            url: b"https://example.com/",
            flagged: false,
        };
        render(&preview, false, true, false, &mut out);
        assert!(out.starts_with(b"previousHTTP/1.1 404 Not Found\r\n"));
        let second = out.windows(9).rposition(|w| w == b"HTTP/1.1 ").unwrap();
        assert!(second > 8);
        let r = parse_response(&out[second..], false);
        assert_eq!(r.status, 200);
        assert!(r.body.starts_with(b"<!doctype html>"));
    }

    #[test]
    fn errors() {
        let (out, _) = rendered(&Answer::NotFound, false, true, false);
        assert_eq!(
            text(&out),
            "HTTP/1.1 404 Not Found\r\nCache-Control: no-store\r\n\
             Content-Type: text/plain; charset=utf-8\r\nContent-Length: 10\r\n\r\nnot found\n"
        );
        let (out, close) = rendered(&Answer::MethodNotAllowed, false, true, false);
        assert!(!close, "a 405 without a body keeps the connection");
        let r = parse_response(&out, false);
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some(&b"GET, HEAD"[..]))
        );
        let cases = [
            (HttpError::Malformed, 400),
            (HttpError::BodyNotAllowed, 400),
            (HttpError::MethodWithBody, 405),
            (HttpError::UriTooLong, 414),
            (HttpError::HeadersTooLarge, 431),
            (HttpError::VersionNotSupported, 505),
        ];
        for (e, status) in cases {
            let a = Answer::BadRequest(e);
            assert_eq!(a.status(), status);
            let (out, close) = rendered(&a, false, true, false);
            assert!(close, "{e:?} closes");
            let r = parse_response(&out, false);
            assert_eq!(r.status, status);
            assert_eq!(r.header("connection"), Some(&b"close"[..]));
        }
        for a in [
            Answer::Gone,
            Answer::Unavailable,
            Answer::NeedOrigin {
                domain: None,
                code: b"x",
                preview: false,
                cache_negative: false,
                confirming: false,
            },
        ] {
            let (out, _) = rendered(&a, false, true, false);
            assert_eq!(parse_response(&out, false).status, a.status());
        }
    }

    #[test]
    fn head_has_headers_and_no_body() {
        let answers = [
            Answer::NotFound,
            Answer::Gone,
            Answer::Preview {
                domain: None,
                code: b"abcDEF1",
                url: b"https://example.com/",
                flagged: false,
            },
            Answer::Warn {
                domain: None,
                code: b"abcDEF1",
                url: b"https://example.com/",
            },
        ];
        for a in answers {
            for json in [false, true] {
                let (get, _) = rendered(&a, false, true, json);
                let (head, _) = rendered(&a, true, true, json);
                let get = parse_response(&get, false);
                let head = parse_response(&head, true);
                assert_eq!(get.headers, head.headers, "{a:?}");
                assert!(head.body.is_empty());
            }
        }
    }

    #[test]
    fn http10_keep_alive_says_so() {
        let a = Answer::Redirect {
            url: b"https://example.com/",
        };
        let buf = b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
        let Parse::Complete { req, .. } = parse(buf, &Limits::default()) else {
            panic!()
        };
        let mut out = Vec::new();
        assert!(!render_for(&a, &req, &mut out));
        assert_eq!(
            parse_response(&out, false).header("connection"),
            Some(&b"keep-alive"[..])
        );
        let Parse::Complete { req, .. } = parse(b"HEAD /x HTTP/1.0\r\n\r\n", &Limits::default())
        else {
            panic!()
        };
        out.clear();
        assert!(render_for(&Answer::NotFound, &req, &mut out));
        let r = parse_response(&out, true);
        assert_eq!(r.header("connection"), Some(&b"close"[..]));
    }

    #[test]
    fn preview_and_interstitial_pages() {
        let url: &[u8] = b"https://example.com/<script>alert('x')</script>?a=1&b=\"2\"";
        let preview = Answer::Preview {
            domain: None,
            code: b"abcDEF1",
            url,
            flagged: false,
        };
        let (out, _) = rendered(&preview, false, true, false);
        let r = parse_response(&out, false);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some(HTML));
        assert_eq!(r.header("cache-control"), Some(&b"no-store"[..]));
        assert_eq!(
            r.header("content-security-policy"),
            Some(&b"default-src 'none'; style-src 'unsafe-inline'; form-action 'none'"[..])
        );
        assert!(r.header("location").is_none());
        let body = text(&r.body);
        assert!(!body.contains("<script>"), "{body}");
        assert!(!body.contains("http-equiv"), "never a refresh");
        assert!(body.contains(
            "https://example.com/&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;?a=1&amp;b=&quot;2&quot;"
        ));
        assert!(body.contains("/abcDEF1"));
        assert!(!body.contains("flagged"));

        let (out, _) = rendered(&preview, false, true, true);
        let r = parse_response(&out, false);
        assert_eq!(r.header("content-type"), Some(JSON));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], "abcDEF1");
        assert_eq!(v["url"].as_str().unwrap().as_bytes(), url);
        assert_eq!(v["flagged"], false);

        let warn = Answer::Warn {
            domain: None,
            code: b"abcDEF1",
            url,
        };
        let (out, _) = rendered(&warn, false, true, false);
        let r = parse_response(&out, false);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("cache-control"), Some(&b"no-store"[..]));
        let body = text(&r.body);
        assert!(body.contains("flagged"));
        assert!(body.contains("Continue"));
        assert!(body.contains("href=\"https://example.com/&lt;script&gt;"));
        assert!(!body.contains("<script>"));

        let (out, _) = rendered(&warn, false, true, true);
        let v: serde_json::Value =
            serde_json::from_slice(&parse_response(&out, false).body).unwrap();
        assert_eq!(v["flagged"], true);
        assert!(!body.contains("<form"), "no report form unless configured");
    }

    #[test]
    fn report_form_posts_to_the_configured_api() {
        let pages = Pages::with_report_url("https://api.lh.example:8443/").unwrap();
        let req_bytes = b"GET /abcDEF1 HTTP/1.1\r\nHost: x\r\n\r\n";
        let Parse::Complete { req, .. } = parse(req_bytes, &Limits::default()) else {
            panic!("parses");
        };
        for answer in [
            Answer::Warn {
                domain: None,
                code: b"abc\"DEF",
                url: b"https://example.com/",
            },
            Answer::Preview {
                domain: None,
                code: b"abc\"DEF",
                url: b"https://example.com/",
                flagged: false,
            },
        ] {
            let mut out = Vec::new();
            render_with(&answer, &req, b"", &pages, &mut out);
            let r = parse_response(&out, false);
            assert_eq!(
                r.header("content-security-policy"),
                Some(
                    &b"default-src 'none'; style-src 'unsafe-inline'; form-action https://api.lh.example:8443"[..]
                )
            );
            let body = text(&r.body);
            assert!(
                body.contains(
                    "<form method=\"post\" action=\"https://api.lh.example:8443/v1/reports\">"
                ),
                "{body}"
            );
            assert!(
                body.contains("name=\"code\" value=\"abc&quot;DEF\""),
                "{body}"
            );
            assert!(body.contains("name=\"reason\"") && body.contains("name=\"details\""));
            assert!(body.ends_with("</main></body></html>\n"));
        }
        // The full endpoint is taken as it is; a query or fragment is dropped.
        let full = Pages::with_report_url("http://127.0.0.1:8081/v1/reports?x#y").unwrap();
        assert_eq!(
            full.report_action.as_deref(),
            Some(&b"http://127.0.0.1:8081/v1/reports"[..])
        );
        for bad in [
            "ftp://x/",
            "https://",
            "https:///path",
            "https://a b/",
            "https://x/\"onmouseover=\"",
            "https://user@x/",
            "javascript:alert(1)",
        ] {
            assert!(Pages::with_report_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unsafe_urls_never_reach_a_header_or_a_link() {
        for url in [
            &b"https://example.com/\r\nSet-Cookie: a=b"[..],
            b"javascript:alert(1)",
            b"",
            b"https://example.com/ x",
        ] {
            for a in [
                Answer::Redirect { url },
                Answer::Preview {
                    domain: None,
                    code: b"abcDEF1",
                    url,
                    flagged: false,
                },
                Answer::Warn {
                    domain: None,
                    code: b"abcDEF1",
                    url,
                },
            ] {
                let (out, _) = rendered(&a, false, true, false);
                assert_eq!(parse_response(&out, false).status, 410, "{a:?}");
            }
        }
    }

    #[test]
    fn escapers() {
        let mut out = Vec::new();
        write_html(&mut out, b"a<b>&\"'\n\xff");
        assert_eq!(text(&out), "a&lt;b&gt;&amp;&quot;&#39;&#xfffd;&#xfffd;");
        out.clear();
        write_json(&mut out, b"a\"\\</\x01\xe9");
        assert_eq!(text(&out), "a\\\"\\\\\\u003c/\\u0001\\u00e9");
        out.clear();
        for n in [0usize, 7, 10, 12345, usize::MAX] {
            out.clear();
            write_decimal(&mut out, n);
            assert_eq!(text(&out), n.to_string());
        }
    }

    fn arb_answer() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>, bool)> {
        (
            0u8..10,
            proptest::collection::vec(any::<u8>(), 0..20),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..80),
                "https?://[ -~]{0,60}".prop_map(String::into_bytes),
            ],
            any::<bool>(),
        )
    }

    fn build<'a>(kind: u8, code: &'a [u8], url: &'a [u8], flag: bool) -> Answer<'a> {
        match kind {
            0 => Answer::Redirect { url },
            1 => Answer::Preview {
                domain: None,
                code,
                url,
                flagged: flag,
            },
            2 => Answer::Warn {
                domain: None,
                code,
                url,
            },
            3 => Answer::NotFound,
            4 => Answer::Gone,
            5 => Answer::MethodNotAllowed,
            6 => Answer::BadRequest(HttpError::Malformed),
            7 => Answer::NeedOrigin {
                domain: None,
                code,
                preview: flag,
                cache_negative: flag,
                confirming: !flag,
            },
            8 => Answer::Unavailable,
            9 => Answer::TooEarly,
            _ => Answer::BadRequest(HttpError::HeadersTooLarge),
        }
    }

    proptest! {
        /// Any answer, with any bytes in it, renders as one well-framed response; a URL reaches
        /// `Location` only when servable, and pages are valid UTF-8 (JSON pages valid JSON).
        #[test]
        fn always_a_valid_response(
            (kind, code, url, flag) in arb_answer(),
            head in any::<bool>(),
            keep in any::<bool>(),
            json in any::<bool>(),
        ) {
            let a = build(kind, &code, &url, flag);
            let (out, close) = rendered(&a, head, keep, json);
            let r = parse_response(&out, head);
            if r.status != 410 {
                prop_assert_eq!(r.status, a.status());
            }
            prop_assert_eq!(close, !keep || a.closes());
            prop_assert_eq!(r.header("connection").is_some(), close);
            if let Some(location) = r.header("location") {
                prop_assert!(is_servable(location));
                prop_assert_eq!(location, &url[..]);
            }
            if r.status == 410 {
                let may_be_gone = matches!(
                    a,
                    Answer::Gone | Answer::Redirect { .. } | Answer::Preview { .. } | Answer::Warn { .. }
                );
                prop_assert!(may_be_gone, "{:?}", a);
            }
            prop_assert!(std::str::from_utf8(&r.body).is_ok());
            if json && !head && r.header("content-type") == Some(JSON) {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                prop_assert_eq!(v["url"].as_str().map(str::as_bytes), Some(&url[..]));
            }
        }

        /// The whole path on arbitrary request bytes: whatever parses is decided and rendered
        /// into a valid response, and the caller can always make progress.
        #[test]
        fn parse_decide_render(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            path in "/[A-Za-z0-9_+?-]{0,70}",
        ) {
            let f = fixture(true);
            let mut input = format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes();
            input.extend_from_slice(&bytes);
            let mut at = 0;
            let mut out = Vec::new();
            while at < input.len() {
                out.clear();
                match parse(&input[at..], &Limits::default()) {
                    Parse::Complete { req, consumed } => {
                        prop_assert!(consumed > 0);
                        let (a, _) = decide(&req, &f.tables, 0);
                        let close = render_for(&a, &req, &mut out);
                        parse_response(&out, req.method == crate::http::Method::Head);
                        at += consumed;
                        if close { break; }
                    }
                    Parse::Partial => break,
                    Parse::Error(e) => {
                        prop_assert!(render(&Answer::BadRequest(e), false, true, false, &mut out));
                        parse_response(&out, false);
                        break;
                    }
                }
            }
        }
    }
}
