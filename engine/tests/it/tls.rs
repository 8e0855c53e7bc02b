//! HTTPS at the edge with real clients: curl, and `openssl s_client` for resumption and 0-RTT,
//! against a CA and certificates generated with the openssl CLI at test time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lasthop_testkit::{curl, pki, server_cert, set_mode, Engine, Pki, Site};

/// An engine with HTTPS served through userspace rustls (`--no-ktls`), whatever the kernel:
/// these tests pin the path every host has; `ktls_hand_off_where_the_kernel_has_it` takes the
/// kernel's.
pub(crate) fn start(site: &Site, pki: &Pki, extra: &[&str]) -> Engine {
    let mut args = vec!["--no-ktls"];
    args.extend_from_slice(extra);
    start_with_kernel_tls(site, pki, &args)
}

fn start_with_kernel_tls(site: &Site, pki: &Pki, extra: &[&str]) -> Engine {
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let mut args = vec!["--tls-listen", "127.0.0.1:0", "--cert", cert, "--key", key];
    args.extend_from_slice(extra);
    site.start(&args)
}

fn port(e: &Engine) -> String {
    e.tls
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string()
}

/// `openssl s_client` with `input` on stdin (kept open briefly so tickets arrive); its stdout
/// and stderr together.
pub(crate) fn s_client(e: &Engine, pki: &Pki, extra: &[&str], input: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", e.tls.as_deref().unwrap()])
        .args([
            "-servername",
            "lh.test",
            "-CAfile",
            pki.ca.to_str().unwrap(),
        ])
        .args(["-tls1_3", "-ign_eof"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub(crate) fn links(site: &Site) -> String {
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), "https://example.com/secure".into(), None)],
    );
    code
}

#[test]
fn curl_over_https_gets_the_redirect_with_hsts() {
    for rsa in [false, true] {
        let site = Site::new();
        let code = links(&site);
        let pki = pki(&site, rsa);
        let e = start(&site, &pki, &[]);
        let resolve = format!("lh.test:{}:127.0.0.1", port(&e));
        let url = format!("https://lh.test:{}/{code}", port(&e));
        let (status, headers, err) = curl(&[
            "--http1.1",
            "--cacert",
            pki.ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            "-v",
            &url,
        ]);
        assert_eq!(
            status,
            302,
            "rsa={rsa}: {headers}\n{err}\nengine log:\n{}",
            e.log()
        );
        assert!(
            headers.contains("Location: https://example.com/secure"),
            "{headers}"
        );
        assert!(
            headers.contains("Strict-Transport-Security: max-age=31536000"),
            "{headers}"
        );
        // TLS 1.2 with an AEAD suite works too.
        let (status, _, _) = curl(&[
            "--http1.1",
            "--cacert",
            pki.ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            "--tls-max",
            "1.2",
            &url,
        ]);
        assert_eq!(status, 302, "TLS 1.2, rsa={rsa}");
        // The plain listener stays up, without HSTS.
        let (status, headers, _) = curl(&[&format!("http://{}/{code}", e.addr)]);
        assert_eq!(status, 302);
        assert!(!headers.contains("Strict-Transport-Security"), "{headers}");
    }
}

