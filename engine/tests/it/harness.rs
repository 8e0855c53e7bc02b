//! Building snapshots, starting the engine, and a raw HTTP/1.1 client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lasthop_core::{CodeScheme, HighWater, PermutationKey};
use lasthop_snapshot::{SnapshotMeta, SnapshotWriter};

pub const ENGINE: &str = env!("CARGO_BIN_EXE_lasthop-engine");

/// A directory (world-readable, so a non-root engine can read it) with a key file.
#[derive(Debug)]
pub struct Site {
    pub dir: tempfile::TempDir,
    pub key: PermutationKey,
}

impl Site {
    #[allow(clippy::new_without_default)] // a test fixture, made explicitly
    pub fn new() -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        set_mode(dir.path(), 0o755);
        let key = PermutationKey::from_bytes(&[9u8; 16]).expect("key");
        let path = dir.path().join("key");
        std::fs::write(&path, key.to_file_text()).expect("write key");
        set_mode(&path, 0o644);
        Site { dir, key }
    }

    pub fn scheme(&self) -> CodeScheme {
        CodeScheme::new(&self.key).expect("scheme")
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.dir.path().join("links.snap")
    }

    /// Writes a snapshot (temp name, rename) with `links` of (key, url, expires_at_ms), region 0
    /// marked as issued up to `mark`.
    pub fn write_snapshot(
        &self,
        sequence: u64,
        mark: u64,
        links: &[(String, String, Option<i64>)],
    ) {
        let mut hw = HighWater::new(1, 1_000).expect("high water");
        hw.raise(0, mark).expect("raise");
        let meta = SnapshotMeta::new(sequence, self.key.id(), hw);
        let mut w = SnapshotWriter::create(self.snapshot_path(), meta).expect("writer");
        for (k, u, e) in links {
            w.add(k.as_bytes(), u.as_bytes(), *e).expect("add");
        }
        w.seal().expect("seal");
        set_mode(&self.snapshot_path(), 0o644);
    }

    pub fn start(&self, extra: &[&str]) -> Engine {
        Engine::start(Command::new(ENGINE), self, extra)
    }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[derive(Debug)]
pub struct Engine {
    pub child: Child,
    pub addr: String,
    pub admin: String,
    pub log: PathBuf,
    /// The HTTPS listener, when started with `--tls-listen`.
    pub tls: Option<String>,
}

