//! HTTP/3 over QUIC with real clients: aioquic (the `client.py` beside these tests, in the
//! Python that `scripts/test` installs it into: `$LASTHOP_AIOQUIC_PYTHON`, else `python3`).

use std::path::Path;
use std::process::Command;

use lasthop_testkit::{
    aioquic, aioquic_json, aioquic_python, curl, h3, h3_client, pki, skip, Engine, Pki, Site,
};
use serde_json::Value;

use crate::tls::{links, start};

/// A site with the test links and an ECDSA test PKI, where aioquic is installed (else the test
/// `what` is reported skipped).
fn quic_site(what: &str) -> Option<(Site, String, Pki)> {
    if !aioquic(what) {
        return None;
    }
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    Some((site, code, pki))
}

/// A returning visitor: a first request that saves a ticket in `ticket`, then the request again
/// with it, sent in 0-RTT (with `extra`); the second's answer.
fn returning(e: &Engine, pki: &Pki, path: &str, ticket: &str, extra: &[&str]) -> Value {
    h3(e, pki, path, &["--ticket", ticket]);
    let mut args = vec!["--ticket", ticket, "--early"];
    args.extend_from_slice(extra);
    h3(e, pki, path, &args)
}

/// `client.py --hold`: a connection kept open after its answer, until the server closes it.
struct Holding {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Holding {
    /// Started, answered, and holding (its "holding" line read).
    fn start(e: &Engine, pki: &Pki, path: &str, extra: &[&str]) -> Holding {
        use std::io::BufRead;
        let quic = e.quic.as_deref().expect("the engine serves QUIC");
        let (host, port) = quic.rsplit_once(':').unwrap();
        let mut child = Command::new(aioquic_python())
            .arg(h3_client())
            .args([host, port, path, "--ca", pki.ca.to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "holding");
        Holding { child, out }
    }

    /// Its JSON once the server closed the connection (or the hold ran out).
    fn result(&mut self) -> Value {
        use std::io::BufRead;
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success());
        serde_json::from_str(&line).expect("json")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(r: &'a Value, name: &str) -> Option<&'a str> {
    r["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// The client's view of a connection in a qlog (aioquic's `QuicLogger`): datagrams and packets
/// in the order it sent and received them.
struct Qlog(Vec<Value>);

impl Qlog {
    fn read(path: &Path) -> Qlog {
        let q: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        Qlog(q["traces"][0]["events"].as_array().unwrap().clone())
    }

    /// The events up to the client's handshake Finished (a Handshake packet it sent with a
    /// CRYPTO frame).
    fn before_finished(&self) -> &[Value] {
        let at = self
            .0
            .iter()
            .position(|e| {
                e["name"] == "transport:packet_sent"
                    && e["data"]["header"]["packet_type"] == "handshake"
                    && frames(e).contains(&"crypto".to_string())
            })
            .expect("the client's Finished");
        &self.0[..at]
    }
}

fn frames(e: &Value) -> Vec<String> {
    e["data"]["frames"]
        .as_array()
        .map(|f| {
            f.iter()
                .map(|f| match f["stream_id"].as_u64() {
                    Some(id) => format!("{}/{id}", f["frame_type"].as_str().unwrap_or("")),
                    None => f["frame_type"].as_str().unwrap_or("").to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Bytes in the datagrams events of `name` among `events`.
fn datagram_bytes(events: &[Value], name: &str) -> u64 {
    events
        .iter()
        .filter(|e| e["name"] == name)
        .flat_map(|e| e["data"]["raw"].as_array().cloned().unwrap_or_default())
        .map(|r| r["payload_length"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn a_get_over_h3_gets_the_exact_redirect_and_0rtt_gets_it_in_the_first_flight() {
    let Some((site, code, pki)) = quic_site("h3 with aioquic") else {
        return;
    };
    let e = start(&site, &pki, &[]);
    let ticket = site.dir.path().join("ticket.bin");
    let ticket = ticket.to_str().unwrap();
    let qlog = site.dir.path().join("full.qlog");
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &["--ticket", ticket, "--qlog", qlog.to_str().unwrap()],
    );
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(
        header(&r, "location"),
        Some("https://example.com/secure"),
        "{r}"
    );
    assert_eq!(
        header(&r, "cache-control"),
        Some("private, max-age=300"),
        "{r}"
    );
    assert_eq!(header(&r, "content-length"), Some("0"), "{r}");
    assert!(header(&r, "date").is_some(), "{r}");
    assert!(header(&r, "strict-transport-security").is_some(), "{r}");
    let port = e.quic.as_deref().unwrap().rsplit(':').next().unwrap();
    assert_eq!(
        header(&r, "alt-svc"),
        Some(&*format!("h3=\":{port}\"; ma=86400")),
        "{r}"
    );
    assert_eq!(
        r["headers"].as_array().unwrap().len(),
        6,
        "exactly these: {r}"
    );
    assert_eq!(r["body"], "");
    assert_eq!(r["early_data_accepted"], false, "{r}");
    // The full handshake with the ECDSA chain: the server's whole flight came at once, within
    // 3x what the client had sent (RFC 9000 §8.1), with no round trip for more.
    let q = Qlog::read(&qlog);
    let before = q.before_finished();
    let first_received = before
        .iter()
        .position(|e| e["name"] == "transport:datagrams_received")
        .expect("the server's flight");
    assert!(
        before[first_received..]
            .iter()
            .all(|e| e["name"] != "transport:datagrams_sent"),
        "the client sent nothing between the server's flight and its Finished"
    );
    let (sent, received) = (
        datagram_bytes(before, "transport:datagrams_sent"),
        datagram_bytes(before, "transport:datagrams_received"),
    );
    assert!(
        received <= 3 * sent,
        "amplification: {received} > 3 x {sent}"
    );
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    assert!(m.contains("lasthop_engine_quic_handshakes_total 1"), "{m}");

    // Resumed with the ticket, the GET in 0-RTT: accepted, and its 302 in the server's first
    // flight, received before the client sent its Finished.
    let qlog = site.dir.path().join("early.qlog");
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &[
            "--ticket",
            ticket,
            "--early",
            "--qlog",
            qlog.to_str().unwrap(),
        ],
    );
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["early_data_accepted"], true, "{r}");
    assert_eq!(r["session_resumed"], true, "{r}");
    let q = Qlog::read(&qlog);
    let before = q.before_finished();
    assert!(
        before.iter().any(|e| e["name"] == "transport:packet_sent"
            && e["data"]["header"]["packet_type"] == "0RTT"
            && frames(e).contains(&"stream/0".to_string())),
        "the request went in 0-RTT"
    );
    assert!(
        before
            .iter()
            .any(|e| e["name"] == "transport:packet_received"
                && e["data"]["header"]["packet_type"] == "1RTT"
                && frames(e).contains(&"stream/0".to_string())),
        "the answer came before the client's Finished"
    );
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    assert!(
        m.contains("lasthop_engine_quic_zero_rtt_accepted_total 1"),
        "{m}"
    );
    // Two handshakes: the first full, the second resumed.
    assert!(m.contains("lasthop_engine_quic_handshakes_total 2"), "{m}");
    assert!(m.contains("lasthop_engine_quic_resumed_total 1"), "{m}");
}

#[test]
fn the_serving_contract_over_h3() {
    if !aioquic("h3 serving with aioquic") {
        return;
    }
    let site = Site::new();
    let code = site.scheme().encode_string(3).unwrap();
    let gone = site.scheme().encode_string(4).unwrap();
    let missing = site.scheme().encode_string(9).unwrap();
    site.write_snapshot(
        1,
        10,
        &[
            (code.clone(), "https://example.com/secure".into(), None),
            (gone.clone(), "".into(), None),
        ],
    );
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let r = h3(&e, &pki, &format!("/{code}"), &["--method", "HEAD"]);
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["body"], "");
    let r = h3(&e, &pki, &format!("/{missing}"), &[]);
    assert_eq!(r["status"], 404, "{r}");
    let r = h3(&e, &pki, &format!("/{gone}"), &[]);
    assert!(r["status"] == 410 || r["status"] == 404, "{r}");
    let r = h3(&e, &pki, &format!("/{code}+"), &[]);
    assert_eq!(r["status"], 200, "{r}");
    assert!(
        r["body"]
            .as_str()
            .unwrap()
            .contains("https://example.com/secure"),
        "{r}"
    );
    let r = h3(&e, &pki, &format!("/{code}"), &["--method", "POST"]);
    assert_eq!(r["status"], 405, "{r}");
    // A POST in 0-RTT early data: 425 Too Early.
    let ticket = site.dir.path().join("ticket.bin");
    let ticket = ticket.to_str().unwrap();
    let r = returning(&e, &pki, &format!("/{code}"), ticket, &["--method", "POST"]);
    assert_eq!(r["early_data_accepted"], true, "{r}");
    assert_eq!(r["status"], 425, "{r}");
}

#[test]
fn retry_and_a_client_that_changes_its_port() {
    let Some((site, code, pki)) = quic_site("h3 retry with aioquic") else {
        return;
    };
    // Two cores: the steering program keeps the connection on its core after the port change.
    let e = start(&site, &pki, &["--quic-retry", "always", "--cores", "2"]);
    let r = h3(&e, &pki, &format!("/{code}"), &["--port-change"]);
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["second"]["status"], 302, "{r}");
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    assert!(m.contains("lasthop_engine_quic_retries_total 1"), "{m}");
    assert!(m.contains("lasthop_engine_quic_connections_total 1"), "{m}");
}

/// `Alt-Svc` over TCP: HTTP/3 on the QUIC port by default, a value of the operator's, or none.
#[test]
fn alt_svc_is_advertised_set_or_off() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let ca = pki.ca.to_str().unwrap().to_string();
    let get = |e: &Engine| {
        let tls = e.tls.as_deref().unwrap();
        let port = tls.rsplit(':').next().unwrap();
        let resolve = format!("lh.test:{port}:127.0.0.1");
        curl(&[
            "--http1.1",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            &format!("https://lh.test:{port}/{code}"),
        ])
        .1
    };
    let e = start(&site, &pki, &[]);
    let port = e
        .quic
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let h = get(&e);
    assert!(
        h.contains(&format!("Alt-Svc: h3=\":{port}\"; ma=86400\r\n")),
        "{h}"
    );
    drop(e);
    let e = start(&site, &pki, &["--alt-svc", "h3=\":443\"; ma=3600"]);
    let h = get(&e);
    assert!(h.contains("Alt-Svc: h3=\":443\"; ma=3600\r\n"), "{h}");
    drop(e);
    let e = start(&site, &pki, &["--alt-svc", "off"]);
    assert!(!get(&e).contains("Alt-Svc"));
    drop(e);
    // No QUIC, no advertisement.
    let e = start(&site, &pki, &["--no-quic"]);
    assert!(e.quic.is_none());
    assert!(!get(&e).contains("Alt-Svc"));
}

/// SIGTERM: an open HTTP/3 connection gets GOAWAY naming the first request stream not served
/// (12, after the requests on streams 0, 4 and 8), then a close with H3_NO_ERROR, and the engine
/// exits. Before it, the client abandoned two requests: stream 0 reset mid-request (forgotten,
/// so the drain is not left waiting for it) and stream 4's answer refused with STOP_SENDING
/// (answered with RESET_STREAM and the client's code, RFC 9000 §3.5).
#[test]
fn sigterm_says_goaway_then_closes_with_no_error() {
    let Some((site, code, pki)) = quic_site("h3 drain with aioquic") else {
        return;
    };
    let mut e = start(&site, &pki, &[]);
    let mut client = Holding::start(
        &e,
        &pki,
        &format!("/{code}"),
        &["--hold", "10", "--abandon"],
    );
    e.signal("TERM");
    let r = client.result();
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["goaway_id"], 12, "{r}");
    assert_eq!(r["resets"]["4"], 0x10c, "STOP_SENDING answered: {r}");
    assert!(r["resets"].get("0").is_none(), "{r}");
    assert_eq!(r["close_code"], 0x100, "H3_NO_ERROR: {r}");
    let started = std::time::Instant::now();
    let status = e.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", e.log());
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

/// Floods of real Initials (each a handshake's state, past `--quic-retry-threshold`: then
/// answered with Retry) and of garbage datagrams, from one address, while a client is served on
/// another: it gets its redirect during each, and the engine counts what the flood cost.
#[test]
fn floods_of_initials_and_garbage_leave_other_connections_served() {
    let Some((site, code, pki)) = quic_site("h3 floods with aioquic") else {
        return;
    };
    let e = start(&site, &pki, &["--quic-retry-threshold", "20"]);
    let quic = e.quic.clone().unwrap();
    let (host, port) = quic.rsplit_once(':').unwrap();
    let flood = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/flood.py");
    for kind in ["initial", "garbage"] {
        let before = e
            .metric("lasthop_engine_quic_packets_received_total")
            .unwrap_or(0.0);
        let flooder = Command::new(aioquic_python())
            .arg(&flood)
            .args([host, port, "3", kind])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python");
        std::thread::sleep(std::time::Duration::from_millis(500));
        for _ in 0..3 {
            let r = h3(&e, &pki, &format!("/{code}"), &[]);
            assert_eq!(r["status"], 302, "during the {kind} flood: {r}");
        }
        let out = flooder.wait_with_output().unwrap();
        assert!(out.status.success(), "{kind} flood");
        let sent: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(sent > 500.0, "{kind}: only {sent} datagrams");
        let got = e
            .metric("lasthop_engine_quic_packets_received_total")
            .unwrap()
            - before;
        assert!(got > 500.0, "{kind}: the engine read {got} of {sent}");
        if kind == "initial" {
            let retries = e.metric("lasthop_engine_quic_retries_total").unwrap();
            assert!(
                retries > 0.0,
                "past the threshold, Initials get Retry: {}",
                e.log()
            );
        }
    }
    // And after both.
    assert_eq!(h3(&e, &pki, &format!("/{code}"), &[])["status"], 302);
}

/// `--quic-idle-timeout`: a connection with nothing to say is forgotten after it (the client's
/// own idle timeout, aioquic's 60 s, is longer: the smaller one applies, RFC 9000 §10.1).
#[test]
fn an_idle_connection_is_forgotten_after_the_quic_idle_timeout() {
    if !aioquic("h3 idle timeout with aioquic") {
        return;
    }
    use std::time::{Duration, Instant};
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &["--quic-idle-timeout", "2"]);
    let client = Holding::start(&e, &pki, &format!("/{code}"), &["--hold", "6"]);
    let held = Instant::now();
    let open = || e.metric("lasthop_engine_quic_open_connections").unwrap();
    assert_eq!(open(), 1.0, "open while within the idle timeout");
    while open() > 0.0 {
        assert!(
            held.elapsed() < Duration::from_secs(5),
            "still open: {}",
            e.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone = held.elapsed();
    assert!(
        gone >= Duration::from_millis(1500),
        "forgotten after {gone:?}, before the 2 s"
    );
    client.stop();
}

/// Headless Chromium, told to speak QUIC to the engine (`--origin-to-force-quic-on`) and to
/// trust its certificate by its SPKI pin (QUIC takes no `--ignore-certificate-errors`), follows a
/// short URL over HTTP/3 to a landing page the test serves; its net log shows the QUIC session.
#[test]
fn chromium_follows_a_short_url_over_h3_to_its_landing_page() {
    let Some(chromium) = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        skip(
            "h3::chromium_follows_a_short_url_over_h3",
            "chromium is not installed",
        );
        return;
    };
    let landing_addr = crate::h2::landing_page("landed over h3");
    let site = Site::new();
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), format!("http://{landing_addr}/landing"), None)],
    );
    let pki = pki(&site, false);
    let e = start(&site, &pki, &[]);
    let port = e
        .quic
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    // The leaf's SubjectPublicKeyInfo, hashed (SHA-256, base64): Chromium's pin.
    let spki = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
            pki.cert.display()
        ))
        .output()
        .expect("openssl");
    let spki = String::from_utf8(spki.stdout).unwrap().trim().to_string();
    assert_eq!(spki.len(), 44, "a SHA-256 in base64");
    let profile = site.dir.path().join("chromium-profile");
    let netlog = site.dir.path().join("netlog.json");
    let out = Command::new("timeout")
        .args(["60", chromium])
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--enable-quic",
            &format!("--origin-to-force-quic-on=lh.test:{port}"),
            &format!("--ignore-certificate-errors-spki-list={spki}"),
            "--host-resolver-rules=MAP lh.test 127.0.0.1",
            &format!("--log-net-log={}", netlog.display()),
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &format!("https://lh.test:{port}/{code}"),
        ])
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("landed over h3"),
        "{dom}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        e.log()
    );
    let log = std::fs::read_to_string(&netlog).unwrap_or_default();
    assert!(
        log.contains("QUIC_SESSION"),
        "the net log shows no QUIC session"
    );
    assert!(
        e.metric("lasthop_engine_requests_by_protocol_total{protocol=\"h3\"}")
            .unwrap()
            >= 1.0,
        "{}",
        e.log()
    );
    assert_eq!(
        e.metric("lasthop_engine_requests_by_protocol_total{protocol=\"h1\"}"),
        Some(0.0)
    );
    assert!(e.metric("lasthop_engine_quic_handshakes_total").unwrap() >= 1.0);
}