/// HSTS is on every HTTPS answer, refusals included; with `--redirect-http-to-https` the plain
/// listener sends every request to the same target on HTTPS (what HSTS preload requires).
#[test]
fn hsts_on_every_https_answer_and_plain_http_redirected() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &["--redirect-http-to-https"]);
    let tls_port = port(&e);
    let resolve = format!("lh.test:{tls_port}:127.0.0.1");
    // A GET with a body is refused by the parser (400, connection closed): still with HSTS.
    let (status, headers, _) = curl(&[
        "--http1.1",
        "--cacert",
        pki.ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-X",
        "GET",
        "--data-raw",
        "hello",
        &format!("https://lh.test:{tls_port}/{code}"),
    ]);
    assert_eq!(status, 400, "{headers}");
    assert!(
        headers.contains("Strict-Transport-Security: max-age=31536000"),
        "{headers}"
    );
    assert!(headers.contains("Date: "), "{headers}");
    // The plain listener: 301 to HTTPS, same path and query, the HTTPS port named.
    let plain_port = e.addr.rsplit(':').next().unwrap().to_string();
    let (status, headers, _) = curl(&[
        "-H",
        &format!("Host: lh.test:{plain_port}"),
        &format!("http://{}/{code}?utm_source=x", e.addr),
    ]);
    assert_eq!(status, 301, "{headers}");
    assert!(
        headers.contains(&format!(
            "Location: https://lh.test:{tls_port}/{code}?utm_source=x"
        )),
        "{headers}"
    );
    assert!(!headers.contains("Strict-Transport-Security"), "{headers}");
    // ... which answers the redirect.
    let (status, headers, _) = curl(&[
        "--http1.1",
        "--cacert",
        pki.ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &format!("https://lh.test:{tls_port}/{code}?utm_source=x"),
    ]);
    assert_eq!(status, 302, "{headers}");
}

#[test]
fn a_wrong_host_fails_cleanly_and_is_counted() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let resolve = format!("wrong.test:{}:127.0.0.1", port(&e));
    let url = format!("https://wrong.test:{}/{code}", port(&e));
    let (status, _, err) = curl(&[
        "--http1.1",
        "--cacert",
        pki.ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &url,
    ]);
    assert_eq!(status, 0, "no HTTP answer: {err}");
    // An untrusted chain fails too.
    let url = format!("https://127.0.0.1:{}/{code}", port(&e));
    assert_eq!(curl(&[&url]).0, 0);
    // The engine is unharmed.
    let url = format!("https://lh.test:{}/{code}", port(&e));
    let resolve = format!("lh.test:{}:127.0.0.1", port(&e));
    assert_eq!(
        curl(&[
            "--http1.1",
            "--cacert",
            pki.ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            &url
        ])
        .0,
        302
    );
    // Counted: a client that rejects the certificate sends an alert (or just hangs up).
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    let count = |reason: &str| -> u64 {
        let prefix = format!("lasthop_engine_tls_handshake_failures_total{{reason=\"{reason}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("alert") + count("io") >= 1, "{m}");
}

/// The server applies its own suite order (SHA-256 suites first: their key schedule is the
/// cheaper one), whatever the client prefers, and still speaks AES-256 to a client with nothing
/// else.
#[test]
fn the_server_picks_its_preferred_cipher_suite() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let suites = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256";
    let out = s_client(&e, &pki, &["-ciphersuites", suites], get.as_bytes());
    assert!(out.contains("HTTP/1.1 302 Found"), "{out}");
    assert!(out.contains("Cipher is TLS_AES_128_GCM_SHA256"), "{out}");
    let only = ["-ciphersuites", "TLS_AES_256_GCM_SHA384"];
    let out = s_client(&e, &pki, &only, get.as_bytes());
    assert!(out.contains("HTTP/1.1 302 Found"), "{out}");
    assert!(out.contains("Cipher is TLS_AES_256_GCM_SHA384"), "{out}");
}

/// A connection the server ends (a `Connection: close` answer, a 400 for garbage) ends with
/// close_notify after the last answer, so the client can tell the end from a truncation
/// (RFC 8446 §6.1, RFC 9112 §9.8).
#[test]
fn the_server_ends_a_closing_connection_with_close_notify() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let notify = "<<< TLS 1.3, Alert [length 0002], warning close_notify";
    for (input, status) in [
        (get.as_bytes(), "HTTP/1.1 302 Found"),
        (&b"GARBAGE\r\n\r\n"[..], "HTTP/1.1 400 Bad Request"),
    ] {
        let out = s_client(&e, &pki, &["-msg"], input);
        let answer = out
            .find(status)
            .unwrap_or_else(|| panic!("no {status}: {out}"));
        let alert = out
            .find(notify)
            .unwrap_or_else(|| panic!("no close_notify: {out}"));
        assert!(answer < alert, "close_notify after the answer: {out}");
    }
}

