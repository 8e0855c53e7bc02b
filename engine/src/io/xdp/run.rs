//! One core's AF_XDP loop (`--io xdp`): the queue's socket in, `lasthop_edge::tcp` for the
//! connections, the same [`Session`] protocol as the io_uring and epoll loops for HTTP, the
//! socket out (engine/DESIGN.md, "The AF_XDP path").
//!
//! A turn: wait for frames or origin replies (at most one tick), hand every frame to the TCP
//! endpoint of its port, feed the bytes it delivers to each connection's session, send what the
//! sessions rendered (closing where they say so), fire the TCP timers, flush the ACKs still
//! owed, and send every frame written. Frames are written into one flat buffer per turn and
//! copied into the UMEM by the socket, so nothing is allocated per frame.
//!
//! With `--tls-listen`, the core has a second endpoint on the HTTPS port, and its connections
//! go through the same TLS layer as the io_uring loop's (`crate::tls::conn`: rustls, records in
//! and out of memory buffers, 0-RTT early data, the handshake cap and timeout). There is no
//! kernel socket to hand the record layer to, so kTLS never applies here.

use std::io;
use std::net::IpAddr;
use std::ops::Range;

use hashbrown::HashMap;
use lasthop_edge::tcp::{ConnId, Tcp, TcpConfig, TcpEvent};
use lasthop_edge::wire;

use super::xsk::{Xsk, XskConfig};
use super::XskMap;
use crate::io::uring::TlsListen;
use crate::io::EARLY_SEND;
use crate::origin::{OriginInbox, OriginReply};
use crate::session::{CoreCtx, Drive as _, Session};
use crate::tls::conn::{self as tls_conn, TlsConn};
use crate::tls::TlsServe;

/// What one core serves on the bypass path.
#[derive(Debug, Clone)]
pub struct XdpCore {
    pub ifindex: u32,
    pub queue: u32,
    pub mac: [u8; 6],
    /// IPv4 or IPv6 (`--listen`'s): the endpoints serve this one address.
    pub addr: IpAddr,
    pub port: u16,
    /// The HTTPS port (`--tls-listen`), on the same address.
    pub tls_port: Option<u16>,
    /// The SYN cookies' key (one per engine, random at start).
    pub cookie_key: [u8; 16],
    pub socket: XskConfig,
}

/// Bytes a connection may have waiting in the engine (rendered and not yet taken by TCP, or
/// received and not yet fed to its session): past this it is reset. A client that pipelines
/// without reading cannot make a core hold more (TCP's own send queue is bounded too).
const MAX_BUFFERED: usize = 1 << 20;

/// Which of a core's two endpoints a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Lane {
    Plain,
    Https,
}

/// A connection: its endpoint and its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    lane: Lane,
    id: ConnId,
}

struct Conn {
    session: Session,
    /// The TLS state of a connection on the HTTPS endpoint.
    tls: Option<Box<TlsConn>>,
    /// This connection's origin token, never reused (see [`XdpLoop::tokens`]).
    token: u64,
    /// Rendered bytes the TCP endpoint has not taken yet (its send queue is full).
    pending: Vec<u8>,
    /// The peer sent FIN: close once everything rendered is taken.
    peer_closed: bool,
    /// Our FIN is queued: TCP reports the end.
    closing: bool,
    /// Bytes that arrived while the session was parked on the origin (TCP has acknowledged
    /// them): fed to it once the reply is in.
    held: Vec<u8>,
}

/// An event a TCP endpoint reported, its bytes kept in the turn's arena.
enum Heard {
    Open(Key),
    Data(Key, Range<usize>),
    PeerClosed(Key),
    Closed(Key),
}

/// The HTTPS endpoint of a core.
struct Https {
    tcp: Tcp,
    tls: TlsServe,
    /// Connections of this core in their handshake now (against `tls.max_handshakes`).
    handshakes: usize,
}

/// A turn's frames to send, back to back in one buffer, and their lengths.
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    lens: Vec<usize>,
}

impl Outbox {
    fn push(&mut self, frame: &[u8]) {
        self.bytes.extend_from_slice(frame);
        self.lens.push(frame.len());
    }
}

