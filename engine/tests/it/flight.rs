//! The TLS first flight with a rustls client that says exactly what it offers: the
//! post-quantum hybrid (X25519MLKEM768) and X25519 each alone on the io_uring listener (the
//! AF_XDP one in `xdp`), `--tls-groups` refusing what it leaves out, the certificate chain
//! compressed for clients that ask (RFC 8879) and not with `--no-tls-cert-compression`, a
//! ClientHello that reaches the server in pieces, and testssl.sh's vulnerability scan.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::{aws_lc_rs, ring, SupportedKxGroup};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, NamedGroup};

use lasthop_testkit::{pki, Engine, Pki, Site};

use crate::tls::links;

/// What a client offers: its key exchange groups (one key share, for the first) and whether
/// it takes a compressed certificate chain.
#[derive(Clone, Copy)]
pub(crate) struct Offer {
    pub(crate) groups: &'static [&'static dyn SupportedKxGroup],
    pub(crate) decompress: bool,
}

pub(crate) const HYBRID: &[&dyn SupportedKxGroup] = &[aws_lc_rs::kx_group::X25519MLKEM768];
pub(crate) const X25519: &[&dyn SupportedKxGroup] = &[ring::kx_group::X25519];
pub(crate) const HYBRID_AND_X25519: &[&dyn SupportedKxGroup] = &[
    aws_lc_rs::kx_group::X25519MLKEM768,
    aws_lc_rs::kx_group::X25519,
];

/// A TLS 1.3 client for `lh.test` trusting `ca` alone, offering `offer`, ALPN http/1.1.
pub(crate) fn client(ca: &Path, offer: Offer) -> ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    for cert in lasthop_tls::certs(ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let provider = rustls::crypto::CryptoProvider {
        kx_groups: offer.groups.to_vec(),
        ..ring::default_provider()
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !offer.decompress {
        config.cert_decompressors = Vec::new();
    }
    config.resumption = rustls::client::Resumption::disabled();
    ClientConnection::new(Arc::new(config), ServerName::try_from("lh.test").unwrap()).unwrap()
}

/// What one exchange saw.
#[derive(Debug)]
pub(crate) struct Seen {
    /// The group the handshake agreed on.
    pub(crate) group: Option<NamedGroup>,
    /// The ClientHello's bytes on the wire.
    pub(crate) hello: usize,
    /// The server's first flight on the wire: every byte it sent before it had the client's
    /// Finished (ServerHello through Finished; the server sends nothing more until then).
    pub(crate) flight: usize,
    /// The answer, whole (the request asks to close).
    pub(crate) answer: String,
}

/// The client's pending TLS bytes.
pub(crate) fn tls_out(c: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out).unwrap();
    }
    out
}

/// Feeds `data` to the client; the plaintext it yields goes to `plain`.
pub(crate) fn tls_in(
    c: &mut ClientConnection,
    mut data: &[u8],
    plain: &mut Vec<u8>,
) -> Result<(), rustls::Error> {
    while !data.is_empty() {
        c.read_tls(&mut data).unwrap();
        c.process_new_packets()?;
        let _ = c.reader().read_to_end(plain);
    }
    Ok(())
}

/// A GET of `/code` that closes the connection.
pub(crate) fn get(code: &str) -> Vec<u8> {
    format!("GET /{code} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n").into_bytes()
}

/// One request over TLS to `addr` (the ClientHello cut at `cuts`, each piece written alone
/// with a pause between, TCP_NODELAY so each is its own segment).
pub(crate) fn exchange(
    addr: &str,
    pki: &Pki,
    offer: Offer,
    cuts: &[usize],
    request: &[u8],
) -> Result<Seen, String> {
    let mut c = client(&pki.ca, offer);
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = tls_out(&mut c);
    if cuts.last().is_some_and(|&cut| cut >= hello.len()) {
        return Err(format!(
            "a {} byte ClientHello, cut at {cuts:?}",
            hello.len()
        ));
    }
    let mut at = 0;
    for &cut in cuts.iter().chain([&hello.len()]) {
        s.write_all(&hello[at..cut]).unwrap();
        at = cut;
        if at < hello.len() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (mut flight, mut plain, mut buf) = (0, Vec::new(), vec![0u8; 16_384]);
    while c.is_handshaking() {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("reading the flight: {e}"))?;
        if n == 0 {
            return Err("closed during the handshake".into());
        }
        flight += n;
        tls_in(&mut c, &buf[..n], &mut plain).map_err(|e| e.to_string())?;
        if c.is_handshaking() {
            // A second ClientHello after a HelloRetryRequest.
            s.write_all(&tls_out(&mut c)).unwrap();
        }
    }
    let group = c.negotiated_key_exchange_group().map(|g| g.name());
    c.writer().write_all(request).unwrap();
    s.write_all(&tls_out(&mut c)).unwrap();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Err(e) = tls_in(&mut c, &buf[..n], &mut plain) {
                    return Err(format!("after the handshake: {e}"));
                }
            }
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
        s.write_all(&tls_out(&mut c)).ok();
    }
    Ok(Seen {
        group,
        hello: hello.len(),
        flight,
        answer: String::from_utf8_lossy(&plain).into_owned(),
    })
}