#[test]
fn sessions_resume_and_early_data_gets_get_only() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    // Each connection saves the tickets it got, and the next resumes with them: with 0-RTT on,
    // resumption is stateful and every ticket is single-use (rustls' replay guard).
    let sess = |n: u32| site.dir.path().join(format!("sess{n}.pem"));
    let s = |n: u32| sess(n).to_str().unwrap().to_string();
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let first = s_client(&e, &pki, &["-sess_out", &s(1)], get.as_bytes());
    assert!(first.contains("HTTP/1.1 302 Found"), "{first}");
    assert!(first.contains("New, TLSv1.3"), "{first}");

    let again = s_client(
        &e,
        &pki,
        &["-sess_in", &s(1), "-sess_out", &s(2)],
        get.as_bytes(),
    );
    assert!(again.contains("Reused, TLSv1.3"), "{again}");
    assert!(again.contains("HTTP/1.1 302 Found"), "{again}");

    // 0-RTT: a GET in early data is answered.
    let early = site.dir.path().join("early.txt");
    std::fs::write(&early, &get).unwrap();
    let early_arg = early.to_str().unwrap().to_string();
    let out = s_client(
        &e,
        &pki,
        &[
            "-sess_in",
            &s(2),
            "-sess_out",
            &s(3),
            "-early_data",
            &early_arg,
        ],
        b"",
    );
    assert!(out.contains("Early data was accepted"), "{out}");
    assert!(out.contains("HTTP/1.1 302 Found"), "{out}");

    // A POST in early data gets 425 Too Early.
    let post = format!(
        "POST /{code} HTTP/1.1\r\nHost: lh.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    std::fs::write(&early, post).unwrap();
    let out = s_client(
        &e,
        &pki,
        &["-sess_in", &s(3), "-early_data", &early_arg],
        b"",
    );
    assert!(out.contains("Early data was accepted"), "{out}");
    assert!(out.contains("HTTP/1.1 425 Too Early"), "{out}");

    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    for needle in [
        "lasthop_engine_tls_handshakes_total{kind=\"full\"} 1",
        "lasthop_engine_tls_handshakes_total{kind=\"resumed\"} 3",
        "lasthop_engine_tls_handshakes_total{kind=\"early_data\"} 2",
        "lasthop_engine_tls_too_early_total 1",
    ] {
        assert!(m.contains(needle), "{needle}\n{m}");
    }
}

#[test]
fn sessions_resume_across_processes_sharing_a_ticket_key_file() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let keyfile = site.dir.path().join("tickets.key");
    lasthop_testkit::write_secret(&keyfile, hex_of(&[0x42; 32]));
    let args = ["--tls-ticket-key-file", keyfile.to_str().unwrap()];
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let sess = site.dir.path().join("sess.pem");
    let one = start(&site, &pki, &args);
    let first = s_client(
        &one,
        &pki,
        &["-sess_out", sess.to_str().unwrap()],
        get.as_bytes(),
    );
    assert!(first.contains("New, TLSv1.3"), "{first}");
    drop(one);
    let two = start(&site, &pki, &args);
    let again = s_client(
        &two,
        &pki,
        &["-sess_in", sess.to_str().unwrap()],
        get.as_bytes(),
    );
    assert!(
        again.contains("Reused, TLSv1.3"),
        "another process resumes: {again}"
    );
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_stalled_handshake_is_dropped_at_the_timeout() {
    let site = Site::new();
    links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &["--tls-handshake-timeout-ms", "500"]);
    let mut s = TcpStream::connect(e.tls.as_deref().unwrap()).unwrap();
    // The first bytes of a ClientHello record, then silence.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    assert!(
        m.contains("lasthop_engine_tls_handshake_failures_total{reason=\"timeout\"} 1"),
        "{m}"
    );
}

