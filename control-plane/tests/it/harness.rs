//! Starting the real binary on a temp data dir, and talking to it: what only the control
//! plane's own tests need. (PostgreSQL, ClickHouse, the broker, ports, signals, logs and metrics
//! come from `lasthop-testkit`.)

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lasthop_core::{CodeScheme, PermutationKey};
use lasthop_testkit::{logs, metrics, process};

pub const BIN: &str = env!("CARGO_BIN_EXE_lasthop-control");

/// A data dir with a key file and one API key, shared across restarts.
pub struct Site {
    pub dir: tempfile::TempDir,
    pub api_key: String,
    starts: std::sync::atomic::AtomicUsize,
    /// The shared store every start of this site uses (`None`: each data dir's embedded one).
    pub store: Option<String>,
}

impl Site {
    pub fn new() -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(BIN)
            .args(["keygen", "--out"])
            .arg(dir.path().join("key"))
            .output()
            .expect("keygen runs");
        assert!(out.status.success(), "keygen: {out:?}");
        let api_key = Site::create_key(dir.path(), "alice", false);
        Site {
            dir,
            api_key,
            starts: std::sync::atomic::AtomicUsize::new(0),
            store: None,
        }
    }

    /// A site whose control planes share the PostgreSQL store at `url` (its keys too).
    pub fn shared(url: &str) -> Site {
        let mut site = Site::new();
        site.store = Some(url.to_string());
        site.api_key = site.create_store_key("alice", false);
        site
    }

    /// A site on the shared store at `url`, or on embedded stores when `None`.
    pub fn for_store(url: Option<&str>) -> Site {
        match url {
            Some(url) => Site::shared(url),
            None => Site::new(),
        }
    }

    /// A new API key wherever this site keeps them.
    pub fn new_key(&self, owner: &str, admin: bool) -> String {
        match self.store {
            Some(_) => self.create_store_key(owner, admin),
            None => Site::create_key(self.dir.path(), owner, admin),
        }
    }

    /// A new API key in the shared store (`apikey create --store`).
    pub fn create_store_key(&self, owner: &str, admin: bool) -> String {
        let url = self.store.as_deref().expect("a shared site");
        let mut cmd = Command::new(BIN);
        cmd.args(["apikey", "create", "--store", url, "--owner", owner]);
        if admin {
            cmd.arg("--admin");
        }
        let out = cmd.output().expect("apikey runs");
        assert!(out.status.success(), "apikey: {out:?}");
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    pub fn create_key(dir: &Path, owner: &str, admin: bool) -> String {
        let mut cmd = Command::new(BIN);
        cmd.args(["apikey", "create", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--owner", owner]);
        if admin {
            cmd.arg("--admin");
        }
        let out = cmd.output().expect("apikey runs");
        assert!(out.status.success(), "apikey: {out:?}");
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    /// The edge token `serve` wrote on first start.
    pub fn edge_token(&self) -> String {
        self.edge_token_in("data")
    }

    /// The edge token the control plane with data dir `name` wrote.
    pub fn edge_token_in(&self, name: &str) -> String {
        let path = self.dir.path().join(name).join("edge.token");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .trim_end()
            .to_string()
    }

    pub fn scheme(&self) -> CodeScheme {
        CodeScheme::new(&PermutationKey::load(&self.key_file()).expect("key")).expect("scheme")
    }

    /// Starts `serve` on ephemeral ports (API and edge listener) and waits until it listens.
    pub fn start(&self, extra: &[&str]) -> Server {
        self.start_in("data", extra)
    }

    /// Starts another control plane of this site, with its own data dir `name` (for several
    /// control planes on one shared store).
    pub fn start_in(&self, name: &str, extra: &[&str]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.dir.path().join(name))
            .arg("--key-file")
            .arg(self.key_file())
            .args(["--api-listen", "127.0.0.1:0", "--create-rate", "0"]);
        if let Some(url) = &self.store {
            if !extra.contains(&"--store") {
                cmd.args(["--store", url]);
            }
        }
        if !extra.contains(&"--edge-listen") {
            cmd.args(["--edge-listen", "127.0.0.1:0"]);
        }
        // Each start logs to its own file in the site's dir (`Server::log` reads it).
        let n = self
            .starts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.path().join(format!("serve-{n}.log"));
        let mut child = cmd
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(logs::create(&log))
            .spawn()
            .expect("serve starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout);
        let mut listen_line = |prefix: &str| {
            let mut line = String::new();
            lines.read_line(&mut line).expect("read listen line");
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected {prefix:?}..., got {line:?}"))
                .to_string()
        };
        // The api line comes first (scripts rely on it), the edge line right after.
        let base = listen_line("api listening on ");
        let edge_base = listen_line("edge listening on ");
        Server {
            child,
            base,
            edge_base,
            log,
        }
    }
}

pub struct Server {
    pub child: Child,
    pub base: String,
    /// The internal edge listener, e.g. `http://127.0.0.1:PORT`.
    pub edge_base: String,
    /// Its stderr.
    pub log: PathBuf,
}

impl Server {
    /// What it logged so far.
    pub fn log(&self) -> String {
        logs::read(&self.log)
    }

    /// The value of the first `/metrics` sample whose line starts with `prefix` (a name, or a
    /// name with its labels).
    pub fn metric(&self, prefix: &str) -> Option<f64> {
        let (_, text) = call("GET", &self.url("/metrics"), None, None).ok()?;
        metrics::first_starting_with(&text, prefix)
    }

    /// Sends a signal (`HUP`, `TERM`, ...).
    pub fn signal(&self, sig: &str) {
        process::signal(&self.child, sig);
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn edge_url(&self, path: &str) -> String {
        format!("{}{}", self.edge_base, path)
    }

    /// SIGKILL: no chance to return anything.
    pub fn kill(mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("wait");
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) {
        self.signal("TERM");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "graceful shutdown exit status {status:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (status, body) of a request, whatever the status.
pub fn call(
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let mut req = agent.request(method, url);
    if let Some(k) = key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let resp = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match resp {
        Ok(r) => {
            let status = r.status();
            Ok((status, r.into_string().map_err(|e| e.to_string())?))
        }
        Err(ureq::Error::Status(status, r)) => {
            Ok((status, r.into_string().map_err(|e| e.to_string())?))
        }
        Err(e) => Err(e.to_string()),
    }
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A feed subscriber over a raw socket: sends the request by hand, checks the answer is a
/// chunked NDJSON stream, decodes the chunks and parses each line as an engine would.
pub struct FeedClient {
    reader: std::io::BufReader<std::net::TcpStream>,
    /// Body bytes received but not yet split into lines.
    pending: Vec<u8>,
}

impl FeedClient {
    /// `GET /edge/v1/feed?{query}` on the edge listener at `edge_base` (`http://host:port`).
    pub fn connect(edge_base: &str, token: &str, query: &str) -> FeedClient {
        use std::io::Write as _;
        let addr = edge_base.strip_prefix("http://").expect("http base");
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to the edge listener");
        // Generous: heartbeats come every second; a read this slow is a failure.
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "GET /edge/v1/feed?{query} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        .expect("send the feed request");
        let mut reader = std::io::BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).expect("status line");
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "feed answered {status:?}"
        );
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("header line");
            if line == "\r\n" {
                break;
            }
            headers.push(line.trim().to_ascii_lowercase());
        }
        assert!(
            headers
                .iter()
                .any(|h| h == "content-type: application/x-ndjson"),
            "{headers:?}"
        );
        assert!(
            headers.iter().any(|h| h == "transfer-encoding: chunked"),
            "{headers:?}"
        );
        FeedClient {
            reader,
            pending: Vec::new(),
        }
    }

    /// The next frame line, parsed with the engine's parser.
    pub fn next(&mut self) -> lasthop_core::feed::Frame {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return lasthop_core::feed::parse_frame(&line).unwrap_or_else(|e| {
                    panic!("bad frame {e}: {}", String::from_utf8_lossy(&line))
                });
            }
            let chunk = self.read_chunk().expect("the feed ended");
            self.pending.extend_from_slice(&chunk);
        }
    }

    /// The next frame that is not a heartbeat.
    pub fn next_event(&mut self) -> lasthop_core::feed::Frame {
        loop {
            match self.next() {
                lasthop_core::feed::Frame::Heartbeat { .. } => continue,
                f => return f,
            }
        }
    }

    /// One chunk of the chunked body; `None` at its end (or when the connection closes).
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        use std::io::Read as _;
        let mut size = String::new();
        if self.reader.read_line(&mut size).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).ok()?;
        assert_eq!(&data[size..], b"\r\n", "chunk trailer");
        data.truncate(size);
        (size > 0).then_some(data)
    }
}

