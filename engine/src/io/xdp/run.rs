//! One core's AF_XDP loop (`--io xdp`): the queue's socket in, `lasthop_edge::tcp` for the
//! connections, the same [`Session`] protocol as the io_uring and epoll loops for HTTP, the
//! socket out (engine/DESIGN.md, "The AF_XDP path").
//!
//! A turn: wait for frames or origin replies (at most one tick), hand every frame to the TCP
//! endpoint, feed the bytes it delivers to each connection's session, send what the sessions
//! rendered (closing where they say so), fire the TCP timers, flush the ACKs still owed, and
//! send every frame written. Frames are written into one flat buffer per turn and copied into
//! the UMEM by the socket, so nothing is allocated per frame.

use std::io;
use std::net::Ipv4Addr;
use std::ops::Range;

use hashbrown::HashMap;
use lasthop_edge::tcp::{ConnId, Tcp, TcpConfig, TcpEvent};

use super::xsk::{Xsk, XskConfig};
use super::XskMap;
use crate::origin::{OriginInbox, OriginReply};
use crate::session::{CoreCtx, Drive as _, Session};

/// What one core serves on the bypass path.
#[derive(Debug, Clone)]
pub struct XdpCore {
    pub ifindex: u32,
    pub queue: u32,
    pub mac: [u8; 6],
    pub addr: Ipv4Addr,
    pub port: u16,
    /// The SYN cookies' key (one per engine, random at start).
    pub cookie_key: [u8; 16],
    pub socket: XskConfig,
}

/// Bytes a connection may have waiting in the engine (rendered and not yet taken by TCP, or
/// received and not yet fed to its session): past this it is reset. A client that pipelines
/// without reading cannot make a core hold more (TCP's own send queue is bounded too).
const MAX_BUFFERED: usize = 1 << 20;

struct Conn {
    session: Session,
    /// Distinguishes this connection from an earlier one of the same 4-tuple in origin tokens.
    gen: u16,
    /// Rendered bytes the TCP endpoint has not taken yet (its send queue is full).
    pending: Vec<u8>,
    /// The peer sent FIN: close once everything rendered is taken.
    peer_closed: bool,
    /// Bytes that arrived while the session was parked on the origin (TCP has acknowledged
    /// them): fed to it once the reply is in.
    held: Vec<u8>,
}

/// An event the TCP endpoint reported, its bytes kept in the turn's arena.
enum Heard {
    Open(ConnId),
    Data(ConnId, Range<usize>),
    PeerClosed(ConnId),
    Closed(ConnId),
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
    conns: HashMap<ConnId, Conn>,
    next_gen: u16,
    inbox: Option<OriginInbox>,
    replies: Vec<OriginReply>,
    heard: Vec<Heard>,
    arena: Vec<u8>,
    /// This turn's frames to send.
    out: Outbox,
    /// Connections whose sessions rendered something this turn.
    touched: Vec<ConnId>,
    /// Connections with output TCP could not take yet: tried again every turn.
    stalled: Vec<ConnId>,
    started: std::time::Instant,
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

/// An origin token: the peer's address and port and the connection's generation.
fn token(id: ConnId, gen: u16) -> u64 {
    (u64::from(u32::from(id.addr)) << 32) | (u64::from(id.port) << 16) | u64::from(gen)
}

fn untoken(token: u64) -> (ConnId, u16) {
    let id = ConnId {
        addr: Ipv4Addr::from((token >> 32) as u32),
        port: (token >> 16) as u16,
    };
    (id, token as u16)
}

impl XdpLoop {
    /// Opens this core's socket on its queue and enters it in `map` (the XDP program, attached
    /// once every core has its socket, redirects into it).
    pub fn new(
        core: &XdpCore,
        map: &XskMap,
        max_conns: usize,
        inbox: Option<OriginInbox>,
        tick: std::time::Duration,
        idle_timeout_ms: i64,
        header_timeout_ms: i64,
    ) -> io::Result<XdpLoop> {
        let xsk = Xsk::open(core.ifindex, core.queue, &core.socket)?;
        map.set(core.queue, xsk.fd())?;
        let mut cfg = TcpConfig::new(core.addr, core.port, core.mac, core.cookie_key);
        // The sessions' own timeouts close idle connections first; this is the backstop.
        cfg.idle_ms = (idle_timeout_ms.max(header_timeout_ms).max(1) as u64) * 2;
        cfg.max_conns = max_conns.max(1);
        Ok(XdpLoop {
            xsk,
            tcp: Tcp::new(cfg),
            conns: HashMap::new(),
            next_gen: 1,
            inbox,
            replies: Vec::new(),
            heard: Vec::new(),
            arena: Vec::new(),
            out: Outbox::default(),
            touched: Vec::new(),
            stalled: Vec::new(),
            started: std::time::Instant::now(),
            tick_ms: tick.as_millis().clamp(1, 1000) as i32,
            idle_timeout_ms,
            header_timeout_ms,
            last_sweep_ms: 0,
        })
    }

