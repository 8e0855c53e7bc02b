//! A TLS handshake load generator for `perf/tls.sh`: CONNS threads, each opening connection
//! after connection to ADDR for SECS seconds, sending one `GET /PATH` with `Connection: close`
//! and reading the answer to its end; prints the connections completed and how many of them
//! resumed.
//!
//! `openssl s_time -new` verifies the server's ECDSA signature on every handshake, which costs
//! the client more than the signature costs the server, so on a 2-core machine four of them
//! leave the server mostly idle; wrk resumes (it keeps its session across reconnects). This
//! client, on rustls and ring like the engine, checks nothing about the certificate (as wrk
//! does not) and chooses whether to resume, so one core of it can keep a server core busy with
//! full handshakes:
//!
//! - `full`: TLS 1.3, resumption off: every connection a full handshake (X25519, the server's
//!   P-256 signature, the key schedule);
//! - `resumed13`: TLS 1.3 resuming with the ticket of the previous connection (psk_dhe_ke);
//! - `resumed12`: TLS 1.2 resuming with a session ticket (no asymmetric crypto).
//!
//! `cargo run --release -p lasthop-benches --example tls_load -- ADDR PATH MODE CONNS SECS`

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate and signature: this measures the server, not the client.
#[derive(Debug)]
struct NoCheck(Vec<SignatureScheme>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "tls_load ADDR PATH full|resumed13|resumed12 CONNS SECS";
    let (Some(addr), Some(path), Some(mode)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().expect("ADDR is ip:port");
    let conns: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16);
    let secs: u64 = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(5);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match mode.as_str() {
        "resumed12" => &[&rustls::version::TLS12],
        "full" | "resumed13" => &[&rustls::version::TLS13],
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let schemes = provider
        .signature_verification_algorithms
        .supported_schemes();
    let mut config =
        ClientConfig::builder_with_provider(Arc::clone(&provider) as Arc<CryptoProvider>)
            .with_protocol_versions(versions)
            .expect("protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCheck(schemes)))
            .with_no_client_auth();
    if mode == "full" {
        config.resumption = Resumption::disabled();
    }
    let config = Arc::new(config);
    let request = format!("GET /{path} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let (done, resumed, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let until = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            // Each thread its own config (and so its own ticket store): a thread resumes the
            // session its previous connection got.
            let config = Arc::new((*config).clone());
            let (done, resumed, failed) = (done.clone(), resumed.clone(), failed.clone());
            let request = request.clone();
            std::thread::spawn(move || {
                let name = ServerName::try_from("lh.test").expect("a DNS name");
                let mut answer = Vec::with_capacity(4096);
                while Instant::now() < until {
                    let mut one = || -> std::io::Result<bool> {
                        let mut conn = ClientConnection::new(Arc::clone(&config), name.clone())
                            .map_err(std::io::Error::other)?;
                        let mut sock = TcpStream::connect(addr)?;
                        sock.set_nodelay(true)?;
                        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                        tls.write_all(request.as_bytes())?;
                        answer.clear();
                        match tls.read_to_end(&mut answer) {
                            Ok(_) => {}
                            // A server that closes without close_notify after `Connection: close`.
                            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                            Err(e) => return Err(e),
                        }
                        if !answer.starts_with(b"HTTP/1.1 ") {
                            return Err(std::io::Error::other("no HTTP answer"));
                        }
                        Ok(conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed))
                    };
                    match one() {
                        Ok(r) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            resumed.fetch_add(u64::from(r), Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    println!(
        "{} connections in {secs} s, {} resumed, {} failed",
        done.load(Ordering::Relaxed),
        resumed.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
}
