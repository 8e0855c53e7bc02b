//! One fetch of `GET /edge/v1/links/{code}` from one control plane's edge listener, and what
//! its answer means: only a 404 whose body carries the error code `not_found` is "no such link";
//! any other answer (a wrong path, a proxy's 404 page, a 5xx) is a failure.

use std::io::Read as _;

use lasthop_core::feed::EdgeLink;
use serde::Deserialize;

use super::{Fetched, OriginAnswer};

/// Largest answer body read from the origin.
const MAX_BODY: u64 = 64 * 1024;

#[derive(Deserialize)]
struct WireError {
    error: WireErrorBody,
}

#[derive(Deserialize)]
struct WireErrorBody {
    code: String,
}

/// Appends `code` to `url`, percent-encoding everything but unreserved characters (codes are
/// `[A-Za-z0-9_-]`, but the caller may hand over any bytes).
fn push_encoded(url: &mut String, code: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in code {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            url.push(char::from(b));
        } else {
            url.push('%');
            url.push(char::from(HEX[usize::from(b >> 4)]));
            url.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

pub(super) fn fetch(agent: &ureq::Agent, base: &str, token: Option<&str>, code: &[u8]) -> Fetched {
    let mut url = String::with_capacity(base.len() + 16 + code.len() * 3);
    url.push_str(base);
    url.push_str("/edge/v1/links/");
    push_encoded(&mut url, code);
    let mut req = agent.get(&url);
    if let Some(token) = token {
        req = req.set("Authorization", &format!("Bearer {token}"));
    }
    match req.call() {
        Ok(resp) if resp.status() == 200 => {
            match serde_json::from_reader::<_, EdgeLink>(resp.into_reader().take(MAX_BODY)) {
                Ok(w) => Fetched::Found(OriginAnswer::Found {
                    url: w.long_url.into_bytes().into_boxed_slice(),
                    expires_at_ms: w.expires_at_ms,
                    status: w.status,
                    warn: w.warn,
                    options: w.options,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "origin: unreadable answer");
                    let timed_out = is_timeout(&e);
                    Fetched::Failed {
                        timed_out,
                        fail_over: timed_out,
                    }
                }
            }
        }
        Ok(resp) => {
            tracing::warn!(status = resp.status(), "origin: unexpected status");
            Fetched::Failed {
                timed_out: false,
                fail_over: false,
            }
        }
        Err(ureq::Error::Status(404, resp)) => {
            match serde_json::from_reader::<_, WireError>(resp.into_reader().take(MAX_BODY)) {
                Ok(w) if w.error.code == "not_found" => Fetched::NotFound,
                _ => {
                    tracing::warn!("origin: a 404 that is not the edge listener's not_found");
                    Fetched::Failed {
                        timed_out: false,
                        fail_over: false,
                    }
                }
            }
        }
        Err(ureq::Error::Status(status, _)) => {
            tracing::warn!(status, "origin: error status");
            Fetched::Failed {
                timed_out: false,
                fail_over: status >= 500,
            }
        }
        Err(e) => {
            let timed_out = is_timeout(&e);
            tracing::warn!(error = %e, timed_out, "origin: fetch failed");
            Fetched::Failed {
                timed_out,
                fail_over: true,
            }
        }
    }
}

/// Whether an error chain bottoms out in an I/O timeout.
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}
