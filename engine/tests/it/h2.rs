//! HTTP/2 end to end: the serving contract over h2 (TLS with ALPN on io_uring, h2c with prior
//! knowledge on io_uring and epoll; AF_XDP runs it from `xdp`), real clients (curl, nghttp,
//! h2load, headless Chromium), and each flood limit with a raw-frame client while other
//! connections keep being served.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use lasthop_engine::h2::frame::{self, flag, kind, setting, ErrorCode, Header};
use lasthop_testkit::{curl, Engine};

use crate::serving::Fixture;

/// The serving contract over HTTP/2 against `base` (`http://ADDR` with prior knowledge, or
/// `https://NAME:PORT`), curl given `extra` (`--http2-prior-knowledge`, or `--http2` and how
/// to trust and reach the server). `https`: answers carry HSTS and this `Alt-Svc` value.
pub fn check_serving_h2(f: &Fixture, base: &str, extra: &[&str], https: Option<&str>, what: &str) {
    let get = |args: &[&str]| {
        let mut all: Vec<&str> = extra.to_vec();
        all.extend_from_slice(args);
        curl(&all)
    };
    // 302 with exactly the contract's fields, lower case, no connection-specific ones.
    let (status, headers, body) = get(&[&format!("{base}/{}?utm=dropped", f.live)]);
    assert_eq!(status, 302, "{what}: {headers}");
    let lines: Vec<&str> = headers.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines[0].trim(), "HTTP/2 302", "{what}: {headers}");
    let mut rest: Vec<&str> = lines[1..].iter().map(|l| l.trim()).collect();
    let date = rest
        .iter()
        .position(|l| l.starts_with("date: "))
        .map(|i| rest.remove(i))
        .unwrap_or_else(|| panic!("{what}: no date in {headers}"));
    let when = httpdate::parse_http_date(&date["date: ".len()..]).expect("an HTTP-date");
    let skew = std::time::SystemTime::now()
        .duration_since(when)
        .unwrap_or_default();
    assert!(skew.as_secs() < 5, "{what}: {date}");
    let mut want = vec![
        "location: https://example.com/live?x=1",
        "cache-control: private, max-age=300",
        "content-length: 0",
    ];
    let alt_svc;
    if let Some(alt) = https {
        want.push("strict-transport-security: max-age=31536000");
        alt_svc = format!("alt-svc: {alt}");
        want.push(&alt_svc);
    }
    assert_eq!(rest, want, "{what}");
    assert!(body.is_empty());

    assert_eq!(
        get(&["-I", &format!("{base}/{}", f.live)]).0,
        302,
        "{what}: HEAD"
    );
    assert_eq!(get(&[&format!("{base}/spring-sale-2026")]).0, 302, "{what}");
    assert_eq!(
        get(&[&format!("{base}/{}", f.never)]).0,
        404,
        "{what}: never issued"
    );
    assert_eq!(
        get(&[&format!("{base}/{}", f.expired)]).0,
        410,
        "{what}: expired"
    );
    assert_eq!(get(&[&format!("{base}/no-such-alias")]).0, 404, "{what}");
    assert_eq!(get(&[&format!("{base}/")]).0, 404, "{what}");
    let (status, headers, _) = get(&["-X", "POST", "-d", "x=1", &format!("{base}/{}", f.live)]);
    assert_eq!(status, 405, "{what}");
    assert!(headers.contains("allow: GET, HEAD"), "{what}: {headers}");
    let (status, _, page) = get(&[&format!("{base}/{}+", f.live)]);
    assert_eq!(status, 200, "{what}");
    assert!(
        page.contains("https://example.com/live?x=1"),
        "{what}: {page}"
    );
    let (status, _, json) = get(&[
        "-H",
        "Accept: application/json",
        &format!("{base}/{}+", f.live),
    ]);
    assert_eq!(status, 200, "{what}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("preview JSON");
    assert_eq!(v["url"], "https://example.com/live?x=1", "{what}");

    // Several requests on one connection, multiplexed.
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sv",
        "--max-time",
        "20",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
    ])
    .args(extra)
    .args(["--parallel", "--parallel-immediate"]);
    for path in [f.live.as_str(), "spring-sale-2026", f.never.as_str()] {
        cmd.arg(format!("{base}/{path}"));
    }
    let out = cmd.output().expect("curl runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("< HTTP/2 302").count(), 2, "{what}: {err}");
    assert_eq!(err.matches("< HTTP/2 404").count(), 1, "{what}: {err}");
}