/// The epoll fallback (no TLS over TCP there) serves HTTP/3 on `--quic-listen` with the same
/// QUIC core: the redirect, 0-RTT, and on two cores a client that changes its port.
#[test]
fn http3_on_the_epoll_fallback() {
    let Some((site, code, pki)) = quic_site("h3 on epoll with aioquic") else {
        return;
    };
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let e = site.start(&[
        "--io",
        "epoll",
        "--quic-listen",
        "127.0.0.1:0",
        "--cert",
        cert,
        "--key",
        key,
        "--cores",
        "2",
    ]);
    assert!(e.tls.is_none(), "no HTTPS over TCP on epoll");
    let ticket = site.dir.path().join("ticket");
    let ticket = ticket.to_str().unwrap();
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &["--ticket", ticket, "--port-change"],
    );
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(header(&r, "location"), Some("https://example.com/secure"));
    assert_eq!(r["second"]["status"], 302, "after the port change: {r}");
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &["--ticket", ticket, "--early"],
    );
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["early_data_accepted"], true, "{r}");
    assert!(
        e.metric("lasthop_engine_quic_zero_rtt_accepted_total")
            .unwrap()
            >= 1.0
    );
}

/// 0-RTT is off over QUIC exactly when it is over TCP: with `--tls-max-early-data 0`, and with
/// stateless tickets (`--tls-ticket-key-file`: rustls takes early data only with its single-use
/// session store). A returning client's GET then waits for the handshake, and is still a 302.
#[test]
fn no_0rtt_over_quic_where_tcp_has_none() {
    let Some((site, code, pki)) = quic_site("h3 without 0-RTT with aioquic") else {
        return;
    };
    let keyfile = site.dir.path().join("tickets.key");
    lasthop_testkit::write_secret(&keyfile, "42".repeat(32));
    let off: [&[&str]; 2] = [
        &["--tls-max-early-data", "0"],
        &["--tls-ticket-key-file", keyfile.to_str().unwrap()],
    ];
    for args in off {
        let e = start(&site, &pki, args);
        let ticket = site.dir.path().join("no-0rtt.ticket");
        let _ = std::fs::remove_file(&ticket);
        let ticket = ticket.to_str().unwrap();
        let r = returning(&e, &pki, &format!("/{code}"), ticket, &[]);
        assert_eq!(r["status"], 302, "{args:?}: {r}");
        assert_eq!(r["session_resumed"], true, "{args:?}: {r}");
        assert_eq!(r["early_data_accepted"], false, "{args:?}: {r}");
        assert_eq!(
            e.metric("lasthop_engine_quic_zero_rtt_accepted_total"),
            Some(0.0),
            "{args:?}"
        );
    }
}

