//! QUIC v1 (RFC 9000/9001) and HTTP/3 on a serving core: `quinn-proto`'s sans-I/O endpoint and
//! connections, driven by the core's loop through [`QuicCore`] (datagrams in, timers, origin
//! replies, transmits out), with [`lasthop_edge::h3`] on each connection's streams.
//!
//! - One endpoint per core over its own SO_REUSEPORT UDP socket. Connection IDs are 8 bytes
//!   whose first is the core ([`CoreCids`]); the socket group's steering program
//!   (`io::udp::steer_by_connection_id`) sends every packet of a connection to that core, a
//!   client whose port changed included. Initial and 0-RTT packets follow the kernel's hash.
//! - One `ServerConfig` for all cores: its rustls configuration (shared session store, the
//!   0-RTT replay guard), its address-validation token key (a Retry issued by one core is
//!   accepted by another) and the transport limits. The stateless-reset key is shared too.
//! - 0-RTT: a request read while the handshake is still running came in early data; it is
//!   answered at once (0.5-RTT data, the server's first flight) with its click flagged early.
//! - Retry (`--quic-retry`): `always`, `never`, or `auto`, once this core has more handshakes in
//!   flight than `--quic-retry-threshold`. The 3× amplification limit before validation is
//!   quinn's (RFC 9000 §8.1); a handshake that reached it is counted.
//! - What quinn does not tell a server is read from each datagram's long headers
//!   ([`lasthop_edge::quic::packets`]): 0-RTT tried (so rejected is counted), the client's first
//!   Handshake packet (its address validated), and the 0-RTT bytes a core holds for handshakes
//!   in flight, bounded by `--quic-max-early-buffer-total` (0-RTT-only datagrams past it are
//!   dropped; the client sends their data again in 1-RTT). `--quic-max-early-buffer` is each
//!   connection's flow-control window, and so what a resuming client may send in 0-RTT.
//! - Transmits: every one of a loop turn (all connections', the endpoint's) is queued and leaves
//!   in one `sendmmsg` at the turn's end ([`QuicCore::flush`]).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use lasthop_edge::h3::{Act, H3Conn, H3Limits};
use lasthop_edge::session::{How, Proto};
use quinn_proto::{
    ConnectionHandle, ConnectionId, ConnectionIdGenerator, DatagramEvent, Dir, EndpointConfig,
    Event, ServerConfig, StreamEvent, StreamId, Transmit, VarInt,
};

use crate::io::udp;
use crate::metrics::prom::{family, sample};
use crate::metrics::CoreMetrics;
use crate::origin::OriginAnswer;
use crate::session::{CoreCtx, CoreEffects};

/// The top byte of the origin tokens of QUIC connections (TCP connections' is 0).
pub const TOKEN_KIND: u64 = 0x51;

/// Connection ID length: the core, then 7 random bytes.
const CID_LEN: usize = 8;

/// Datagrams one GSO send may carry.
const MAX_GSO: usize = 10;

/// When a new Initial is answered with a Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RetryMode {
    /// Once the core has more handshakes in flight than the threshold.
    Auto,
    Always,
    Never,
}

/// What `--quic-*` configure.
#[derive(Debug, Clone)]
pub struct QuicSettings {
    pub retry: RetryMode,
    pub retry_threshold: usize,
    /// 0-RTT (and other early) bytes buffered per incoming connection, and per core in total.
    pub max_early_buffer: u64,
    pub max_early_total: u64,
    pub max_streams: u64,
    pub idle_timeout: Duration,
    pub h3: H3Limits,
}

/// QUIC counters, for all cores.
#[derive(Debug, Default)]
pub struct QuicStats {
    connections: AtomicU64,
    handshakes: AtomicU64,
    zero_rtt: AtomicU64,
    zero_rtt_rejected: AtomicU64,
    amplification_limited: AtomicU64,
    early_dropped: AtomicU64,
    send_batches: AtomicU64,
    retries: AtomicU64,
    refused: AtomicU64,
    packets_in: AtomicU64,
    packets_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    gso_sends: AtomicU64,
    gso_segments: AtomicU64,
    send_errors: AtomicU64,
    recv_errors: AtomicU64,
    resumed: AtomicU64,
    open: AtomicU64,
}