fn h2c(io: &str) {
    let f = crate::serving::fixture();
    let engine = f.site.start(&["--io", io]);
    let base = format!("http://{}", engine.addr);
    check_serving_h2(&f, &base, &["--http2-prior-knowledge"], None, io);
    // HTTP/1 on the same listener is untouched.
    crate::serving::check_serving(&f, &engine, io);
    assert!(
        engine
            .metric("lasthop_engine_h2_connections_total")
            .unwrap_or(0.0)
            >= 10.0
    );
    // SIGTERM with an HTTP/2 connection open: GOAWAY, then the connection closes.
    let mut c = RawH2::connect(&engine.addr);
    c.get(1, &format!("/{}", f.live), "t");
    assert_eq!(c.status_of(1), Some(302));
    engine.signal("TERM");
    let (last, code) = c.goaway().expect("GOAWAY on drain");
    assert_eq!((last, code), (1, ErrorCode::NoError), "{io}");
    assert!(c.closed(), "{io}: closed after the drain's GOAWAY");
}

#[test]
fn h2c_with_prior_knowledge_on_io_uring() {
    h2c("uring");
}

#[test]
fn h2c_with_prior_knowledge_on_epoll() {
    h2c("epoll");
}

/// The engine with HTTPS (`--no-ktls`: the path every host has).
fn tls_engine(f: &Fixture, extra: &[&str]) -> (Engine, lasthop_testkit::Pki) {
    let pki = lasthop_testkit::pki(&f.site, false);
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let mut args = vec![
        "--tls-listen",
        "127.0.0.1:0",
        "--cert",
        cert,
        "--key",
        key,
        "--no-ktls",
    ];
    args.extend_from_slice(extra);
    (f.site.start(&args), pki)
}

fn tls_port(e: &Engine) -> String {
    e.tls
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn h2_over_tls_with_curl_nghttp_and_h2load() {
    let f = crate::serving::fixture();
    let (e, pki) = tls_engine(&f, &[]);
    let port = tls_port(&e);
    let resolve = format!("lh.test:{port}:127.0.0.1");
    let ca = pki.ca.to_str().unwrap();
    let base = format!("https://lh.test:{port}");
    // HTTP/3 on the same port over UDP, advertised on every answer over TLS.
    let alt_svc = format!("h3=\":{port}\"; ma=86400");
    assert_eq!(e.quic.as_deref(), Some(&*format!("127.0.0.1:{port}")));
    check_serving_h2(
        &f,
        &base,
        &["--http2", "--cacert", ca, "--resolve", &resolve],
        Some(&alt_svc),
        "tls",
    );
    // nghttp: the server's SETTINGS, then the answer.
    let out = Command::new("nghttp")
        .args(["-nv", &format!("https://127.0.0.1:{port}/{}", f.live)])
        .output()
        .expect("nghttp (scripts/test installs nghttp2-client)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("recv SETTINGS frame"), "{text}");
    assert!(
        text.contains("(niv=4)") && text.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):100]"),
        "{text}"
    );
    assert!(text.contains(":status: 302"), "{text}");
    // h2load with 100 streams a connection never meets a flood limit.
    for (url, label) in [
        (format!("https://127.0.0.1:{port}/{}", f.live), "tls"),
        (format!("http://{}/{}", e.addr, f.live), "h2c"),
    ] {
        let out = Command::new("h2load")
            .args(["-n", "20000", "-c", "4", "-m", "100", &url])
            .output()
            .expect("h2load (scripts/test installs nghttp2-client)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("20000 succeeded, 0 failed, 0 errored"),
            "{label}: {text}"
        );
        assert!(text.contains("20000 3xx"), "{label}: {text}");
    }
    let calm = e
        .metric("lasthop_engine_h2_goaways_total{error=\"ENHANCE_YOUR_CALM\"}")
        .unwrap();
    assert_eq!(calm, 0.0, "legitimate multiplexing is never refused");
    assert!(e.metric("lasthop_engine_h2_streams_total").unwrap() >= 40_000.0);
    assert!(
        e.metric("lasthop_engine_requests_by_protocol_total{protocol=\"h2\"}")
            .unwrap()
            >= 40_000.0
    );

    // A name neither the SNI nor the certificate covers gets 421 (curl sends its Host header
    // as :authority); one the certificate covers (its IP address) is served.
    let url = format!("{base}/{}", f.live);
    let args = |host: &'static str| {
        vec![
            "--http2".to_string(),
            "--cacert".into(),
            ca.into(),
            "--resolve".into(),
            resolve.clone(),
            "-H".into(),
            format!("Host: {host}"),
            url.clone(),
        ]
    };
    let run = |a: Vec<String>| curl(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(run(args("evil.example")).0, 421);
    assert_eq!(run(args("127.0.0.1")).0, 302);
    assert_eq!(run(args("LH.TEST")).0, 302);
}

