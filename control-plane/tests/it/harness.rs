//! Starting the real binary on a temp data dir, and talking to it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lasthop_core::{CodeScheme, PermutationKey};

pub const BIN: &str = env!("CARGO_BIN_EXE_lasthop-control");

/// A data dir with a key file and one API key, shared across restarts.
pub struct Site {
    pub dir: tempfile::TempDir,
    pub api_key: String,
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
        Site { dir, api_key }
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
        let path = self.dir.path().join("data").join("edge.token");
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
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--key-file")
            .arg(self.key_file())
            .args(["--api-listen", "127.0.0.1:0", "--create-rate", "0"]);
        if !extra.contains(&"--edge-listen") {
            cmd.args(["--edge-listen", "127.0.0.1:0"]);
        }
        let mut child = cmd
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
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
        }
    }
}

pub struct Server {
    pub child: Child,
    pub base: String,
    /// The internal edge listener, e.g. `http://127.0.0.1:PORT`.
    pub edge_base: String,
}

impl Server {
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
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "sending SIGTERM");
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
