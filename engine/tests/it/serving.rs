//! The request path end to end, on the io_uring loop and on the epoll fallback.

use lasthop_testkit::{curl, Conn, Engine, Site};

pub struct Fixture {
    pub site: Site,
    pub live: String,
    pub expired: String,
    pub never: String,
}

pub fn fixture() -> Fixture {
    let site = Site::new();
    let scheme = site.scheme();
    let live = scheme.encode_string(1).unwrap();
    let expired = scheme.encode_string(2).unwrap();
    // Far above mark + reserve: never issued.
    let never = scheme.encode_string(5_000_000).unwrap();
    site.write_snapshot(
        7,
        10,
        &[
            (live.clone(), "https://example.com/live?x=1".into(), None),
            (
                expired.clone(),
                "https://example.com/old".into(),
                Some(1_000),
            ),
            (
                "spring-sale-2026".into(),
                "https://shop.example/sale".into(),
                None,
            ),
        ],
    );
    Fixture {
        site,
        live,
        expired,
        never,
    }
}

fn check_backend(io: &str) {
    let f = fixture();
    let engine = f.site.start(&["--io", io]);
    check_serving(&f, &engine, io);
}

/// The request path's contract against a running engine serving `f`'s snapshot with `--io io`.
pub fn check_serving(f: &Fixture, engine: &Engine, io: &str) {
    let base = format!("http://{}", engine.addr);

    // 302 with exactly the headers the contract names.
    let (status, headers, body) = curl(&[&format!("{base}/{}?utm=dropped", f.live)]);
    assert_eq!(status, 302, "{headers}");
    let mut lines: Vec<&str> = headers.lines().filter(|l| !l.trim().is_empty()).collect();
    // Date (RFC 9110 §6.6.1): an HTTP-date within a few seconds of now.
    let date = lines.pop().unwrap_or_default();
    let when = httpdate::parse_http_date(date.strip_prefix("Date: ").unwrap_or(date))
        .unwrap_or_else(|e| panic!("{io}: {date:?}: {e}"));
    let skew = std::time::SystemTime::now()
        .duration_since(when)
        .unwrap_or_default();
    assert!(skew.as_secs() < 5, "{io}: {date} is {skew:?} old");
    assert_eq!(
        lines,
        [
            "HTTP/1.1 302 Found",
            "Location: https://example.com/live?x=1",
            "Cache-Control: private, max-age=300",
            "Content-Length: 0",
        ],
        "{io}"
    );
    assert!(body.is_empty());

    // curl -L follows it (the query string of the short URL is dropped, the long URL's kept).
    let (status, _, _) = curl(&["-I", &format!("{base}/{}", f.live)]);
    assert_eq!(status, 302, "HEAD");

    assert_eq!(curl(&[&format!("{base}/spring-sale-2026")]).0, 302);
    assert_eq!(
        curl(&[&format!("{base}/{}", f.never)]).0,
        404,
        "never issued"
    );
    assert_eq!(curl(&[&format!("{base}/{}", f.expired)]).0, 410, "expired");
    assert_eq!(curl(&[&format!("{base}/no-such-alias")]).0, 404);
    assert_eq!(curl(&[&format!("{base}/x")]).0, 404);
    assert_eq!(curl(&[&format!("{base}/")]).0, 404);

    let (status, headers, _) = curl(&["-X", "POST", "-d", "x=1", &format!("{base}/{}", f.live)]);
    assert_eq!(status, 405);
    assert!(headers.contains("Allow: GET, HEAD"), "{headers}");

    // Preview: HTML, and JSON on Accept: application/json; no redirect.
    let (status, _, page) = curl(&[&format!("{base}/{}+", f.live)]);
    assert_eq!(status, 200);
    assert!(page.contains("https://example.com/live?x=1"), "{page}");
    let (status, _, json) = curl(&[
        "-H",
        "Accept: application/json",
        &format!("{base}/{}+", f.live),
    ]);
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&json).expect("preview JSON");
    assert_eq!(v["url"], "https://example.com/live?x=1");

    // Pipelining: three requests in one write, three answers in order, connection kept.
    let mut conn = Conn::open(&engine.addr);
    conn.send(
        format!(
            "GET /{} HTTP/1.1\r\nHost: t\r\n\r\nHEAD /spring-sale-2026 HTTP/1.1\r\nHost: t\r\n\r\nGET /{} HTTP/1.1\r\nHost: t\r\n\r\n",
            f.live, f.never
        )
        .as_bytes(),
    );
    let a = conn.read(false).expect("first");
    let b = conn.read(true).expect("second");
    let c = conn.read(false).expect("third");
    assert_eq!((a.status, b.status, c.status), (302, 302, 404));
    assert_eq!(b.header("location"), Some("https://shop.example/sale"));
    assert_eq!(conn.get(&format!("/{}", f.live)).status, 302, "still open");

    // A request split across writes is reassembled.
    let mut slow = Conn::open(&engine.addr);
    slow.send(format!("GET /{} HT", f.live).as_bytes());
    std::thread::sleep(std::time::Duration::from_millis(50));
    slow.send(b"TP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(slow.read(false).expect("reassembled").status, 302);

    // Garbage gets 400 and the connection closes.
    let mut bad = Conn::open(&engine.addr);
    bad.send(b"\x16\x03\x01 not http at all\r\n\r\n");
    let r = bad.read(false).expect("an answer");
    assert_eq!(r.status, 400);
    assert!(!r.body.is_empty(), "400 says why");
    assert!(bad.read(false).is_none(), "closed after 400");
    assert!(r.header("date").is_some(), "a 400 carries Date too");

    // Two Host headers: 400 (RFC 9112 §3.2). HTTP/1.2: answered as HTTP/1.1 (RFC 9110 §2.5).
    let mut two = Conn::open(&engine.addr);
    two.send(format!("GET /{} HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n", f.live).as_bytes());
    assert_eq!(two.read(false).expect("an answer").status, 400, "{io}");
    let mut later = Conn::open(&engine.addr);
    later.send(format!("GET /{} HTTP/1.2\r\nHost: t\r\n\r\n", f.live).as_bytes());
    let r = later.read(false).expect("an answer");
    assert_eq!(r.status, 302, "{io}: HTTP/1.2");
    assert_eq!(
        later.get(&format!("/{}", f.live)).status,
        302,
        "kept alive as 1.1"
    );
    let mut two_oh = Conn::open(&engine.addr);
    two_oh.send(b"GET / HTTP/2.0\r\nHost: t\r\n\r\n");
    assert_eq!(two_oh.read(false).expect("an answer").status, 505, "{io}");

    // The admin listener counts what happened, never labelled by code.
    let (status, _, metrics) = curl(&[&format!("http://{}/metrics", engine.admin)]);
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!(
            "lasthop_engine_io_backend{{backend=\"{}\"}} 1",
            match io {
                "uring" => "io_uring",
                "xdp" => "af_xdp",
                _ => "epoll",
            }
        )),
        "{metrics}"
    );
    assert!(!metrics.contains(&f.live), "a metric carries a code");
    assert_eq!(curl(&[&format!("http://{}/readyz", engine.admin)]).0, 200);
    let (_, _, top) = curl(&[&format!("http://{}/debug/top", engine.admin)]);
    assert!(top.contains(&f.live), "{top}");
}

