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
}

impl Engine {
    pub fn start(mut cmd: Command, site: &Site, extra: &[&str]) -> Engine {
        let mut child = cmd
            .arg("--snapshot")
            .arg(site.snapshot_path())
            .arg("--key-file")
            .arg(site.key_file())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--cores",
                "2",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("engine starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let mut second = String::new();
        out.read_line(&mut first).expect("read");
        out.read_line(&mut second).expect("read");
        if first.is_empty() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err)
                .ok();
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
        Engine { child, addr, admin }
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
        .args(["-sS", "-D", "-", "-o", "/dev/stderr", "-w", "%{http_code}"])
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