    /// Stops accepting (drain on SIGTERM): new SYNs are reset, open connections served.
    pub fn stop_accepting(&mut self) -> io::Result<()> {
        self.tcp.stop_accepting();
        Ok(())
    }

    /// Connections still open.
    pub fn open_conns(&self) -> usize {
        self.conns.len()
    }

    /// One turn: wait up to one tick, then serve what arrived.
    pub fn turn(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        let wake = self.inbox.as_ref().map(OriginInbox::eventfd);
        self.xsk.wait_with(wake, self.tick_ms)?;
        ctx.refresh_clock();
        let now = self.started.elapsed().as_millis() as u64;
        let out = &mut self.out;
        let mut tx = |frame: &[u8]| out.push(frame);
        let (heard, arena) = (&mut self.heard, &mut self.arena);
        let mut app = |e: TcpEvent<'_>| {
            heard.push(match e {
                TcpEvent::Open(id) => Heard::Open(id),
                TcpEvent::Data(id, data) => {
                    let start = arena.len();
                    arena.extend_from_slice(data);
                    Heard::Data(id, start..arena.len())
                }
                TcpEvent::PeerClosed(id) => Heard::PeerClosed(id),
                TcpEvent::Closed(id) => Heard::Closed(id),
            })
        };
        let tcp = &mut self.tcp;
        self.xsk.receive(256, |frame| {
            // Frames that are not ours are counted by the endpoint and dropped.
            let _ = tcp.receive(frame, now, &mut tx, &mut app);
        });
        tcp.poll_timers(now, &mut tx, &mut app);
        self.on_heard(ctx);
        self.on_replies(ctx);
        self.push_output(now, ctx);
        let out = &mut self.out;
        self.tcp.flush(&mut |frame: &[u8]| out.push(frame));
        self.send_frames(ctx)?;
        self.sweep(ctx);
        Ok(())
    }

    fn on_heard(&mut self, ctx: &mut CoreCtx) {
        let mut heard = std::mem::take(&mut self.heard);
        for h in heard.drain(..) {
            match h {
                Heard::Open(id) => {
                    let gen = self.next_gen;
                    self.next_gen = self.next_gen.wrapping_add(1).max(1);
                    let mut session = Session::new(ctx.now_ms);
                    session.peer = Some(std::net::IpAddr::V4(id.addr));
                    self.conns.insert(
                        id,
                        Conn {
                            session,
                            gen,
                            pending: Vec::new(),
                            peer_closed: false,
                            held: Vec::new(),
                        },
                    );
                    ctx.metrics.connection_opened();
                }
                Heard::Data(id, range) => {
                    let Some(conn) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    ctx.metrics.bytes_in(range.len() as u64);
                    if conn.session.paused() || !conn.held.is_empty() || !conn.pending.is_empty() {
                        // Parked on the origin, or TCP has not taken the last answer yet: kept,
                        // in order, for later (TCP has acknowledged these bytes).
                        conn.held.extend_from_slice(&self.arena[range]);
                        if conn.held.len() > MAX_BUFFERED {
                            self.reset(id, ctx);
                        } else {
                            self.touched.push(id);
                        }
                        continue;
                    }
                    conn.session
                        .receive(&self.arena[range], ctx, token(id, conn.gen));
                    self.touched.push(id);
                }
                Heard::PeerClosed(id) => {
                    if let Some(conn) = self.conns.get_mut(&id) {
                        conn.peer_closed = true;
                        self.touched.push(id);
                    }
                }
                Heard::Closed(id) => {
                    if self.conns.remove(&id).is_some() {
                        ctx.metrics.connection_closed();
                    }
                }
            }
        }
        self.heard = heard;
        self.arena.clear();
    }