/// ngtcp2's client (GnuTLS; Debian's `ngtcp2-client`): a GET, then 0-RTT with the session and
/// transport parameters it saved, Retry, and version negotiation for a version we do not speak.
#[test]
fn ngtcp2_gets_the_redirect_with_0rtt_retry_and_version_negotiation() {
    if Command::new("gtlsclient").arg("--help").output().is_err() {
        skip(
            "h3 with ngtcp2",
            "gtlsclient (ngtcp2-client) is not installed",
        );
        return;
    }
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &["--quic-retry", "always"]);
    let quic = e.quic.clone().unwrap();
    let (host, port) = quic.rsplit_once(':').unwrap();
    let session = site.dir.path().join("ngtcp2.session");
    let tp = site.dir.path().join("ngtcp2.tp");
    let run = |extra: &[&str]| {
        let out = Command::new("gtlsclient")
            .args([
                "--exit-on-all-streams-close",
                "--timeout=5s",
                "--no-quic-dump",
            ])
            .args(["--session-file", session.to_str().unwrap()])
            .args(["--tp-file", tp.to_str().unwrap()])
            .args(extra)
            .args([host, port, &format!("https://lh.test:{port}/{code}")])
            .output()
            .expect("gtlsclient");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{text}");
        text
    };
    let first = run(&[]);
    assert!(first.contains(":status: 302"), "{first}");
    assert!(
        first.contains("location: https://example.com/secure"),
        "{first}"
    );
    // Resumed: the GET in 0-RTT packets, and the 302 before the client's Handshake packet
    // (its Finished) went out.
    let again = run(&[]);
    let answer = again.find(":status: 302").expect("302");
    assert!(again.contains("type=0RTT"), "{again}");
    let finished = again
        .lines()
        .scan(0, |at, l| {
            let start = *at;
            *at += l.len() + 1;
            Some((start, l))
        })
        .find(|(_, l)| l.contains("pkt tx") && l.contains("type=Handshake"))
        .map(|(at, _)| at)
        .expect("the client's Finished");
    assert!(answer < finished, "{again}");
    // A version we do not speak: a Version Negotiation packet listing QUIC v1 (this ngtcp2
    // then stops: it does not retry with v1 by itself).
    let vn = run(&["-v", "0x1a2a3a4a"]);
    assert!(vn.contains("type=VN"), "{vn}");
    assert!(vn.contains("VN v=0x00000001"), "{vn}");
    let m = curl(&[&format!("http://{}/metrics", e.admin)]).2;
    assert!(m.contains("lasthop_engine_quic_retries_total 2"), "{m}");
}