/// One core's AF_XDP loop.
pub struct XdpLoop {
    xsk: Xsk,
    tcp: Tcp,
    https: Option<Https>,
    conns: HashMap<Key, Conn>,
    /// Each connection's origin token, to its key: the token an origin reply carries finds
    /// its connection (an IPv6 peer's address does not fit in the token itself), and a reply
    /// for a connection gone, or gone and come back on the same 4-tuple, finds none.
    tokens: HashMap<u64, Key>,
    next_token: u64,
    inbox: Option<OriginInbox>,
    replies: Vec<OriginReply>,
    heard: Vec<Heard>,
    arena: Vec<u8>,
    /// This turn's frames to send.
    out: Outbox,
    /// Connections whose sessions rendered something this turn.
    touched: Vec<Key>,
    /// Connections with output TCP could not take yet: tried again every turn.
    stalled: Vec<Key>,
    started: std::time::Instant,
    /// When this turn's wait for the socket returned (see [`EARLY_SEND`]).
    entered: std::time::Instant,
    tick_ms: i32,
    idle_timeout_ms: i64,
    header_timeout_ms: i64,
    last_sweep_ms: i64,
}

impl std::fmt::Debug for XdpLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpLoop")
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

/// Feeds bytes received on a connection to its session: straight in, or through rustls on the
/// HTTPS lane (a TLS error queues rustls' alert and closes the connection once it is out).
fn feed(conn: &mut Conn, data: &[u8], ctx: &CoreCtx, token: u64, https: Option<&mut Https>) {
    let Some(tls) = conn.tls.as_mut() else {
        conn.session.receive(data, ctx, token);
        return;
    };
    let stats = https.as_ref().map(|h| &*h.tls.stats);
    match tls_conn::input(tls, &mut conn.session, data, ctx, token, stats) {
        Ok(true) => uncounted(https),
        Ok(false) => {}
        Err(_) => {
            tls.failed = true;
            conn.session.close_after_send = true;
        }
    }
}

/// One handshake fewer in flight on this core (a connection [`TlsConn::uncount`] took out).
fn uncounted(https: Option<&mut Https>) {
    if let Some(h) = https {
        h.handshakes = h.handshakes.saturating_sub(1);
    }
}

/// Whether bytes arriving for a connection must wait: its session is parked on the origin,
/// backlogged or closing. On HTTPS a closing session's records still go in: they may be the
/// client's Finished, which releases the answers to 0-RTT requests waiting in rustls.
fn paused(conn: &Conn) -> bool {
    let s = &conn.session;
    if conn.tls.is_some() {
        s.waiting_origin() || (s.paused() && !s.close_after_send)
    } else {
        s.paused()
    }
}

/// Moves what the session rendered to the bytes waiting for TCP: as they are, or as TLS
/// records (with whatever else rustls has to send: handshake flights, tickets, alerts).
fn take_output(conn: &mut Conn) {
    if let Some(tls) = conn.tls.as_mut() {
        tls_conn::output(tls, &mut conn.session, &mut conn.pending);
    } else if conn.pending.is_empty() {
        std::mem::swap(&mut conn.pending, &mut conn.session.out);
    } else {
        conn.pending.append(&mut conn.session.out);
    }
}

/// Whether a connection with nothing left to send is done: its session says so (a TLS one
/// only once its handshake ended, so answers to 0-RTT data still go out), or the peer closed
/// and no origin reply is awaited.
fn done(conn: &Conn) -> bool {
    let s = &conn.session;
    let said = match conn.tls.as_deref() {
        Some(t) => tls_conn::done(t, s),
        None => s.close_after_send,
    };
    said || (conn.peer_closed && !s.waiting_origin())
}

