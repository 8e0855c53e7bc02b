//! The floor of an HTTP/3 request on the engine's QUIC stack: what `quinn-proto` (the QUIC
//! implementation the engine drives, configured as the engine configures it) costs the server
//! per request on a long-lived connection, in memory: no sockets, no syscalls, no HTTP/3
//! framing, no lookup. Put beside what `perf/h3.sh` measures per server CPU-second for the
//! engine's h3 and h2, it says how much of the h3 figure is the QUIC layer itself, and the best
//! h3/h2 ratio any server built on this QUIC stack can reach.
//!
//! - `quinn_server_request`: one established connection (TLS 1.3 on ring, AES-128-GCM, the
//!   engine's transport limits); each round the client opens M = 10 bidirectional streams, each
//!   with a 40-byte request and FIN (what an h3 GET with QPACK's static table takes), the
//!   datagrams go to the server, the server accepts and reads every stream and writes a
//!   120-byte answer with FIN (an h3 302's HEADERS frame), its datagrams go to the client, the
//!   client reads the answers and its acknowledgements go back to the server; the clock steps
//!   1 ms a round and both sides' timers run (delayed ACKs, loss detection). Only the server's
//!   calls are timed (datagrams decrypted and handled, endpoint events, stream accept, read,
//!   write and finish, packets built and encrypted, timers); the figure is per request.
//!
//! Run: `cargo bench -p lasthop-benches --bench quic`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    ServerConfig, StreamId, TransportConfig, VarInt,
};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;

/// Requests in flight on the connection each round (perf/h3.sh's M).
const M: usize = 10;
/// An h3 GET's bytes on its stream (HEADERS with QPACK static references and a short path).
const REQUEST: [u8; 40] = [0x41; 40];
/// An h3 302's bytes on its stream (HEADERS: status, location, content-length, alt-svc).
const ANSWER: [u8; 120] = [0x52; 120];
/// Datagrams per poll_transmit, as the engine asks with GSO.
const MAX_GSO: usize = 10;

/// The certificate a resolver hands out for every name.
#[derive(Debug)]
struct SingleCert(Arc<CertifiedKey>);

impl ResolvesServerCert for SingleCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

/// The server as the engine configures its QUIC listener (`engine/src/quic/mod.rs`,
/// `engine/src/tls/config.rs`): TLS 1.3 only, ALPN h3, a session cache with 0-RTT, 100
/// bidirectional and 8 unidirectional streams, 64 KiB windows, no MTU discovery, no
/// datagrams; and a client of the same suites that checks nothing.
fn configs() -> (Arc<ServerConfig>, ClientConfig) {
    use rustls::crypto::ring::cipher_suite as cs;
    let provider = Arc::new(CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
        ],
        kx_groups: vec![rustls::crypto::ring::kx_group::X25519],
        ..rustls::crypto::ring::default_provider()
    });
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &SystemRandom::new())
        .expect("a P-256 key");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.as_ref().to_vec()));
    let signer = provider
        .key_provider
        .load_private_key(key)
        .expect("the P-256 key");
    // The client checks nothing, so a blob of a real leaf's length stands in for it.
    let chain = vec![CertificateDer::from(vec![0x30u8; 560])];
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCert(Arc::new(CertifiedKey::new(
            chain, signer,
        )))));
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.ignore_client_order = true;
    tls.session_storage = ServerSessionMemoryCache::new(16_384);
    tls.max_early_data_size = u32::MAX;
    let crypto = QuicServerConfig::try_from(Arc::new(tls)).expect("a QUIC-capable TLS config");
    let mut server = ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(100))
        .max_concurrent_uni_streams(VarInt::from_u32(8))
        .receive_window(VarInt::from_u32(64 * 1024))
        .stream_receive_window(VarInt::from_u32(64 * 1024))
        .mtu_discovery_config(None)
        .datagram_receive_buffer_size(None);
    server.transport_config(Arc::new(transport));

    let client = lasthop_benches::NoCheck::tls13_client(provider, b"h3");
    let client = QuicClientConfig::try_from(Arc::new(client)).expect("a QUIC-capable client");
    (Arc::new(server), ClientConfig::new(Arc::new(client)))
}

/// One side of the connection: its endpoint, its connection and its address.
struct Side {
    endpoint: Endpoint,
    conn: Option<(ConnectionHandle, Connection)>,
    addr: SocketAddr,
}

impl Side {
    /// Hands `datagram` from `from` to this side (a server accepts a new connection).
    fn receive(&mut self, now: Instant, from: SocketAddr, datagram: &[u8], buf: &mut Vec<u8>) {
        buf.clear();
        match self.endpoint.handle(
            now,
            from,
            Some(self.addr.ip()),
            None,
            BytesMut::from(datagram),
            buf,
        ) {
            Some(DatagramEvent::NewConnection(incoming)) => {
                let accepted = self
                    .endpoint
                    .accept(incoming, now, buf, None)
                    .expect("the server accepts the connection");
                self.conn = Some(accepted);
            }
            Some(DatagramEvent::ConnectionEvent(_, event)) => {
                if let Some((_, conn)) = self.conn.as_mut() {
                    conn.handle_event(event);
                }
            }
            Some(DatagramEvent::Response(_)) | None => {}
        }
    }

