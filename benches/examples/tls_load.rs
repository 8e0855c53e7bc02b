//! A TLS handshake load generator for `perf/tls.sh`: CONNS connections at a time to ADDR for
//! SECS seconds, each sending one `GET /PATH` with `Connection: close` and reading the answer
//! to its end, a finished one replaced at once; prints the connections completed and how many
//! of them resumed.
//!
//! One thread drives them all on one poll (mio, edge-triggered), as wrk does. The first version
//! ran a blocking thread per connection: every read parked a thread, so every segment the
//! server sent woke one, and on loopback that wake-up (the IPI to the client's core) is paid in
//! the server's send, on the server's core. A busy event loop is seldom asleep when a segment
//! arrives, so the server pays a client's wake-up about as rarely as it would across a wire.
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
//! GROUP (default `X25519`) is the one key exchange group offered (`X25519MLKEM768` from
//! aws-lc-rs, as the engine has it; `X25519`, `secp256r1`, `secp384r1` from ring), so each
//! group's handshakes can be counted alone.
//!
//! `cargo run --release -p lasthop-benches --example tls_load -- ADDR PATH MODE CONNS SECS [GROUP]`

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "tls_load ADDR PATH full|resumed13|resumed12 CONNS SECS [GROUP]";
    let (Some(addr), Some(path), Some(mode)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().expect("ADDR is ip:port");
    let conns: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16);
    let secs: u64 = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(5);
    let group = args.get(6).map(String::as_str).unwrap_or("X25519");
    let Some(group) = lasthop_benches::kx_group(group) else {
        eprintln!("{usage}: no group {group}");
        std::process::exit(2);
    };
    let provider = Arc::new(CryptoProvider {
        kx_groups: vec![group],
        ..rustls::crypto::ring::default_provider()
    });
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
            .with_custom_certificate_verifier(Arc::new(lasthop_benches::NoCheck(schemes)))
            .with_no_client_auth();
    if mode == "full" {
        config.resumption = Resumption::disabled();
    }
    let request = format!("GET /{path} HTTP/1.1\r\nHost: lh.test\r\nConnection: close\r\n\r\n");
    let until = Instant::now() + Duration::from_secs(secs);
    let mut load = Load::new(addr, config, request.into_bytes(), conns);
    load.run(until);
    println!(
        "{} connections in {secs} s, {} resumed, {} failed",
        load.done, load.resumed, load.failed
    );
}

/// One connection in flight.
struct Conn {
    sock: TcpStream,
    tls: ClientConnection,
    answer: Vec<u8>,
}

/// CONNS connections on one thread's poll: a finished one is replaced at once.
struct Load {
    addr: SocketAddr,
    /// Per slot: each its own config (and so its own ticket store), so a slot resumes the
    /// session its previous connection got.
    configs: Vec<Arc<ClientConfig>>,
    request: Vec<u8>,
    poll: Poll,
    slots: Vec<Option<Conn>>,
    done: u64,
    resumed: u64,
    failed: u64,
}

impl Load {
    fn new(addr: SocketAddr, config: ClientConfig, request: Vec<u8>, conns: usize) -> Load {
        Load {
            addr,
            configs: (0..conns).map(|_| Arc::new(config.clone())).collect(),
            request,
            poll: Poll::new().expect("a poll"),
            slots: (0..conns).map(|_| None).collect(),
            done: 0,
            resumed: 0,
            failed: 0,
        }
    }

    fn run(&mut self, until: Instant) {
        for slot in 0..self.slots.len() {
            self.open(slot);
        }
        let mut events = Events::with_capacity(1024);
        while Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(left)) {
                assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
                continue;
            }
            for event in events.iter() {
                let slot = event.token().0;
                match self.drive(slot) {
                    Ok(None) => {}
                    Ok(Some(resumed)) => {
                        self.done += 1;
                        self.resumed += u64::from(resumed);
                        self.close(slot);
                        if Instant::now() < until {
                            self.open(slot);
                        }
                    }
                    Err(_) => {
                        self.failed += 1;
                        self.close(slot);
                        if Instant::now() < until {
                            self.open(slot);
                        }
                    }
                }
            }
        }
    }

    /// Starts slot's next connection: a non-blocking connect, the request queued in rustls
    /// until the handshake is done.
    fn open(&mut self, slot: usize) {
        let name = ServerName::try_from("lh.test").expect("a DNS name");
        let started = ClientConnection::new(Arc::clone(&self.configs[slot]), name)
            .map_err(std::io::Error::other)
            .and_then(|mut tls| {
                tls.writer().write_all(&self.request)?;
                let mut sock = TcpStream::connect(self.addr)?;
                sock.set_nodelay(true)?;
                self.poll.registry().register(
                    &mut sock,
                    Token(slot),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                Ok(Conn {
                    sock,
                    tls,
                    answer: Vec::with_capacity(4096),
                })
            });
        match started {
            Ok(conn) => self.slots[slot] = Some(conn),
            Err(_) => self.failed += 1,
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut conn) = self.slots[slot].take() {
            let _ = self.poll.registry().deregister(&mut conn.sock);
        }
    }

    /// Moves slot's connection as far as its socket allows (edge-triggered: reads and writes
    /// until they would block). `Some(resumed)` once the whole answer is in.
    fn drive(&mut self, slot: usize) -> std::io::Result<Option<bool>> {
        let Some(conn) = self.slots[slot].as_mut() else {
            return Ok(None);
        };
        loop {
            let mut progress = false;
            while conn.tls.wants_write() {
                match conn.tls.write_tls(&mut conn.sock) {
                    Ok(_) => progress = true,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // Not connected yet: the writable event comes once it is.
                    Err(e) if e.kind() == std::io::ErrorKind::NotConnected => break,
                    Err(e) => return Err(e),
                }
            }
            let mut eof = false;
            match conn.tls.read_tls(&mut conn.sock) {
                Ok(0) => eof = true,
                Ok(_) => {
                    progress = true;
                    conn.tls
                        .process_new_packets()
                        .map_err(std::io::Error::other)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {}
                Err(e) => return Err(e),
            }
            let mut closed = eof;
            loop {
                let mut buf = [0u8; 4096];
                match conn.tls.reader().read(&mut buf) {
                    // close_notify: the answer is whole.
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => conn.answer.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // A server that closes without close_notify after `Connection: close`.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        closed = true;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if closed {
                if !conn.answer.starts_with(b"HTTP/1.1 ") {
                    return Err(std::io::Error::other("no HTTP answer"));
                }
                return Ok(Some(
                    conn.tls.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
                ));
            }
            if !progress {
                return Ok(None);
            }
        }
    }
}