/// The kTLS hand-off: where the kernel takes the TLS ULP, connections go to it after their
/// handshake and keep serving (several requests on one connection, both directions through the
/// kernel). Where it does not (this project's CI kernel has no `CONFIG_TLS`), the test says
/// skipped with the reason, and checks that the engine saw the same and serves through
/// userspace rustls instead: the fallback is what every other test here exercises.
#[test]
fn ktls_hand_off_where_the_kernel_has_it() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start_with_kernel_tls(&site, &pki, &[]);
    let resolve = format!("lh.test:{}:127.0.0.1", port(&e));
    let url = format!("https://lh.test:{}/{code}", port(&e));
    // Three requests on one connection (curl reuses it).
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}\n"])
        .args(["--cacert", pki.ca.to_str().unwrap(), "--resolve", &resolve])
        .args([&url, &url, &url])
        .output()
        .expect("curl");
    let codes = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        codes.lines().collect::<Vec<_>>(),
        ["302", "302", "302"],
        "{codes}"
    );
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    match lasthop_engine::tls::probe_ktls() {
        Err(reason) => {
            assert!(m.contains("lasthop_engine_ktls_available 0"), "{m}");
            assert!(
                m.contains("lasthop_engine_tls_connections_total{path=\"userspace\"} 1"),
                "{m}"
            );
            assert!(
                m.contains("lasthop_engine_tls_connections_total{path=\"ktls\"} 0"),
                "{m}"
            );
            eprintln!(
                "SKIPPED ktls_hand_off_where_the_kernel_has_it: this kernel refuses the TLS ULP \
                 ({reason}); the userspace fallback served instead"
            );
        }
        Ok(_) => {
            assert!(m.contains("lasthop_engine_ktls_available 1"), "{m}");
            assert!(
                m.contains("lasthop_engine_tls_connections_total{path=\"ktls\"} 1"),
                "handed to the kernel: {m}"
            );
            assert!(
                m.contains("lasthop_engine_tls_handshake_failures_total{reason=\"ktls\"} 0"),
                "{m}"
            );
        }
    }
}