static ENGINES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Engine {
    pub fn start(cmd: Command, site: &Site, extra: &[&str]) -> Engine {
        let mut args = vec![
            "--snapshot",
            site.snapshot_path().to_str().expect("utf-8 path"),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Engine::launch(cmd, site, &args)
    }

    /// Starts the engine with exactly `extra` beside the common flags (no `--snapshot`
    /// unless `extra` has one). Its log goes to `site/engine-N.log`; a `--data-dir` under the
    /// site is added unless `extra` has one, and so are `--listen 127.0.0.1:0`,
    /// `--admin-listen 127.0.0.1:0` and `--cores 2`.
    pub fn launch(mut cmd: Command, site: &Site, extra: &[&str]) -> Engine {
        let n = ENGINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = site.dir.path().join(format!("engine-{n}.log"));
        let log_file = std::fs::File::create(&log).expect("engine log");
        if !extra.contains(&"--data-dir") {
            let data = site.dir.path().join(format!("engine-{n}"));
            cmd.arg("--data-dir").arg(data);
        }
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--admin-listen", "127.0.0.1:0"),
            ("--cores", "2"),
        ] {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        let mut child = cmd
            .arg("--key-file")
            .arg(site.key_file())
            .args([
                // Count every redirect in /debug/top, so a test's few requests show there.
                "--top-sample",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("engine starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let mut second = String::new();
        out.read_line(&mut first).expect("read");
        out.read_line(&mut second).expect("read");
        if first.is_empty() {
            let _ = child.wait();
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("engine did not start: {err}");
        }
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected line {first:?}"))
            .to_string();
        let admin = second
            .trim()
            .strip_prefix("admin listening on http://")
            .unwrap_or_else(|| panic!("unexpected line {second:?}"))
            .to_string();
        let tls = if extra.contains(&"--tls-listen") {
            let mut third = String::new();
            out.read_line(&mut third).expect("read");
            Some(
                third
                    .trim()
                    .strip_prefix("tls listening on https://")
                    .unwrap_or_else(|| panic!("unexpected line {third:?}"))
                    .to_string(),
            )
        } else {
            None
        };
        Engine {
            child,
            addr,
            admin,
            log,
            tls,
        }
    }

    /// The engine's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The admin listener's `/metrics` value of an unlabelled sample, if present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (status, _, body) = curl(&["-m", "2", &format!("http://{}/metrics", self.admin)]);
        if status != 200 {
            return None;
        }
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig}");
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // A failed test shows what each of its engines logged.
            eprintln!("--- log of the engine on {} ---\n{}", self.addr, self.log());
        }
    }
}

/// A response as a raw client sees it.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A keep-alive HTTP/1.1 connection that reads responses by Content-Length.
#[derive(Debug)]
pub struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    pub fn from_stream(s: TcpStream) -> Conn {
        Conn {
            stream: BufReader::new(s),
        }
    }

    pub fn open(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        Conn {
            stream: BufReader::new(s),
        }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.get_mut().write_all(raw).expect("write");
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: t\r\nUser-Agent: test\r\n\r\n").as_bytes());
        self.read(false).expect("response")
    }

    /// Reads one response; `head` when it answers a HEAD (no body whatever Content-Length says).
    pub fn read(&mut self, head: bool) -> Option<Resp> {
        let mut line = String::new();
        if self.stream.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.stream.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (n, v) = h.split_once(':')?;
            headers.push((n.to_string(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; if head { 0 } else { len }];
        self.stream.read_exact(&mut body).ok()?;
        Some(Resp {
            status,
            headers,
            body,
        })
    }
}

/// curl's view: (status, headers text, body).
pub fn curl(args: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-D",
            "-",
            "-o",
            "/dev/stderr",
            "-w",
            "%{http_code}",
        ])
        .args(args)
        .output()
        .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (headers, status) = stdout.split_at(stdout.len().saturating_sub(3));
    (
        status.parse().unwrap_or(0),
        headers.to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The workspace's `lasthop-control` binary (built on demand when only this crate's tests run).
pub fn control_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LASTHOP_CONTROL_BIN") {
        return PathBuf::from(p);
    }
    let dir = PathBuf::from(ENGINE)
        .parent()
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("lasthop-control");
    if !bin.exists() {
        // A workspace test run builds it; `cargo test -p lasthop-engine` alone may not have.
        // (Building it unconditionally would resolve `-p lasthop-control`'s own feature set and
        // rebuild much of the dependency tree on every run.)
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-q", "-p", "lasthop-control"])
            .status()
            .expect("cargo build")
            .success();
        assert!(ok, "building lasthop-control");
    }
    bin
}

/// A running control plane (the real binary) with an owner key and an admin key.
#[derive(Debug)]
pub struct Control {
    bin: PathBuf,
    child: Option<Child>,
    pub api: String,
    pub edge: String,
    pub data: PathBuf,
    key_file: PathBuf,
    pub key: String,
    pub admin_key: String,
    extra: Vec<String>,
}

