//! The admin listener: Prometheus `/metrics`, `/healthz`, `/readyz` and `/debug/top`, on its own
//! std thread and its own socket, never on a serving core.
//!
//! It is for operators and scrapers, a few requests a second at most, so it serves one
//! connection at a time with a per-connection read and write timeout (a stuck client delays the
//! next scrape by at most that long, and never a redirect) and closes every connection after one
//! answer. The request head is parsed with `httparse`; anything but `GET`/`HEAD` is a 405.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::prom::{family, sample};
use crate::metrics::EngineMetrics;
use crate::topk::{merge_top, TopK};

/// How long a client may take to send its request or read the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read.
const MAX_HEAD: usize = 8 * 1024;
/// Default and largest `n` of `/debug/top`.
const DEFAULT_TOP: usize = 20;
const MAX_TOP: usize = 1000;

/// What the admin listener reports on.
#[derive(Debug)]
pub struct AdminState {
    /// Counters, gauges and the health flags (`metrics.health`) that `/readyz` reads.
    pub metrics: Arc<EngineMetrics>,
    /// One hot-code sketch per serving core.
    pub sketches: Vec<Arc<TopK>>,
    /// The sketches count one redirect in this many; `/debug/top` scales counts back up.
    pub top_sample: u64,
}

impl AdminState {
    /// Marks the engine ready (snapshot mapped, listeners accepting).
    pub fn set_ready(&self, ready: bool) {
        self.metrics
            .health
            .ready
            .store(ready, std::sync::atomic::Ordering::Relaxed);
    }

    /// `/metrics`: the engine's metrics plus the sketches' own counter.
    fn render_metrics(&self) -> String {
        let mut text = self.metrics.render_prometheus();
        let skipped: u64 = self.sketches.iter().map(|s| s.skipped()).sum();
        let name = "lasthop_engine_topk_skipped_total";
        family(
            &mut text,
            name,
            "counter",
            "Hot-code records skipped while /debug/top read a sketch.",
        );
        sample(&mut text, name, "", skipped);
        text
    }
}