/// `tls::start` (HTTPS through userspace rustls) on the `io` backend.
fn start(site: &Site, pki: &Pki, io: &str, extra: &[&str]) -> Engine {
    crate::tls::start(site, pki, &[&["--io", io][..], extra].concat())
}

fn key_exchanges(e: &Engine, group: &str) -> f64 {
    e.metric(&format!(
        "lasthop_engine_tls_key_exchanges_total{{group=\"{group}\"}}"
    ))
    .unwrap_or(-1.0)
}

/// A client offering only the hybrid and one offering only X25519 both complete on `addr`,
/// each with its group, and get the redirect.
pub(crate) fn check_each_group_alone(addr: &str, pki: &Pki, code: &str, what: &str) {
    for (groups, want) in [
        (HYBRID, NamedGroup::X25519MLKEM768),
        (X25519, NamedGroup::X25519),
    ] {
        let offer = Offer {
            groups,
            decompress: true,
        };
        let seen = exchange(addr, pki, offer, &[], &get(code))
            .unwrap_or_else(|err| panic!("{what}, {want:?}: {err}"));
        assert_eq!(seen.group, Some(want), "{what}");
        assert!(
            seen.answer.starts_with("HTTP/1.1 302 Found"),
            "{what}: {seen:?}"
        );
        if want == NamedGroup::X25519MLKEM768 {
            // The hybrid share is 1,184 + 32 bytes; the ServerHello's, a 1,088-byte ciphertext
            // and 32.
            assert!(
                seen.hello > 1216,
                "{what}: a {} byte ClientHello",
                seen.hello
            );
            assert!(seen.flight > 1088 + 32, "{what}: {seen:?}");
        }
    }
}

/// A browser-like ClientHello (the hybrid's share and X25519's, rustls reusing the hybrid's
/// X25519 half for it: past one 1,460-byte segment) written in pieces, each its own segment:
/// at a 1,460-byte MSS (two), at 536 (three), and the record header itself cut.
pub(crate) fn check_hello_in_pieces(addr: &str, pki: &Pki, code: &str, what: &str) {
    let offer = Offer {
        groups: HYBRID_AND_X25519,
        decompress: true,
    };
    for cuts in [&[1460][..], &[536, 1072], &[3, 700]] {
        let seen = exchange(addr, pki, offer, cuts, &get(code))
            .unwrap_or_else(|err| panic!("{what}, cut at {cuts:?}: {err}"));
        assert_eq!(seen.group, Some(NamedGroup::X25519MLKEM768), "{what}");
        assert!(
            seen.answer.starts_with("HTTP/1.1 302 Found"),
            "{what}: {seen:?}"
        );
    }
}

/// The io_uring listener (`xdp::the_first_flight_over_af_xdp...` checks the AF_XDP one; the
/// epoll fallback serves no TLS).
#[test]
fn a_client_offering_only_the_hybrid_and_one_offering_only_x25519_both_complete() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, "uring", &[]);
    check_each_group_alone(e.tls.as_deref().unwrap(), &pki, &code, "io_uring");
    assert_eq!(key_exchanges(&e, "X25519MLKEM768"), 1.0);
    assert_eq!(key_exchanges(&e, "X25519"), 1.0);
    assert_eq!(key_exchanges(&e, "secp256r1"), 0.0);
}

#[test]
fn tls_groups_offers_only_the_groups_it_names() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, "uring", &["--tls-groups", "X25519,secp256r1"]);
    let addr = e.tls.clone().unwrap();
    let hybrid = Offer {
        groups: HYBRID,
        decompress: true,
    };
    let err = exchange(&addr, &pki, hybrid, &[], &get(&code)).unwrap_err();
    assert!(
        err.contains("HandshakeFailure") || err.contains("closed"),
        "a hybrid-only client is refused: {err}"
    );
    const HYBRID_THEN_P256: &[&dyn SupportedKxGroup] = &[
        aws_lc_rs::kx_group::X25519MLKEM768,
        ring::kx_group::SECP256R1,
    ];
    let both = Offer {
        groups: HYBRID_THEN_P256,
        decompress: true,
    };
    // It offered secp256r1 too, without a share: a HelloRetryRequest, then secp256r1.
    let seen = exchange(&addr, &pki, both, &[], &get(&code)).unwrap();
    assert_eq!(seen.group, Some(NamedGroup::secp256r1));
    assert!(seen.answer.starts_with("HTTP/1.1 302 Found"), "{seen:?}");
    // A name outside the registry's four is refused at start.
    let out = std::process::Command::new(crate::harness::ENGINE)
        .args(["--tls-groups", "X448", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("X25519MLKEM768"),
        "the refusal lists the groups"
    );
}