#[test]
fn io_uring_backend_serves_the_contract() {
    check_backend("uring");
}

#[test]
fn epoll_backend_serves_the_same() {
    check_backend("epoll");
}

/// The io_uring loop sends a closing connection's last answer with MSG_MORE behind a linked
/// shutdown, so the FIN rides on the answer's segment: the client receives the SYN-ACK, the
/// ACK of its request and one segment holding the answer and the FIN (read from the client
/// socket's `segs_in` with `ss`). Sent apart, the FIN would be a fourth.
#[test]
fn io_uring_puts_the_fin_on_the_last_answer() {
    use std::io::{Read as _, Write as _};
    let f = fixture();
    let engine = f.site.start(&["--io", "uring"]);
    let sent = || {
        engine
            .metric("lasthop_engine_sent_bytes_total")
            .expect("sent bytes in /metrics") as u64
    };
    let before = sent();
    let mut s = std::net::TcpStream::connect(&engine.addr).expect("connect");
    let req = format!(
        "GET /{} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        f.live
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("answer, then the server's close");
    assert!(
        answer.starts_with(b"HTTP/1.1 302 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // The socket stays open (CLOSE-WAIT) until `s` drops, so `ss` still has it.
    let local = s.local_addr().unwrap().to_string();
    let out = std::process::Command::new("ss")
        .args(["-Htin", "src", &local])
        .output()
        .expect("ss (iproute2)");
    let info = String::from_utf8_lossy(&out.stdout).to_string();
    let segs_in: u32 = info
        .split_whitespace()
        .find_map(|w| w.strip_prefix("segs_in:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no segs_in in ss's line: {info}"));
    assert!(segs_in <= 3, "answer and FIN in separate segments: {info}");
    // The last answer is counted like any other, though its connection was closing.
    assert_eq!(sent() - before, answer.len() as u64);
}

/// Every core serves from the engine's first line on: the kernel hashes connections across the
/// cores' SO_REUSEPORT sockets, so a core that never armed its listener leaves its share
/// waiting (it happened: a glommio executor parked before its first poll). 32 connections made
/// the moment the engine says it listens are all answered within seconds, by both cores.
fn every_core_answers_at_once(io: &str) {
    use std::io::{Read, Write};
    let f = fixture();
    let engine = f.site.start(&["--io", io]);
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (addr, live) = (engine.addr.clone(), f.live.clone());
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(&addr).expect("connect");
                s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap();
                s.write_all(
                    format!("GET /{live} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .unwrap();
                let mut head = [0u8; 12];
                s.read_exact(&mut head).map(|_| head.to_vec())
            })
        })
        .collect();
    for t in threads {
        let head = t.join().unwrap();
        assert!(
            matches!(&head, Ok(h) if h.as_slice() == b"HTTP/1.1 302"),
            "{io}: {head:?}\n{}",
            engine.log()
        );
    }
    let (_, _, metrics) = curl(&[&format!("http://{}/metrics", engine.admin)]);
    for core in 0..2 {
        assert!(
            core_requests(&metrics, core) >= 1.0,
            "{io}: core {core} answered nothing\n{metrics}"
        );
    }
}

/// Requests core `core` answered, from the admin listener's `/metrics` text (0 if absent).
pub fn core_requests(metrics: &str, core: usize) -> f64 {
    let prefix = format!("lasthop_engine_core_requests_total{{core=\"{core}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn io_uring_every_core_answers_at_once() {
    every_core_answers_at_once("uring");
}

#[test]
fn epoll_every_core_answers_at_once() {
    every_core_answers_at_once("epoll");
}
