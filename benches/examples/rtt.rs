//! Round trips to the redirect, through a userspace delay relay (this kernel has no netem).
//!
//!   rtt relay --tcp-to ADDR --udp-to ADDR --delay-ms D
//!       Prints `tcp ADDR` and `udp ADDR`, then forwards: every chunk of a TCP stream and every
//!       UDP datagram is held D ms in each direction. Runs until its stdin closes.
//!   rtt tcp --via ADDR --ca PEM --path /CODE --delay-ms D [--rounds N]
//!       A new visitor (a full TLS 1.3 handshake, then the GET) and a returning one (resumed,
//!       the GET in 0-RTT early data), each timed from the connect to the answer's status line;
//!       prints `tcp-full MS` and `tcp-early MS` (medians of N).
//!
//! A userspace relay cannot delay TCP's own handshake (the kernel completes it with the relay
//! at once), so the TCP client waits one round trip (2 D) after its connect before it sends:
//! the SYN / SYN-ACK exchange every real visitor pays. UDP needs no such model: QUIC's every
//! packet goes through the relay.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let delay = Duration::from_millis(
        arg(&args, "--delay-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    );
    match args.first().map(String::as_str) {
        Some("relay") => relay(
            arg(&args, "--tcp-to").expect("--tcp-to").parse().unwrap(),
            arg(&args, "--udp-to").expect("--udp-to").parse().unwrap(),
            delay,
        ),
        Some("tcp") => tcp(
            arg(&args, "--via").expect("--via").parse().unwrap(),
            &arg(&args, "--ca").expect("--ca"),
            &arg(&args, "--path").expect("--path"),
            delay,
            arg(&args, "--rounds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(9),
        ),
        _ => {
            eprintln!("usage: rtt relay ... | rtt tcp ... (see the source's doc)");
            std::process::exit(2);
        }
    }
}

/// A FIFO whose items come out `delay` after they went in (every item has the same delay, so
/// first in is first due).
fn delayer<T: Send + 'static>(
    delay: Duration,
    mut deliver: impl FnMut(T) + Send + 'static,
) -> mpsc::Sender<T> {
    let (tx, rx) = mpsc::channel::<(Instant, T)>();
    std::thread::spawn(move || {
        for (due, item) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            deliver(item);
        }
    });
    let (in_tx, in_rx) = mpsc::channel::<T>();
    std::thread::spawn(move || {
        for item in in_rx {
            if tx.send((Instant::now() + delay, item)).is_err() {
                break;
            }
        }
    });
    in_tx
}

fn relay(tcp_to: SocketAddr, udp_to: SocketAddr, delay: Duration) {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    println!("tcp {}", tcp.local_addr().unwrap());
    println!("udp {}", udp.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    std::thread::spawn(move || {
        for client in tcp.incoming().flatten() {
            let Ok(server) = TcpStream::connect(tcp_to) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            pump(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                delay,
            );
            pump(server, client, delay);
        }
    });
    // UDP: one upstream socket per client address, each direction through its own delayer.
    let to_client = {
        let udp = Arc::clone(&udp);
        delayer(delay, move |(to, data): (SocketAddr, Vec<u8>)| {
            let _ = udp.send_to(&data, to);
        })
    };
    std::thread::spawn(move || {
        let mut upstream: std::collections::HashMap<SocketAddr, mpsc::Sender<Vec<u8>>> =
            Default::default();
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let tx = upstream.entry(from).or_insert_with(|| {
                let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                sock.connect(udp_to).unwrap();
                let back = to_client.clone();
                let reader = Arc::clone(&sock);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while let Ok(n) = reader.recv(&mut buf) {
                        if back.send((from, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                });
                delayer(delay, move |data: Vec<u8>| {
                    let _ = sock.send(&data);
                })
            });
            let _ = tx.send(buf[..n].to_vec());
        }
    });
    // Until the caller closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Copies `from` to `to`, each chunk `delay` later; the write side is shut when `from` ends.
fn pump(mut from: TcpStream, to: TcpStream, delay: Duration) {
    let mut to_w = to;
    let tx = delayer(delay, move |chunk: Option<Vec<u8>>| match chunk {
        Some(c) => {
            let _ = to_w.write_all(&c);
        }
        None => {
            let _ = to_w.shutdown(std::net::Shutdown::Write);
        }
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    break;
                }
                Ok(n) => {
                    let _ = tx.send(Some(buf[..n].to_vec()));
                }
            }
        }
    });
}

fn client_config(ca: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).expect("--ca");
    for cert in rustls_pemfile_certs(&pem) {
        roots.add(cert).unwrap();
    }
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.enable_early_data = true;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// The certificates of a PEM file (rustls' own PEM reader).
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates")
}

/// One visit: connect (then the modelled SYN round trip), TLS, the GET (in early data when the
/// config holds a ticket that allows it), until the status line; the time it took.
fn visit(
    config: &Arc<rustls::ClientConfig>,
    via: SocketAddr,
    get: &[u8],
    delay: Duration,
) -> (Duration, bool) {
    let started = Instant::now();
    let mut sock = TcpStream::connect(via).unwrap();
    sock.set_nodelay(true).unwrap();
    std::thread::sleep(delay * 2);
    let mut conn =
        rustls::ClientConnection::new(Arc::clone(config), "lh.test".try_into().unwrap()).unwrap();
    let mut early = false;
    if let Some(mut e) = conn.early_data() {
        e.write_all(get).unwrap();
        early = true;
    }
    if !early {
        conn.writer().write_all(get).unwrap();
    }
    let mut plain = Vec::new();
    let mut buf = [0u8; 16_384];
    loop {
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        let _ = conn.reader().read_to_end(&mut plain);
        if plain.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer");
        let mut data = &buf[..n];
        while !data.is_empty() {
            conn.read_tls(&mut data).unwrap();
            conn.process_new_packets().unwrap();
        }
    }
    let took = started.elapsed();
    assert!(
        plain.starts_with(b"HTTP/1.1 302"),
        "{}",
        String::from_utf8_lossy(&plain)
    );
    // Let the ticket arrive (sent after the client's Finished) before closing.
    sock.set_read_timeout(Some(delay * 4 + Duration::from_millis(20)))
        .unwrap();
    let deadline = Instant::now() + delay * 4 + Duration::from_millis(20);
    while Instant::now() < deadline {
        while conn.wants_write() {
            let _ = conn.write_tls(&mut sock);
        }
        match sock.read(&mut buf) {
            Ok(n) if n > 0 => {
                let mut data = &buf[..n];
                while !data.is_empty() {
                    if conn.read_tls(&mut data).is_err() {
                        break;
                    }
                    let _ = conn.process_new_packets();
                }
            }
            _ => break,
        }
    }
    (took, early && conn.is_early_data_accepted())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn tcp(via: SocketAddr, ca: &str, path: &str, delay: Duration, rounds: usize) {
    let get = format!("GET {path} HTTP/1.1\r\nHost: lh.test\r\nUser-Agent: rtt/1\r\n\r\n");
    let mut full = Vec::new();
    let mut early = Vec::new();
    for _ in 0..rounds {
        // A new visitor: a config with no ticket.
        let config = client_config(ca);
        let (t, _) = visit(&config, via, get.as_bytes(), delay);
        full.push(t.as_secs_f64() * 1e3);
        // The same visitor again: resumed, the GET in 0-RTT.
        let (t, accepted) = visit(&config, via, get.as_bytes(), delay);
        assert!(accepted, "early data was not accepted");
        early.push(t.as_secs_f64() * 1e3);
    }
    println!("tcp-full {:.1}", median(full));
    println!("tcp-early {:.1}", median(early));
}