#[test]
fn the_certificate_chain_is_compressed_for_clients_that_ask() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    // A leaf and its issuer, as CAs serve them.
    let dir = site.dir.path();
    let chain = [
        std::fs::read(&pki.cert).unwrap(),
        std::fs::read(&pki.ca).unwrap(),
    ]
    .concat();
    std::fs::write(dir.join("chain.pem"), chain).unwrap();
    let pki = Pki {
        ca: pki.ca.clone(),
        cert: dir.join("chain.pem"),
        key: pki.key.clone(),
    };
    let flight = |e: &Engine, decompress: bool| {
        let offer = Offer {
            groups: X25519,
            decompress,
        };
        let seen = exchange(e.tls.as_deref().unwrap(), &pki, offer, &[], &get(&code))
            .unwrap_or_else(|err| panic!("{err}\n{}", e.log()));
        assert!(seen.answer.starts_with("HTTP/1.1 302 Found"), "{seen:?}");
        seen.flight
    };
    let e = start(&site, &pki, "uring", &[]);
    let (compressed, plain) = (flight(&e, true), flight(&e, false));
    drop(e);
    let e = start(&site, &pki, "uring", &["--no-tls-cert-compression"]);
    let off = flight(&e, true);
    // The chain shrinks by more than an ECDSA signature's length can vary (a few bytes).
    assert!(
        compressed + 40 < plain,
        "compressed {compressed} bytes, uncompressed {plain}"
    );
    assert!(
        off.abs_diff(plain) <= 4,
        "--no-tls-cert-compression sends it whole: {off} vs {plain}"
    );
}

#[test]
fn a_client_hello_in_pieces_is_reassembled() {
    let site = Site::new();
    let code = links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, "uring", &[]);
    check_hello_in_pieces(e.tls.as_deref().unwrap(), &pki, &code, "io_uring");
}

/// testssl.sh's vulnerability checks (`-U`: Heartbleed, CCS, Ticketbleed, ROBOT,
/// renegotiation, CRIME, BREACH, POODLE, fallback, SWEET32, FREAK, DROWN, LOGJAM, BEAST,
/// LUCKY13, RC4) find nothing on the HTTPS listener as it starts by default.
#[test]
fn testssl_finds_no_vulnerability() {
    if Command::new("testssl").arg("--version").output().is_err() {
        lasthop_testkit::skip(
            "flight::testssl_finds_no_vulnerability",
            "testssl is not installed (apt install testssl.sh)",
        );
        return;
    }
    let site = Site::new();
    links(&site);
    let pki = pki(&site, false);
    let e = start(&site, &pki, "uring", &["--cores", "1"]);
    let json = site.dir.path().join("testssl.json");
    let out = Command::new("timeout")
        .arg("300")
        .arg("testssl")
        .args([
            "--quiet",
            "--color",
            "0",
            "--nodns",
            "none",
            "--warnings",
            "off",
        ])
        .args(["-U", "--jsonfile"])
        .arg(&json)
        .arg(e.tls.as_deref().unwrap())
        .output()
        .expect("testssl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let findings: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap_or_default())
            .unwrap_or_else(|err| panic!("testssl's JSON: {err}\n{text}"));
    let severity = |id: &str| {
        findings
            .iter()
            .find(|f| f["id"] == id)
            .and_then(|f| f["severity"].as_str())
            .unwrap_or_else(|| panic!("no {id} in testssl's findings\n{text}"))
            .to_owned()
    };
    for id in [
        "heartbleed",
        "CCS",
        "ticketbleed",
        "secure_client_renego",
        "CRIME_TLS",
    ] {
        assert_eq!(severity(id), "OK", "{id}\n{text}");
    }
    let bad: Vec<&serde_json::Value> = findings
        .iter()
        .filter(|f| {
            matches!(
                f["severity"].as_str(),
                Some("LOW" | "MEDIUM" | "HIGH" | "CRITICAL")
            )
        })
        .collect();
    assert!(bad.is_empty(), "{bad:#?}\n{text}");
}