/// A client that tries 0-RTT with a ticket this engine never issued (another engine's): a full
/// handshake, its 0-RTT counted rejected, and its GET answered in 1-RTT.
#[test]
fn a_0rtt_the_server_cannot_accept_is_counted_rejected() {
    let Some((site, code, pki)) = quic_site("h3 0-RTT rejected with aioquic") else {
        return;
    };
    let ticket = site.dir.path().join("elsewhere.ticket");
    let ticket = ticket.to_str().unwrap();
    let issuer = start(&site, &pki, &[]);
    h3(&issuer, &pki, &format!("/{code}"), &["--ticket", ticket]);
    drop(issuer);
    let e = start(&site, &pki, &[]);
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &["--ticket", ticket, "--early"],
    );
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["early_data_accepted"], false, "{r}");
    assert_eq!(r["session_resumed"], false, "{r}");
    assert_eq!(
        e.metric("lasthop_engine_quic_zero_rtt_rejected_total"),
        Some(1.0)
    );
    assert_eq!(
        e.metric("lasthop_engine_quic_zero_rtt_accepted_total"),
        Some(0.0)
    );
    // With a ticket of its own: accepted, nothing more rejected.
    let r = h3(
        &e,
        &pki,
        &format!("/{code}"),
        &["--ticket", ticket, "--early"],
    );
    assert_eq!(r["early_data_accepted"], true, "{r}");
    assert_eq!(
        e.metric("lasthop_engine_quic_zero_rtt_accepted_total"),
        Some(1.0)
    );
    assert_eq!(
        e.metric("lasthop_engine_quic_zero_rtt_rejected_total"),
        Some(1.0)
    );
}