fn api_key(bin: &Path, data: &Path, owner: &str, admin: bool) -> String {
    let mut cmd = Command::new(bin);
    cmd.args(["apikey", "create", "--owner", owner, "--data-dir"])
        .arg(data);
    if admin {
        cmd.arg("--admin");
    }
    let out = cmd.output().expect("apikey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Control {
    /// Starts a control plane for `site` (its key) on loopback ports of its choosing.
    pub fn start(site: &Site, extra: &[&str]) -> Control {
        Control::start_from(
            &control_bin(),
            site,
            &site.dir.path().join("control"),
            extra,
        )
    }

    /// [`Control::start`] with the binary at `bin` (an installed one) and its state in `data`.
    pub fn start_from(bin: &Path, site: &Site, data: &Path, extra: &[&str]) -> Control {
        let bin = bin.to_path_buf();
        let data = data.to_path_buf();
        let key = api_key(&bin, &data, "t", false);
        let admin_key = api_key(&bin, &data, "ops", true);
        let mut c = Control {
            bin,
            child: None,
            api: "127.0.0.1:0".into(),
            edge: "127.0.0.1:0".into(),
            data,
            key_file: site.key_file(),
            key,
            admin_key,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let strip = |s: &str| {
            let s = s.strip_prefix("https://").unwrap_or(s);
            s.trim_start_matches("http://").to_string()
        };
        let mut child = Command::new(&self.bin)
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--key-file")
            .arg(&self.key_file)
            .args(["--api-listen", &strip(&self.api)])
            .args(["--edge-listen", &strip(&self.edge)])
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.data.with_extension("log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("control plane starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let (mut a, mut e) = (String::new(), String::new());
        out.read_line(&mut a).expect("api line");
        out.read_line(&mut e).expect("edge line");
        self.api = a
            .trim()
            .strip_prefix("api listening on ")
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(self.data.with_extension("log"));
                panic!(
                    "control plane did not start: {a:?}\n{}",
                    log.unwrap_or_default()
                )
            })
            .to_string();
        self.edge = e
            .trim()
            .strip_prefix("edge listening on ")
            .unwrap_or_else(|| panic!("unexpected line {e:?}"))
            .to_string();
        // Keep reading stdout so the pipe never fills.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        self.child = Some(child);
    }

    /// Sends `sig` (`HUP`, `TERM`, ...) to the control plane.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// What the control plane logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default()
    }

    /// SIGKILLs the control plane (engines lose their feed).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again on the same ports and data with `extra` in place of its flags.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    pub fn token_file(&self) -> PathBuf {
        self.data.join("edge.token")
    }

    /// Engine flags that subscribe to this control plane.
    pub fn engine_args(&self) -> Vec<String> {
        vec![
            "--control".into(),
            self.edge.clone(),
            "--edge-token-file".into(),
            self.token_file().to_string_lossy().into_owned(),
        ]
    }

    /// One API call: (status, JSON body or null).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let req = ureq::request(method, &format!("{}{path}", self.api))
            .set("Authorization", &format!("Bearer {key}"));
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let text = resp.into_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Creates a link as the owner; returns its code.
    pub fn create(&self, url: &str) -> String {
        let (status, v) = self.call(
            "POST",
            "/v1/links",
            &self.key,
            Some(serde_json::json!({"long_url": url})),
        );
        assert_eq!(status, 201, "{v}");
        v["code"].as_str().expect("code").to_string()
    }

    pub fn takedown(&self, code: &str, reason: &str) {
        let (status, v) = self.call(
            "POST",
            &format!("/v1/links/{code}/takedown"),
            &self.admin_key,
            Some(serde_json::json!({"reason": reason})),
        );
        assert_eq!(status, 200, "{v}");
    }

    pub fn restore(&self, code: &str) {
        let (status, v) = self.call(
            "POST",
            &format!("/v1/links/{code}/restore"),
            &self.admin_key,
            None,
        );
        assert_eq!(status, 200, "{v}");
    }

    pub fn delete(&self, code: &str) {
        let (status, v) = self.call("DELETE", &format!("/v1/links/{code}"), &self.key, None);
        assert_eq!(status, 204, "{v}");
    }

    /// Publishes a snapshot now; returns its frame.
    pub fn snapshot_now(&self) -> serde_json::Value {
        let (status, v) = self.call("POST", "/v1/admin/snapshots", &self.admin_key, None);
        assert_eq!(status, 201, "{v}");
        v
    }

    /// `GET /v1/links/{code}/stats` as the owner (today's numbers by default).
    pub fn stats(&self, code: &str) -> serde_json::Value {
        let (status, v) = self.call("GET", &format!("/v1/links/{code}/stats"), &self.key, None);
        assert_eq!(status, 200, "{v}");
        v
    }

    /// `GET /v1/edges`.
    pub fn edges(&self) -> serde_json::Value {
        let (status, v) = self.call("GET", "/v1/edges", &self.admin_key, None);
        assert_eq!(status, 200, "{v}");
        v
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An engine (the real binary) subscribed to `control`'s feed, with `extra` flags and no
/// snapshot of its own (it downloads the control plane's).
pub fn subscribed_engine(site: &Site, control: &Control, extra: &[&str]) -> Engine {
    let mut args = control.engine_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Engine::launch(Command::new(ENGINE), site, &args)
}

/// The flags that make an engine spool its clicks to `control`'s processor
/// (`DATA_DIR/clicks/spool`), flushed every 50 ms.
pub fn spool_to(control: &Control) -> Vec<String> {
    vec![
        "--click-spool".into(),
        control
            .data
            .join("clicks")
            .join("spool")
            .to_string_lossy()
            .into_owned(),
        "--click-flush-ms".into(),
        "50".into(),
    ]
}

/// Subscribed, caught up, and serving a snapshot (the control plane publishes one at start; an
/// engine that started before it existed downloads it when the feed announces it).
pub fn in_sync(e: &Engine) -> bool {
    e.metric("lasthop_engine_feed_in_sync") == Some(1.0)
        && e.metric("lasthop_engine_snapshot_missing") == Some(0.0)
}

/// Polls `f` every 10 ms until it is true; the time it took, or a panic with `what` after
/// `limit`.
pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// One GET on a fresh connection: the status (0 when the engine is unreachable).
pub fn status_of(addr: &str, path: &str) -> u16 {
    match TcpStream::connect(addr) {
        Ok(s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut c = Conn::from_stream(s);
            c.send(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
            c.read(false).map_or(0, |r| r.status)
        }
        Err(_) => 0,
    }
}

/// Keep-alive clients hammering `codes` until stopped; each response goes through `check`
/// (which panics on a bad one, failing the join).
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(addr: &str, codes: &[String], clients: usize, check: fn(&str, &Resp)) -> Load {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let clients = (0..clients)
            .map(|t| {
                let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
                let (addr, codes) = (addr.to_string(), codes.to_vec());
                std::thread::spawn(move || {
                    let mut conn = Conn::open(&addr);
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let code = &codes[i % codes.len()];
                        check(code, &conn.get(&format!("/{code}")));
                        done.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        Load {
            stop,
            done,
            clients,
        }
    }

    /// Stops the clients; the number of requests answered. Panics if a client saw a failure.
    pub fn finish(self) -> u64 {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("a client saw a failure");
        }
        self.done.load(Ordering::Relaxed)
    }
}

/// A Kafka-protocol broker for the Kafka sink's tests: `tansu` (in-memory storage), from `PATH`,
/// `~/.cargo/bin` or `$LASTHOP_TANSU`. `scripts/test` installs it; without it the tests that
/// need it say SKIPPED.
#[derive(Debug)]
pub struct Tansu {
    bin: PathBuf,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Tansu {
    /// The broker binary, if installed.
    pub fn find() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("LASTHOP_TANSU") {
            return Some(PathBuf::from(p));
        }
        let home = std::env::var("HOME").unwrap_or_default();
        std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(PathBuf::from)
            .chain([PathBuf::from(home).join(".cargo/bin")])
            .map(|d| d.join("tansu"))
            .find(|p| p.is_file())
    }

    /// Starts a broker on a free loopback port with `topic` created, or `None` (after printing
    /// `SKIPPED <test>: ...`) when tansu is not installed.
    pub fn start(site: &Site, test: &str, topic: &str) -> Option<Tansu> {
        let Some(bin) = Tansu::find() else {
            lasthop_testkit::skip(
                test,
                "no Kafka-protocol broker (tansu) installed; scripts/test installs it \
                 with `cargo install --locked tansu --features dynostore`",
            );
            return None;
        };
        let port = free_port();
        let mut t = Tansu {
            bin,
            port,
            child: None,
            log: site.dir.path().join(format!("tansu-{port}.log")),
        };
        t.up(topic);
        Some(t)
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// (Re)starts the broker (empty: its storage is in memory) and creates `topic`.
    pub fn up(&mut self, topic: &str) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("tansu log");
        let child = Command::new(&self.bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        wait_until(Duration::from_secs(30), "tansu listening", || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        });
        let ok = Command::new(&self.bin)
            .args([
                "topic",
                "create",
                topic,
                "--broker",
                &url,
                "--partitions",
                "2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("tansu topic create")
            .success();
        assert!(
            ok,
            "creating topic {topic}: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Stops the broker (SIGKILL: a crash, not a goodbye).
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.down();
    }
}

/// A TCP proxy on loopback standing in for a WAN link between regions: every byte is held
/// `delay` in each direction (one-way delay, so a round trip through it costs twice that), and
/// [`Proxy::cut`] drops every connection and refuses new ones until [`Proxy::mend`].
pub struct Proxy {
    pub addr: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(target: &str, delay: Duration) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let target = target
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let flag = Arc::clone(&cut);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if flag.load(Ordering::SeqCst) {
                    continue; // dropped: the connection closes
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    pump(from, to, delay, Arc::clone(&flag));
                }
            }
        });
        Proxy { addr, cut }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn mend(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, each chunk delivered `delay` after it was read; stops (shutting both
/// down) at EOF, an error, or a cut.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let reader_cut = std::sync::Arc::clone(&cut);
    let watched = from.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if reader_cut.load(Ordering::SeqCst) {
                break;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .send((std::time::Instant::now(), buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        while let Ok((read_at, bytes)) = rx.recv() {
            let due = read_at + delay;
            let now = std::time::Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if cut.load(Ordering::SeqCst) || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = watched.shutdown(std::net::Shutdown::Both);
    });
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