impl QuicStats {
    /// Appends the counters in the Prometheus text format.
    pub fn render(&self, o: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counters: [(&str, &str, &AtomicU64); 17] = [
            (
                "lasthop_engine_quic_connections_total",
                "QUIC connections accepted.",
                &self.connections,
            ),
            (
                "lasthop_engine_quic_handshakes_total",
                "QUIC handshakes completed.",
                &self.handshakes,
            ),
            (
                "lasthop_engine_quic_zero_rtt_accepted_total",
                "QUIC handshakes that accepted the client's 0-RTT early data.",
                &self.zero_rtt,
            ),
            (
                "lasthop_engine_quic_zero_rtt_rejected_total",
                "QUIC handshakes whose client sent 0-RTT packets the server did not accept (no usable ticket, or 0-RTT off): their requests came again in 1-RTT.",
                &self.zero_rtt_rejected,
            ),
            (
                "lasthop_engine_quic_amplification_limited_total",
                "QUIC handshakes whose server flight used up the 3x anti-amplification budget before the client's address was validated (the rest waited for more from the client, RFC 9000 section 8.1).",
                &self.amplification_limited,
            ),
            (
                "lasthop_engine_quic_early_dropped_total",
                "Datagrams of 0-RTT packets alone dropped because the core held --quic-max-early-buffer-total bytes of 0-RTT for handshakes in flight (the client sends their data again in 1-RTT).",
                &self.early_dropped,
            ),
            (
                "lasthop_engine_quic_send_batches_total",
                "sendmmsg batches of the QUIC listener, one or more a loop turn (datagrams per batch: packets_sent over this).",
                &self.send_batches,
            ),
            (
                "lasthop_engine_quic_resumed_total",
                "QUIC handshakes that resumed a session (a ticket found in the session store; the rest of handshakes_total are full).",
                &self.resumed,
            ),
            (
                "lasthop_engine_quic_retries_total",
                "Initials answered with a Retry (address validation).",
                &self.retries,
            ),
            (
                "lasthop_engine_quic_refused_total",
                "Initials refused (draining, or the endpoint's limits).",
                &self.refused,
            ),
            (
                "lasthop_engine_quic_packets_received_total",
                "UDP datagrams received on the QUIC listener.",
                &self.packets_in,
            ),
            (
                "lasthop_engine_quic_packets_sent_total",
                "UDP datagrams sent by the QUIC listener.",
                &self.packets_out,
            ),
            (
                "lasthop_engine_quic_bytes_received_total",
                "UDP payload bytes received on the QUIC listener.",
                &self.bytes_in,
            ),
            (
                "lasthop_engine_quic_bytes_sent_total",
                "UDP payload bytes sent by the QUIC listener.",
                &self.bytes_out,
            ),
            (
                "lasthop_engine_quic_gso_sends_total",
                "sendmsg calls carrying more than one datagram (UDP_SEGMENT).",
                &self.gso_sends,
            ),
            (
                "lasthop_engine_quic_send_errors_total",
                "Datagrams dropped because sendmsg failed (QUIC retransmits).",
                &self.send_errors,
            ),
            (
                "lasthop_engine_quic_receive_errors_total",
                "recvmsg calls on the QUIC listener that failed (the core reads on).",
                &self.recv_errors,
            ),
        ];
        for (name, help, v) in counters {
            family(o, name, "counter", help);
            sample(o, name, "", get(v));
        }
        let name = "lasthop_engine_quic_gso_segments_total";
        family(
            o,
            name,
            "counter",
            "Datagrams sent in sendmsg calls that carried more than one (segments per GSO send: this over gso_sends).",
        );
        sample(o, name, "", get(&self.gso_segments));
        let name = "lasthop_engine_quic_open_connections";
        family(o, name, "gauge", "QUIC connections open.");
        sample(o, name, "", get(&self.open));
    }
}

/// Connection IDs that name their core in their first byte.
#[derive(Debug)]
struct CoreCids {
    core: u8,
}