/// Serves the admin endpoints on `listener` from a dedicated thread named `admin`.
///
/// The thread runs until the process exits; an accept error (out of descriptors, say) is logged
/// and retried after a short pause rather than ending it.
pub fn spawn_admin(
    listener: TcpListener,
    state: Arc<AdminState>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = serve(stream, &state) {
                            tracing::debug!(error = %e, "admin connection");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
}

/// An answer: status, content type, body.
struct Answer {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
    allow: bool,
}

impl Answer {
    fn new(status: u16, reason: &'static str, content_type: &'static str, body: String) -> Self {
        Answer {
            status,
            reason,
            content_type,
            body,
            allow: false,
        }
    }

    fn text(status: u16, reason: &'static str, body: impl Into<String>) -> Self {
        Answer::new(status, reason, "text/plain; charset=utf-8", body.into())
    }
}

fn serve(mut stream: TcpStream, state: &AdminState) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let (answer, head) = loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(()); // closed before a whole request
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("");
                let path = req.path.unwrap_or("");
                break (route(method, path, state), method == "HEAD");
            }
            Ok(httparse::Status::Partial) if len < buf.len() => continue,
            Ok(httparse::Status::Partial) => {
                break (
                    Answer::text(
                        431,
                        "Request Header Fields Too Large",
                        "request head too large\n",
                    ),
                    false,
                )
            }
            Err(_) => {
                break (
                    Answer::text(400, "Bad Request", "malformed request\n"),
                    false,
                )
            }
        }
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
        answer.status,
        answer.reason,
        answer.content_type,
        answer.body.len()
    );
    if answer.allow {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head {
        out.push_str(&answer.body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

fn route(method: &str, target: &str, state: &AdminState) -> Answer {
    if method != "GET" && method != "HEAD" {
        let mut a = Answer::text(405, "Method Not Allowed", "GET or HEAD only\n");
        a.allow = true;
        return a;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/metrics" => Answer::new(
            200,
            "OK",
            "text/plain; version=0.0.4; charset=utf-8",
            state.render_metrics(),
        ),
        "/healthz" => Answer::text(200, "OK", "ok\n"),
        "/readyz" => match state.metrics.health.readiness() {
            Ok(None) => Answer::text(200, "OK", "ready\n"),
            // `?strict`: for operators who would rather drain a degraded engine.
            Ok(Some(why)) if query.split('&').any(|p| p == "strict" || p == "strict=1") => {
                Answer::text(503, "Service Unavailable", format!("degraded: {why}\n"))
            }
            Ok(Some(why)) => Answer::text(200, "OK", format!("ready (degraded: {why})\n")),
            Err(reason) => {
                Answer::text(503, "Service Unavailable", format!("not ready: {reason}\n"))
            }
        },
        "/debug/top" => match top_n(query) {
            Some(n) => {
                let top = merge_top(state.sketches.iter().map(|s| &**s), n);
                let body = serde_json::json!({
                    "approximate": true,
                    "cores": state.sketches.len(),
                    "sample": state.top_sample,
                    "top": top
                        .iter()
                        .map(|(code, count)| {
                            let count = count.saturating_mul(state.top_sample);
                            serde_json::json!({"code": code, "count": count})
                        })
                        .collect::<Vec<_>>(),
                });
                Answer::new(200, "OK", "application/json", format!("{body}\n"))
            }
            None => Answer::text(400, "Bad Request", format!("n must be 1..={MAX_TOP}\n")),
        },
        _ => Answer::text(404, "Not Found", "not found\n"),
    }
}

/// The `n` of a `/debug/top` query string; `None` when it is not a number in 1..=MAX_TOP.
fn top_n(query: &str) -> Option<usize> {
    let mut n = DEFAULT_TOP;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        if let Some(v) = pair.strip_prefix("n=") {
            n = v.parse().ok().filter(|n| (1..=MAX_TOP).contains(n))?;
        }
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::StatusClass;
    use std::sync::atomic::Ordering;

    fn start() -> (String, Arc<AdminState>) {
        let metrics = Arc::new(EngineMetrics::new(2, "epoll"));
        let state = Arc::new(AdminState {
            metrics,
            sketches: vec![Arc::new(TopK::new()), Arc::new(TopK::new())],
            top_sample: 1,
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        spawn_admin(listener, Arc::clone(&state)).unwrap();
        (base, state)
    }

    /// (status, content type, body) over a real socket with ureq.
    fn get(url: &str) -> (u16, String, String) {
        let resp = match ureq::get(url).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{url}: {e}"),
        };
        let status = resp.status();
        let ct = resp.header("content-type").unwrap_or("").to_string();
        (status, ct, resp.into_string().unwrap())
    }

    fn raw(base: &str, request: &[u8]) -> String {
        let mut s = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn metrics_over_a_socket() {
        let (base, state) = start();
        state.metrics.cores[0].request(StatusClass::Found);
        state.metrics.cores[1].answer(3);
        let (status, ct, body) = get(&format!("{base}/metrics"));
        assert_eq!(status, 200);
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        crate::metrics::prom::tests::check_exposition(&body);
        assert!(body.contains("lasthop_engine_io_backend{backend=\"epoll\"} 1\n"));
        assert!(body.contains("lasthop_engine_requests_total{status=\"302\"} 1\n"));
        assert!(body.contains("lasthop_engine_answers_total{layer=\"snapshot\"} 1\n"));
        assert!(body.contains("lasthop_engine_topk_skipped_total 0\n"));
    }

    #[test]
    fn health_and_readiness() {
        let (base, state) = start();
        assert_eq!(
            get(&format!("{base}/healthz")),
            (200, "text/plain; charset=utf-8".into(), "ok\n".into())
        );
        let (status, _, body) = get(&format!("{base}/readyz"));
        assert_eq!((status, body.as_str()), (503, "not ready: starting\n"));
        state.set_ready(true);
        assert_eq!(get(&format!("{base}/readyz")).0, 200);
        state
            .metrics
            .health
            .feed_lost
            .store(true, Ordering::Relaxed);
        let (status, _, body) = get(&format!("{base}/readyz"));
        assert_eq!(
            (status, body.as_str()),
            (200, "ready (degraded: feed lost, safe mode)\n")
        );
        let (status, _, body) = get(&format!("{base}/readyz?strict"));
        assert_eq!(
            (status, body.as_str()),
            (503, "degraded: feed lost, safe mode\n")
        );
        state
            .metrics
            .health
            .feed_lost
            .store(false, Ordering::Relaxed);
        state
            .metrics
            .health
            .snapshot_missing
            .store(true, Ordering::Relaxed);
        let (status, _, body) = get(&format!("{base}/readyz"));
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: snapshot missing\n")
        );
    }

    #[test]
    fn debug_top_merges_the_cores() {
        let (base, state) = start();
        for _ in 0..5 {
            state.sketches[0].record(b"hotcode");
        }
        for _ in 0..3 {
            state.sketches[1].record(b"hotcode");
            state.sketches[1].record(b"warm-alias");
        }
        state.sketches[0].record(b"coldone");
        let (status, ct, body) = get(&format!("{base}/debug/top?n=2"));
        assert_eq!((status, ct.as_str()), (200, "application/json"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["top"],
            serde_json::json!([{"code": "hotcode", "count": 8}, {"code": "warm-alias", "count": 3}])
        );
        assert_eq!(v["cores"], 2);
        let v: serde_json::Value =
            serde_json::from_str(&get(&format!("{base}/debug/top")).2).unwrap();
        assert_eq!(v["top"].as_array().unwrap().len(), 3);
        for bad in ["n=0", "n=x", "n=100000"] {
            assert_eq!(get(&format!("{base}/debug/top?{bad}")).0, 400, "{bad}");
        }
    }

    #[test]
    fn other_requests() {
        let (base, _) = start();
        assert_eq!(get(&format!("{base}/nope")).0, 404);
        let out = raw(
            &base,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
        assert!(out.contains("\r\nAllow: GET, HEAD\r\n"), "{out}");
        let out = raw(&base, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 200 ")
                && out.ends_with(
                    "Content-Length: 3\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                ),
            "{out:?}"
        );
        let out = raw(&base, b"GET /\x01 HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
        // Exactly the limit, unterminated: the server reads it all, so its close is clean.
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.resize(MAX_HEAD, b'a');
        let out = raw(&base, &huge);
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }

    #[test]
    fn a_silent_client_does_not_wedge_the_listener() {
        let (base, _) = start();
        let _silent = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
        let started = std::time::Instant::now();
        // Served after the silent connection's read timeout at the latest.
        assert_eq!(get(&format!("{base}/healthz")).0, 200);
        assert!(started.elapsed() < IO_TIMEOUT + Duration::from_secs(2));
    }
}