/// `--quic-retry never` sends no Retry even past a threshold of 0 (where `auto` sends one to
/// every new client); `--quic-max-streams` and `--quic-max-early-buffer` are what the client
/// is told (initial_max_streams_bidi, initial_max_data), and ten requests at once on a
/// connection allowed three streams are all answered as streams free up.
#[test]
fn quic_limits_retry_never_streams_and_flow_window() {
    let Some((site, code, pki)) = quic_site("h3 limits with aioquic") else {
        return;
    };
    let e = start(
        &site,
        &pki,
        &[
            "--quic-retry",
            "never",
            "--quic-retry-threshold",
            "0",
            "--quic-max-streams",
            "3",
            "--quic-max-early-buffer",
            "5000",
        ],
    );
    let r = h3(&e, &pki, &format!("/{code}"), &["--requests", "10"]);
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["statuses"], serde_json::json!(vec![302; 10]), "{r}");
    assert_eq!(r["params"]["initial_max_streams_bidi"], 3, "{r}");
    assert_eq!(r["params"]["initial_max_data"], 5000, "{r}");
    assert_eq!(
        r["params"]["initial_max_stream_data_bidi_remote"], 5000,
        "{r}"
    );
    assert_eq!(e.metric("lasthop_engine_quic_retries_total"), Some(0.0));
    assert_eq!(e.metric("lasthop_engine_quic_handshakes_total"), Some(1.0));
    drop(e);
    let auto = start(&site, &pki, &["--quic-retry-threshold", "0"]);
    let r = h3(&auto, &pki, &format!("/{code}"), &[]);
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(r["params"]["initial_max_streams_bidi"], 100, "{r}");
    assert_eq!(r["params"]["initial_max_data"], 65_536, "{r}");
    assert_eq!(auto.metric("lasthop_engine_quic_retries_total"), Some(1.0));
}