#[test]
fn alpn_and_h2c_can_be_turned_off() {
    let f = crate::serving::fixture();
    let (e, pki) = tls_engine(&f, &["--alpn", "http/1.1", "--no-h2c"]);
    let port = tls_port(&e);
    let resolve = format!("lh.test:{port}:127.0.0.1");
    let (status, headers, _) = curl(&[
        "--http2",
        "--cacert",
        pki.ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &format!("https://lh.test:{port}/{}", f.live),
    ]);
    assert_eq!(status, 302);
    assert!(headers.starts_with("HTTP/1.1 302"), "{headers}");
    // The preface is read as an HTTP/1 request line, and refused.
    let (status, _, _) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://{}/{}", e.addr, f.live),
    ]);
    assert_ne!(status, 302);
    assert_eq!(e.metric("lasthop_engine_h2_connections_total"), Some(0.0));
}

/// A landing page served by the test over plain HTTP on loopback (a few visits): its address.
/// The page's body says `text`.
pub(crate) fn landing_page(text: &'static str) -> std::net::SocketAddr {
    let landing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = landing.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in landing.incoming().flatten().take(8) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body =
                format!("<html><head><title>landed</title></head><body>{text}</body></html>");
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn chromium_follows_a_short_url_over_h2_to_its_landing_page() {
    let Some(chromium) = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        lasthop_testkit::skip(
            "h2::chromium_follows_a_short_url_over_h2",
            "chromium is not installed",
        );
        return;
    };
    let landing_addr = landing_page("landed over h2");
    let site = lasthop_testkit::Site::new();
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), format!("http://{landing_addr}/landing"), None)],
    );
    let pki = lasthop_testkit::pki(&site, false);
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let e = site.start(&[
        "--tls-listen",
        "127.0.0.1:0",
        "--cert",
        cert,
        "--key",
        key,
        "--no-ktls",
    ]);
    let port = tls_port(&e);
    let profile = site.dir.path().join("chromium-profile");
    let out = Command::new("timeout")
        .args(["60", chromium])
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--ignore-certificate-errors",
            "--host-resolver-rules=MAP lh.test 127.0.0.1",
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &format!("https://lh.test:{port}/{code}"),
        ])
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("landed over h2"),
        "{dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The redirect came over HTTP/2: the engine saw Chromium's stream.
    assert!(
        e.metric("lasthop_engine_h2_streams_total").unwrap() >= 1.0,
        "{}",
        e.log()
    );
    assert_eq!(
        e.metric("lasthop_engine_requests_by_protocol_total{protocol=\"h1\"}"),
        Some(0.0)
    );
}

/// A raw HTTP/2 client over h2c: frames written by hand, read back whole.
pub struct RawH2 {
    s: TcpStream,
    buf: Vec<u8>,
    frames: Vec<(Header, Vec<u8>)>,
    eof: bool,
}

impl RawH2 {
    pub fn connect(addr: &str) -> RawH2 {
        Self::with_settings(addr, &[])
    }

    pub fn with_settings(addr: &str, settings: &[(u16, u32)]) -> RawH2 {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut c = RawH2 {
            s,
            buf: Vec::new(),
            frames: Vec::new(),
            eof: false,
        };
        let mut b = frame::PREFACE.to_vec();
        frame::write_settings(&mut b, settings);
        c.send(&b);
        c
    }

    pub fn send(&mut self, b: &[u8]) {
        // A peer that already closed may reset the rest: what it said before is what counts.
        let _ = self.s.write_all(b);
    }

    /// A GET's header block: static-table method and scheme, literal path and user agent.
    pub fn block(path: &str, ua: &str) -> Vec<u8> {
        let mut b = vec![0x82, 0x86, 0x41, 9];
        b.extend_from_slice(b"localhost");
        b.push(0x04);
        b.push(path.len() as u8);
        b.extend_from_slice(path.as_bytes());
        b.push(0x0f);
        b.push(58 - 15); // user-agent, static index 58
        b.push(ua.len() as u8);
        b.extend_from_slice(ua.as_bytes());
        b
    }