    /// Timers due at `now`, endpoint events, and the datagrams the connection has to send
    /// (appended to `out`).
    fn drive(&mut self, now: Instant, out: &mut Vec<Vec<u8>>, buf: &mut Vec<u8>) {
        let Some((ch, conn)) = self.conn.as_mut() else {
            return;
        };
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(*ch, ev) {
                conn.handle_event(back);
            }
        }
        while conn.poll().is_some() {}
        loop {
            buf.clear();
            let Some(t) = conn.poll_transmit(now, MAX_GSO, buf) else {
                break;
            };
            let seg = t.segment_size.unwrap_or(t.size);
            out.extend(buf[..t.size].chunks(seg).map(<[u8]>::to_vec));
        }
    }

    fn conn(&mut self) -> &mut Connection {
        &mut self.conn.as_mut().expect("a connection").1
    }
}

/// Reads every stream of `conn` in `ids` to its end; the count of streams that ended.
fn read_all(conn: &mut Connection, ids: &[StreamId]) -> usize {
    let mut ended = 0;
    for &id in ids {
        let mut recv = conn.recv_stream(id);
        let Ok(mut chunks) = recv.read(true) else {
            continue;
        };
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    ended += 1;
                    break;
                }
                Err(_) => break,
            }
        }
        let _ = chunks.finalize();
    }
    ended
}

/// A connection between a client and a server in memory, established, and the clock they
/// share.
struct Pair {
    client: Side,
    server: Side,
    now: Instant,
    buf: Vec<u8>,
}

impl Pair {
    fn new() -> Pair {
        let (server_config, client_config) = configs();
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let endpoint = Arc::new(EndpointConfig::default());
        let server = Side {
            endpoint: Endpoint::new(Arc::clone(&endpoint), Some(server_config), false, None),
            conn: None,
            addr: SocketAddr::new(localhost, 443),
        };
        let mut client = Side {
            endpoint: Endpoint::new(endpoint, None, false, None),
            conn: None,
            addr: SocketAddr::new(localhost, 50_000),
        };
        let now = Instant::now();
        let conn = client
            .endpoint
            .connect(now, client_config, server.addr, "lh.test")
            .expect("the client connects");
        client.conn = Some(conn);
        let mut pair = Pair {
            client,
            server,
            now,
            buf: Vec::new(),
        };
        for _ in 0..100 {
            pair.exchange(None);
            if !pair.client.conn().is_handshaking() && !pair.server.conn().is_handshaking() {
                // A few more rounds for the handshake's last acknowledgements and tickets.
                for _ in 0..5 {
                    pair.exchange(None);
                }
                return pair;
            }
        }
        panic!("the in-memory handshake did not complete");
    }

    /// One round trip: the client's datagrams to the server, the server's back, the client's
    /// acknowledgements to the server; the server's calls timed into `timed` when given.
    fn exchange(&mut self, timed: Option<&mut Duration>) {
        let mut to_server = Vec::new();
        self.client.drive(self.now, &mut to_server, &mut self.buf);
        let mut to_client = Vec::new();
        let start = Instant::now();
        for d in &to_server {
            self.server
                .receive(self.now, self.client.addr, d, &mut self.buf);
        }
        self.server.drive(self.now, &mut to_client, &mut self.buf);
        if let Some(t) = timed {
            *t += start.elapsed();
        }
        for d in &to_client {
            self.client
                .receive(self.now, self.server.addr, d, &mut self.buf);
        }
        self.now += Duration::from_millis(1);
    }
}

/// Runs `rounds` rounds of M requests; the time spent in the server's calls.
fn requests(pair: &mut Pair, rounds: u64) -> Duration {
    let mut timed = Duration::ZERO;
    let mut opened = Vec::with_capacity(M);
    let mut accepted = Vec::with_capacity(M);
    for _ in 0..rounds {
        opened.clear();
        let client = pair.client.conn();
        for _ in 0..M {
            let id = client
                .streams()
                .open(Dir::Bi)
                .expect("stream credit (the server grants it as streams close)");
            client.send_stream(id).write(&REQUEST).expect("write");
            client.send_stream(id).finish().expect("finish");
            opened.push(id);
        }
        let mut to_server = Vec::new();
        pair.client.drive(pair.now, &mut to_server, &mut pair.buf);

        // The server: the requests in, the answers out.
        let start = Instant::now();
        for d in &to_server {
            pair.server
                .receive(pair.now, pair.client.addr, d, &mut pair.buf);
        }
        let server = pair.server.conn();
        while server.poll().is_some() {}
        accepted.clear();
        while let Some(id) = server.streams().accept(Dir::Bi) {
            accepted.push(id);
        }
        let ended = read_all(server, &accepted);
        for &id in &accepted {
            let mut send = server.send_stream(id);
            send.write(&ANSWER).expect("answer");
            send.finish().expect("finish");
        }
        let mut to_client = Vec::new();
        pair.server.drive(pair.now, &mut to_client, &mut pair.buf);
        timed += start.elapsed();
        assert_eq!(ended, M, "every request arrived whole in one round");

        for d in &to_client {
            pair.client
                .receive(pair.now, pair.server.addr, d, &mut pair.buf);
        }
        let client = pair.client.conn();
        while client.poll().is_some() {}
        assert_eq!(read_all(client, &opened), M, "every answer arrived");
        pair.now += Duration::from_millis(1);
        // The client's acknowledgements (and the server's to them) before the next round.
        pair.exchange(Some(&mut timed));
    }
    timed
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("quic");
    group.throughput(Throughput::Elements(1));
    let mut pair = Pair::new();
    group.bench_function("quinn_server_request", |b| {
        b.iter_custom(|iters| {
            let rounds = iters.div_ceil(M as u64);
            let spent = requests(&mut pair, rounds);
            spent.mul_f64(iters as f64 / (rounds * M as u64) as f64)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