/// `--quic-max-early-buffer-total`: past the bytes of 0-RTT a core holds for handshakes in
/// flight, datagrams of 0-RTT alone are dropped, and their request comes again in 1-RTT and
/// is answered. A request that spans several 0-RTT datagrams (a 3 KB header) shows it; under
/// the default total the same request drops nothing.
#[test]
fn early_data_past_the_cores_total_is_dropped_and_comes_again() {
    let Some((site, code, pki)) = quic_site("h3 early buffer with aioquic") else {
        return;
    };
    let pad = format!("x-pad:{}", "p".repeat(3000));
    for (total, dropped) in [(Some("1"), true), (None, false)] {
        let extra: Vec<&str> = total
            .map(|t| vec!["--quic-max-early-buffer-total", t])
            .unwrap_or_default();
        let e = start(&site, &pki, &extra);
        let ticket = site.dir.path().join(format!("early-{total:?}.ticket"));
        let ticket = ticket.to_str().unwrap();
        let r = returning(&e, &pki, &format!("/{code}"), ticket, &["--header", &pad]);
        assert_eq!(r["status"], 302, "{total:?}: {r}");
        assert_eq!(r["early_data_accepted"], true, "{total:?}: {r}");
        let n = e.metric("lasthop_engine_quic_early_dropped_total").unwrap();
        assert_eq!(n > 0.0, dropped, "{total:?}: {n} dropped");
    }
}