    pub fn get(&mut self, stream: u32, path: &str, ua: &str) {
        let mut b = Vec::new();
        frame::write_headers(&mut b, stream, &Self::block(path, ua), true, 16_384);
        self.send(&b);
    }

    /// Reads until `done` says so or `limit` passes.
    fn read_until(&mut self, limit: Duration, mut done: impl FnMut(&[(Header, Vec<u8>)]) -> bool) {
        let end = Instant::now() + limit;
        let mut chunk = [0u8; 65536];
        while !done(&self.frames) && !self.eof && Instant::now() < end {
            match self.s.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => self.eof = true,
            }
            while let Some(h) = Header::read(&self.buf) {
                let end = 9 + h.len as usize;
                if self.buf.len() < end {
                    break;
                }
                let payload = self.buf[9..end].to_vec();
                self.buf.drain(..end);
                self.frames.push((h, payload));
            }
        }
    }

    /// The `:status` of the answer on `stream` (literal or static-indexed, as the engine
    /// encodes it).
    pub fn status_of(&mut self, stream: u32) -> Option<u16> {
        let has = |f: &[(Header, Vec<u8>)]| {
            f.iter()
                .any(|(h, _)| h.kind == kind::HEADERS && h.stream == stream)
        };
        self.read_until(Duration::from_secs(10), has);
        let (_, p) = self
            .frames
            .iter()
            .find(|(h, _)| h.kind == kind::HEADERS && h.stream == stream)?;
        let p: &[u8] = p;
        Some(match p.first()? {
            0x88 => 200,
            0x8d => 404,
            0x8c => 400,
            0x08 => std::str::from_utf8(p.get(2..5)?).ok()?.parse().ok()?,
            _ => return None,
        })
    }

    pub fn goaway(&mut self) -> Option<(u32, ErrorCode)> {
        let has = |f: &[(Header, Vec<u8>)]| f.iter().any(|(h, _)| h.kind == kind::GOAWAY);
        self.read_until(Duration::from_secs(15), has);
        self.frames
            .iter()
            .find(|(h, _)| h.kind == kind::GOAWAY)
            .map(|(_, p)| {
                (
                    u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                    ErrorCode::from_u32(u32::from_be_bytes([p[4], p[5], p[6], p[7]])),
                )
            })
    }

    pub fn closed(&mut self) -> bool {
        self.read_until(Duration::from_secs(10), |_| false);
        self.eof
    }

    pub fn resets(&self) -> Vec<(u32, ErrorCode)> {
        self.frames
            .iter()
            .filter(|(h, _)| h.kind == kind::RST_STREAM)
            .map(|(h, p)| {
                (
                    h.stream,
                    ErrorCode::from_u32(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
                )
            })
            .collect()
    }
}

