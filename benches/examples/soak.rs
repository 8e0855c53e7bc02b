//! The soak driver of `perf/soak.sh`: it runs the whole system for DURATION seconds under load
//! and faults, samples it, draws it and judges it. The script prepares everything (keys, API
//! keys, certificates, PostgreSQL, ClickHouse, one start script a process) and describes it in
//! a JSON file; this program starts the processes from those scripts, and then:
//!
//! - measures the system's capacity for CALIBRATE seconds (every load connection asking as fast
//!   as it is answered) and loads it at FRACTION of that (or RATE requests a second), paced:
//!   per engine, HTTP/1.1 in clear, HTTP/1.1 over TLS, HTTP/2 over TLS and HTTP/3, each its own
//!   connections and a quarter of the rate, every request `GET /CODE` of a live link with a
//!   browser's user agent (so its click counts as human); a 302 must carry the link's URL;
//! - creates links at CREATES a second (each live for the load at once: read-through covers
//!   the engines until the feed brings it), takes one down every second (and probes every
//!   serving engine until it answers 410: within a second of the ack, or a failure), publishes
//!   a snapshot and sends the engines SIGHUP every minute, and every KILL_EVERY seconds
//!   SIGKILLs and restarts, in turn, an engine (alternately), the control plane and the click
//!   processor;
//! - every SAMPLE seconds writes a CSV row (`samples.csv`): each process's anonymous and
//!   file-backed RSS, descriptors and threads, each protocol's requests a second and p50/p99
//!   latency (request written to answer read, in µs), errors by kind, each engine's feed lag
//!   (sequences behind the control plane), the processor's click lag and spool backlog, the
//!   clicks counted so far (ClickHouse);
//! - at the end stops the load, asks every live link at both engines (302 with its URL) and
//!   every taken-down one (410), waits for the clicks to drain, draws the samples as PNG charts
//!   (plotters) and writes `summary.md` and `summary.json` with the verdicts below; exits 1
//!   when one fails.
//!
//! Verdicts: every acknowledged link redirects at both engines; every takedown enforced at
//! every serving engine within a second of its ack (and still after an engine's restart); no
//! unexpected status or error (a connection cut while its engine is killed is expected); no
//! panic in any log; anonymous RSS grows less than 5% and descriptors not at all over the last
//! 30 minutes (each process since its last restart, after a minute's warm-up; medians and
//! minimums of a minute's samples at each end); human + bot clicks counted equal the 302s
//! answered less the drops the engines report, within rate x 100 ms an engine kill.
//!
//! `cargo run --release -p lasthop-benches --example soak -- WORK/soak.json`

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

type Err = Box<dyn std::error::Error + Send + Sync>;

/// A browser's user agent, one of many millions: the processor counts a visitor (address and
/// user agent) that asks for more than 30 codes a minute as a bot, and the load comes from a few
/// loopback connections, so each request is another visitor (a build number of its own).
fn browser(rng: &mut u64) -> String {
    let r = next(rng);
    let (build, patch) = (r % 7000, (r >> 16) % 200);
    match (r >> 32) % 3 {
        0 => format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.{build}.{patch} Safari/537.36"),
        1 => format!("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.{build}.{patch} Safari/537.36"),
        _ => format!("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.{build}.{patch} Mobile Safari/537.36"),
    }
}

const UAS: [&str; 4] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Proto {
    H1,
    Https,
    H2,
    H3,
}

impl Proto {
    const ALL: [Proto; 4] = [Proto::H1, Proto::Https, Proto::H2, Proto::H3];
    fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::Https => "https",
            Proto::H2 => "h2",
            Proto::H3 => "h3",
        }
    }
    /// Connections per engine.
    fn conns(self) -> usize {
        match self {
            Proto::H1 => 4,
            Proto::Https => 2,
            Proto::H2 => 2,
            Proto::H3 => 2,
        }
    }
}

/// A process the driver starts (from its script), kills and restarts.
struct Proc {
    name: String,
    start: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pid: u32,
    started: Instant,
    /// (killed at, serving again at) of each kill.
    windows: Vec<(Instant, Option<Instant>)>,
}

impl Proc {
    fn new(v: &Value) -> Proc {
        Proc {
            name: v["name"].as_str().expect("name").to_string(),
            start: PathBuf::from(v["start"].as_str().expect("start")),
            log: PathBuf::from(v["log"].as_str().expect("log")),
            child: None,
            pid: 0,
            started: Instant::now(),
            windows: Vec::new(),
        }
    }

    fn spawn(&mut self) {
        let child = Command::new("bash")
            .arg(&self.start)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.start.display()));
        self.pid = child.id();
        self.child = Some(child);
        self.started = Instant::now();
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([format!("-{sig}"), self.pid.to_string()])
            .status();
    }

    /// SIGTERM, then SIGKILL after 20 s.
    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        self.signal("TERM");
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    fn in_window(&self, from: Instant, to: Instant) -> bool {
        self.windows.iter().any(|&(k, r)| {
            let end = r.map_or(to + Duration::from_secs(1), |r| r + Duration::from_secs(2));
            k <= to && from <= end
        })
    }
}

#[derive(Clone)]
struct EngineAddrs {
    http: SocketAddr,
    tls: SocketAddr,
    admin: String,
}

/// The links the load asks for, and the ones taken down.
#[derive(Default)]
struct Links {
    live: Vec<(Arc<str>, Arc<str>)>,
    index: HashMap<Arc<str>, usize>,
    /// Code -> (URL, the takedown's ack once it came).
    down: HashMap<Arc<str>, (Arc<str>, Option<Instant>)>,
    created: u64,
}

impl Links {
    fn add(&mut self, code: Arc<str>, url: Arc<str>) {
        self.index.insert(code.clone(), self.live.len());
        self.live.push((code, url));
        self.created += 1;
    }
    fn remove(&mut self, i: usize) -> (Arc<str>, Arc<str>) {
        let (code, url) = self.live.swap_remove(i);
        self.index.remove(&code);
        if let Some((moved, _)) = self.live.get(i) {
            self.index.insert(moved.clone(), i);
        }
        (code, url)
    }
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    answered_302: AtomicU64,
    gone_410: AtomicU64,
    lat: Mutex<BTreeMap<Proto, Vec<u32>>>,
    errors: Mutex<BTreeMap<String, u64>>,
    examples: Mutex<Vec<String>>,
    takedown_ms: Mutex<Vec<f64>>,
}

/// Error kinds that do not fail the run.
const EXPECTED: [&str; 2] = ["cut_by_kill", "api_during_kill"];

impl Tally {
    fn error(&self, kind: &str, what: String) {
        *self
            .errors
            .lock()
            .unwrap()
            .entry(kind.to_string())
            .or_default() += 1;
        if !EXPECTED.contains(&kind) {
            let mut ex = self.examples.lock().unwrap();
            if ex.len() < 30 {
                ex.push(format!("{kind}: {what}"));
            }
        }
    }
}

struct Ctx {
    host: String,
    api: String,
    owner_key: String,
    admin_key: String,
    engines: Vec<EngineAddrs>,
    procs: Mutex<Vec<Proc>>,
    links: Mutex<Links>,
    tally: Tally,
    running: AtomicBool,
    /// Requests a second in all (f64 bits); 0 is unpaced.
    rate: AtomicU64,
    seq: AtomicU64,
    start: Instant,
    /// When the paced run began (set once the calibration ends).
    run_start: Mutex<Option<Instant>>,
}