/// `(status, body bytes)` of a GET with a bearer token.
pub fn get_bytes(url: &str, token: &str) -> (u16, Vec<u8>, Option<String>) {
    use std::io::Read as _;
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    let resp = match agent
        .get(url)
        .set("Authorization", &format!("Bearer {token}"))
        .call()
    {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let status = resp.status();
    let len = resp.header("content-length").map(str::to_string);
    let mut body = Vec::new();
    resp.into_reader()
        .read_to_end(&mut body)
        .expect("read the body");
    (status, body, len)
}

/// What the test verdict service does with one request.
pub enum Hook {
    /// Answer with this status and body.
    Reply(u16, String),
    /// Read the request and never answer (until the test ends).
    Hang,
}

/// A verdict webhook on a real socket: `respond` sees the `url` of each POSTed
/// `{"url": ...}` and says what to answer.
pub struct WebhookServer {
    pub url: String,
    /// The URLs it was asked about, in order.
    pub asked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl WebhookServer {
    pub fn start(respond: impl Fn(&str) -> Hook + Send + Sync + 'static) -> WebhookServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/verdict", listener.local_addr().expect("addr"));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let respond = Arc::new(respond);
        {
            let (asked, stop) = (Arc::clone(&asked), Arc::clone(&stop));
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (asked, respond, stop) =
                        (Arc::clone(&asked), Arc::clone(&respond), Arc::clone(&stop));
                    std::thread::spawn(move || serve_hook(conn, &asked, &*respond, &stop));
                }
            });
        }
        WebhookServer { url, asked, stop }
    }

    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("lock").clone()
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = std::net::TcpStream::connect(
            self.url
                .trim_start_matches("http://")
                .trim_end_matches("/verdict"),
        );
    }
}

fn serve_hook(
    mut conn: std::net::TcpStream,
    asked: &Mutex<Vec<String>>,
    respond: &(dyn Fn(&str) -> Hook + Send + Sync),
    stop: &AtomicBool,
) {
    use std::io::{Read as _, Write as _};
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, length) = loop {
        let Ok(n) = conn.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (i + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let Ok(n) = conn.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: serde_json::Value =
        serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or_default();
    let url = body["url"].as_str().unwrap_or_default().to_string();
    asked.lock().expect("lock").push(url.clone());
    match respond(&url) {
        Hook::Reply(status, body) => {
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
        Hook::Hang => {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Polls `f` every 50 ms until it holds or `limit` passes; the time it took. (Every 50 ms
/// rather than testkit's 10: these conditions are API calls, feed connections and store
/// queries against control planes that share one PostgreSQL.)
pub fn wait_until(limit: Duration, what: &str, f: impl FnMut() -> bool) -> Duration {
    lasthop_testkit::wait_until_every(Duration::from_millis(50), limit, what, f)
}