impl XdpLoop {
    /// Opens this core's socket on its queue and enters it in `map` (the XDP program, attached
    /// once every core has its socket, redirects into it). With `tls`, the core serves HTTPS
    /// on `core.tls_port` too (the listener's kernel socket is closed: connections come
    /// through the socket, like the plain port's).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        core: &XdpCore,
        map: &XskMap,
        max_conns: usize,
        inbox: Option<OriginInbox>,
        tick: std::time::Duration,
        idle_timeout_ms: i64,
        header_timeout_ms: i64,
        tls: Option<TlsListen>,
    ) -> io::Result<XdpLoop> {
        let xsk = Xsk::open(core.ifindex, core.queue, &core.socket)?;
        map.set(core.queue, xsk.fd())?;
        let endpoint = |port: u16| {
            let mut cfg = TcpConfig::new(core.addr, port, core.mac, core.cookie_key);
            // The sessions' own timeouts close idle connections first; this is the backstop.
            cfg.idle_ms = (idle_timeout_ms.max(header_timeout_ms).max(1) as u64) * 2;
            cfg.max_conns = max_conns.max(1);
            Tcp::new(cfg)
        };
        let https =
            match (tls, core.tls_port) {
                (Some(listen), Some(port)) => {
                    // As with the plain port: connections come through the socket only, and the
                    // kernel listener is closed so that this host's own are refused, not queued.
                    // No kernel socket ever holds a connection here, so kTLS does not apply.
                    drop(listen.listener);
                    Some(Https {
                        tcp: endpoint(port),
                        tls: listen.serve,
                        handshakes: 0,
                    })
                }
                (None, None) => None,
                _ => return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an HTTPS listener needs its port in the XDP program, and the other way round",
                )),
            };
        Ok(XdpLoop {
            xsk,
            tcp: endpoint(core.port),
            https,
            conns: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 1,
            inbox,
            replies: Vec::new(),
            heard: Vec::new(),
            arena: Vec::new(),
            out: Outbox::default(),
            touched: Vec::new(),
            stalled: Vec::new(),
            started: std::time::Instant::now(),
            entered: std::time::Instant::now(),
            tick_ms: tick.as_millis().clamp(1, 1000) as i32,
            idle_timeout_ms,
            header_timeout_ms,
            last_sweep_ms: 0,
        })
    }

    /// Stops accepting (drain on SIGTERM): new SYNs are reset, open connections served;
    /// HTTP/2 connections say GOAWAY and close once their streams are answered.
    pub fn stop_accepting(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        self.tcp.stop_accepting();
        if let Some(h) = &mut self.https {
            h.tcp.stop_accepting();
        }
        for (key, conn) in self.conns.iter_mut() {
            if conn.session.is_h2() && !conn.closing {
                let token = conn.token;
                conn.session.drain_h2(ctx, token);
                self.touched.push(*key);
            }
        }
        let now = self.started.elapsed().as_millis() as u64;
        self.push_output(now, ctx);
        self.send_frames(ctx)
    }

    /// Connections still open.
    pub fn open_conns(&self) -> usize {
        self.conns.len()
    }

    /// One turn: wait up to one tick, then serve what arrived.
    pub fn turn(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        let wake = self.inbox.as_ref().map(OriginInbox::eventfd);
        self.xsk.wait_with(wake, self.tick_ms)?;
        self.entered = std::time::Instant::now();
        ctx.refresh_clock();
        let now = self.started.elapsed().as_millis() as u64;
        let out = &mut self.out;
        let mut tx = |frame: &[u8]| out.push(frame);
        let (heard, arena) = (&mut self.heard, &mut self.arena);
        let mut hear = |lane: Lane, e: TcpEvent<'_>| {
            let key = |id| Key { lane, id };
            heard.push(match e {
                TcpEvent::Open(id) => Heard::Open(key(id)),
                TcpEvent::Data(id, data) => {
                    let start = arena.len();
                    arena.extend_from_slice(data);
                    Heard::Data(key(id), start..arena.len())
                }
                TcpEvent::PeerClosed(id) => Heard::PeerClosed(key(id)),
                TcpEvent::Closed(id) => Heard::Closed(key(id)),
            })
        };
        let (plain, mut https) = (&mut self.tcp, self.https.as_mut().map(|h| &mut h.tcp));
        self.xsk.receive(256, |frame| {
            // Frames that are not ours are counted by the plain endpoint and dropped.
            let (lane, tcp) = match https.as_deref_mut() {
                Some(t) if wire::dst_port(frame) == Some(t.port()) => (Lane::Https, t),
                _ => (Lane::Plain, &mut *plain),
            };
            let _ = tcp.receive(frame, now, &mut tx, &mut |e| hear(lane, e));
        });
        plain.poll_timers(now, &mut tx, &mut |e| hear(Lane::Plain, e));
        if let Some(t) = https {
            t.poll_timers(now, &mut tx, &mut |e| hear(Lane::Https, e));
        }
        self.on_heard(now, ctx)?;
        self.on_replies(ctx);
        self.push_output(now, ctx);
        let out = &mut self.out;
        self.tcp.flush(&mut |frame: &[u8]| out.push(frame));
        if let Some(h) = &mut self.https {
            h.tcp.flush(&mut |frame: &[u8]| out.push(frame));
        }
        self.send_frames(ctx)?;
        self.sweep(ctx);
        Ok(())
    }

    fn on_heard(&mut self, now: u64, ctx: &mut CoreCtx) -> io::Result<()> {
        let mut heard = std::mem::take(&mut self.heard);
        for h in heard.drain(..) {
            match h {
                Heard::Open(key) => self.open(key, ctx),
                Heard::Data(key, range) => {
                    let Some(conn) = self.conns.get_mut(&key) else {
                        continue;
                    };
                    ctx.metrics.bytes_in(range.len() as u64);
                    if conn.closing || conn.tls.as_ref().is_some_and(|t| t.failed) {
                        // Our FIN is out, or rustls refused the stream: nothing more is read
                        // (TCP still acknowledges it, so the peer's close completes).
                        continue;
                    }
                    if paused(conn) || !conn.held.is_empty() || !conn.pending.is_empty() {
                        // Parked on the origin, or TCP has not taken the last answer yet: kept,
                        // in order, for later (TCP has acknowledged these bytes; on HTTPS they
                        // are still records, fed through rustls then).
                        conn.held.extend_from_slice(&self.arena[range]);
                        if conn.held.len() > MAX_BUFFERED {
                            self.reset(key, ctx);
                        } else {
                            self.touched.push(key);
                        }
                        continue;
                    }
                    let handshaking = conn.tls.as_ref().is_some_and(|t| t.conn.is_handshaking());
                    let token = conn.token;
                    feed(conn, &self.arena[range], ctx, token, self.https.as_mut());
                    self.touched.push(key);
                    if handshaking && self.entered.elapsed() >= EARLY_SEND {
                        self.send_early(now, ctx)?;
                    }
                }
                Heard::PeerClosed(key) => {
                    if let Some(conn) = self.conns.get_mut(&key) {
                        conn.peer_closed = true;
                        self.touched.push(key);
                    }
                }
                Heard::Closed(key) => self.forget(key, ctx),
            }
        }
        self.heard = heard;
        self.arena.clear();
        Ok(())
    }

    /// After a handshake step, once the turn has run [`EARLY_SEND`] since the socket was
    /// waited on: what the connections touched so far rendered goes to TCP and out now, as the
    /// turn's end would send it (ACKs still owed to the others wait for the end of the turn,
    /// so they can ride on those connections' own answers).
    fn send_early(&mut self, now: u64, ctx: &mut CoreCtx) -> io::Result<()> {
        self.push_output(now, ctx);
        self.send_frames(ctx)?;
        self.entered = std::time::Instant::now();
        Ok(())
    }

    /// A connection's handshake completed: its session, and on HTTPS its TLS state (or a
    /// reset, past the core's handshake cap).
    fn open(&mut self, key: Key, ctx: &mut CoreCtx) {
        let token = self.next_token;
        let mut session = Session::new(ctx.now_ms);
        session.peer = Some(key.id.addr);
        let tls = match (key.lane, &mut self.https) {
            (Lane::Https, Some(h)) => {
                match TlsConn::start(
                    &h.tls.config,
                    &h.tls.stats,
                    h.tls.max_handshakes,
                    h.handshakes,
                    ctx.now_ms,
                ) {
                    Ok(Some(t)) => {
                        h.handshakes += 1;
                        session.https = true;
                        Some(t)
                    }
                    Ok(None) | Err(_) => {
                        // Refused (the handshake cap, or no TLS state): reset straight away.
                        let out = &mut self.out;
                        h.tcp.abort(key.id, &mut |frame: &[u8]| out.push(frame));
                        return;
                    }
                }
            }
            _ => None,
        };
        self.conns.insert(
            key,
            Conn {
                session,
                tls,
                token,
                pending: Vec::new(),
                peer_closed: false,
                closing: false,
                held: Vec::new(),
            },
        );
        self.tokens.insert(token, key);
        self.next_token += 1;
        ctx.metrics.connection_opened();
    }

    /// Drops `key`'s state (TCP has closed it, or is being told to).
    fn forget(&mut self, key: Key, ctx: &mut CoreCtx) {
        let Some(mut conn) = self.conns.remove(&key) else {
            return;
        };
        self.tokens.remove(&conn.token);
        if conn.tls.as_mut().is_some_and(|t| t.uncount()) {
            uncounted(self.https.as_mut());
        }
        ctx.metrics.connection_closed();
    }

    fn on_replies(&mut self, ctx: &mut CoreCtx) {
        let Some(inbox) = &self.inbox else { return };
        inbox.drain(&mut self.replies);
        for reply in self.replies.drain(..) {
            ctx.metrics.origin_reply(&reply.answer);
            let Some(&key) = self.tokens.get(&reply.token) else {
                continue;
            };
            if let Some(conn) = self
                .conns
                .get_mut(&key)
                .filter(|c| c.token == reply.token && !c.closing)
            {
                conn.session
                    .origin_replied(&reply.code, &reply.answer, ctx, reply.token);
                if !conn.session.paused() && !conn.held.is_empty() {
                    let held = std::mem::take(&mut conn.held);
                    feed(conn, &held, ctx, reply.token, self.https.as_mut());
                }
                self.touched.push(key);
            }
        }
    }

    /// Hands what the touched sessions rendered to TCP, and closes where they (or the peer)
    /// are done.
    fn push_output(&mut self, now: u64, ctx: &mut CoreCtx) {
        let mut over = Vec::new();
        // Each connection once, however many events listed it this turn (a stalled one would
        // otherwise gain a copy per event and be retried that many times every turn).
        self.touched.append(&mut self.stalled);
        self.touched.sort_unstable();
        self.touched.dedup();
        let mut touched = std::mem::take(&mut self.touched);
        for key in touched.drain(..) {
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            loop {
                take_output(conn);
                if !conn.pending.is_empty() {
                    let out = &mut self.out;
                    let tcp = endpoint(&mut self.tcp, &mut self.https, key.lane);
                    let tx = &mut |f: &[u8]| out.push(f);
                    // A connection's last answer takes the FIN along in its last segment.
                    let taken = if done(conn) && conn.held.is_empty() {
                        tcp.send_and_close(key.id, &conn.pending, now, tx)
                    } else {
                        tcp.send(key.id, &conn.pending, now, tx)
                    };
                    conn.pending.drain(..taken);
                }
                // Input held while the last answer waited goes in once it has gone out.
                let ready = conn.pending.is_empty() && !paused(conn);
                if ready && !conn.held.is_empty() {
                    let held = std::mem::take(&mut conn.held);
                    let token = conn.token;
                    feed(conn, &held, ctx, token, self.https.as_mut());
                    continue;
                }
                break;
            }
            if conn.pending.is_empty() && done(conn) && !conn.closing {
                conn.closing = true;
                // A handshake that ends in a close gives its slot back now, as the io_uring
                // loop's close does, not when TCP is finally done with the connection.
                if conn.tls.as_mut().is_some_and(|t| t.uncount()) {
                    uncounted(self.https.as_mut());
                }
                let out = &mut self.out;
                endpoint(&mut self.tcp, &mut self.https, key.lane).close(
                    key.id,
                    now,
                    &mut |f: &[u8]| out.push(f),
                );
            } else if conn.pending.len() > MAX_BUFFERED {
                over.push(key);
            } else if !conn.pending.is_empty() {
                self.stalled.push(key);
            }
        }
        self.touched = touched;
        for key in over {
            self.reset(key, ctx);
        }
    }

    /// Resets `key` and forgets it.
    fn reset(&mut self, key: Key, ctx: &mut CoreCtx) {
        let out = &mut self.out;
        endpoint(&mut self.tcp, &mut self.https, key.lane)
            .abort(key.id, &mut |f: &[u8]| out.push(f));
        self.forget(key, ctx);
    }

    fn send_frames(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        let mut at = 0;
        for &len in &self.out.lens {
            let frame = &self.out.bytes[at..at + len];
            at += len;
            // Every send frame in flight: kick the kernel, take back what it finished, retry
            // once; a frame still refused is lost like a NIC's, and TCP retransmits it.
            if self.xsk.send(frame) || (self.xsk.flush().is_ok() && self.xsk.send(frame)) {
                ctx.metrics.bytes_out(len as u64);
            }
        }
        self.out.bytes.clear();
        self.out.lens.clear();
        self.xsk.flush()
    }

    /// Once a second: connections their sessions call expired, and handshakes past their
    /// timeout, are closed.
    fn sweep(&mut self, ctx: &mut CoreCtx) {
        if ctx.now_ms - self.last_sweep_ms < 1000 {
            return;
        }
        self.last_sweep_ms = ctx.now_ms;
        // A core's two endpoints report as one.
        let mut counts = self.tcp.stats().counts();
        if let Some(h) = &self.https {
            for (sum, n) in counts.iter_mut().zip(h.tcp.stats().counts()) {
                *sum += n;
            }
        }
        ctx.metrics.set_xdp_tcp(counts);
        let (now, idle, header) = (ctx.now_ms, self.idle_timeout_ms, self.header_timeout_ms);
        let handshake = self
            .https
            .as_ref()
            .map_or(i64::MAX, |h| h.tls.handshake_timeout_ms);
        let mut timed_out_handshakes = 0;
        let expired: Vec<Key> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                let started = c
                    .tls
                    .as_ref()
                    .filter(|t| t.handshaking)
                    .map(|t| t.accepted_ms);
                let handshaking = started.is_some();
                let slow =
                    started.is_some_and(|at| now - at > handshake) && !c.session.waiting_origin();
                // A closing connection is forgotten once its session expires too (TCP resets
                // it at its own idle backstop), so a peer that keeps ACKing holds nothing.
                let gone = slow || c.session.expired(now, idle, header);
                timed_out_handshakes += usize::from(gone && handshaking);
                gone
            })
            .map(|(key, _)| *key)
            .collect();
        if let Some(h) = &self.https {
            for _ in 0..timed_out_handshakes {
                h.tls.stats.failure(1); // timeout
            }
        }
        let tcp_now = self.started.elapsed().as_millis() as u64;
        let mut said_goodbye = false;
        for key in expired {
            if let Some(conn) = self.conns.get_mut(&key) {
                let handshaking = conn.tls.as_ref().is_some_and(|t| t.handshaking);
                if conn.session.is_h2() && !conn.closing && !handshaking {
                    // HTTP/2 says GOAWAY first; the output goes with a FIN.
                    let token = conn.token;
                    conn.session.expire(ctx, token, idle, header);
                    self.touched.push(key);
                    said_goodbye = true;
                    continue;
                }
            }
            // Closed with a FIN, as the kernel loops do; TCP resets it if the peer never
            // answers. Whatever still arrives for it is dropped.
            let out = &mut self.out;
            endpoint(&mut self.tcp, &mut self.https, key.lane).close(
                key.id,
                tcp_now,
                &mut |f: &[u8]| out.push(f),
            );
            self.forget(key, ctx);
        }
        if said_goodbye {
            self.push_output(tcp_now, ctx);
        }
        let _ = self.send_frames(ctx);
    }
}

/// The TCP endpoint of `lane` (a free function, so the caller can borrow the loop's other
/// fields beside it).
fn endpoint<'a>(plain: &'a mut Tcp, https: &'a mut Option<Https>, lane: Lane) -> &'a mut Tcp {
    match (lane, https) {
        (Lane::Https, Some(h)) => &mut h.tcp,
        _ => plain,
    }
}
