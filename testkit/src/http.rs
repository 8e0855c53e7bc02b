//! HTTP as the tests' clients speak it: curl (the real client), and a raw keep-alive HTTP/1.1
//! connection for pipelining, load and exact bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

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

/// The status of a GET of `path` over HTTP/2 with prior knowledge (h2c), by curl.
pub fn h2_status(addr: &str, path: &str) -> u16 {
    curl(&["--http2-prior-knowledge", &format!("http://{addr}{path}")]).0
}

/// One GET on a fresh connection: the status (0 when the server is unreachable).
/// The status and `Location` (empty when none) of a curl request with `args` (redirects not
/// followed).
pub fn location_of(args: &[&str]) -> (u16, String) {
    let (status, headers, _) = curl(args);
    let location = headers
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("location")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, location)
}

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