impl Ctx {
    /// Whether `proc` (a name) was down or restarting any time from `from` to now.
    fn killed(&self, proc: &str, from: Instant) -> bool {
        let now = Instant::now();
        self.procs
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.name == proc && p.in_window(from, now))
    }
    /// An API call asked at `asked` that failed: expected while the control plane is killed.
    fn api_failed(&self, asked: Instant, what: String) {
        let kind = if self.killed("control", asked) {
            "api_during_kill"
        } else {
            "api_error"
        };
        self.tally.error(kind, what);
    }
    fn engine_name(i: usize) -> String {
        format!("engine-{}", (b'a' + i as u8) as char)
    }
    fn pick(&self, rng: &mut u64) -> Option<(Arc<str>, Arc<str>)> {
        let links = self.links.lock().unwrap();
        if links.live.is_empty() {
            return None;
        }
        let i = (next(rng) % links.live.len() as u64) as usize;
        Some(links.live[i].clone())
    }
    /// Judges one answer to `GET /code` from engine `e`.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        e: usize,
        proto: Proto,
        code: &str,
        url: &str,
        status: u16,
        location: Option<&str>,
        sent: Instant,
    ) {
        let t = &self.tally;
        match status {
            302 => {
                t.answered_302.fetch_add(1, Ordering::Relaxed);
                if location != Some(url) {
                    t.error(
                        "wrong_location",
                        format!("{} /{code}: {location:?}, not {url}", Ctx::engine_name(e)),
                    );
                }
                let down = self.links.lock().unwrap().down.get(code).and_then(|d| d.1);
                if let Some(ack) = down {
                    if ack + Duration::from_secs(1) < sent {
                        t.error(
                            "served_after_takedown",
                            format!(
                                "{} /{code} 302 {:?} after the ack",
                                Ctx::engine_name(e),
                                sent - ack
                            ),
                        );
                    }
                }
            }
            410 if self.links.lock().unwrap().down.contains_key(code) => {
                t.gone_410.fetch_add(1, Ordering::Relaxed);
            }
            s => t.error(
                "unexpected_status",
                format!(
                    "{} {} /{code}: {s} at t={:.1}s",
                    Ctx::engine_name(e),
                    proto.name(),
                    self.run_t()
                ),
            ),
        }
    }
    fn fail(&self, e: usize, what: &str, err: impl std::fmt::Display, sent: Instant) {
        let kind = if self.killed(&Ctx::engine_name(e), sent) {
            "cut_by_kill"
        } else {
            "io_error"
        };
        self.tally
            .error(kind, format!("{} {what}: {err}", Ctx::engine_name(e)));
    }
    fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    /// Seconds since the paced run began (negative before).
    fn run_t(&self) -> f64 {
        match *self.run_start.lock().unwrap() {
            Some(t) => t.elapsed().as_secs_f64(),
            None => -self.start.elapsed().as_secs_f64(),
        }
    }
}

fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

// ---------------------------------------------------------------------------------------------
// Clients.

/// One HTTP/1.1 `GET` on a keep-alive stream: (status, Location, whether the server keeps it).
async fn h1_get<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    host: &str,
    path: &str,
    ua: &str,
) -> Result<(u16, Option<String>, bool), Err> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {ua}\r\nAccept: text/html\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err("connection closed before the answer".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head) = resp.parse(buf)? {
            let status = resp.code.unwrap_or(0);
            let mut len = 0usize;
            let mut location = None;
            let mut keep = true;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    len = std::str::from_utf8(h.value)?.trim().parse()?;
                } else if h.name.eq_ignore_ascii_case("location") {
                    location = Some(String::from_utf8_lossy(h.value).into_owned());
                } else if h.name.eq_ignore_ascii_case("connection") {
                    keep = !h.value.eq_ignore_ascii_case(b"close");
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    return Err("a chunked answer".into());
                }
            }
            while buf.len() < head + len {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err("connection closed in the body".into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, location, keep));
        }
        if buf.len() > 64 * 1024 {
            return Err("an answer head over 64 KiB".into());
        }
    }
}

fn tls_config(alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(lasthop_benches::NoCheck::tls13_client(provider, alpn))
}

fn quic_config() -> quinn::ClientConfig {
    let tls = (*tls_config(b"h3")).clone();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Duration::from_secs(5).try_into().ok());
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport));
    config
}

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

enum Conn {
    H1(TcpStream),
    Https(Box<TlsStream>),
    H2(h2::client::SendRequest<Bytes>),
    H3(
        h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
        quinn::Connection,
    ),
}

async fn tls_connect(addr: SocketAddr, host: &str, alpn: &[u8]) -> Result<TlsStream, Err> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())?;
    Ok(tokio_rustls::TlsConnector::from(tls_config(alpn))
        .connect(name, tcp)
        .await?)
}

async fn connect(ctx: &Ctx, e: usize, proto: Proto, quic: &quinn::Endpoint) -> Result<Conn, Err> {
    let a = &ctx.engines[e];
    let io = Duration::from_secs(5);
    let conn = async {
        Ok::<Conn, Err>(match proto {
            Proto::H1 => {
                let s = TcpStream::connect(a.http).await?;
                s.set_nodelay(true)?;
                Conn::H1(s)
            }
            Proto::Https => {
                Conn::Https(Box::new(tls_connect(a.tls, &ctx.host, b"http/1.1").await?))
            }
            Proto::H2 => {
                let tls = tls_connect(a.tls, &ctx.host, b"h2").await?;
                let (send, conn) = h2::client::handshake(tls).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Conn::H2(send)
            }
            Proto::H3 => {
                let conn = quic.connect_with(quic_config(), a.tls, &ctx.host)?.await?;
                let (mut driver, send) =
                    h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
                tokio::spawn(async move {
                    let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
                });
                Conn::H3(send, conn)
            }
        })
    };
    tokio::time::timeout(io, conn)
        .await
        .map_err(|_| "connect timed out")?
}

/// One `GET path` on `conn`: (status, Location); `Ok(None)` for an answer after which the
/// connection is closed.
async fn get(
    conn: &mut Conn,
    host: &str,
    path: &str,
    ua: &str,
    buf: &mut Vec<u8>,
) -> Result<(u16, Option<String>, bool), Err> {
    match conn {
        Conn::H1(s) => h1_get(s, buf, host, path, ua).await,
        Conn::Https(s) => h1_get(s.as_mut(), buf, host, path, ua).await,
        Conn::H2(send) => {
            let req = http::Request::get(format!("https://{host}{path}"))
                .header("user-agent", ua)
                .body(())?;
            let mut send = send.clone().ready().await?;
            let (resp, _) = send.send_request(req, true)?;
            let resp = resp.await?;
            let status = resp.status().as_u16();
            let location = resp
                .headers()
                .get("location")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            let mut body = resp.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Ok((status, location, true))
        }
        Conn::H3(send, _) => {
            let req = http::Request::get(format!("https://{host}{path}"))
                .header("user-agent", ua)
                .body(())?;
            let mut stream = send.send_request(req).await?;
            stream.finish().await?;
            let resp = stream.recv_response().await?;
            let status = resp.status().as_u16();
            let location = resp
                .headers()
                .get("location")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            while stream.recv_data().await?.is_some() {}
            Ok((status, location, true))
        }
    }
}