impl ConnectionIdGenerator for CoreCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut b = [0u8; CID_LEN];
        let _ = getrandom::getrandom(&mut b[1..]);
        b[0] = self.core;
        ConnectionId::new(&b)
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        // Another core's (steering missed it): dropped here rather than answered with a
        // stateless reset that would end that core's connection.
        if cid.len() == CID_LEN && cid[0] == self.core {
            Ok(())
        } else {
            Err(quinn_proto::InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// What every core's endpoint shares.
#[derive(Clone)]
pub struct QuicShared {
    /// The server configuration and its generation (each SIGHUP's [`QuicShared::reload`] makes
    /// the next): each core's endpoint takes a new one on its next tick.
    server: Arc<std::sync::Mutex<(u64, Arc<ServerConfig>)>>,
    /// The generation in `server`, for the cores to compare without the lock.
    generation: Arc<AtomicU64>,
    reset_key: Arc<ring::hmac::Key>,
    settings: QuicSettings,
    pub stats: Arc<QuicStats>,
}

impl std::fmt::Debug for QuicShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicShared")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why the QUIC listener could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    #[error("the TLS configuration has no TLS_AES_128_GCM_SHA256, which QUIC's Initials need")]
    NoInitialSuite,
    #[error("QUIC transport settings: {0}")]
    Config(String),
}

impl QuicShared {
    /// The shared configuration over `tls` (a [`crate::tls::config::quic_server_config`]).
    pub fn new(
        tls: Arc<rustls::ServerConfig>,
        settings: QuicSettings,
        stats: Arc<QuicStats>,
    ) -> Result<QuicShared, QuicError> {
        let tls = counting_resumptions(tls, &stats);
        let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|_| QuicError::NoInitialSuite)?;
        let mut server = ServerConfig::with_crypto(Arc::new(crypto));
        let mut transport = quinn_proto::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(
                VarInt::from_u64(settings.max_streams)
                    .map_err(|e| QuicError::Config(e.to_string()))?,
            )
            // The client's control stream and its two QPACK streams, and room for GREASE.
            .max_concurrent_uni_streams(VarInt::from_u32(8))
            // What a client may send before the server has read it: its initial_max_data,
            // which a resuming client remembers, so also what it may send in 0-RTT.
            .receive_window(
                VarInt::from_u64(settings.max_early_buffer)
                    .map_err(|e| QuicError::Config(e.to_string()))?,
            )
            .stream_receive_window(
                VarInt::from_u64(settings.max_early_buffer)
                    .map_err(|e| QuicError::Config(e.to_string()))?,
            )
            .max_idle_timeout(Some(
                VarInt::from_u64(settings.idle_timeout.as_millis() as u64)
                    .map_err(|e| QuicError::Config(e.to_string()))?
                    .into(),
            ))
            // An answer is written whole on its own stream: sent in the order written, no
            // round robin between streams (quinn: less fragmentation for many small streams).
            .send_fairness(false)
            // Answers are small: the initial MTU (1200) always fits; no probing.
            .mtu_discovery_config(None)
            // No unreliable datagrams (RFC 9221): HTTP/3 here has no use for them.
            .datagram_receive_buffer_size(None);
        server
            .transport_config(Arc::new(transport))
            .incoming_buffer_size(settings.max_early_buffer)
            .incoming_buffer_size_total(settings.max_early_total);
        let mut seed = [0u8; 32];
        let _ = getrandom::getrandom(&mut seed);
        let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &seed);
        Ok(QuicShared {
            server: Arc::new(std::sync::Mutex::new((0, Arc::new(server)))),
            generation: Arc::new(AtomicU64::new(0)),
            reset_key: Arc::new(reset_key),
            settings,
            stats,
        })
    }

    /// SIGHUP's new certificate and key (`tls`, a [`crate::tls::config::quic_server_config`]):
    /// new connections on every core get it from the core's next tick; open ones keep theirs.
    /// The transport limits and the Retry token key stay (a Retry issued before still counts).
    pub fn reload(&self, tls: Arc<rustls::ServerConfig>) -> Result<(), QuicError> {
        let tls = counting_resumptions(tls, &self.stats);
        let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|_| QuicError::NoInitialSuite)?;
        let mut slot = self.slot();
        let mut next = (*slot.1).clone();
        next.crypto = Arc::new(crypto);
        slot.0 += 1;
        slot.1 = Arc::new(next);
        self.generation.store(slot.0, Ordering::Release);
        Ok(())
    }

    /// The configuration's slot (a plain pair, whole whatever a panicking holder did).
    fn slot(&self) -> std::sync::MutexGuard<'_, (u64, Arc<ServerConfig>)> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `tls` with its session store counting the sessions it hands back (resumptions) into
/// `stats`. With stateless tickets (`--tls-ticket-key-file`) there is no store to count in, and
/// no 0-RTT.
fn counting_resumptions(
    tls: Arc<rustls::ServerConfig>,
    stats: &Arc<QuicStats>,
) -> Arc<rustls::ServerConfig> {
    let mut config = (*tls).clone();
    config.session_storage = Arc::new(CountingStore {
        inner: Arc::clone(&config.session_storage),
        stats: Arc::clone(stats),
    });
    Arc::new(config)
}

/// A session store that counts the sessions found (each a resumed handshake).
#[derive(Debug)]
struct CountingStore {
    inner: Arc<dyn rustls::server::StoresServerSessions>,
    stats: Arc<QuicStats>,
}

impl rustls::server::StoresServerSessions for CountingStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.found(self.inner.get(key))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.found(self.inner.take(key))
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

impl CountingStore {
    fn found(&self, session: Option<Vec<u8>>) -> Option<Vec<u8>> {
        if session.is_some() {
            self.stats.resumed.fetch_add(1, Ordering::Relaxed);
        }
        session
    }
}

/// A reset key shared by the cores (quinn takes an `Arc<dyn HmacKey>`).
struct SharedKey(Arc<ring::hmac::Key>);

impl quinn_proto::crypto::HmacKey for SharedKey {
    fn sign(&self, data: &[u8], out: &mut [u8]) {
        self.0.sign(data, out)
    }
    fn signature_len(&self) -> usize {
        self.0.signature_len()
    }
    fn verify(
        &self,
        data: &[u8],
        signature: &[u8],
    ) -> Result<(), quinn_proto::crypto::CryptoError> {
        self.0.verify(data, signature)
    }
}