/// Stateless reset (RFC 9000 §10.3): once the server has forgotten a connection (its idle
/// timeout passed while the client stayed quiet), a packet on it is answered with a datagram
/// smaller than the packet, shaped as a short header, ending in the reset token the server gave
/// for that connection ID; while the connection lives, the same packet gets no reset.
#[test]
fn a_forgotten_connection_gets_a_stateless_reset() {
    if !aioquic("h3 stateless reset with aioquic") {
        return;
    }
    let site = Site::new();
    links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, &["--quic-idle-timeout", "1"]);
    let quic = e.quic.clone().unwrap();
    let (host, port) = quic.rsplit_once(':').unwrap();
    let script = h3_client().with_file_name("reset.py");
    let ca = pki.ca.to_str().unwrap();
    let r = aioquic_json(&e, &script, &[host, port, "--ca", ca, "--wait", "2.5"]);
    assert_eq!(r["alive_reply_is_reset"], false, "{r}");
    assert_eq!(r["reset"], true, "{r}\n{}", e.log());
    assert!(
        r["got"].as_u64().unwrap() < r["sent"].as_u64().unwrap(),
        "{r}"
    );
    assert_eq!(r["first_byte"].as_u64().unwrap() & 0xc0, 0x40, "{r}");
    assert_eq!(e.metric("lasthop_engine_quic_open_connections"), Some(0.0));
}

