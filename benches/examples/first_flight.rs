//! The server's first flight on the wire, for `perf/tls.sh`: one TLS 1.3 connection to ADDR
//! offering GROUP alone (as `tls_load` names groups), taking a compressed certificate chain
//! (RFC 8879: brotli, zlib) with `compress` and not with `plain`; prints the ClientHello's
//! bytes and every byte the server sent before it had the client's Finished (ServerHello
//! through Finished: a server sends nothing more until then).
//!
//! `cargo run --release -p lasthop-benches --example first_flight -- ADDR GROUP compress|plain`

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "first_flight ADDR GROUP compress|plain";
    let (Some(addr), Some(group), Some(mode)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let Some(kx) = lasthop_benches::kx_group(group) else {
        eprintln!("{usage}: no group {group}");
        std::process::exit(2);
    };
    let provider = Arc::new(CryptoProvider {
        kx_groups: vec![kx],
        ..rustls::crypto::ring::default_provider()
    });
    let schemes = provider
        .signature_verification_algorithms
        .supported_schemes();
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(lasthop_benches::NoCheck(schemes)))
        .with_no_client_auth();
    config.resumption = Resumption::disabled();
    match mode.as_str() {
        "compress" => {}
        "plain" => config.cert_decompressors = Vec::new(),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
    let name = ServerName::try_from("lh.test").expect("a DNS name");
    let mut tls = ClientConnection::new(Arc::new(config), name).expect("a client");
    let mut sock = TcpStream::connect(addr.as_str()).expect("connects");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a timeout");
    let (mut hello, mut flight) = (0, 0);
    let mut buf = vec![0u8; 65_536];
    while tls.is_handshaking() {
        while tls.wants_write() {
            let mut out = Vec::new();
            tls.write_tls(&mut out).expect("to memory");
            hello += out.len();
            sock.write_all(&out).expect("sends");
        }
        if !tls.is_handshaking() {
            break;
        }
        let n = sock.read(&mut buf).expect("reads the flight");
        assert!(n > 0, "closed during the handshake");
        flight += n;
        let mut input = &buf[..n];
        while !input.is_empty() {
            tls.read_tls(&mut input).expect("from memory");
            tls.process_new_packets().expect("a good handshake");
        }
    }
    let group = tls
        .negotiated_key_exchange_group()
        .map(|g| format!("{:?}", g.name()))
        .unwrap_or_default();
    println!("flight {flight} hello {hello} group {group}");
}