/// One connection and its HTTP/3 state.
struct Conn {
    gen: u32,
    conn: quinn_proto::Connection,
    h3: Option<H3Conn>,
    /// Our control stream, once opened; what is still to be written on it.
    control: Option<StreamId>,
    control_out: Vec<u8>,
    /// Answers not yet taken whole by flow control: stream, the bytes quinn has not taken.
    pending: Vec<(StreamId, Bytes)>,
    /// Streams with data to read.
    readable: Vec<StreamId>,
    timeout: Option<Instant>,
    handshaking: bool,
    closing: bool,
    /// While it is handshaking: the datagram bytes received (the anti-amplification budget is
    /// 3x this until `validated`: a Retry token, or the client's first Handshake packet).
    rx: u64,
    validated: bool,
    /// Counted once in `amplification_limited`.
    amp_limited: bool,
    /// The client sent 0-RTT packets; their bytes, held in the core's total until the
    /// handshake ends.
    tried_0rtt: bool,
    early: u64,
    /// When it said GOAWAY (SIGTERM): it closes once answered and the GOAWAY has had time to
    /// arrive (a close discards stream data not yet sent).
    goaway_at: Option<Instant>,
}

/// A core's QUIC endpoint, its connections and its socket.
pub struct QuicCore {
    socket: OwnedFd,
    endpoint: quinn_proto::Endpoint,
    shared: QuicShared,
    conns: Vec<Option<Conn>>,
    next_gen: u32,
    /// Connections to drive at the end of this turn.
    dirty: Vec<usize>,
    /// Handshakes in flight on this core (the Retry threshold).
    handshakes: usize,
    draining: bool,
    /// The generation of the server configuration in use ([`QuicShared::reload`]).
    config_generation: u64,
    /// Transmits are sent as one GSO buffer; cleared when the path cannot segment.
    gso: bool,
    /// 0-RTT bytes received by this core's connections still handshaking.
    early_held: u64,
    recv_buf: Vec<u8>,
    send_buf: Vec<u8>,
    /// Transmits of this turn, sent in one `sendmmsg` at its end ([`QuicCore::send_out`]).
    out: Outbox,
    acts: Vec<Act>,
}

/// Datagrams queued for the turn's `sendmmsg`.
#[derive(Default)]
struct Outbox {
    data: Vec<u8>,
    msgs: Vec<Queued>,
}

/// One queued transmit: `Outbox::data[start..start + len]`.
#[derive(Clone, Copy)]
struct Queued {
    to: SocketAddr,
    from: Option<IpAddr>,
    start: usize,
    len: usize,
    segment: Option<usize>,
}

/// Transmits queued before the outbox is sent whatever the turn still holds.
const MAX_BATCH: usize = 64;

impl std::fmt::Debug for QuicCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicCore")
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

fn token(gen: u32, idx: usize) -> u64 {
    (TOKEN_KIND << 56) | ((u64::from(gen) & 0xff_ffff) << 32) | idx as u64
}

impl QuicCore {
    /// Core `core`'s endpoint on `socket` (its place in the reuseport group is `core`).
    pub fn new(core: usize, socket: OwnedFd, shared: QuicShared) -> QuicCore {
        let mut config = EndpointConfig::new(Arc::new(SharedKey(Arc::clone(&shared.reset_key))));
        let id = core as u8;
        config.cid_generator(move || Box::new(CoreCids { core: id }));
        let (config_generation, server) = shared.slot().clone();
        let endpoint = quinn_proto::Endpoint::new(Arc::new(config), Some(server), false, None);
        QuicCore {
            socket,
            endpoint,
            shared,
            conns: Vec::new(),
            next_gen: 1,
            dirty: Vec::new(),
            handshakes: 0,
            draining: false,
            config_generation,
            gso: true,
            early_held: 0,
            recv_buf: vec![0u8; 65_536],
            send_buf: Vec::with_capacity(MAX_GSO * 1500),
            out: Outbox::default(),
            acts: Vec::new(),
        }
    }

    /// The socket, for the loop to wait on.
    pub fn socket(&self) -> &OwnedFd {
        &self.socket
    }

    /// Connections open.
    pub fn open(&self) -> usize {
        self.conns.iter().filter(|c| c.is_some()).count()
    }