    fn on_replies(&mut self, ctx: &mut CoreCtx) {
        let Some(inbox) = &self.inbox else { return };
        inbox.drain(&mut self.replies);
        for reply in self.replies.drain(..) {
            let (id, gen) = untoken(reply.token);
            if let Some(conn) = self.conns.get_mut(&id).filter(|c| c.gen == gen) {
                conn.session.origin_replied(&reply.answer, ctx, reply.token);
                if !conn.session.paused() && !conn.held.is_empty() {
                    let held = std::mem::take(&mut conn.held);
                    conn.session.receive(&held, ctx, reply.token);
                }
                self.touched.push(id);
            }
        }
    }

    /// Hands what the touched sessions rendered to TCP, and closes where they (or the peer)
    /// are done.
    fn push_output(&mut self, now: u64, ctx: &mut CoreCtx) {
        let out = &mut self.out;
        let mut tx = |frame: &[u8]| out.push(frame);
        let mut over = Vec::new();
        // A connection listed twice is harmless: its second pass finds nothing to do.
        self.touched.append(&mut self.stalled);
        for id in self.touched.drain(..) {
            let Some(conn) = self.conns.get_mut(&id) else {
                continue;
            };
            loop {
                if conn.pending.is_empty() {
                    std::mem::swap(&mut conn.pending, &mut conn.session.out);
                } else {
                    conn.pending.append(&mut conn.session.out);
                }
                if !conn.pending.is_empty() {
                    let taken = self.tcp.send(id, &conn.pending, now, &mut tx);
                    conn.pending.drain(..taken);
                }
                // Input held while the last answer waited goes in once it has gone out.
                let ready = conn.pending.is_empty()
                    && !conn.session.paused()
                    && !conn.session.close_after_send;
                if ready && !conn.held.is_empty() {
                    let held = std::mem::take(&mut conn.held);
                    conn.session.receive(&held, ctx, token(id, conn.gen));
                    continue;
                }
                break;
            }
            let done = conn.session.close_after_send
                || (conn.peer_closed && !conn.session.waiting_origin());
            if conn.pending.is_empty() && done {
                self.tcp.close(id, now, &mut tx);
            } else if conn.pending.len() > MAX_BUFFERED {
                over.push(id);
            } else if !conn.pending.is_empty() {
                self.stalled.push(id);
            }
        }
        for id in over {
            self.reset(id, ctx);
        }
    }

    /// Resets `id` and forgets it.
    fn reset(&mut self, id: ConnId, ctx: &mut CoreCtx) {
        let out = &mut self.out;
        self.tcp.abort(id, &mut |frame: &[u8]| out.push(frame));
        if self.conns.remove(&id).is_some() {
            ctx.metrics.connection_closed();
        }
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

    /// Once a second: connections their sessions call expired are closed.
    fn sweep(&mut self, ctx: &mut CoreCtx) {
        if ctx.now_ms - self.last_sweep_ms < 1000 {
            return;
        }
        self.last_sweep_ms = ctx.now_ms;
        ctx.metrics.set_xdp_tcp(&self.tcp.stats());
        let (now, idle, header) = (ctx.now_ms, self.idle_timeout_ms, self.header_timeout_ms);
        let expired: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.session.expired(now, idle, header))
            .map(|(id, _)| *id)
            .collect();
        let tcp_now = self.started.elapsed().as_millis() as u64;
        let out = &mut self.out;
        let mut tx = |frame: &[u8]| out.push(frame);
        for id in expired {
            // Closed with a FIN, as the kernel loops do; TCP resets it if the peer never
            // answers. Whatever still arrives for it is dropped.
            self.tcp.close(id, tcp_now, &mut tx);
            if self.conns.remove(&id).is_some() {
                ctx.metrics.connection_closed();
            }
        }
        let _ = self.send_frames(ctx);
    }
}