/// SIGHUP re-reads the certificate and key: new connections get the new certificate, the
/// connection opened before keeps working; over HTTP/3 too.
#[test]
fn sighup_reloads_the_certificate() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let subject = |e: &Engine| {
        let out = s_client(e, &pki, &[], get.as_bytes());
        out.lines()
            .find(|l| l.starts_with("subject="))
            .unwrap_or_default()
            .to_string()
    };
    assert!(subject(&e).contains("lh.test"), "{}", subject(&e));
    let h3 = lasthop_testkit::aioquic("SIGHUP over h3");
    let h3_cn =
        |e: &Engine| lasthop_testkit::h3(e, &pki, &format!("/{code}"), &[])["peer_cn"].clone();
    if h3 {
        assert_eq!(h3_cn(&e), "lh.test");
    }
    let resolve = format!("lh.test:{}:127.0.0.1", port(&e));
    let url = format!("https://lh.test:{}/{code}", port(&e));

    // A new certificate from the same CA, for another name (and still for lh.test).
    let dir = site.dir.path();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
    server_cert(dir, &ec, "renewed.lh.test", "new.key", "new.pem");
    std::fs::rename(dir.join("new.pem"), &pki.cert).unwrap();
    std::fs::rename(dir.join("new.key"), &pki.key).unwrap();
    set_mode(&pki.cert, 0o644);
    set_mode(&pki.key, 0o644);
    e.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !subject(&e).contains("renewed.lh.test") {
        assert!(Instant::now() < deadline, "new certificate never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _, _) = curl(&[
        "--http1.1",
        "--cacert",
        pki.ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &url,
    ]);
    assert_eq!(status, 302);
    if h3 {
        // Every core's QUIC endpoint takes the new one on its next tick.
        while h3_cn(&e) != "renewed.lh.test" {
            assert!(
                Instant::now() < deadline,
                "HTTP/3 kept the old certificate: {}",
                e.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A rustls client of the engine's CA, TLS 1.3 only, keeping its tickets, willing to send
/// early data.
fn early_client(pki: &Pki) -> std::sync::Arc<rustls::ClientConfig> {
    let roots = lasthop_tls::root_store(&pki.ca).unwrap();
    let mut config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(lasthop_tls::provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.enable_early_data = true;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    std::sync::Arc::new(config)
}

/// Reads from `sock` into `conn` for `wait` (or until an answer's head is in), sending
/// nothing; the plaintext that arrived.
fn read_without_writing(
    conn: &mut rustls::ClientConnection,
    sock: &mut TcpStream,
    wait: Duration,
) -> Vec<u8> {
    let deadline = Instant::now() + wait;
    let mut plain = Vec::new();
    let mut buf = [0u8; 16_384];
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    while Instant::now() < deadline && !plain.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => panic!("{e}"),
        };
        let mut data = &buf[..n];
        while !data.is_empty() {
            conn.read_tls(&mut data).unwrap();
            conn.process_new_packets().unwrap();
        }
        let _ = conn.reader().read_to_end(&mut plain);
    }
    plain
}

/// 0-RTT early answers (`--tls-early-answer`, on by default): a resumed client sends its GET in
/// early data and holds back its Finished; the 302 arrives all the same, in the server's first
/// flight. Off, nothing arrives until the Finished is sent.
#[test]
fn early_data_is_answered_before_the_client_finished() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let get = format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nUser-Agent: early/1\r\n\r\n");
    for answer in ["on", "off"] {
        let spool = site.dir.path().join(format!("spool-{answer}"));
        let e = start(
            &site,
            &pki,
            &[
                "--tls-early-answer",
                answer,
                "--click-spool",
                spool.to_str().unwrap(),
                "--click-flush-ms",
                "20",
            ],
        );
        let addr = e.tls.as_deref().unwrap();
        let config = early_client(&pki);
        // A full handshake for a ticket (which arrives after the client's Finished).
        {
            let mut conn =
                rustls::ClientConnection::new(config.clone(), "lh.test".try_into().unwrap())
                    .unwrap();
            let mut sock = TcpStream::connect(addr).unwrap();
            let mut tls = rustls::Stream::new(&mut conn, &mut sock);
            tls.write_all(get.as_bytes()).unwrap();
            let mut head = [0u8; 20];
            tls.read_exact(&mut head).unwrap();
            assert_eq!(&head[..], b"HTTP/1.1 302 Found\r\n");
        }
        let mut conn =
            rustls::ClientConnection::new(config.clone(), "lh.test".try_into().unwrap()).unwrap();
        conn.early_data()
            .expect("the ticket allows early data")
            .write_all(get.as_bytes())
            .unwrap();
        let mut sock = TcpStream::connect(addr).unwrap();
        // The ClientHello and the early data, then nothing more from this side.
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        let early = read_without_writing(&mut conn, &mut sock, Duration::from_secs(1));
        assert!(conn.is_early_data_accepted(), "{answer}");
        assert!(
            !conn.is_handshaking() && conn.wants_write(),
            "the client's Finished is still unsent ({answer})"
        );
        let plain = if answer == "on" {
            early
        } else {
            assert!(
                early.is_empty(),
                "no answer before the Finished: {}",
                String::from_utf8_lossy(&early)
            );
            while conn.wants_write() {
                conn.write_tls(&mut sock).unwrap();
            }
            read_without_writing(&mut conn, &mut sock, Duration::from_secs(5))
        };
        let text = String::from_utf8_lossy(&plain);
        assert!(
            text.starts_with("HTTP/1.1 302 Found\r\n"),
            "{answer}: {text}"
        );
        let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
        assert!(
            m.contains("lasthop_engine_tls_handshakes_total{kind=\"early_data\"} 1"),
            "{m}"
        );
        // Its click says it came in early data (the processor counts one per visitor, code
        // and minute); the full handshake's does not.
        lasthop_testkit::wait_until(Duration::from_secs(5), "two clicks in the spool", || {
            crate::clicks::spool_events(&spool).len() == 2
        });
        let events = crate::clicks::spool_events(&spool);
        let early = events.iter().filter(|(e, _)| e.early).count();
        assert_eq!(early, 1, "{answer}: {events:?}");
    }
}