/// Amplification (RFC 9000 §8.1): a certificate chain larger than 3x the client's Initial
/// (here 200 names in the leaf) cannot go in one flight before the client's address is
/// validated: the handshake is counted amplification-limited, and completes once the client's
/// next packets lift the budget. The usual ECDSA chain fits: counted nothing.
#[test]
fn a_flight_past_three_times_what_the_client_sent_waits_and_is_counted() {
    let Some((site, code, small)) = quic_site("h3 amplification with aioquic") else {
        return;
    };
    let e = start(&site, &small, &[]);
    assert_eq!(h3(&e, &small, &format!("/{code}"), &[])["status"], 302);
    assert_eq!(
        e.metric("lasthop_engine_quic_amplification_limited_total"),
        Some(0.0)
    );
    drop(e);
    let dir = site.dir.path();
    let names: String = (0..200)
        .map(|i| format!(",DNS:name-{i:03}.padding.lh.test"))
        .collect();
    std::fs::write(
        dir.join("san.ext"),
        format!("subjectAltName=DNS:lh.test,IP:127.0.0.1{names}\n"),
    )
    .unwrap();
    lasthop_testkit::server_cert(
        dir,
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
        "lh.test",
        "big.key",
        "big.pem",
    );
    for f in ["big.pem", "big.key"] {
        lasthop_testkit::set_mode(&dir.join(f), 0o644);
    }
    let big = Pki {
        ca: small.ca.clone(),
        cert: dir.join("big.pem"),
        key: dir.join("big.key"),
    };
    assert!(std::fs::metadata(&big.cert).unwrap().len() > 6000);
    let e = start(&site, &big, &[]);
    let r = h3(&e, &big, &format!("/{code}"), &[]);
    assert_eq!(r["status"], 302, "{r}");
    assert_eq!(
        e.metric("lasthop_engine_quic_amplification_limited_total"),
        Some(1.0)
    );
    assert_eq!(e.metric("lasthop_engine_quic_handshakes_total"), Some(1.0));
}