    /// Reads the datagrams waiting on the socket, a bounded batch, and hands each to its
    /// connection (or makes a new one); the connections they touched are driven by
    /// [`QuicCore::flush`]. True when the batch ended before the socket was empty: the loop
    /// calls again next turn (its readiness wait fires only on new arrivals).
    pub fn on_readable(&mut self, ctx: &CoreCtx) -> bool {
        let now = Instant::now();
        let mut buf = std::mem::take(&mut self.recv_buf);
        let mut more = true;
        let (mut packets, mut bytes) = (0u64, 0u64);
        // A bounded batch per turn, so a flood cannot starve the TCP side.
        for _ in 0..64 {
            let r = match udp::recv(&self.socket, &mut buf) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    more = false;
                    break;
                }
                Err(e) => {
                    // A datagram's error (none is expected on an unconnected socket): counted;
                    // the next one is read on the next turn.
                    self.shared
                        .stats
                        .recv_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "QUIC recvmsg");
                    break;
                }
            };
            for seg in buf[..r.len].chunks(r.segment.max(1)) {
                packets += 1;
                self.datagram(now, r.from, r.to, seg);
            }
            bytes += r.len as u64;
        }
        // Counted once a batch: the counters are shared by every core.
        let st = &self.shared.stats;
        st.packets_in.fetch_add(packets, Ordering::Relaxed);
        st.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        self.recv_buf = buf;
        self.flush(ctx);
        more
    }

    fn datagram(&mut self, now: Instant, from: SocketAddr, to: Option<IpAddr>, seg: &[u8]) {
        let mut out = std::mem::take(&mut self.send_buf);
        out.clear();
        // What quinn does not tell a server: 0-RTT tried, the client's first Handshake packet.
        let kinds = lasthop_edge::quic::packets(seg);
        match self
            .endpoint
            .handle(now, from, to, None, BytesMut::from(seg), &mut out)
        {
            Some(DatagramEvent::NewConnection(incoming)) => {
                self.incoming(now, incoming, kinds, seg.len(), &mut out)
            }
            Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                if let Some(Some(c)) = self.conns.get_mut(ch.0) {
                    if c.handshaking {
                        let early = kinds.zero_rtt as u64;
                        // 0-RTT alone, past the core's total: dropped (the Initial and
                        // Handshake packets a handshake needs are never).
                        if kinds.only_zero_rtt()
                            && self.early_held + early > self.shared.settings.max_early_total
                        {
                            self.shared
                                .stats
                                .early_dropped
                                .fetch_add(1, Ordering::Relaxed);
                            self.send_buf = out;
                            return;
                        }
                        c.validated |= kinds.handshake;
                        c.tried_0rtt |= early > 0;
                        c.early += early;
                        self.early_held += early;
                        c.rx += seg.len() as u64;
                    }
                    c.conn.handle_event(event);
                    self.dirty.push(ch.0);
                }
            }
            Some(DatagramEvent::Response(t)) => self.transmit(&t, &out),
            None => {}
        }
        self.send_buf = out;
    }

    fn incoming(
        &mut self,
        now: Instant,
        incoming: quinn_proto::Incoming,
        kinds: lasthop_edge::quic::Packets,
        len: usize,
        out: &mut Vec<u8>,
    ) {
        let s = &self.shared.settings;
        let validated = incoming.remote_address_validated();
        let retry = !incoming.remote_address_validated()
            && incoming.may_retry()
            && match s.retry {
                RetryMode::Always => true,
                RetryMode::Never => false,
                RetryMode::Auto => self.handshakes >= s.retry_threshold,
            };
        if self.draining {
            let t = self.endpoint.refuse(incoming, out);
            self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            self.transmit(&t, out);
            return;
        }
        if retry {
            match self.endpoint.retry(incoming, out) {
                Ok(t) => {
                    self.shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                    self.transmit(&t, out);
                }
                Err(e) => self.endpoint.ignore(e.into_incoming()),
            }
            return;
        }
        match self.endpoint.accept(incoming, now, out, None) {
            Ok((ch, conn)) => {
                let idx = ch.0;
                if self.conns.len() <= idx {
                    self.conns.resize_with(idx + 1, || None);
                }
                let gen = self.next_gen;
                self.next_gen = self.next_gen.wrapping_add(1);
                self.conns[idx] = Some(Conn {
                    gen,
                    conn,
                    h3: None,
                    control: None,
                    control_out: Vec::new(),
                    pending: Vec::new(),
                    readable: Vec::new(),
                    timeout: None,
                    handshaking: true,
                    closing: false,
                    rx: len as u64,
                    validated,
                    amp_limited: false,
                    tried_0rtt: kinds.zero_rtt > 0,
                    early: kinds.zero_rtt as u64,
                    goaway_at: None,
                });
                self.early_held += kinds.zero_rtt as u64;
                self.handshakes += 1;
                self.shared
                    .stats
                    .connections
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.stats.open.fetch_add(1, Ordering::Relaxed);
                self.dirty.push(idx);
            }
            Err(e) => {
                self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = e.response {
                    self.transmit(&t, out);
                }
            }
        }
    }

    /// Queues a transmit (`buf[..t.size]`) for the turn's `sendmmsg`.
    fn transmit(&mut self, t: &Transmit, buf: &[u8]) {
        queue(&mut self.out, t, buf);
        if self.out.msgs.len() >= MAX_BATCH {
            self.send_out();
        }
    }

    /// Sends what the turn queued, in one `sendmmsg` (more only where the kernel refuses a
    /// message). A GSO buffer the path cannot segment goes datagram by datagram, now and from
    /// then on (`gso` cleared), as quinn-udp does.
    fn send_out(&mut self) {
        let ob = &mut self.out;
        if ob.msgs.is_empty() {
            return;
        }
        let st = &self.shared.stats;
        let out: Vec<udp::Outgoing<'_>> = ob
            .msgs
            .iter()
            .map(|q| udp::Outgoing {
                to: q.to,
                from: q.from,
                data: &ob.data[q.start..q.start + q.len],
                segment: q.segment,
            })
            .collect();
        // Per message: None sent as queued; Some(true) sent one by one; Some(false) dropped.
        let mut fate: Vec<Option<bool>> = vec![None; out.len()];
        let (socket, gso) = (&self.socket, &mut self.gso);
        udp::send_batch(socket, &out, |i, e| {
            let o = out[i];
            let segmented = o.segment.filter(|&s| s < o.data.len());
            if let (Some(size), true) = (segmented, udp::gso_unsupported(&e)) {
                if *gso {
                    tracing::warn!(error = %e, "UDP segmentation offload refused: sending datagrams one by one");
                    *gso = false;
                }
                fate[i] = Some(udp::send_each(socket, o.to, o.from, o.data, size).is_ok());
            } else {
                tracing::debug!(error = %e, "QUIC sendmsg");
                fate[i] = Some(false);
            }
        });
        st.send_batches.fetch_add(1, Ordering::Relaxed);
        let (mut packets, mut bytes, mut errors, mut gso_sends, mut gso_segments) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for (o, fate) in out.iter().zip(&fate) {
            let segments = o
                .segment
                .map_or(1, |s| o.data.len().div_ceil(s.max(1)) as u64);
            match fate {
                Some(false) => errors += segments,
                _ => {
                    packets += segments;
                    bytes += o.data.len() as u64;
                    if fate.is_none() && segments > 1 {
                        gso_sends += 1;
                        gso_segments += segments;
                    }
                }
            }
        }
        drop(out);
        let add = |a: &AtomicU64, v: u64| {
            if v > 0 {
                a.fetch_add(v, Ordering::Relaxed);
            }
        };
        add(&st.packets_out, packets);
        add(&st.bytes_out, bytes);
        add(&st.send_errors, errors);
        add(&st.gso_sends, gso_sends);
        add(&st.gso_segments, gso_segments);
        ob.msgs.clear();
        ob.data.clear();
    }

    /// Runs the timers that are due, then drives what they touched.
    pub fn on_tick(&mut self, ctx: &CoreCtx) {
        if self.shared.generation.load(Ordering::Acquire) != self.config_generation {
            let (generation, server) = self.shared.slot().clone();
            self.endpoint.set_server_config(Some(server));
            self.config_generation = generation;
        }
        let now = Instant::now();
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            if let Some(c) = slot {
                if c.timeout.is_some_and(|t| t <= now) {
                    c.conn.handle_timeout(now);
                    self.dirty.push(idx);
                } else if c.goaway_at.is_some() && !c.closing {
                    self.dirty.push(idx);
                }
            }
        }
        self.flush(ctx);
    }

    /// The origin replied to a request of the connection `token` names.
    pub fn on_origin(&mut self, token: u64, code: &[u8], answer: &OriginAnswer, ctx: &CoreCtx) {
        let idx = (token & 0xffff_ffff) as usize;
        let gen = ((token >> 32) & 0xff_ffff) as u32;
        let Some(Some(c)) = self.conns.get_mut(idx) else {
            return;
        };
        if c.gen & 0xff_ffff != gen {
            return;
        }
        let peer = Some(c.conn.remote_address().ip());
        if let Some(h3) = c.h3.as_mut() {
            let mut fx = CoreEffects::for_peer(ctx, token, peer);
            h3.on_origin(code, answer, &ctx.env(), &mut fx, &mut self.acts);
        }
        self.dirty.push(idx);
        self.flush(ctx);
    }

    /// SIGTERM: no new connections; each connection says GOAWAY and closes once answered.
    pub fn drain(&mut self, ctx: &CoreCtx) {
        self.draining = true;
        for idx in 0..self.conns.len() {
            if let Some(Some(c)) = self.conns.get_mut(idx) {
                match c.h3.as_mut() {
                    Some(h3) => {
                        h3.drain(&mut self.acts);
                        c.goaway_at = Some(Instant::now());
                    }
                    None => {
                        c.conn
                            .close(Instant::now(), VarInt::from_u32(0x100), Bytes::new());
                    }
                }
                apply(c, &mut self.acts, &ctx.metrics);
                self.dirty.push(idx);
            }
        }
        self.flush(ctx);
    }

    /// Drives every connection something happened to: endpoint events, HTTP/3 on readable
    /// streams, pending writes, transmits, the next timeout, and forgets drained ones.
    pub fn flush(&mut self, ctx: &CoreCtx) {
        if self.dirty.is_empty() {
            self.send_out();
            return;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let now = Instant::now();
        for &idx in &dirty {
            self.drive(idx, now, ctx);
        }
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
        self.send_out();
    }

    fn drive(&mut self, idx: usize, now: Instant, ctx: &CoreCtx) {
        let Some(Some(c)) = self.conns.get_mut(idx) else {
            return;
        };
        let ch = ConnectionHandle(idx);
        loop {
            // Endpoint events may hand events back (new connection IDs), which may make more.
            let mut any = false;
            while let Some(ev) = c.conn.poll_endpoint_events() {
                any = true;
                if let Some(back) = self.endpoint.handle_event(ch, ev) {
                    c.conn.handle_event(back);
                }
            }
            while let Some(ev) = c.conn.poll() {
                any = true;
                match ev {
                    Event::Stream(StreamEvent::Readable { id }) => c.readable.push(id),
                    // STOP_SENDING: the answer is not wanted; the stream is reset with the
                    // client's code (RFC 9000 §3.5).
                    Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                        let _ = c.conn.send_stream(id).reset(error_code);
                        c.pending.retain(|(p, _)| *p != id);
                    }
                    Event::Connected => {
                        self.shared.stats.handshakes.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            if c.h3.is_none() {
                let data = c.conn.crypto_session().handshake_data();
                if let Some(hd) = data.and_then(|d| {
                    d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                        .ok()
                }) {
                    let (h3, control) =
                        H3Conn::new(self.shared.settings.h3, hd.server_name.as_deref());
                    c.h3 = Some(h3);
                    c.control_out = control;
                    if self.draining {
                        if let Some(h3) = c.h3.as_mut() {
                            h3.drain(&mut self.acts);
                            c.goaway_at = Some(now);
                        }
                    }
                }
            }
            if c.h3.is_some() && c.control.is_none() {
                c.control = c.conn.streams().open(Dir::Uni);
            }
            while let Some(id) = c.conn.streams().accept(Dir::Bi) {
                c.readable.push(id);
            }
            while let Some(id) = c.conn.streams().accept(Dir::Uni) {
                c.readable.push(id);
            }
            if c.h3.is_some() && !c.readable.is_empty() && read_streams(c, idx, ctx, &mut self.acts)
            {
                any = true;
            }
            apply(c, &mut self.acts, &ctx.metrics);
            write_pending(c);
            if !any {
                break;
            }
        }
        if c.handshaking && !c.conn.is_handshaking() {
            c.handshaking = false;
            self.handshakes = self.handshakes.saturating_sub(1);
            self.early_held = self.early_held.saturating_sub(std::mem::take(&mut c.early));
            // A server's 0-RTT keys exist only where it accepted the client's early data.
            let st = &self.shared.stats;
            if c.conn.has_0rtt() {
                st.zero_rtt.fetch_add(1, Ordering::Relaxed);
            } else if c.tried_0rtt {
                st.zero_rtt_rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Answered after GOAWAY: closed once the GOAWAY has had two round trips (at least
        // 20 ms) to arrive and be acknowledged.
        let settled = c
            .goaway_at
            .is_some_and(|at| now >= at + (c.conn.rtt() * 2).max(Duration::from_millis(20)));
        if !c.closing
            && c.h3.as_ref().is_some_and(H3Conn::done)
            && c.pending.is_empty()
            && c.control_out.is_empty()
            && settled
        {
            c.closing = true;
            c.conn.close(now, VarInt::from_u32(0x100), Bytes::new());
        }
        // Transmits: up to MAX_GSO datagrams each, queued for the turn's sendmmsg.
        let mut buf = std::mem::take(&mut self.send_buf);
        let mut full = false;
        loop {
            buf.clear();
            let most = if self.gso { MAX_GSO } else { 1 };
            let Some(t) = c.conn.poll_transmit(now, most, &mut buf) else {
                break;
            };
            queue(&mut self.out, &t, &buf);
            full |= self.out.msgs.len() >= MAX_BATCH;
        }
        self.send_buf = buf;
        // Before validation a server may send 3x what it received (quinn stops there): a
        // handshake whose flight reached that waited for more from the client.
        if c.handshaking
            && !c.validated
            && !c.amp_limited
            && c.conn.stats().udp_tx.bytes >= 3 * c.rx
        {
            c.amp_limited = true;
            self.shared
                .stats
                .amplification_limited
                .fetch_add(1, Ordering::Relaxed);
        }
        c.timeout = c.conn.poll_timeout();
        if c.conn.is_drained() {
            if c.handshaking {
                self.handshakes = self.handshakes.saturating_sub(1);
                self.early_held = self.early_held.saturating_sub(c.early);
            }
            self.conns[idx] = None;
            self.shared.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
        if full {
            self.send_out();
        }
    }
}

/// Appends a transmit (`buf[..t.size]`) to `out`.
fn queue(out: &mut Outbox, t: &Transmit, buf: &[u8]) {
    let start = out.data.len();
    out.data.extend_from_slice(&buf[..t.size]);
    out.msgs.push(Queued {
        to: t.destination,
        from: t.src_ip,
        start,
        len: t.size,
        segment: t.segment_size,
    });
}

/// Reads every readable stream of `c` into its HTTP/3 state. True when anything was read.
fn read_streams(c: &mut Conn, idx: usize, ctx: &CoreCtx, acts: &mut Vec<Act>) -> bool {
    let mut readable = std::mem::take(&mut c.readable);
    readable.sort_unstable_by_key(|id| u64::from(*id));
    readable.dedup();
    let token = token(c.gen, idx);
    let peer = Some(c.conn.remote_address().ip());
    // Stream data read while the handshake runs can only have come in 0-RTT packets.
    let how = How {
        early: c.conn.is_handshaking(),
        https: true,
        proto: Proto::H3,
    };
    let mut any = false;
    let mut data = Vec::new();
    for id in readable.drain(..) {
        data.clear();
        let mut fin = false;
        let mut reset = false;
        let mut recv = c.conn.recv_stream(id);
        let Ok(mut chunks) = recv.read(true) else {
            continue;
        };
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(chunk)) => data.extend_from_slice(&chunk.bytes),
                Ok(None) => {
                    fin = true;
                    break;
                }
                Err(quinn_proto::ReadError::Reset(_)) => {
                    reset = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let _ = chunks.finalize();
        let Some(h3) = c.h3.as_mut() else {
            continue;
        };
        let raw = u64::from(id);
        if reset {
            // What came before the reset is dropped with the stream.
            any = true;
            h3.on_reset(raw, acts);
            continue;
        }
        if data.is_empty() && !fin {
            continue;
        }
        any = true;
        if id.dir() == Dir::Bi {
            let mut fx = CoreEffects::for_peer(ctx, token, peer);
            h3.on_request(raw, &data, fin, how, &ctx.env(), &mut fx, acts);
        } else {
            h3.on_uni(raw, &data, fin, acts);
        }
    }
    c.readable = readable;
    any
}

/// Carries out what the HTTP/3 layer asked.
fn apply(c: &mut Conn, acts: &mut Vec<Act>, metrics: &CoreMetrics) {
    for act in acts.drain(..) {
        match act {
            Act::Control(bytes) => c.control_out.extend_from_slice(&bytes),
            Act::Answer { stream, data } => {
                metrics.h3_answer();
                // Handed to quinn as it is (`write` would copy it into a new buffer).
                c.pending.push((
                    StreamId::from(VarInt::from_u64(stream).unwrap_or_default()),
                    Bytes::from(data),
                ));
            }
            Act::StopSending { stream, code } => {
                let id = StreamId::from(VarInt::from_u64(stream).unwrap_or_default());
                let _ = c
                    .conn
                    .recv_stream(id)
                    .stop(VarInt::from_u64(code).unwrap_or_default());
            }
            Act::Reset { stream, code } => {
                let id = StreamId::from(VarInt::from_u64(stream).unwrap_or_default());
                let code = VarInt::from_u64(code).unwrap_or_default();
                let _ = c.conn.recv_stream(id).stop(code);
                let _ = c.conn.send_stream(id).reset(code);
            }
            Act::Close { code, reason } => {
                c.closing = true;
                c.conn.close(
                    Instant::now(),
                    VarInt::from_u64(code).unwrap_or_default(),
                    Bytes::from_static(reason.as_bytes()),
                );
            }
        }
    }
}

/// Writes what flow control lets through: the control stream's bytes, then the answers.
fn write_pending(c: &mut Conn) {
    if let Some(id) = c.control {
        if !c.control_out.is_empty() {
            if let Ok(n) = c.conn.send_stream(id).write(&c.control_out) {
                c.control_out.drain(..n);
            }
        }
    }
    c.pending.retain_mut(|(id, data)| {
        let mut s = c.conn.send_stream(*id);
        // What quinn takes is split off the front of `data`.
        match s.write_chunks(std::slice::from_mut(data)) {
            Ok(_) => {
                if !data.is_empty() {
                    return true;
                }
                let _ = s.finish();
                false
            }
            // Blocked by flow control: again when the stream is writable (the next drive).
            Err(quinn_proto::WriteError::Blocked) => true,
            // Stopped by the client: the answer is not wanted; reset with its code.
            Err(quinn_proto::WriteError::Stopped(code)) => {
                let _ = s.reset(code);
                false
            }
            Err(_) => false,
        }
    });
}