fn rss_kib(e: &Engine) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", e.child.id()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Each flood limit, with raw frames: the GOAWAY or RST code, memory that stays bounded, and
/// another client served meanwhile.
#[test]
fn each_flood_is_refused_while_other_clients_are_served() {
    let f = crate::serving::fixture();
    let e = f.site.start(&[
        "--h2-max-client-resets",
        "50",
        "--h2-max-local-resets",
        "40",
        "--header-timeout",
        "2",
    ]);
    let live = format!("/{}", f.live);
    let rss_before = rss_kib(&e);
    let served = |what: &str| {
        let (status, _, err) = curl(&[
            "--http2-prior-knowledge",
            &format!("http://{}{live}", e.addr),
        ]);
        assert_eq!(status, 302, "{what}: another client is served: {err}");
    };
    let refused = |kind: &str| {
        e.metric(&format!(
            "lasthop_engine_h2_refused_total{{kind=\"{kind}\"}}"
        ))
        .unwrap_or(0.0)
    };

    // Rapid Reset: HEADERS then RST_STREAM, over and over.
    let mut c = RawH2::connect(&e.addr);
    let mut b = Vec::new();
    for i in 0..60u32 {
        frame::write_headers(
            &mut b,
            2 * i + 1,
            &RawH2::block(&live, "rapid"),
            true,
            16_384,
        );
        frame::write_rst(&mut b, 2 * i + 1, ErrorCode::Cancel);
    }
    c.send(&b);
    assert_eq!(
        c.goaway().map(|g| g.1),
        Some(ErrorCode::EnhanceYourCalm),
        "rapid reset"
    );
    assert!(c.closed());
    served("rapid reset");
    assert_eq!(refused("client_resets"), 1.0);

    // MadeYouReset: requests we must reset (malformed: no :path).
    let mut c = RawH2::connect(&e.addr);
    let mut b = Vec::new();
    for i in 0..50u32 {
        frame::write_headers(&mut b, 2 * i + 1, &[0x82, 0x86], true, 16_384);
    }
    c.send(&b);
    assert_eq!(
        c.goaway().map(|g| g.1),
        Some(ErrorCode::EnhanceYourCalm),
        "local resets"
    );
    assert!(c.resets().iter().all(|r| r.1 == ErrorCode::Protocol));
    served("local resets");
    assert_eq!(refused("local_resets"), 1.0);

    // PING flood, never reading the answers until the end.
    let mut c = RawH2::connect(&e.addr);
    let mut b = Vec::new();
    for _ in 0..2000 {
        frame::write_header(&mut b, 8, kind::PING, 0, 0);
        b.extend_from_slice(&[7; 8]);
    }
    c.send(&b);
    assert_eq!(
        c.goaway().map(|g| g.1),
        Some(ErrorCode::EnhanceYourCalm),
        "ping flood"
    );
    served("ping flood");
    assert_eq!(refused("ping"), 1.0);

    // SETTINGS, WINDOW_UPDATE and empty DATA floods.
    for (kind_name, write) in [
        (
            "settings",
            (|b: &mut Vec<u8>| frame::write_settings(b, &[])) as fn(&mut Vec<u8>),
        ),
        ("window_update", |b| frame::write_window_update(b, 0, 1)),
        ("empty_data", |b| frame::write_data(b, 1, &[], false)),
    ] {
        let mut c = RawH2::connect(&e.addr);
        let mut b = Vec::new();
        // A request whose END_STREAM never comes, for the empty DATA to ride on.
        frame::write_headers(&mut b, 1, &RawH2::block(&live, "flood"), false, 16_384);
        for _ in 0..2000 {
            write(&mut b);
        }
        c.send(&b);
        assert_eq!(
            c.goaway().map(|g| g.1),
            Some(ErrorCode::EnhanceYourCalm),
            "{kind_name}"
        );
        served(kind_name);
        assert_eq!(refused(kind_name), 1.0, "{kind_name}");
    }

    // CONTINUATION flood: a header block that never ends.
    let mut c = RawH2::connect(&e.addr);
    let mut b = Vec::new();
    frame::write_header(&mut b, 2, kind::HEADERS, 0, 1);
    b.extend_from_slice(&[0x82, 0x86]);
    for _ in 0..100 {
        frame::write_header(&mut b, 1024, kind::CONTINUATION, 0, 1);
        b.extend(std::iter::repeat_n(0x40, 1024));
    }
    c.send(&b);
    assert_eq!(
        c.goaway().map(|g| g.1),
        Some(ErrorCode::EnhanceYourCalm),
        "continuation"
    );
    served("continuation");
    // ... and one that stops short of its end: refused at the header timeout.
    let mut c = RawH2::connect(&e.addr);
    let mut b = Vec::new();
    frame::write_header(&mut b, 2, kind::HEADERS, 0, 1);
    b.extend_from_slice(&[0x82, 0x86]);
    c.send(&b);
    assert_eq!(
        c.goaway().map(|g| g.1),
        Some(ErrorCode::EnhanceYourCalm),
        "slow header block"
    );
    assert_eq!(refused("continuation"), 2.0);

    // The HPACK bomb: a 4 KiB field indexed, then referenced 3,000 times in 16 KiB: 431, and
    // the connection goes on.
    let mut c = RawH2::connect(&e.addr);
    let mut block = vec![0x82, 0x86, 0x04, live.len() as u8];
    block.extend_from_slice(live.as_bytes());
    block.extend_from_slice(&[0x40, 0x04]);
    block.extend_from_slice(b"bomb");
    block.extend_from_slice(&[0x7f, 0xa1, 0x1e]); // 4,000
    block.extend(std::iter::repeat_n(b'x', 4000));
    block.extend(std::iter::repeat_n(0xbe, 3000));
    let mut b = Vec::new();
    frame::write_headers(&mut b, 1, &block, true, 16_384);
    c.send(&b);
    assert_eq!(c.status_of(1), Some(431), "hpack bomb");
    c.get(3, &live, "after the bomb");
    assert_eq!(c.status_of(3), Some(302));

    // A zero window: the preview page waits, bounded by the window timeout (not tested for
    // time here: it is 10 s), and its headers still come.
    let mut c = RawH2::with_settings(&e.addr, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    c.get(1, &format!("{live}+"), "zero window");
    assert_eq!(c.status_of(1), Some(200));
    assert!(
        !c.frames.iter().any(|(h, _)| h.kind == kind::DATA),
        "no DATA without a window"
    );
    let mut b = Vec::new();
    frame::write_window_update(&mut b, 1, 1 << 20);
    c.send(&b);
    let has_end = |f: &[(Header, Vec<u8>)]| {
        f.iter()
            .any(|(h, _)| h.kind == kind::DATA && h.has(flag::END_STREAM))
    };
    c.read_until(Duration::from_secs(10), has_end);
    assert!(has_end(&c.frames), "the page once the window opened");

    let grown = rss_kib(&e).saturating_sub(rss_before);
    assert!(
        grown < 64 * 1024,
        "the floods grew the engine by {grown} KiB"
    );
    assert_eq!(
        e.metric("lasthop_engine_h2_goaways_total{error=\"ENHANCE_YOUR_CALM\"}"),
        Some(8.0)
    );
}

#[test]
fn an_idle_h2_connection_gets_goaway_no_error() {
    let f = crate::serving::fixture();
    let e = f.site.start(&["--idle-timeout", "1"]);
    let mut c = RawH2::connect(&e.addr);
    c.get(1, &format!("/{}", f.live), "idle");
    assert_eq!(c.status_of(1), Some(302));
    assert_eq!(c.goaway(), Some((1, ErrorCode::NoError)));
    assert!(c.closed());
}

/// The h2spec cases that may not pass, each for a reason `engine/DESIGN.md` gives with the
/// RFC text that allows it, recognised by what httpwg reports.
const HTTPWG_EXCEPTIONS: [(&str, &str); 2] = [
    // RFC 9113 §3.3/§3.4: the plain listener serves HTTP/1 too; bytes that are not the
    // preface are an HTTP/1 request (here a malformed one: 400, RFC 9112 §3).
    (
        "sends invalid connection preface",
        "peer frame header, then incomplete payload, then hung up",
    ),
    // The case expects 200 to a POST with `te: trailers`: the request is accepted (no
    // stream error, RFC 9113 §8.2.2) and answered 405, as every POST to a shortener is.
    ("sends headers frame with te trailers", "left: 405"),
];

/// httpwg-cli (a Rust port of h2spec: RFC 9113's cases) against the h2c listener: every case
/// passes but the two exceptions above, which fail exactly as described.
#[test]
fn httpwg_conformance_over_h2c() {
    let Some(httpwg) = ["httpwg"]
        .into_iter()
        .map(|b| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cargo/bin").join(b))
                .filter(|p| p.exists())
                .unwrap_or_else(|| b.into())
        })
        .find(|p| Command::new(p).arg("--version").output().is_ok())
    else {
        lasthop_testkit::skip(
            "h2::httpwg_conformance_over_h2c",
            "httpwg-cli is not installed (cargo install --locked httpwg-cli)",
        );
        return;
    };
    let f = crate::serving::fixture();
    let e = f.site.start(&["--cores", "1"]);
    let out = Command::new("timeout")
        .arg("300")
        .arg(&httpwg)
        .args(["-a", &e.addr])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .output()
        .expect("httpwg runs");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let text: String = strip_ansi(&text);
    let failed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("Test failed: ").nth(1))
        .collect();
    assert!(failed.is_empty(), "failed: {failed:#?}\n{}", tail(&text));
    let summary = text
        .lines()
        .find(|l| l.contains("Passed ") && l.contains(" tests in "))
        .unwrap_or_else(|| panic!("no summary:\n{}", tail(&text)));
    let counts: Vec<u32> = summary
        .split("Passed ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.split('/').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    let (passed, total) = (counts[0], counts[1]);
    assert!(total >= 100, "{summary}");
    // A case that panics is neither passed nor failed in httpwg's report: the exceptions.
    let panics: Vec<&str> = text.lines().filter(|l| l.starts_with("Message:")).collect();
    for (case, sign) in HTTPWG_EXCEPTIONS {
        assert!(
            text.contains(sign),
            "the exception {case:?} no longer fails as described: drop it from the list and DESIGN.md\n{}",
            tail(&text)
        );
    }
    assert!(
        panics.len() <= HTTPWG_EXCEPTIONS.len()
            && (total.saturating_sub(passed) as usize) <= HTTPWG_EXCEPTIONS.len(),
        "{summary}; cases that crashed the client: {panics:#?}\n{}",
        tail(&text)
    );
    eprintln!("httpwg: {summary}");
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.contains("DEBUG")).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