/// One load connection of `proto` to engine `e`: paced `GET`s of live links until the end,
/// reconnecting after a failure.
async fn worker(ctx: Arc<Ctx>, e: usize, proto: Proto, n: u64, quic: quinn::Endpoint) {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (n + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut buf = Vec::with_capacity(4096);
    let mut next_at = Instant::now();
    while ctx.running.load(Ordering::Relaxed) {
        let began = Instant::now();
        let mut conn = match connect(&ctx, e, proto, &quic).await {
            Ok(c) => c,
            Err(err) => {
                ctx.fail(e, &format!("{} connect", proto.name()), err, began);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while ctx.running.load(Ordering::Relaxed) {
            let rate = f64::from_bits(ctx.rate.load(Ordering::Relaxed))
                / (ctx.engines.len() * Proto::ALL.len() * proto.conns()) as f64;
            if rate > 0.0 {
                let now = Instant::now();
                if next_at > now {
                    tokio::time::sleep_until(next_at.into()).await;
                } else if now - next_at > Duration::from_secs(1) {
                    next_at = now;
                }
                next_at += Duration::from_secs_f64(1.0 / rate);
            }
            let Some((code, url)) = ctx.pick(&mut rng) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let ua = browser(&mut rng);
            let sent = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(5),
                get(&mut conn, &ctx.host, &format!("/{code}"), &ua, &mut buf),
            )
            .await
            .unwrap_or_else(|_| Err("no answer within 5 s".into()));
            match answer {
                Ok((status, location, keep)) => {
                    let us = sent.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    ctx.tally
                        .lat
                        .lock()
                        .unwrap()
                        .entry(proto)
                        .or_default()
                        .push(us);
                    ctx.judge(e, proto, &code, &url, status, location.as_deref(), sent);
                    if !keep {
                        break;
                    }
                }
                Err(err) => {
                    ctx.fail(e, &format!("{} GET /{code}", proto.name()), err, sent);
                    break;
                }
            }
        }
        if let Conn::H3(_, c) = &conn {
            c.close(quinn::VarInt::from_u32(0x100), b"");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The control plane's API, the metrics, ClickHouse (blocking: ureq, on the blocking pool).

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build()
}

fn api(
    ctx: &Ctx,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let req = agent()
        .request(method, &format!("http://{}{path}", ctx.api))
        .set("Authorization", &format!("Bearer {key}"));
    let res = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match res {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            let status = r.status();
            let v = r.into_json::<Value>().unwrap_or(Value::Null);
            Ok((status, v))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn scrape(addr: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    let Some(text) = agent()
        .get(&format!("http://{addr}/metrics"))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
    else {
        return out;
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                *out.entry(name.to_string()).or_default() += v;
            }
        }
    }
    out
}

fn sum_of(m: &HashMap<String, f64>, prefix: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| *k == prefix || k.starts_with(&format!("{prefix}{{")))
        .map(|(_, v)| v)
        .sum()
}

fn ready(url: &str, secs: u64) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if agent().get(url).call().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// (human, bot) clicks in ClickHouse's rollups: each (day, code, part)'s newest row of its
/// day's current generation.
fn clicks_counted(ch: &str, db: &str) -> Option<(u64, u64)> {
    let sql = format!(
        "SELECT sum(r.h), sum(r.b) FROM (SELECT day, code, part, argMax(human, version) AS h, \
         argMax(bot, version) AS b, argMax(gen, version) AS g FROM {db}.rollups WHERE day > 0 \
         GROUP BY day, code, part) AS r LEFT JOIN (SELECT day, argMax(gen, version) AS g \
         FROM {db}.days GROUP BY day) AS d ON r.day = d.day WHERE r.g = d.g FORMAT TSV"
    );
    let text = agent()
        .post(ch)
        .send_string(&sql)
        .ok()?
        .into_string()
        .ok()?;
    let mut f = text.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

// ---------------------------------------------------------------------------------------------
// /proc.

#[derive(Clone, Copy, Default)]
struct ProcSample {
    anon_kb: u64,
    file_kb: u64,
    fds: u64,
    threads: u64,
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut s = ProcSample::default();
    for line in status.lines() {
        let mut f = line.split_whitespace();
        let (Some(k), Some(v)) = (f.next(), f.next()) else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "RssAnon:" => s.anon_kb = v,
            "RssFile:" => s.file_kb = v,
            "Threads:" => s.threads = v,
            _ => {}
        }
    }
    s.fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(s)
}

fn pid_file(path: &str) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

// ---------------------------------------------------------------------------------------------
// The run.

struct Spec {
    v: Value,
}

impl Spec {
    fn f(&self, k: &str, d: f64) -> f64 {
        self.v[k].as_f64().unwrap_or(d)
    }
    fn s(&self, k: &str) -> String {
        self.v[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k} in the spec"))
            .to_string()
    }
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: soak SPEC.json");
    let spec = Spec {
        v: serde_json::from_str(&std::fs::read_to_string(&path).expect("the spec")).expect("JSON"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let pass = runtime.block_on(run(spec));
    std::process::exit(if pass { 0 } else { 1 });
}

fn ready_url(ctx: &Ctx, spec: &Value, name: &str) -> String {
    if name == "control" {
        return format!("http://{}/healthz", ctx.api);
    }
    if name == "processor" {
        return format!(
            "http://{}/metrics",
            spec["processor"]["metrics"].as_str().unwrap()
        );
    }
    let i = (name.as_bytes()[7] - b'a') as usize;
    format!("http://{}/readyz", ctx.engines[i].admin)
}

async fn start_proc(ctx: &Arc<Ctx>, spec: &Value, name: &str) -> bool {
    let url = ready_url(ctx, spec, name);
    {
        let mut procs = ctx.procs.lock().unwrap();
        procs.iter_mut().find(|p| p.name == name).unwrap().spawn();
    }
    tokio::task::spawn_blocking(move || ready(&url, 120))
        .await
        .unwrap_or(false)
}

async fn run(spec: Spec) -> bool {
    let out = PathBuf::from(spec.s("out"));
    std::fs::create_dir_all(&out).expect("out");
    let duration = spec.f("duration", 3600.0);
    let sample = spec.f("sample_secs", 10.0);
    let kill_every = spec.f("kill_every", 600.0);
    let creates = spec.f("creates_per_sec", 5.0);
    let engines: Vec<EngineAddrs> = spec.v["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| EngineAddrs {
            http: e["http"].as_str().unwrap().parse().unwrap(),
            tls: e["tls"].as_str().unwrap().parse().unwrap(),
            admin: e["admin"].as_str().unwrap().to_string(),
        })
        .collect();
    let mut procs = vec![Proc::new(&spec.v["control"])];
    procs.extend(spec.v["engines"].as_array().unwrap().iter().map(Proc::new));
    procs.push(Proc::new(&spec.v["processor"]));
    let ctx = Arc::new(Ctx {
        host: spec.s("host"),
        api: spec.s("api"),
        owner_key: spec.s("owner_key"),
        admin_key: spec.s("admin_key"),
        engines,
        procs: Mutex::new(procs),
        links: Mutex::new(Links::default()),
        tally: Tally::default(),
        running: AtomicBool::new(true),
        rate: AtomicU64::new(0f64.to_bits()),
        seq: AtomicU64::new(0),
        start: Instant::now(),
        run_start: Mutex::new(None),
    });
    let ch = spec.s("clickhouse");
    let db = spec.s("clickhouse_db");
    let mut notes: Vec<String> = Vec::new();

    // Start: the control plane, the engines, the processor.
    for name in ["control", "engine-a", "engine-b", "processor"] {
        if !start_proc(&ctx, &spec.v, name).await {
            eprintln!(
                "soak: {name} did not start; its log: {}",
                log_of(&ctx, name)
            );
            stop_all(&ctx);
            return false;
        }
    }
    println!("soak: control plane, two engines and the processor are up");

    // Seed links.
    let seed = spec.f("seed_links", 2000.0) as u64;
    let mut tasks = Vec::new();
    for chunk in 0..8u64 {
        let ctx = Arc::clone(&ctx);
        tasks.push(tokio::task::spawn_blocking(move || {
            for i in (chunk..seed).step_by(8) {
                create(&ctx, &format!("https://example.com/soak/seed/{i}"));
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "soak: {} links created",
        ctx.links.lock().unwrap().live.len()
    );

    // Load: every connection, unpaced for the calibration.
    let quic = quinn::Endpoint::client("0.0.0.0:0".parse().unwrap()).expect("a UDP socket");
    let mut load = Vec::new();
    let mut n = 0u64;
    for e in 0..ctx.engines.len() {
        for proto in Proto::ALL {
            for _ in 0..proto.conns() {
                n += 1;
                load.push(tokio::spawn(worker(
                    Arc::clone(&ctx),
                    e,
                    proto,
                    n,
                    quic.clone(),
                )));
            }
        }
    }
    let calibrate = spec.f("calibrate_secs", 10.0);
    let before = ctx.tally.answered_302.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(calibrate)).await;
    let capacity = (ctx.tally.answered_302.load(Ordering::Relaxed) - before) as f64 / calibrate;
    let rate = match spec.f("rate", 0.0) {
        r if r > 0.0 => r,
        _ => capacity * spec.f("fraction", 0.5),
    };
    // Each engine an equal share, each protocol a quarter of it, split over its connections.
    ctx.rate.store(rate.to_bits(), Ordering::Relaxed);
    println!("soak: capacity {capacity:.0} requests/s (unpaced, {calibrate} s); running at {rate:.0}/s for {duration} s");
    notes.push(format!("capacity {capacity:.0}/s, rate {rate:.0}/s"));
    {
        let mut lat = ctx.tally.lat.lock().unwrap();
        lat.clear();
    }
    let run_start = Instant::now();
    let run_t0 = ctx.elapsed();
    *ctx.run_start.lock().unwrap() = Some(run_start);

    // Creates, takedowns, publishes, SIGHUPs, kills, samples.
    let bg = vec![
        tokio::spawn(creator(Arc::clone(&ctx), creates)),
        tokio::spawn(taker(Arc::clone(&ctx))),
        tokio::spawn(publisher(Arc::clone(&ctx), spec.f("publish_every", 60.0))),
        tokio::spawn(hupper(Arc::clone(&ctx), spec.f("hup_every", 60.0))),
    ];
    let sampler_ctx = Arc::clone(&ctx);
    let sampler_spec = spec.v.clone();
    let sampler_out = out.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(async move {
        sampler_task(sampler_ctx, sampler_spec, sampler_out, sample, stop_rx).await
    });
    let order = ["engine", "control", "processor"];
    let mut kills: Vec<(f64, String, f64)> = Vec::new();
    let mut k = 0usize;
    let mut engine_kills = 0usize;
    loop {
        let at = run_start + Duration::from_secs_f64(kill_every * (k as f64 + 1.0));
        // Each kill leaves the run time to recover before its end.
        let margin = Duration::from_secs_f64(kill_every.min(60.0));
        if kill_every <= 0.0 || at + margin > run_start + Duration::from_secs_f64(duration) {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let name = match order[k % 3] {
            "engine" => {
                engine_kills += 1;
                Ctx::engine_name((engine_kills - 1) % ctx.engines.len())
            }
            other => other.to_string(),
        };
        k += 1;
        let t = ctx.elapsed() - run_t0;
        if name.starts_with("engine") {
            // Its drops so far, before its counters go with it.
            sampler_drops(&ctx, &name).await;
        }
        {
            let mut procs = ctx.procs.lock().unwrap();
            let p = procs.iter_mut().find(|p| p.name == name).unwrap();
            p.windows.push((Instant::now(), None));
            p.kill9();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let up = start_proc(&ctx, &spec.v, &name).await;
        let back = Instant::now();
        {
            let mut procs = ctx.procs.lock().unwrap();
            let p = procs.iter_mut().find(|p| p.name == name).unwrap();
            if let Some(w) = p.windows.last_mut() {
                w.1 = Some(back);
            }
        }
        let down_for = (ctx.elapsed() - run_t0) - t;
        println!(
            "soak: t={t:.0}s SIGKILL {name}; serving again after {down_for:.1} s{}",
            if up { "" } else { " (NOT UP)" }
        );
        if !up {
            ctx.tally.error(
                "restart_failed",
                format!("{name} did not come back: {}", log_of(&ctx, &name)),
            );
        }
        if up && name.starts_with("engine") {
            recheck_takedowns(&ctx, &name).await;
        }
        kills.push((t, name, down_for));
    }
    let end = run_start + Duration::from_secs_f64(duration);
    tokio::time::sleep_until(end.into()).await;

    // The end: stop the load, ask every link at both engines, drain the clicks.
    ctx.running.store(false, Ordering::Relaxed);
    for t in bg {
        t.abort();
    }
    for w in load {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    println!("soak: load stopped; asking every link at both engines");
    let final_check = final_check(&ctx).await;
    let drops_total = {
        for i in 0..ctx.engines.len() {
            sampler_drops(&ctx, &Ctx::engine_name(i)).await;
        }
        DROPS
            .lock()
            .unwrap()
            .values()
            .map(|d| d.0 + d.1)
            .sum::<f64>()
    };
    println!(
        "soak: {drops_total} clicks dropped by the engines; waiting for the processor to drain"
    );
    let mut counted = (0, 0);
    let mut stable = 0;
    let until = Instant::now() + Duration::from_secs(240);
    while Instant::now() < until {
        let (ch2, db2) = (ch.clone(), db.clone());
        let now = tokio::task::spawn_blocking(move || clicks_counted(&ch2, &db2))
            .await
            .ok()
            .flatten();
        if let Some(now) = now {
            stable = if now == counted { stable + 1 } else { 0 };
            counted = now;
            // Half a minute without a change (the processor flushes every second or so).
            if stable >= 6 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    // Every 302 is in by now (the takedown probes end within 5 s of their ack).
    let answered = ctx.tally.answered_302.load(Ordering::Relaxed);
    let expected = answered as f64 - drops_total;
    let _ = stop_tx.send(true);
    let samples = sampler.await.unwrap_or_default();
    // Every process's metrics at the end, beside the samples.
    let mut ends: Vec<(String, String)> = ctx
        .engines
        .iter()
        .enumerate()
        .map(|(i, e)| (Ctx::engine_name(i), e.admin.clone()))
        .collect();
    ends.push(("control".into(), ctx.api.clone()));
    ends.push((
        "processor".into(),
        spec.v["processor"]["metrics"]
            .as_str()
            .unwrap_or_default()
            .into(),
    ));
    for (name, addr) in ends {
        let text = tokio::task::spawn_blocking(move || {
            agent()
                .get(&format!("http://{addr}/metrics"))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
        let _ = std::fs::write(out.join(format!("metrics-{name}.txt")), text);
    }
    stop_all(&ctx);
    let panics = {
        let procs = ctx.procs.lock().unwrap();
        procs
            .iter()
            .filter_map(|p| {
                let log = std::fs::read_to_string(&p.log).unwrap_or_default();
                let n = log.matches("panicked").count();
                (n > 0).then(|| format!("{}: {n}", p.name))
            })
            .collect::<Vec<_>>()
    };

    // Verdicts.
    let mut verdicts: Vec<(String, Option<bool>, String)> = Vec::new();
    verdicts.push((
        "every acknowledged link redirects at both engines".into(),
        Some(final_check.0 == 0 && final_check.2 == 0),
        format!(
            "{} live links asked at {} engines: {} did not redirect to their URL; {} taken-down links: {} not 410",
            final_check.1,
            ctx.engines.len(),
            final_check.0,
            final_check.3,
            final_check.2
        ),
    ));
    let td = {
        let mut v = ctx.tally.takedown_ms.lock().unwrap().clone();
        v.sort_by(f64::total_cmp);
        v
    };
    let errors = ctx.tally.errors.lock().unwrap().clone();
    let late = errors.get("takedown_late").copied().unwrap_or(0)
        + errors.get("takedown_lost_on_restart").copied().unwrap_or(0)
        + errors.get("served_after_takedown").copied().unwrap_or(0);
    verdicts.push((
        "every takedown enforced at every serving engine within 1 s of its ack".into(),
        Some(late == 0 && !td.is_empty()),
        format!(
            "{} probes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; late {late}",
            td.len(),
            td.get(td.len() / 2).copied().unwrap_or(f64::NAN),
            td.get((td.len() as f64 * 0.99) as usize)
                .copied()
                .unwrap_or(f64::NAN),
            td.last().copied().unwrap_or(f64::NAN)
        ),
    ));
    let unexpected: u64 = errors
        .iter()
        .filter(|(k, _)| !EXPECTED.contains(&k.as_str()))
        .map(|(_, v)| v)
        .sum();
    verdicts.push((
        "no unexpected status or error (connections cut by a kill apart)".into(),
        Some(unexpected == 0),
        format!("{errors:?}"),
    ));
    verdicts.push((
        "nothing panics".into(),
        Some(panics.is_empty()),
        if panics.is_empty() {
            "no \"panicked\" in any log".into()
        } else {
            panics.join(", ")
        },
    ));
    let (growth_ok, growth) = if duration >= 1860.0 {
        let (ok, text) = growth_verdict(&samples, duration, sample);
        (Some(ok), text)
    } else {
        (
            None,
            format!("not judged: a run of {duration} s has no 30 minutes after a minute's warm-up"),
        )
    };
    verdicts.push((
        "anonymous RSS (less what a process reports holding) grows < 5% and descriptors not at all over the last 30 minutes".into(),
        growth_ok,
        growth,
    ));
    let tolerance = rate * 0.1 * engine_kills as f64;
    let got = (counted.0 + counted.1) as f64;
    verdicts.push((
        "human + bot clicks = 302s answered - engine drops, within rate x 100 ms per engine kill".into(),
        Some((got - expected).abs() <= tolerance.max(0.0)),
        format!(
            "counted {got} (human {}, bot {}); 302s {answered}, drops {drops_total}, expected {expected}; \
             difference {:+}; tolerance {tolerance:.0} ({engine_kills} engine kills at {rate:.0}/s)",
            counted.0,
            counted.1,
            got - expected
        ),
    ));
    let pass = verdicts.iter().all(|v| v.1 != Some(false));

    // Charts and the summary.
    let charts = draw_charts(&out, &samples);
    let mut md = String::new();
    let _ = writeln!(md, "# Soak run: {}\n", if pass { "PASS" } else { "FAIL" });
    let _ = writeln!(
        md,
        "- duration {duration} s after a {calibrate} s calibration; capacity {capacity:.0} requests/s, load {rate:.0}/s ({:.0}%)",
        rate / capacity.max(1.0) * 100.0
    );
    let (created, taken) = {
        let links = ctx.links.lock().unwrap();
        (links.created, links.down.len())
    };
    let _ = writeln!(md, "- links created {created}, taken down {taken}");
    for (t, name, down) in &kills {
        let _ = writeln!(
            md,
            "- t={t:.0} s: SIGKILL {name}, serving again after {down:.1} s"
        );
    }
    let _ = writeln!(md, "\n| verdict | pass | measured |\n|---|---|---|");
    for (what, ok, detail) in &verdicts {
        let ok = match ok {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        let _ = writeln!(md, "| {what} | {ok} | {} |", detail.replace('|', "/"));
    }
    let _ = writeln!(
        md,
        "\n## Latency by protocol (whole run, µs)\n\n| protocol | p50 | p99 |\n|---|---:|---:|"
    );
    for (p, (p50, p99)) in whole_run_latency(&samples) {
        let _ = writeln!(md, "| {p} | {p50:.0} | {p99:.0} |");
    }
    let examples = ctx.tally.examples.lock().unwrap().clone();
    if !examples.is_empty() {
        let _ = writeln!(md, "\n## First unexpected events\n");
        for e in examples {
            let _ = writeln!(md, "- {e}");
        }
    }
    let _ = writeln!(md, "\n## Charts\n");
    for c in &charts {
        let _ = writeln!(md, "![{c}]({c})");
    }
    let _ = std::fs::write(out.join("summary.md"), &md);
    let _ = std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&json!({
            "pass": pass,
            "duration": duration,
            "capacity": capacity,
            "rate": rate,
            "kills": kills.iter().map(|k| json!({"t": k.0, "process": k.1, "down_secs": k.2})).collect::<Vec<_>>(),
            "verdicts": verdicts.iter().map(|v| json!({"verdict": v.0, "pass": v.1, "measured": v.2})).collect::<Vec<_>>(),
            "notes": notes,
        }))
        .unwrap_or_default(),
    );
    print!("{md}");
    pass
}

fn log_of(ctx: &Ctx, name: &str) -> String {
    let procs = ctx.procs.lock().unwrap();
    let Some(p) = procs.iter().find(|p| p.name == name) else {
        return String::new();
    };
    let log = std::fs::read_to_string(&p.log).unwrap_or_default();
    log.lines()
        .rev()
        .take(20)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n")
}

fn stop_all(ctx: &Ctx) {
    let mut procs = ctx.procs.lock().unwrap();
    for p in procs.iter_mut().rev() {
        p.stop();
    }
}

fn create(ctx: &Ctx, url: &str) -> bool {
    let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
    let url = format!("{url}?n={n}");
    let asked = Instant::now();
    match api(
        ctx,
        "POST",
        "/v1/links",
        &ctx.owner_key,
        Some(json!({"long_url": url})),
    ) {
        Ok((201, v)) => {
            let code: Arc<str> = v["code"].as_str().unwrap_or_default().into();
            // The URL as the service keeps it (normalised).
            let kept: Arc<str> = v["long_url"].as_str().unwrap_or(&url).into();
            ctx.links.lock().unwrap().add(code, kept);
            true
        }
        other => {
            ctx.api_failed(asked, format!("POST /v1/links: {other:?}"));
            false
        }
    }
}

async fn creator(ctx: Arc<Ctx>, per_sec: f64) {
    if per_sec <= 0.0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ctx = Arc::clone(&ctx);
        let _ =
            tokio::task::spawn_blocking(move || create(&ctx, "https://example.com/soak/new")).await;
    }
}

/// One takedown a second: a live link leaves the load, is taken down, and every engine is
/// asked for it until it answers 410.
async fn taker(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = 0x5eed_u64;
    loop {
        tick.tick().await;
        let picked = {
            let mut links = ctx.links.lock().unwrap();
            if links.live.len() < 100 {
                continue;
            }
            let i = (next(&mut rng) % links.live.len() as u64) as usize;
            let (code, url) = links.remove(i);
            links.down.insert(code.clone(), (url.clone(), None));
            (code, url)
        };
        let (code, url) = picked;
        let asked = Instant::now();
        let c2 = Arc::clone(&ctx);
        let path = format!("/v1/links/{code}/takedown");
        let res = tokio::task::spawn_blocking(move || {
            api(
                &c2,
                "POST",
                &path,
                &c2.admin_key,
                Some(json!({"reason": "phishing"})),
            )
        })
        .await
        .unwrap_or(Err("join".into()));
        match res {
            Ok((200, _)) => {
                let ack = Instant::now();
                if let Some(d) = ctx.links.lock().unwrap().down.get_mut(&code) {
                    d.1 = Some(ack);
                }
                for e in 0..ctx.engines.len() {
                    tokio::spawn(probe(Arc::clone(&ctx), e, code.clone(), url.clone(), ack));
                }
            }
            other => {
                // Not taken down: back to the load.
                let mut links = ctx.links.lock().unwrap();
                links.down.remove(&code);
                links.add(code.clone(), url);
                links.created -= 1;
                drop(links);
                ctx.api_failed(asked, format!("POST /v1/links/{code}/takedown: {other:?}"));
            }
        }
    }
}

/// Asks engine `e` for `code` until it answers 410: within a second of `ack`, or a failure
/// (unless the engine is killed meanwhile: its restart is checked apart).
async fn probe(ctx: Arc<Ctx>, e: usize, code: Arc<str>, url: Arc<str>, ack: Instant) {
    let name = Ctx::engine_name(e);
    let mut conn: Option<TcpStream> = None;
    let mut buf = Vec::new();
    while ack.elapsed() < Duration::from_secs(5) {
        if ctx.killed(&name, ack) {
            return;
        }
        if conn.is_none() {
            conn = TcpStream::connect(ctx.engines[e].http).await.ok();
        }
        let Some(s) = conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let sent = Instant::now();
        match h1_get(s, &mut buf, &ctx.host, &format!("/{code}"), UAS[0]).await {
            Ok((410, _, _)) => {
                let ms = ack.elapsed().as_secs_f64() * 1000.0;
                ctx.tally.takedown_ms.lock().unwrap().push(ms);
                if ms > 1000.0 {
                    ctx.tally.error(
                        "takedown_late",
                        format!("{name} /{code}: 410 after {ms:.0} ms"),
                    );
                }
                return;
            }
            Ok((302, loc, keep)) => {
                ctx.tally.answered_302.fetch_add(1, Ordering::Relaxed);
                if loc.as_deref() != Some(&*url) {
                    ctx.tally
                        .error("wrong_location", format!("{name} /{code}: {loc:?}"));
                }
                if !keep {
                    conn = None;
                }
            }
            Ok((s, _, _)) => {
                ctx.tally
                    .error("unexpected_status", format!("{name} /{code} (probe): {s}"));
                return;
            }
            Err(err) => {
                conn = None;
                if !ctx.killed(&name, sent) {
                    ctx.tally
                        .error("io_error", format!("{name} probe /{code}: {err}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !ctx.killed(&name, ack) {
        ctx.tally.error(
            "takedown_late",
            format!("{name} /{code}: no 410 within 5 s"),
        );
    }
}

/// After an engine's restart: the takedowns acked in the last two minutes answer 410 at once.
async fn recheck_takedowns(ctx: &Arc<Ctx>, name: &str) {
    let e = (name.as_bytes()[7] - b'a') as usize;
    let recent: Vec<Arc<str>> = {
        let links = ctx.links.lock().unwrap();
        links
            .down
            .iter()
            .filter(|(_, d)| d.1.is_some_and(|a| a.elapsed() < Duration::from_secs(120)))
            .map(|(c, _)| c.clone())
            .collect()
    };
    let Ok(mut s) = TcpStream::connect(ctx.engines[e].http).await else {
        ctx.tally.error(
            "io_error",
            format!("{name}: no connection after its restart"),
        );
        return;
    };
    let mut buf = Vec::new();
    for code in recent {
        match h1_get(&mut s, &mut buf, &ctx.host, &format!("/{code}"), UAS[1]).await {
            Ok((410, _, _)) => {}
            Ok((status, _, _)) => {
                if status == 302 {
                    ctx.tally.answered_302.fetch_add(1, Ordering::Relaxed);
                }
                ctx.tally.error(
                    "takedown_lost_on_restart",
                    format!("{name} /{code}: {status} right after its restart"),
                );
            }
            Err(err) => {
                ctx.tally
                    .error("io_error", format!("{name} recheck /{code}: {err}"));
                return;
            }
        }
    }
}

async fn publisher(ctx: Arc<Ctx>, every: f64) {
    if every <= 0.0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(every));
    tick.tick().await;
    loop {
        tick.tick().await;
        let asked = Instant::now();
        let c2 = Arc::clone(&ctx);
        let res = tokio::task::spawn_blocking(move || {
            api(&c2, "POST", "/v1/admin/snapshots", &c2.admin_key, None)
        })
        .await
        .unwrap_or(Err("join".into()));
        if !matches!(res, Ok((201, _))) {
            ctx.api_failed(asked, format!("POST /v1/admin/snapshots: {res:?}"));
        }
    }
}

async fn hupper(ctx: Arc<Ctx>, every: f64) {
    if every <= 0.0 {
        return;
    }
    tokio::time::sleep(Duration::from_secs_f64(every / 2.0)).await;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(every));
    loop {
        tick.tick().await;
        let procs = ctx.procs.lock().unwrap();
        for p in procs
            .iter()
            .filter(|p| p.name.starts_with("engine") && p.child.is_some())
        {
            p.signal("HUP");
        }
    }
}

/// Each engine's click drops: (the sum of its previous lives' last readings, the current).
static DROPS: Mutex<BTreeMap<String, (f64, f64)>> = Mutex::new(BTreeMap::new());

fn note_drops(name: &str, now: f64) {
    let mut d = DROPS.lock().unwrap();
    let e = d.entry(name.to_string()).or_insert((0.0, 0.0));
    if now < e.1 {
        e.0 += e.1;
    }
    e.1 = now;
}

async fn sampler_drops(ctx: &Arc<Ctx>, name: &str) {
    let e = (name.as_bytes()[7] - b'a') as usize;
    let admin = ctx.engines[e].admin.clone();
    let m = tokio::task::spawn_blocking(move || scrape(&admin))
        .await
        .unwrap_or_default();
    if !m.is_empty() {
        note_drops(name, sum_of(&m, "lasthop_engine_clicks_dropped_total"));
    }
}

/// Every live link at every engine (302 to its URL) and every taken-down one (410):
/// (links not redirected, live links, takedowns served, taken-down links).
async fn final_check(ctx: &Arc<Ctx>) -> (u64, u64, u64, u64) {
    let (live, down) = {
        let l = ctx.links.lock().unwrap();
        (
            l.live.clone(),
            l.down
                .iter()
                .filter(|d| d.1 .1.is_some())
                .map(|(c, d)| (c.clone(), d.0.clone()))
                .collect::<Vec<_>>(),
        )
    };
    let mut bad = 0;
    let mut served = 0;
    for e in 0..ctx.engines.len() {
        let name = Ctx::engine_name(e);
        let mut s = None;
        let mut buf = Vec::new();
        for (i, (code, url)) in live.iter().chain(down.iter()).enumerate() {
            let taken = i >= live.len();
            let mut answer = None;
            for _ in 0..3 {
                if s.is_none() {
                    s = TcpStream::connect(ctx.engines[e].http).await.ok();
                }
                let Some(st) = s.as_mut() else { continue };
                match h1_get(st, &mut buf, &ctx.host, &format!("/{code}"), UAS[2]).await {
                    Ok(a) => {
                        if !a.2 {
                            s = None;
                        }
                        answer = Some(a);
                        break;
                    }
                    Err(_) => s = None,
                }
            }
            match (answer, taken) {
                (Some((302, loc, _)), false) => {
                    ctx.tally.answered_302.fetch_add(1, Ordering::Relaxed);
                    if loc.as_deref() != Some(&**url) {
                        bad += 1;
                        ctx.tally
                            .error("final_not_redirected", format!("{name} /{code}: {loc:?}"));
                    }
                }
                (Some((410, _, _)), true) => {}
                (a, taken) => {
                    if let Some((302, _, _)) = a {
                        ctx.tally.answered_302.fetch_add(1, Ordering::Relaxed);
                    }
                    let status = a.map(|a| a.0);
                    if taken {
                        served += 1;
                        ctx.tally.error(
                            "final_takedown_served",
                            format!("{name} /{code}: {status:?}"),
                        );
                    } else {
                        bad += 1;
                        ctx.tally.error(
                            "final_not_redirected",
                            format!("{name} /{code}: {status:?}"),
                        );
                    }
                }
            }
        }
    }
    (bad, live.len() as u64, served, down.len() as u64)
}

// ---------------------------------------------------------------------------------------------
// Samples, their verdict and charts.

/// One row: its time (s since the load began) and named values.
#[derive(Clone, Default)]
struct Row {
    t: f64,
    v: BTreeMap<String, f64>,
    lat: BTreeMap<Proto, Vec<u32>>,
}

async fn sampler_task(
    ctx: Arc<Ctx>,
    spec: Value,
    out: PathBuf,
    every: f64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut csv = std::fs::File::create(out.join("samples.csv")).expect("samples.csv");
    let mut header: Option<Vec<String>> = None;
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(every));
    tick.tick().await;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        let mut row = Row {
            t: t0.elapsed().as_secs_f64(),
            ..Row::default()
        };
        // Processes.
        let pids: Vec<(String, u32)> = {
            let procs = ctx.procs.lock().unwrap();
            let mut v: Vec<(String, u32)> = procs
                .iter()
                .filter(|p| p.child.is_some())
                .map(|p| (p.name.clone(), p.pid))
                .collect();
            for w in spec["watch"].as_array().into_iter().flatten() {
                if let Some(pid) = w["pidfile"].as_str().and_then(pid_file) {
                    v.push((w["name"].as_str().unwrap_or("?").to_string(), pid));
                }
            }
            v
        };
        for (name, pid) in pids {
            if let Some(s) = proc_sample(pid) {
                row.v
                    .insert(format!("{name}.rss_anon_kb"), s.anon_kb as f64);
                row.v
                    .insert(format!("{name}.rss_file_kb"), s.file_kb as f64);
                row.v.insert(format!("{name}.fds"), s.fds as f64);
                row.v.insert(format!("{name}.threads"), s.threads as f64);
                let procs = ctx.procs.lock().unwrap();
                if let Some(p) = procs.iter().find(|p| p.name == name) {
                    row.v
                        .insert(format!("{name}.up_secs"), p.started.elapsed().as_secs_f64());
                }
            }
        }
        // Latency and rates by protocol.
        let lat = std::mem::take(&mut *ctx.tally.lat.lock().unwrap());
        for p in Proto::ALL {
            let mut v = lat.get(&p).cloned().unwrap_or_default();
            v.sort_unstable();
            row.v
                .insert(format!("{}.rps", p.name()), v.len() as f64 / dt);
            row.v.insert(format!("{}.p50_us", p.name()), pct(&v, 0.5));
            row.v.insert(format!("{}.p99_us", p.name()), pct(&v, 0.99));
            row.lat.insert(p, v);
        }
        for (k, n) in ctx.tally.errors.lock().unwrap().iter() {
            row.v.insert(format!("errors.{k}"), *n as f64);
        }
        row.v.insert(
            "answered_302".into(),
            ctx.tally.answered_302.load(Ordering::Relaxed) as f64,
        );
        // Engines' feed lag and drops; the processor's lag; the clicks counted.
        let admins: Vec<String> = ctx.engines.iter().map(|e| e.admin.clone()).collect();
        let pm = spec["processor"]["metrics"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ch = spec["clickhouse"].as_str().unwrap_or_default().to_string();
        let db = spec["clickhouse_db"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let api = ctx.api.clone();
        let (engines, processor, control, counted) = tokio::task::spawn_blocking(move || {
            let e: Vec<HashMap<String, f64>> = admins.iter().map(|a| scrape(a)).collect();
            (e, scrape(&pm), scrape(&api), clicks_counted(&ch, &db))
        })
        .await
        .unwrap_or_default();
        if !control.is_empty() {
            // What it reports holding: the embedded store's page cache (redb's, which grows
            // with the pages the store touches up to its size).
            row.v.insert(
                "control.held_kb".into(),
                sum_of(&control, "lasthop_store_cache_bytes") / 1024.0,
            );
        }
        for (i, m) in engines.iter().enumerate() {
            if m.is_empty() {
                continue;
            }
            let name = Ctx::engine_name(i);
            let lag = sum_of(m, "lasthop_engine_feed_control_sequence")
                - sum_of(m, "lasthop_engine_feed_applied_sequence");
            row.v.insert(format!("{name}.feed_lag"), lag.max(0.0));
            // What it reports holding: the origin read-through's caches (filled while the
            // feed is lost; at most 100,000 codes each).
            row.v.insert(
                format!("{name}.held_kb"),
                sum_of(m, "lasthop_engine_origin_cache_bytes") / 1024.0,
            );
            let drops = sum_of(m, "lasthop_engine_clicks_dropped_total");
            note_drops(&name, drops);
            row.v.insert(format!("{name}.clicks_dropped"), drops);
        }
        if !processor.is_empty() {
            row.v.insert(
                "processor.click_lag_s".into(),
                sum_of(&processor, "lasthop_clicks_lag_seconds"),
            );
            row.v.insert(
                "processor.spool_pending_bytes".into(),
                sum_of(&processor, "lasthop_clicks_spool_pending_bytes"),
            );
            // What it reports holding: today's rollups (dense sketches as links gain
            // visitors) and the dedup window.
            row.v.insert(
                "processor.held_kb".into(),
                (sum_of(&processor, "lasthop_clicks_rollups_held_bytes")
                    + sum_of(&processor, "lasthop_clicks_dedup_bytes"))
                    / 1024.0,
            );
            row.v.insert(
                "processor.rollups_held".into(),
                sum_of(&processor, "lasthop_clicks_rollups_held"),
            );
        }
        if let Some((h, b)) = counted {
            row.v.insert("clicks_counted".into(), (h + b) as f64);
        }
        // CSV: the header from the first row's keys (later keys are appended as they appear).
        let keys: Vec<String> = row.v.keys().cloned().collect();
        let h = header.get_or_insert_with(|| {
            let _ = writeln!(csv, "t,{}", keys.join(","));
            keys.clone()
        });
        for k in &keys {
            if !h.contains(k) {
                h.push(k.clone());
            }
        }
        let line: Vec<String> = h
            .iter()
            .map(|k| row.v.get(k).map_or(String::new(), |v| format!("{v:.1}")))
            .collect();
        let _ = writeln!(csv, "{:.1},{}", row.t, line.join(","));
        let _ = csv.flush();
        if rows.len() % 6 == 5 {
            println!(
                "soak: t={:.0}s {} 302s; h1 p99 {:.0} µs; errors {:?}",
                row.t,
                row.v.get("answered_302").copied().unwrap_or(0.0),
                row.v.get("h1.p99_us").copied().unwrap_or(f64::NAN),
                ctx.tally.errors.lock().unwrap()
            );
        }
        rows.push(row);
    }
    // The header may have grown: rewrite the file with the full one.
    if let Some(h) = header {
        let mut text = format!("t,{}\n", h.join(","));
        for r in &rows {
            let line: Vec<String> = h
                .iter()
                .map(|k| r.v.get(k).map_or(String::new(), |v| format!("{v:.1}")))
                .collect();
            let _ = writeln!(text, "{:.1},{}", r.t, line.join(","));
        }
        let _ = std::fs::write(out.join("samples.csv"), text);
    }
    rows
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// Each sampled process over the last 30 minutes of the run (or since its last restart, after a
/// minute's warm-up): anonymous RSS (median of the first and last minute's samples) grows less
/// than 5%, descriptors (minimum of each) not at all.
fn growth_verdict(rows: &[Row], duration: f64, every: f64) -> (bool, String) {
    let Some(end) = rows.last().map(|r| r.t) else {
        return (false, "no samples".into());
    };
    let run_end = end.min(duration);
    let names: Vec<String> = rows
        .iter()
        .flat_map(|r| r.v.keys())
        .filter_map(|k| k.strip_suffix(".rss_anon_kb").map(str::to_string))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let per_minute = (60.0 / every).round().max(1.0) as usize;
    let mut ok = true;
    let mut parts = Vec::new();
    for name in names {
        let anon = format!("{name}.rss_anon_kb");
        let up = format!("{name}.up_secs");
        // Rows of this process's last life, within the window.
        let mut window: Vec<&Row> = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.t >= run_end - 1800.0 && r.t <= run_end)
        {
            if let (Some(u), Some(prev)) = (r.v.get(&up), window.last().and_then(|p| p.v.get(&up)))
            {
                if *u < *prev {
                    window.clear();
                }
            }
            if r.v.get(&up).is_none_or(|u| *u >= 60.0) && r.v.contains_key(&anon) {
                window.push(r);
            }
        }
        if window.len() < 2 * per_minute {
            parts.push(format!(
                "{name}: too short a window ({} samples)",
                window.len()
            ));
            continue;
        }
        let first = &window[..per_minute];
        let last = &window[window.len() - per_minute..];
        let a0 = median(&mut first.iter().map(|r| r.v[&anon]).collect::<Vec<_>>());
        let a1 = median(&mut last.iter().map(|r| r.v[&anon]).collect::<Vec<_>>());
        // A process that reports what it holds (the processor: its rollups and dedup window,
        // which grow with the links clicked today and their visitors) is judged on the rest:
        // memory it cannot account for.
        let held = format!("{name}.held_kb");
        let held_of = |rs: &[&Row]| {
            median(
                &mut rs
                    .iter()
                    .filter_map(|r| r.v.get(&held).copied())
                    .collect::<Vec<_>>(),
            )
        };
        let (h0, h1) = (held_of(first), held_of(last));
        let accounted = h0.is_finite() && h1.is_finite();
        let fd = |rs: &[&Row]| {
            rs.iter()
                .filter_map(|r| r.v.get(&format!("{name}.fds")))
                .fold(f64::INFINITY, |a, b| a.min(*b))
        };
        let (f0, f1) = (fd(first), fd(last));
        let raw_growth = (a1 - a0) / a0.max(1.0) * 100.0;
        let growth = if accounted {
            ((a1 - h1) - (a0 - h0)) / (a0 - h0).max(1.0) * 100.0
        } else {
            raw_growth
        };
        let span = (window.last().unwrap().t - window[0].t) / 60.0;
        // lasthop's processes are judged; the databases beside them (their caches grow by
        // design) are shown.
        let judged = name == "control" || name == "processor" || name.starts_with("engine-");
        let good = !judged || (growth < 5.0 && f1 <= f0);
        ok &= good;
        let unaccounted = if accounted {
            format!(
                "; it reports holding {:.1} -> {:.1} MiB, the rest {:.1} -> {:.1} MiB ({growth:+.1}%)",
                h0 / 1024.0,
                h1 / 1024.0,
                (a0 - h0) / 1024.0,
                (a1 - h1) / 1024.0
            )
        } else {
            String::new()
        };
        parts.push(format!(
            "{name} ({span:.0} min): anon {:.1} -> {:.1} MiB ({raw_growth:+.1}%){unaccounted}, fds {f0} -> {f1}{}",
            a0 / 1024.0,
            a1 / 1024.0,
            if !judged {
                " (not judged)"
            } else if good {
                ""
            } else {
                " FAIL"
            }
        ));
    }
    (ok, parts.join("; "))
}

fn whole_run_latency(rows: &[Row]) -> Vec<(&'static str, (f64, f64))> {
    Proto::ALL
        .iter()
        .map(|p| {
            let mut all: Vec<u32> = rows
                .iter()
                .flat_map(|r| r.lat.get(p).cloned().unwrap_or_default())
                .collect();
            all.sort_unstable();
            (p.name(), (pct(&all, 0.5), pct(&all, 0.99)))
        })
        .collect()
}

/// A chart's lines: each a name and its (minutes, value) points.
type Series = Vec<(String, Vec<(f64, f64)>)>;

/// The charts (PNG) of the samples; their file names.
fn draw_charts(out: &Path, rows: &[Row]) -> Vec<String> {
    let font = std::env::var("SOAK_FONT")
        .unwrap_or_else(|_| "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into());
    let Ok(bytes) = std::fs::read(&font) else {
        eprintln!("soak: no font at {font} (SOAK_FONT): no charts");
        return Vec::new();
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    if plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
        .is_err()
    {
        eprintln!("soak: {font} is no font plotters reads: no charts");
        return Vec::new();
    }
    let keys: std::collections::BTreeSet<String> =
        rows.iter().flat_map(|r| r.v.keys().cloned()).collect();
    let pick = |suffix: &str, scale: f64| -> Vec<(String, Vec<(f64, f64)>)> {
        keys.iter()
            .filter(|k| k.ends_with(suffix))
            .map(|k| {
                let pts = rows
                    .iter()
                    .filter_map(|r| {
                        r.v.get(k)
                            .filter(|v| v.is_finite())
                            .map(|v| (r.t / 60.0, v * scale))
                    })
                    .collect();
                (
                    k.trim_end_matches(suffix).trim_end_matches('.').to_string(),
                    pts,
                )
            })
            .collect()
    };
    let charts: Vec<(&str, &str, &str, Series)> = vec![
        (
            "rss_anon.png",
            "Anonymous RSS by process",
            "MiB",
            pick(".rss_anon_kb", 1.0 / 1024.0),
        ),
        (
            "held.png",
            "Memory a process reports holding (processor: rollups and dedup window; control: the store's page cache; engines: the origin caches)",
            "MiB",
            pick(".held_kb", 1.0 / 1024.0),
        ),
        (
            "rss_file.png",
            "File-backed RSS by process",
            "MiB",
            pick(".rss_file_kb", 1.0 / 1024.0),
        ),
        (
            "fds.png",
            "Open descriptors by process",
            "descriptors",
            pick(".fds", 1.0),
        ),
        (
            "threads.png",
            "Threads by process",
            "threads",
            pick(".threads", 1.0),
        ),
        (
            "p50.png",
            "Redirect latency p50 by protocol",
            "µs",
            pick(".p50_us", 1.0),
        ),
        (
            "p99.png",
            "Redirect latency p99 by protocol",
            "µs",
            pick(".p99_us", 1.0),
        ),
        (
            "rps.png",
            "Requests a second by protocol (both engines)",
            "requests/s",
            pick(".rps", 1.0),
        ),
        ("errors.png", "Errors by kind (cumulative)", "errors", {
            keys.iter()
                .filter_map(|k| {
                    k.strip_prefix("errors.")
                        .map(|n| (k.clone(), n.to_string()))
                })
                .map(|(k, n)| {
                    (
                        n,
                        rows.iter()
                            .filter_map(|r| r.v.get(&k).map(|v| (r.t / 60.0, *v)))
                            .collect(),
                    )
                })
                .collect()
        }),
        (
            "feed_lag.png",
            "Feed lag by engine",
            "sequences behind",
            pick(".feed_lag", 1.0),
        ),
        (
            "click_lag.png",
            "Click lag (processor)",
            "seconds",
            pick(".click_lag_s", 1.0),
        ),
    ];
    let mut names = Vec::new();
    for (file, title, unit, series) in charts {
        if series.iter().all(|s| s.1.is_empty()) {
            continue;
        }
        match chart(&out.join(file), title, unit, &series) {
            Ok(()) => names.push(file.to_string()),
            Err(e) => eprintln!("soak: {file}: {e}"),
        }
    }
    names
}

fn chart(
    path: &Path,
    title: &str,
    unit: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), Err> {
    use plotters::prelude::*;
    let (w, h) = (1000u32, 500u32);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let xmax = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.0))
            .fold(1.0, f64::max);
        let ymax = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.1;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
        c.configure_mesh()
            .x_desc("minutes")
            .y_desc(unit)
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
    }
    let file = std::fs::File::create(path)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&buf)?;
    Ok(())
}
