//! The passive side of TCP for the kernel-bypass path (engine/DESIGN.md, "The AF_XDP path"):
//! frames in, frames out, time an argument, no I/O. One [`Tcp`] serves one local address and
//! port on one core; the I/O loop hands it every frame the XDP program redirected, sends what
//! it writes, and calls [`Tcp::poll_timers`] every tick.
//!
//! - **Handshake without state: SYN cookies, always.** A SYN is answered with a SYN-ACK whose
//!   initial sequence number carries a keyed hash of the 4-tuple and the client's sequence, a
//!   64-second time slot and the MSS; the connection exists only once an ACK returns a valid
//!   cookie (a bare ACK that proves none is dropped, data or a FIN reset). A SYN flood costs
//!   a hash and a frame per SYN and no memory. The price: no window
//!   scaling or SACK (both need state or timestamps), so the receive window is at most 64 KiB,
//!   plenty for requests of a few hundred bytes.
//! - **Connections by their 4-tuple** in a hash map, and timers in a heap: the work per frame
//!   and per tick is proportional to what happens, not to the connections held (smoltcp's
//!   interface walks them all; `cargo bench --bench stack` measured it).
//! - **In order, with a little reassembly.** Data at `RCV.NXT` is handed to the application at
//!   once (so the window never shrinks). A segment ahead of it is answered with a duplicate ACK
//!   and held, up to [`HELD_SEGMENTS`] segments and [`HELD_BYTES`] bytes a connection, until the
//!   gap before it fills; past that it is dropped and the client retransmits it. Requests are
//!   small, but a ClientHello with a post-quantum key share (about 1,800 bytes from browsers)
//!   spans two segments at a 1,460-byte MSS and four at 536: one of them reordered or lost
//!   should cost its own retransmission, not the others'.
//! - **Sending**: the application's bytes are kept until acknowledged, sent in segments of the
//!   peer's MSS within its window, retransmitted from `SND.UNA` when the retransmission timer
//!   fires (RFC 6298: 1 s until the first round-trip sample, then SRTT + 4·RTTVAR from one
//!   timed segment per round trip, never from a retransmitted one (Karn), at least 200 ms as
//!   Linux's `TCP_RTO_MIN`; doubling on each expiry, at most 60 s, the connection reset after
//!   [`TcpConfig::max_retries`]); a zero window is probed by the same timer with one byte.
//! - **ACKs are deferred to the end of a batch** ([`Tcp::flush`]): a response written while the
//!   batch is handled carries the ACK, which is what a delayed ACK buys.
//! - **Closing**: FIN and RST both ways; a connection fully closed is forgotten at once (no
//!   TIME-WAIT: a late retransmitted FIN finds no connection and no valid cookie and is reset,
//!   which closes the peer's LAST-ACK as its own retransmission would).
//! - **Idle connections** are reset after [`TcpConfig::idle_ms`] without a segment.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hasher;
use std::net::IpAddr;

use hashbrown::HashMap;
use siphasher::sip::SipHasher13;

use crate::wire::{self, FrameError, Segment, TcpControl, TcpRepr, TcpSeqNumber};

/// What one endpoint serves and how it behaves.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// IPv4 or IPv6: an endpoint serves one family.
    pub addr: IpAddr,
    pub port: u16,
    /// The interface's MAC: the source of every frame written.
    pub mac: [u8; 6],
    /// The MSS announced in SYN-ACKs: an Ethernet MTU of 1500 less the IP and TCP headers
    /// (1460 on IPv4, 1440 on IPv6).
    pub mss: u16,
    /// The receive window announced (unscaled, at most 65,535).
    pub window: u16,
    /// Connections held at most; an ACK with a valid cookie beyond it is reset.
    pub max_conns: usize,
    /// Bytes a connection may have queued and unacknowledged; `send` takes no more.
    pub send_limit: usize,
    /// Reset a connection after this long without a segment from the peer.
    pub idle_ms: u64,
    /// Retransmissions of the same data before the connection is reset.
    pub max_retries: u32,
    /// The SYN cookies' hash key (random per process).
    pub cookie_key: [u8; 16],
}

impl TcpConfig {
    pub fn new(addr: IpAddr, port: u16, mac: [u8; 6], cookie_key: [u8; 16]) -> TcpConfig {
        TcpConfig {
            addr,
            port,
            mac,
            mss: (1500 - wire::ip_header(addr) - wire::TCP_HEADER) as u16,
            window: 65535,
            max_conns: 100_000,
            send_limit: 1 << 20,
            idle_ms: 60_000,
            max_retries: 8,
            cookie_key,
        }
    }
}

/// A connection: the peer's address and port (the local ones are the endpoint's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub addr: IpAddr,
    pub port: u16,
}

/// What the application hears.
#[derive(Debug, PartialEq, Eq)]
pub enum TcpEvent<'a> {
    /// A handshake completed.
    Open(ConnId),
    /// Bytes, in order.
    Data(ConnId, &'a [u8]),
    /// The peer sent FIN: no more data will come (the application may still send, then close).
    PeerClosed(ConnId),
    /// The connection is gone (closed both ways, reset, timed out); its id may come back.
    Closed(ConnId),
}

/// Counters, for the engine's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TcpStats {
    pub syns: u64,
    pub bad_cookies: u64,
    pub opened: u64,
    pub retransmits: u64,
    pub resets_sent: u64,
    pub timeouts: u64,
    pub bad_frames: u64,
    /// Segments that arrived ahead of `RCV.NXT` and were held for reassembly.
    pub held: u64,
}

impl TcpStats {
    /// The counters' names in [`TcpStats::counts`]' order (the engine's metric labels).
    pub const NAMES: [&'static str; 8] = [
        "syns",
        "bad_cookies",
        "opened",
        "retransmits",
        "resets_sent",
        "timeouts",
        "bad_frames",
        "held_out_of_order",
    ];

    /// The counters, in [`TcpStats::NAMES`]' order.
    pub fn counts(&self) -> [u64; 8] {
        [
            self.syns,
            self.bad_cookies,
            self.opened,
            self.retransmits,
            self.resets_sent,
            self.timeouts,
            self.bad_frames,
            self.held,
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Established,
    /// The peer's FIN arrived; ours has not been sent.
    CloseWait,
    /// Our FIN is sent (or queued behind data); the peer's has not arrived.
    FinWait,
    /// Both FINs sent; waiting for ours to be acknowledged.
    LastAck,
}

#[derive(Debug)]
struct Conn {
    peer_mac: [u8; 6],
    state: State,
    /// Oldest unacknowledged sequence number; `queue[0]` is its byte.
    snd_una: u32,
    /// Next sequence number to send.
    snd_nxt: u32,
    /// The highest sequence number sent (`snd_nxt` goes back to `snd_una` on a retransmission;
    /// ACKs up to this are still acceptable).
    snd_max: u32,
    /// The peer's window, from its last acceptable segment.
    snd_wnd: u32,
    peer_mss: u16,
    rcv_nxt: u32,
    /// Bytes from `snd_una` on: sent and unacknowledged, then unsent.
    queue: VecDeque<u8>,
    /// The application closed: a FIN follows the queue.
    fin_queued: bool,
    /// The FIN is out (at `snd_una + queue.len()`), acknowledged or not.
    fin_sent: bool,
    /// Our FIN's sequence number, once sent.
    fin_seq: Option<u32>,
    /// The deadline of this connection's live entry in the timer heap (`u64::MAX`: none).
    timer_at: u64,
    /// The retransmission timeout now (backed off while retransmitting).
    rto_ms: u64,
    /// The round-trip estimate (RFC 6298 §2), once a segment was timed.
    rtt: Option<Rtt>,
    /// The segment being timed: the sequence number whose acknowledgement ends the sample, and
    /// when it was sent. Never a retransmitted one (Karn's algorithm).
    timing: Option<(u32, u64)>,
    retries: u32,
    /// When the retransmission (or probe) timer fires, if armed.
    rtx_at: Option<u64>,
    last_heard: u64,
    ack_due: bool,
    /// Segments that arrived ahead of `rcv_nxt`, each within the window (at most
    /// [`HELD_SEGMENTS`], [`HELD_BYTES`] together).
    held: Vec<Held>,
}

/// A segment held until the bytes before it arrive.
#[derive(Debug)]
struct Held {
    seq: u32,
    data: Box<[u8]>,
    fin: bool,
}

/// Segments a connection holds ahead of `RCV.NXT` at most.
pub const HELD_SEGMENTS: usize = 8;
/// Bytes a connection holds ahead of `RCV.NXT` at most: a ClientHello and then some, less than
/// the TLS layer buffers for one record.
pub const HELD_BYTES: usize = 8 * 1024;

impl Conn {
    /// The application is done sending: a FIN follows the queue.
    fn queue_fin(&mut self) {
        self.fin_queued = true;
        self.state = match self.state {
            State::CloseWait => State::LastAck,
            _ => State::FinWait,
        };
    }
}

const RTO_INITIAL_MS: u64 = 1_000;
/// The floor of a computed RTO: Linux's `TCP_RTO_MIN` (RFC 6298 §2.4 asks for 1 s and allows
/// less; a peer's delayed ACK is at most 200 ms in practice, and an edge's round trips are
/// mostly far below it).
const RTO_MIN_MS: u64 = 200;
const RTO_MAX_MS: u64 = 60_000;

/// Smoothed round-trip time and its variation, in milliseconds (RFC 6298 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rtt {
    srtt: u64,
    rttvar: u64,
}

impl Rtt {
    /// The estimate after a first sample, or after `sample` updates it (α = 1/8, β = 1/4).
    fn update(rtt: Option<Rtt>, sample: u64) -> Rtt {
        match rtt {
            None => Rtt {
                srtt: sample,
                rttvar: sample / 2,
            },
            Some(r) => Rtt {
                rttvar: (3 * r.rttvar + r.srtt.abs_diff(sample)) / 4,
                srtt: (7 * r.srtt + sample) / 8,
            },
        }
    }

    /// SRTT + max(G, 4·RTTVAR) with a 1 ms clock, within [`RTO_MIN_MS`, `RTO_MAX_MS`].
    fn rto(self) -> u64 {
        (self.srtt + (4 * self.rttvar).max(1)).clamp(RTO_MIN_MS, RTO_MAX_MS)
    }
}
/// The MSS a cookie can carry (3 bits): the sizes clients announce most.
const COOKIE_MSS: [u16; 8] = [536, 1200, 1360, 1400, 1440, 1452, 1460, 8960];
/// A cookie's time slot: 64 s; one earlier slot is still accepted.
const SLOT_MS: u64 = 64_000;

/// One passive TCP endpoint.
#[derive(Debug)]
pub struct Tcp {
    cfg: TcpConfig,
    conns: HashMap<ConnId, Conn>,
    /// (deadline, connection): each connection's next retransmission or idle check; an entry
    /// is live only if it matches the connection's `timer_at`.
    timers: BinaryHeap<Reverse<(u64, ConnId)>>,
    /// Connections with an ACK owed, sent by `flush`.
    acks: Vec<ConnId>,
    /// Where frames are written before `tx` takes them.
    scratch: Vec<u8>,
    /// False once draining: new SYNs (and cookies coming back) are reset.
    accepting: bool,
    stats: TcpStats,
}

impl Tcp {
    pub fn new(cfg: TcpConfig) -> Tcp {
        Tcp {
            cfg,
            conns: HashMap::new(),
            timers: BinaryHeap::new(),
            acks: Vec::new(),
            scratch: Vec::new(),
            accepting: true,
            stats: TcpStats::default(),
        }
    }

    /// Most connections held at once; SYNs past it are reset.
    pub fn set_max_conns(&mut self, max: usize) {
        self.cfg.max_conns = max;
    }

    /// The local port this endpoint serves.
    pub fn port(&self) -> u16 {
        self.cfg.port
    }

    /// Stops opening connections (a draining engine): SYNs and returning cookies are reset;
    /// connections held are served to their end.
    pub fn stop_accepting(&mut self) {
        self.accepting = false;
    }

    pub fn stats(&self) -> TcpStats {
        self.stats
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Handles one received frame at `now_ms`: frames to send go to `tx`, what the application
    /// must hear to `app`. A frame that is not a well-formed TCP segment to our address and
    /// port from a unicast address is refused with the reason (and counted), changing nothing.
    pub fn receive(
        &mut self,
        frame: &[u8],
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
        app: &mut dyn FnMut(TcpEvent<'_>),
    ) -> Result<(), FrameError> {
        let seg = match wire::parse(frame) {
            Ok(seg)
                if seg.dst == self.cfg.addr
                    && seg.tcp.dst_port == self.cfg.port
                    && wire::unicast(seg.src) =>
            {
                seg
            }
            Ok(_) => {
                self.stats.bad_frames += 1;
                return Err(FrameError::NotOurs);
            }
            Err(e) => {
                self.stats.bad_frames += 1;
                return Err(e);
            }
        };
        let id = ConnId {
            addr: seg.src,
            port: seg.tcp.src_port,
        };
        if self.conns.contains_key(&id) {
            self.on_segment(id, &seg, now_ms, tx, app);
        } else {
            self.on_stranger(id, &seg, now_ms, tx, app);
        }
        Ok(())
    }

    /// Queues `data` on `id` and sends what the peer's window allows. Returns how many bytes
    /// were taken: fewer than offered when the queue is at [`TcpConfig::send_limit`], none on
    /// a connection that is gone or closed for sending.
    pub fn send(
        &mut self,
        id: ConnId,
        data: &[u8],
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
    ) -> usize {
        self.queue(id, data, false, now_ms, tx)
    }

    /// [`Tcp::send`] of a connection's last bytes: when all of `data` is taken, the FIN is
    /// queued behind it before anything is sent, so it rides on the last data segment instead
    /// of following in a segment of its own (as [`Tcp::close`] after [`Tcp::send`] would).
    pub fn send_and_close(
        &mut self,
        id: ConnId,
        data: &[u8],
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
    ) -> usize {
        self.queue(id, data, true, now_ms, tx)
    }

    fn queue(
        &mut self,
        id: ConnId,
        data: &[u8],
        close: bool,
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let limit = self.cfg.send_limit;
        let Some(c) = self.conns.get_mut(&id) else {
            return 0;
        };
        if c.fin_queued {
            return 0;
        }
        let take = data.len().min(limit.saturating_sub(c.queue.len()));
        c.queue.extend(&data[..take]);
        if close && take == data.len() {
            c.queue_fin();
        }
        self.transmit(id, now_ms, tx);
        take
    }

    /// Closes `id` for sending: a FIN follows the queued bytes.
    pub fn close(&mut self, id: ConnId, now_ms: u64, tx: &mut dyn FnMut(&[u8])) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.fin_queued {
            return;
        }
        c.queue_fin();
        self.transmit(id, now_ms, tx);
    }

    /// Resets `id` and forgets it (no `Closed` event: the caller asked).
    pub fn abort(&mut self, id: ConnId, tx: &mut dyn FnMut(&[u8])) {
        if let Some(c) = self.conns.remove(&id) {
            self.send_rst(id, c.peer_mac, c.snd_max, tx);
        }
    }

    /// Sends the ACKs owed since the last flush (those not carried by data meanwhile). Call it
    /// after a batch of frames and the application's answers to them.
    pub fn flush(&mut self, tx: &mut dyn FnMut(&[u8])) {
        for id in std::mem::take(&mut self.acks) {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.ack_due {
                c.ack_due = false;
                let (mac, seq, ack) = (c.peer_mac, c.snd_nxt, c.rcv_nxt);
                self.emit(id, mac, seq, Some(ack), TcpControl::None, &[], None, tx);
            }
        }
    }

    /// Fires the timers due at `now_ms`: retransmissions and zero-window probes, connections
    /// out of retries or idle too long (reset, `Closed`). Work is proportional to the timers
    /// due, not to the connections held.
    pub fn poll_timers(
        &mut self,
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
        app: &mut dyn FnMut(TcpEvent<'_>),
    ) {
        // Stale entries (re-armed earlier, or of connections gone) leave only when due: past
        // twice the live ones, drop them now so churn cannot grow the heap.
        if self.timers.len() > 2 * self.conns.len() + 1024 {
            let conns = &self.conns;
            self.timers
                .retain(|Reverse((at, id))| conns.get(id).is_some_and(|c| c.timer_at == *at));
        }
        while let Some(&Reverse((at, id))) = self.timers.peek() {
            if at > now_ms {
                break;
            }
            self.timers.pop();
            let idle_ms = self.cfg.idle_ms;
            let max_retries = self.cfg.max_retries;
            // Each connection has one live entry, the one at its `timer_at`; others are stale.
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.timer_at != at {
                continue;
            }
            c.timer_at = u64::MAX;
            if now_ms >= c.last_heard + idle_ms
                || (c.rtx_at.is_some_and(|d| d <= now_ms) && c.retries >= max_retries)
            {
                self.stats.timeouts += 1;
                self.abort(id, tx);
                app(TcpEvent::Closed(id));
                continue;
            }
            if c.rtx_at.is_some_and(|d| d <= now_ms) {
                c.retries += 1;
                c.rto_ms = (c.rto_ms * 2).min(RTO_MAX_MS);
                c.rtx_at = None;
                // What is sent again cannot be timed (Karn): its ACK may answer either copy.
                c.timing = None;
                // Go back to the oldest unacknowledged byte (the FIN too, if it was out); a
                // zero window gets a one-byte probe.
                c.snd_nxt = c.snd_una;
                c.fin_sent = c.fin_seq.is_some_and(|f| c.snd_una == f.wrapping_add(1));
                let probe = c.snd_wnd == 0;
                if probe {
                    c.snd_wnd = 1;
                }
                self.stats.retransmits += 1;
                self.transmit(id, now_ms, tx);
                if probe {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.snd_wnd = 0;
                    }
                }
            }
            if let Some(c) = self.conns.get(&id) {
                let next = c.rtx_at.unwrap_or(u64::MAX).min(c.last_heard + idle_ms);
                self.arm(id, next);
            }
        }
    }

    /// A segment for a connection we do not hold: a SYN gets a cookie, an ACK that returns a
    /// valid one opens the connection, a bare ACK that does not is dropped, anything else but
    /// a RST is reset.
    fn on_stranger(
        &mut self,
        id: ConnId,
        seg: &Segment<'_>,
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
        app: &mut dyn FnMut(TcpEvent<'_>),
    ) {
        let t = &seg.tcp;
        match (t.control, t.ack_number) {
            (TcpControl::Rst, _) => {}
            (TcpControl::Syn, None) if self.accepting => {
                self.stats.syns += 1;
                let mss = t.max_seg_size.unwrap_or(536).min(self.cfg.mss);
                let isn = self.cookie(id, t.seq_number.0 as u32, slot(now_ms), mss_index(mss));
                let ack = (t.seq_number + 1).0 as u32;
                self.emit(
                    id,
                    seg.eth_src,
                    isn,
                    Some(ack),
                    TcpControl::Syn,
                    &[],
                    Some(self.cfg.mss),
                    tx,
                );
            }
            (TcpControl::None | TcpControl::Psh | TcpControl::Fin, Some(ack)) => {
                let isn = (ack.0 as u32).wrapping_sub(1);
                let client_isn = (t.seq_number.0 as u32).wrapping_sub(1);
                match self.check_cookie(id, isn, client_isn, now_ms) {
                    Some(mss) if self.accepting && self.conns.len() < self.cfg.max_conns => {
                        self.stats.opened += 1;
                        let conn = Conn {
                            peer_mac: seg.eth_src,
                            state: State::Established,
                            snd_una: ack.0 as u32,
                            snd_nxt: ack.0 as u32,
                            snd_max: ack.0 as u32,
                            snd_wnd: u32::from(t.window_len),
                            peer_mss: mss,
                            rcv_nxt: t.seq_number.0 as u32,
                            queue: VecDeque::new(),
                            fin_queued: false,
                            fin_sent: false,
                            fin_seq: None,
                            timer_at: u64::MAX,
                            rto_ms: RTO_INITIAL_MS,
                            rtt: None,
                            timing: None,
                            retries: 0,
                            rtx_at: None,
                            last_heard: now_ms,
                            ack_due: false,
                            held: Vec::new(),
                        };
                        self.conns.insert(id, conn);
                        self.arm(id, now_ms + self.cfg.idle_ms);
                        app(TcpEvent::Open(id));
                        // The ACK may carry the request (and even a FIN): handle it as usual.
                        self.on_segment(id, seg, now_ms, tx, app);
                    }
                    Some(_) => self.send_rst(id, seg.eth_src, ack.0 as u32, tx),
                    None => {
                        self.stats.bad_cookies += 1;
                        // A bare ACK that proves no cookie is dropped, not reset: its sequence
                        // may be past data of the client's that was lost before it reached
                        // us (a challenge ACK answering a spoofed SYN on the client's port
                        // in a SYN flood is one), and a reset would kill a connection whose
                        // retransmission from its first byte still proves the cookie. A
                        // segment with data or a FIN is reset: that is a connection we
                        // forgot (an engine restart, a lost reset) and the client is waiting.
                        if !t.payload.is_empty() || t.control == TcpControl::Fin {
                            self.send_rst(id, seg.eth_src, ack.0 as u32, tx);
                        }
                    }
                }
            }
            _ => {
                let mut out = [0u8; wire::MAX_RESET];
                if let Some(n) = wire::write_reset(seg, &mut out) {
                    self.stats.resets_sent += 1;
                    tx(&out[..n]);
                }
            }
        }
    }

    /// A segment for a connection we hold (RFC 9293 §3.10.7.4, in-order receive).
    fn on_segment(
        &mut self,
        id: ConnId,
        seg: &Segment<'_>,
        now_ms: u64,
        tx: &mut dyn FnMut(&[u8]),
        app: &mut dyn FnMut(TcpEvent<'_>),
    ) {
        let t = &seg.tcp;
        let seq = t.seq_number.0 as u32;
        let window = u32::from(self.cfg.window);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        // A RST is believed only at exactly RCV.NXT (RFC 5961 §3.2; elsewhere in the window it
        // would earn a challenge ACK, which we fold into "ignored").
        if t.control == TcpControl::Rst {
            if seq == c.rcv_nxt {
                self.conns.remove(&id);
                app(TcpEvent::Closed(id));
            }
            return;
        }
        if t.control == TcpControl::Syn {
            // A SYN on an open connection: a challenge ACK (RFC 5961 §4).
            c.ack_due = true;
            self.acks.push(id);
            return;
        }
        c.last_heard = now_ms;
        if let Some(ack) = t.ack_number {
            let ack = ack.0 as u32;
            let acked = ack.wrapping_sub(c.snd_una);
            let outstanding = c.snd_max.wrapping_sub(c.snd_una);
            if acked <= outstanding {
                if c.snd_wnd == 0 {
                    // A peer answering zero-window probes is alive (RFC 9293 §3.8.6.1): the
                    // probes go on, with their backoff, as long as it answers.
                    c.retries = 0;
                }
                if acked > 0 {
                    // The timed segment is acknowledged: a round-trip sample (RFC 6298 §3), and
                    // the RTO from it. Without one (an ACK of retransmitted data) a backed-off
                    // RTO stays until new data is timed (Karn).
                    if let Some((end, sent_at)) = c.timing {
                        if !seq_lt(ack, end) {
                            let rtt = Rtt::update(c.rtt, now_ms.saturating_sub(sent_at));
                            c.rtt = Some(rtt);
                            c.rto_ms = rtt.rto();
                            c.timing = None;
                        }
                    }
                    // The FIN takes a sequence number but no queue byte.
                    let bytes = (acked as usize).min(c.queue.len());
                    c.queue.drain(..bytes);
                    c.snd_una = ack;
                    // A late ACK for a flight sent before a retransmission moves `snd_nxt` on.
                    if seq_lt(c.snd_nxt, ack) {
                        c.snd_nxt = ack;
                    }
                    if c.fin_seq.is_some_and(|f| ack == f.wrapping_add(1)) {
                        c.fin_sent = true; // acknowledged: never again
                    }
                    c.retries = 0;
                    // What is still out gets a fresh timer (RFC 6298 §5.3).
                    c.rtx_at = (c.snd_max != c.snd_una).then_some(now_ms + c.rto_ms);
                    if let Some(at) = c.rtx_at {
                        arm_timer(&mut self.timers, c, id, at);
                    }
                }
                c.snd_wnd = u32::from(t.window_len);
            } else if seq_lt(c.snd_max, ack) {
                // Acknowledges what we never sent: answer with an ACK, take nothing.
                c.ack_due = true;
                self.acks.push(id);
                return;
            }
        }
        // The part of the segment at or past RCV.NXT, if it starts at or before it.
        let len = t.payload.len() as u32;
        let offset = c.rcv_nxt.wrapping_sub(seq);
        let mut fin = t.control == TcpControl::Fin;
        if len + u32::from(fin) > 0 {
            c.ack_due = true;
            self.acks.push(id);
        }
        let receiving = !matches!(c.state, State::CloseWait | State::LastAck);
        if offset <= len && receiving {
            let fresh = &t.payload[offset as usize..];
            let fresh = &fresh[..fresh.len().min(window as usize)];
            if fresh.len() < t.payload.len() - offset as usize {
                fin = false; // the window cut the tail: its FIN is not here yet
            }
            if !fresh.is_empty() {
                c.rcv_nxt = c.rcv_nxt.wrapping_add(fresh.len() as u32);
                app(TcpEvent::Data(id, fresh));
            }
            if !fin {
                fin = deliver_held(c, id, app);
            }
            if fin {
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                c.rcv_nxt = c.rcv_nxt.wrapping_add(1);
                c.state = match c.state {
                    State::FinWait => State::LastAck,
                    _ => State::CloseWait,
                };
                app(TcpEvent::PeerClosed(id));
            }
        } else if receiving && seq_lt(c.rcv_nxt, seq) && len + u32::from(fin) > 0 {
            // Ahead of RCV.NXT: held if it fits in the window and the connection's allowance
            // (the duplicate ACK owed above tells the client where the gap starts).
            let ahead = seq.wrapping_sub(c.rcv_nxt);
            let bytes: usize = c.held.iter().map(|h| h.data.len()).sum();
            let fits = ahead + len <= window
                && c.held.len() < HELD_SEGMENTS
                && bytes + len as usize <= HELD_BYTES;
            let known = c
                .held
                .iter()
                .any(|h| h.seq == seq && h.data.len() >= len as usize);
            if fits && !known {
                c.held.retain(|h| h.seq != seq);
                c.held.push(Held {
                    seq,
                    data: t.payload.into(),
                    fin,
                });
                self.stats.held += 1;
            }
        }
        // The application may have answered (sent, closed) inside `app`; send what is due.
        self.transmit(id, now_ms, tx);
        let Some(c) = self.conns.get(&id) else { return };
        let fin_acked = c.fin_seq.is_some_and(|f| c.snd_una == f.wrapping_add(1));
        if c.state == State::LastAck && fin_acked {
            // Both FINs sent and ours acknowledged: done. The peer's FIN is ACKed now.
            if c.ack_due {
                let (mac, s, a) = (c.peer_mac, c.snd_nxt, c.rcv_nxt);
                self.emit(id, mac, s, Some(a), TcpControl::None, &[], None, tx);
            }
            self.conns.remove(&id);
            app(TcpEvent::Closed(id));
        }
    }

    /// Sends what the queue holds past `snd_nxt` within the peer's window, then the FIN, and
    /// arms the retransmission timer for what is in flight (or the probe of a zero window).
    fn transmit(&mut self, id: ConnId, now_ms: u64, tx: &mut dyn FnMut(&[u8])) {
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            let in_flight = c.snd_nxt.wrapping_sub(c.snd_una) as usize;
            let data_in_flight = in_flight.min(c.queue.len());
            let unsent = c.queue.len() - data_in_flight;
            let room = (c.snd_wnd as usize).saturating_sub(in_flight);
            let n = unsent.min(room).min(usize::from(c.peer_mss));
            let fin_now = c.fin_queued && !c.fin_sent && n == unsent;
            if n == 0 && !fin_now {
                if unsent > 0 && c.snd_wnd == 0 && c.rtx_at.is_none() {
                    let at = now_ms + c.rto_ms;
                    c.rtx_at = Some(at);
                    self.arm(id, at);
                }
                return;
            }
            let control = if fin_now {
                TcpControl::Fin
            } else if n == unsent {
                TcpControl::Psh
            } else {
                TcpControl::None
            };
            let (mac, seq, ack) = (c.peer_mac, c.snd_nxt, c.rcv_nxt);
            if fin_now {
                c.fin_seq = Some(c.snd_nxt.wrapping_add(n as u32));
            }
            c.snd_nxt = c.snd_nxt.wrapping_add(n as u32 + u32::from(fin_now));
            if seq_lt(c.snd_max, c.snd_nxt) {
                // New data (not a retransmission): time it, unless a segment is timed already.
                if c.timing.is_none() && !seq_lt(seq, c.snd_max) {
                    c.timing = Some((c.snd_nxt, now_ms));
                }
                c.snd_max = c.snd_nxt;
            }
            c.fin_sent |= fin_now;
            c.ack_due = false;
            if c.rtx_at.is_none() {
                let at = now_ms + c.rto_ms;
                c.rtx_at = Some(at);
                self.arm(id, at);
            }
            // The segment's bytes straight from the queue (contiguous after the first call; a
            // per-segment copy into a Vec cost 2 % of a core at 130k requests/s).
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            let payload = &c.queue.make_contiguous()[data_in_flight..data_in_flight + n];
            write_segment(
                &self.cfg,
                &mut self.scratch,
                id,
                mac,
                seq,
                Some(ack),
                control,
                payload,
                None,
                tx,
            );
            if fin_now {
                return;
            }
        }
    }

    /// Makes sure `id`'s timer entry fires no later than `at`.
    fn arm(&mut self, id: ConnId, at: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            arm_timer(&mut self.timers, c, id, at);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &mut self,
        id: ConnId,
        peer_mac: [u8; 6],
        seq: u32,
        ack: Option<u32>,
        control: TcpControl,
        payload: &[u8],
        mss: Option<u16>,
        tx: &mut dyn FnMut(&[u8]),
    ) {
        write_segment(
            &self.cfg,
            &mut self.scratch,
            id,
            peer_mac,
            seq,
            ack,
            control,
            payload,
            mss,
            tx,
        );
    }

    fn send_rst(&mut self, id: ConnId, peer_mac: [u8; 6], seq: u32, tx: &mut dyn FnMut(&[u8])) {
        self.stats.resets_sent += 1;
        self.emit(id, peer_mac, seq, None, TcpControl::Rst, &[], None, tx);
    }

    /// The cookie: 5 bits of time slot, 3 of MSS index, 24 of keyed hash.
    fn cookie(&self, id: ConnId, client_isn: u32, slot: u64, mss_idx: u32) -> u32 {
        let (k0, k1) = self.cfg.cookie_key.split_at(8);
        let mut h = SipHasher13::new_with_keys(
            u64::from_le_bytes(k0.try_into().expect("8 bytes")),
            u64::from_le_bytes(k1.try_into().expect("8 bytes")),
        );
        hash_addr(&mut h, id.addr);
        h.write_u16(id.port);
        hash_addr(&mut h, self.cfg.addr);
        h.write_u16(self.cfg.port);
        h.write_u32(client_isn);
        h.write_u64(slot);
        h.write_u32(mss_idx);
        let hash = (h.finish() & 0x00ff_ffff) as u32;
        ((slot as u32 & 0x1f) << 27) | (mss_idx << 24) | hash
    }

    /// The MSS a returned cookie carries, if it is ours and from this slot or the one before.
    fn check_cookie(&self, id: ConnId, isn: u32, client_isn: u32, now_ms: u64) -> Option<u16> {
        let now = slot(now_ms);
        let mss_idx = (isn >> 24) & 0x7;
        let their = u64::from(isn >> 27);
        [now, now.wrapping_sub(1)]
            .into_iter()
            .find(|&s| s & 0x1f == their && self.cookie(id, client_isn, s, mss_idx) == isn)
            .map(|_| COOKIE_MSS[mss_idx as usize])
    }
}

/// Writes one segment to `id` as a whole frame into `scratch` and hands it to `tx`.
#[allow(clippy::too_many_arguments)]
fn write_segment(
    cfg: &TcpConfig,
    scratch: &mut Vec<u8>,
    id: ConnId,
    peer_mac: [u8; 6],
    seq: u32,
    ack: Option<u32>,
    control: TcpControl,
    payload: &[u8],
    mss: Option<u16>,
    tx: &mut dyn FnMut(&[u8]),
) {
    let repr = TcpRepr {
        src_port: cfg.port,
        dst_port: id.port,
        control,
        seq_number: TcpSeqNumber(seq as i32),
        ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: cfg.window,
        window_scale: None,
        max_seg_size: mss,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload,
    };
    // Only the frame's own bytes are cleared (a 9 KiB stack buffer zeroed per segment
    // cost more than the rest of a SYN-ACK).
    let len = wire::ETHERNET_HEADER + wire::ip_header(cfg.addr) + repr.buffer_len();
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    let out = &mut scratch[..len];
    out.fill(0);
    if let Some(n) = wire::write_frame(cfg.mac, peer_mac, cfg.addr, id.addr, &repr, out) {
        tx(&out[..n]);
    }
}

/// Makes sure connection `c` (`id`) has a timer entry firing no later than `at`: the entry
/// matching its `timer_at` is its live one, earlier ones go stale.
/// Hands the application what the held segments now continue from `rcv_nxt`, in order, and
/// drops those wholly behind it; true when that reached a held FIN.
fn deliver_held(c: &mut Conn, id: ConnId, app: &mut dyn FnMut(TcpEvent<'_>)) -> bool {
    loop {
        let rcv = c.rcv_nxt;
        // A segment ends where its FIN would be; one ending at or before RCV.NXT is done with,
        // unless its FIN sits exactly there.
        c.held.retain(|h| {
            let end = h.seq.wrapping_add(h.data.len() as u32);
            seq_lt(rcv, end) || (h.fin && end == rcv)
        });
        let Some(i) = c.held.iter().position(|h| !seq_lt(rcv, h.seq)) else {
            return false;
        };
        let h = c.held.swap_remove(i);
        let fresh = &h.data[rcv.wrapping_sub(h.seq) as usize..];
        if !fresh.is_empty() {
            c.rcv_nxt = c.rcv_nxt.wrapping_add(fresh.len() as u32);
            app(TcpEvent::Data(id, fresh));
        }
        if h.fin {
            c.held.clear();
            return true;
        }
    }
}

fn arm_timer(timers: &mut BinaryHeap<Reverse<(u64, ConnId)>>, c: &mut Conn, id: ConnId, at: u64) {
    if at < c.timer_at {
        c.timer_at = at;
        timers.push(Reverse((at, id)));
    }
}

/// An address into the cookie's hash: its octets, 4 or 16.
fn hash_addr(h: &mut SipHasher13, addr: IpAddr) {
    match addr {
        IpAddr::V4(a) => h.write(&a.octets()),
        IpAddr::V6(a) => h.write(&a.octets()),
    }
}

fn slot(now_ms: u64) -> u64 {
    now_ms / SLOT_MS
}

/// The largest cookie MSS not above `mss`.
fn mss_index(mss: u16) -> u32 {
    COOKIE_MSS.iter().rposition(|&m| m <= mss).unwrap_or(0) as u32
}

/// `a < b` in sequence space (RFC 9293 §3.4).
fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const SERVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
    const ID: ConnId = ConnId {
        addr: CLIENT,
        port: 40000,
    };
    // The IPv6 benchmarking prefix (RFC 5180).
    const SERVER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1));
    const CLIENT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2));
    const ID6: ConnId = ConnId {
        addr: CLIENT6,
        port: 40000,
    };

    /// What the endpoint wrote back, parsed: (control, seq, ack, payload, mss option).
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Out {
        control: TcpControl,
        seq: u32,
        ack: Option<u32>,
        payload: Vec<u8>,
        mss: Option<u16>,
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Ev {
        Open,
        Data(Vec<u8>),
        PeerClosed,
        Closed,
    }

    struct World {
        tcp: Tcp,
        now: u64,
        sent: Vec<Out>,
        events: Vec<Ev>,
        /// The client's next sequence number.
        seq: u32,
    }

    impl World {
        fn new() -> World {
            World::at(SERVER)
        }

        /// A world whose server has `server` (SERVER or SERVER6), its client the other
        /// constant of that family.
        fn at(server: IpAddr) -> World {
            let mut cfg = TcpConfig::new(server, 80, SERVER_MAC, [7; 16]);
            cfg.max_retries = 3;
            cfg.idle_ms = 30_000;
            World {
                tcp: Tcp::new(cfg),
                now: 1_000_000,
                sent: Vec::new(),
                events: Vec::new(),
                seq: 5000,
            }
        }

        fn segment(&mut self, control: TcpControl, ack: Option<u32>, window: u16, payload: &[u8]) {
            self.segment_at(self.seq, control, ack, window, payload);
            self.seq = self
                .seq
                .wrapping_add(payload.len() as u32 + control.len() as u32);
        }

        fn segment_at(
            &mut self,
            seq: u32,
            control: TcpControl,
            ack: Option<u32>,
            window: u16,
            payload: &[u8],
        ) {
            let repr = TcpRepr {
                src_port: ID.port,
                dst_port: 80,
                control,
                seq_number: TcpSeqNumber(seq as i32),
                ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
                window_len: window,
                window_scale: None,
                max_seg_size: (control == TcpControl::Syn).then_some(1460),
                sack_permitted: false,
                sack_ranges: [None; 3],
                timestamp: None,
                payload,
            };
            let mut frame = vec![0u8; 2000];
            let n = wire::write_frame(
                CLIENT_MAC,
                SERVER_MAC,
                self.id().addr,
                self.tcp.cfg.addr,
                &repr,
                &mut frame,
            )
            .unwrap();
            let (sent, events) = (&mut self.sent, &mut self.events);
            self.tcp
                .receive(
                    &frame[..n],
                    self.now,
                    &mut |f| sent.push(out(f)),
                    &mut |e| events.push(ev(e)),
                )
                .unwrap();
        }

        fn flush(&mut self) {
            let sent = &mut self.sent;
            self.tcp.flush(&mut |f| sent.push(out(f)));
        }

        fn timers(&mut self, after_ms: u64) {
            self.now += after_ms;
            let (sent, events) = (&mut self.sent, &mut self.events);
            self.tcp
                .poll_timers(self.now, &mut |f| sent.push(out(f)), &mut |e| {
                    events.push(ev(e))
                });
        }

        /// The client's connection: [`ID`], or [`ID6`] in an IPv6 world.
        fn id(&self) -> ConnId {
            if self.tcp.cfg.addr.is_ipv6() {
                ID6
            } else {
                ID
            }
        }

        fn send(&mut self, data: &[u8]) -> usize {
            let (id, sent) = (self.id(), &mut self.sent);
            self.tcp
                .send(id, data, self.now, &mut |f| sent.push(out(f)))
        }

        fn close(&mut self) {
            let (id, sent) = (self.id(), &mut self.sent);
            self.tcp.close(id, self.now, &mut |f| sent.push(out(f)));
        }

        /// The handshake; returns the server's next sequence number.
        fn open(&mut self) -> u32 {
            self.segment(TcpControl::Syn, None, 64240, &[]);
            let synack = self.sent.pop().unwrap();
            assert_eq!(synack.control, TcpControl::Syn);
            assert_eq!(synack.ack, Some(self.seq));
            let isn = synack.seq;
            self.segment(TcpControl::None, Some(isn.wrapping_add(1)), 64240, &[]);
            assert_eq!(self.events.drain(..).collect::<Vec<_>>(), [Ev::Open]);
            isn.wrapping_add(1)
        }
    }

    fn out(frame: &[u8]) -> Out {
        let seg = wire::parse(frame).expect("we write parsable frames");
        assert!(
            [(SERVER, CLIENT), (SERVER6, CLIENT6)].contains(&(seg.src, seg.dst)),
            "{} -> {}",
            seg.src,
            seg.dst
        );
        assert_eq!((seg.eth_src, seg.eth_dst), (SERVER_MAC, CLIENT_MAC));
        Out {
            control: seg.tcp.control,
            seq: seg.tcp.seq_number.0 as u32,
            ack: seg.tcp.ack_number.map(|a| a.0 as u32),
            payload: seg.tcp.payload.to_vec(),
            mss: seg.tcp.max_seg_size,
        }
    }

    fn ev(e: TcpEvent<'_>) -> Ev {
        match e {
            TcpEvent::Open(id)
            | TcpEvent::PeerClosed(id)
            | TcpEvent::Closed(id)
            | TcpEvent::Data(id, _) => {
                assert!(id == ID || id == ID6, "{id:?}")
            }
        }
        match e {
            TcpEvent::Open(_) => Ev::Open,
            TcpEvent::Data(_, d) => Ev::Data(d.to_vec()),
            TcpEvent::PeerClosed(_) => Ev::PeerClosed,
            TcpEvent::Closed(_) => Ev::Closed,
        }
    }

    #[test]
    fn a_syn_is_answered_with_a_cookie_and_no_state_until_the_ack_returns_it() {
        let mut w = World::new();
        w.segment(TcpControl::Syn, None, 64240, &[]);
        let synack = w.sent.pop().unwrap();
        assert_eq!(synack.mss, Some(1460));
        assert!(w.tcp.is_empty(), "nothing held for a SYN");
        w.segment(
            TcpControl::None,
            Some(synack.seq.wrapping_add(1)),
            64240,
            &[],
        );
        assert_eq!(w.events, [Ev::Open]);
        assert_eq!(w.tcp.len(), 1);
        assert!(w.sent.is_empty(), "the ACK needs no answer");
    }

    #[test]
    fn a_forged_or_stale_cookie_is_reset_and_opens_nothing() {
        let mut w = World::new();
        w.segment(TcpControl::Syn, None, 64240, &[]);
        let isn = w.sent.pop().unwrap().seq;
        w.segment_at(
            w.seq,
            TcpControl::Psh,
            Some(isn.wrapping_add(2)),
            64240,
            b"GET",
        );
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Rst);
        // The right cookie, two slots (over two minutes) later.
        w.now += 2 * SLOT_MS;
        w.segment_at(
            w.seq,
            TcpControl::Fin,
            Some(isn.wrapping_add(1)),
            64240,
            &[],
        );
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Rst);
        // A bare ACK with either is dropped: it opens nothing and earns nothing.
        w.segment_at(
            w.seq,
            TcpControl::None,
            Some(isn.wrapping_add(1)),
            64240,
            &[],
        );
        assert!(w.sent.is_empty(), "{:?}", w.sent);
        assert!(w.tcp.is_empty() && w.events.is_empty());
        assert_eq!(w.tcp.stats().bad_cookies, 3);
        // One slot later is still good (a slow client).
        w.now -= SLOT_MS;
        w.segment_at(
            w.seq,
            TcpControl::None,
            Some(isn.wrapping_add(1)),
            64240,
            &[],
        );
        assert_eq!(w.events, [Ev::Open]);
    }

    /// The CI failure of a SYN flood over AF_XDP: the client's request was lost before the
    /// server opened the connection, a spoofed SYN from the client's own port drew a SYN-ACK,
    /// and the client's kernel answered it with a challenge ACK whose sequence is past the
    /// request. Resetting that ACK killed the connection; dropped, the request's
    /// retransmission opens it.
    #[test]
    fn a_challenge_ack_past_lost_data_does_not_reset_the_connection_its_retransmission_opens() {
        let mut w = World::new();
        w.segment(TcpControl::Syn, None, 64240, &[]);
        let synack = w.sent.pop().unwrap();
        let first = w.seq;
        let request = b"GET /abc HTTP/1.1\r\n\r\n";
        // The request, lost on the way.
        w.seq = w.seq.wrapping_add(request.len() as u32);
        // A spoofed SYN on the same port, and its SYN-ACK.
        w.segment_at(12345, TcpControl::Syn, None, 64240, &[]);
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Syn);
        // The client's challenge ACK: its next sequence, acknowledging our first SYN-ACK.
        w.segment_at(
            w.seq,
            TcpControl::None,
            Some(synack.seq.wrapping_add(1)),
            64240,
            &[],
        );
        assert!(w.sent.is_empty(), "no reset: {:?}", w.sent);
        assert!(w.tcp.is_empty() && w.events.is_empty());
        // The retransmitted request proves the cookie and is delivered.
        w.segment_at(
            first,
            TcpControl::Psh,
            Some(synack.seq.wrapping_add(1)),
            64240,
            request,
        );
        assert_eq!(w.events, [Ev::Open, Ev::Data(request.to_vec())]);
    }

    #[test]
    fn the_last_answer_carries_the_fin() {
        let mut w = World::new();
        let isn = w.open();
        w.segment(TcpControl::Psh, Some(isn), 64240, b"GET / HTTP/1.1\r\n\r\n");
        let sent = &mut w.sent;
        let taken = w
            .tcp
            .send_and_close(ID, b"HTTP/1.1 302 Found\r\n\r\n", w.now, &mut |f| {
                sent.push(out(f))
            });
        assert_eq!(taken, 22);
        assert_eq!(w.sent.len(), 1, "one segment: {:?}", w.sent);
        let seg = w.sent.pop().unwrap();
        assert_eq!((seg.control, seg.seq), (TcpControl::Fin, isn));
        assert_eq!(seg.payload, b"HTTP/1.1 302 Found\r\n\r\n");
        // Closed for sending: nothing more is taken, and close adds nothing.
        assert_eq!(w.send(b"more"), 0);
        w.close();
        assert!(w.sent.is_empty());
        // The peer acknowledges both and closes: its FIN is acknowledged, and we are done.
        w.segment(TcpControl::Fin, Some(isn.wrapping_add(23)), 64240, &[]);
        let ack = w.sent.pop().unwrap();
        assert_eq!(ack.ack, Some(w.seq));
        assert!(w.tcp.is_empty());
    }

    #[test]
    fn an_ipv6_connection_opens_answers_and_closes_as_an_ipv4_one_does() {
        let mut w = World::at(SERVER6);
        w.segment(TcpControl::Syn, None, 64240, &[]);
        let synack = w.sent.pop().unwrap();
        assert_eq!(
            synack.mss,
            Some(1440),
            "1500 less 40 bytes of IPv6 and 20 of TCP"
        );
        assert!(w.tcp.is_empty(), "nothing held for a SYN");
        let isn = synack.seq.wrapping_add(1);
        w.segment(TcpControl::Psh, Some(isn), 64240, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(
            w.events.drain(..).collect::<Vec<_>>(),
            [Ev::Open, Ev::Data(b"GET / HTTP/1.1\r\n\r\n".to_vec())]
        );
        let sent = &mut w.sent;
        let taken = w
            .tcp
            .send_and_close(ID6, b"HTTP/1.1 302 Found\r\n\r\n", w.now, &mut |f| {
                sent.push(out(f))
            });
        assert_eq!(taken, 22);
        let seg = w.sent.pop().unwrap();
        assert_eq!(
            (seg.control, seg.seq, seg.ack),
            (TcpControl::Fin, isn, Some(w.seq))
        );
        w.segment(TcpControl::Fin, Some(isn.wrapping_add(23)), 64240, &[]);
        assert_eq!(w.sent.pop().unwrap().ack, Some(w.seq));
        assert!(w.tcp.is_empty());
        // The cookie covers the addresses: the same SYN-ACK's number from the same port of the
        // IPv4 client opens nothing on an IPv4 endpoint with the same key.
        let mut v4 = World::new();
        v4.segment_at(5001, TcpControl::Psh, Some(isn), 64240, b"GET");
        assert_eq!(v4.sent.pop().unwrap().control, TcpControl::Rst);
        assert!(v4.tcp.is_empty() && v4.events.is_empty());
    }

    #[test]
    fn a_syn_flood_holds_nothing() {
        let mut w = World::new();
        for port in 1..=10_000u16 {
            let repr = TcpRepr {
                src_port: port,
                dst_port: 80,
                control: TcpControl::Syn,
                seq_number: TcpSeqNumber(i32::from(port)),
                ack_number: None,
                window_len: 1024,
                window_scale: None,
                max_seg_size: None,
                sack_permitted: false,
                sack_ranges: [None; 3],
                timestamp: None,
                payload: &[],
            };
            let mut frame = [0u8; 64];
            let n = wire::write_frame(CLIENT_MAC, SERVER_MAC, CLIENT, SERVER, &repr, &mut frame)
                .unwrap();
            w.tcp
                .receive(&frame[..n], w.now, &mut |_| {}, &mut |_| {})
                .unwrap();
        }
        assert_eq!((w.tcp.stats().syns, w.tcp.len()), (10_000, 0));
    }

    #[test]
    fn a_request_in_order_is_delivered_acked_by_the_response_and_the_response_is_segmented() {
        let mut w = World::new();
        let mut snd = w.open();
        w.segment(TcpControl::Psh, Some(snd), 64240, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(
            w.events.drain(..).collect::<Vec<_>>(),
            [Ev::Data(b"GET / HTTP/1.1\r\n\r\n".to_vec())]
        );
        assert!(w.sent.is_empty(), "the ACK waits for the batch's end");
        let body = vec![b'x'; 3000];
        assert_eq!(w.send(&body), 3000);
        let sizes: Vec<_> = w
            .sent
            .iter()
            .map(|o| (o.seq.wrapping_sub(snd), o.payload.len(), o.control))
            .collect();
        assert_eq!(
            sizes,
            [
                (0, 1460, TcpControl::None),
                (1460, 1460, TcpControl::None),
                (2920, 80, TcpControl::Psh)
            ]
        );
        assert!(
            w.sent.iter().all(|o| o.ack == Some(w.seq)),
            "every segment acknowledges the request"
        );
        w.sent.clear();
        w.flush();
        assert!(w.sent.is_empty(), "the response carried the ACK");
        snd = snd.wrapping_add(3000);
        w.segment(TcpControl::None, Some(snd), 64240, &[]);
        w.timers(5_000);
        assert!(w.sent.is_empty(), "acknowledged data is not retransmitted");
    }

    #[test]
    fn the_rto_follows_the_measured_round_trip() {
        // A 30 ms round trip: SRTT 30, RTTVAR 15, 30 + 60 under the 200 ms floor.
        let mut w = World::new();
        let mut snd = w.open();
        w.send(b"a");
        w.now += 30;
        snd = snd.wrapping_add(1);
        w.segment(TcpControl::None, Some(snd), 64240, &[]);
        w.sent.clear();
        w.send(b"b");
        assert_eq!(w.sent.pop().unwrap().seq, snd);
        w.timers(199);
        assert!(w.sent.is_empty(), "not before the RTO");
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().payload, b"b", "at 200 ms, not 1 s");
        w.timers(399);
        assert!(w.sent.is_empty());
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().payload, b"b", "backed off to 400 ms");

        // A 400 ms round trip, then one of 200: SRTT 375, RTTVAR 200 → 1,175 ms.
        let mut w = World::new();
        let mut snd = w.open();
        for (data, rtt) in [(b"x", 400), (b"y", 200)] {
            w.send(data);
            w.now += rtt;
            snd = snd.wrapping_add(1);
            w.segment(TcpControl::None, Some(snd), 64240, &[]);
        }
        assert_eq!(
            w.tcp.conns.get(&ID).unwrap().rtt,
            Some(Rtt {
                srtt: 375,
                rttvar: 200
            })
        );
        w.sent.clear();
        w.send(b"z");
        w.sent.clear();
        w.timers(1_174);
        assert!(w.sent.is_empty());
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().payload, b"z");
    }

    #[test]
    fn a_retransmitted_segment_is_never_timed_and_its_backoff_stays_until_a_sample() {
        let mut w = World::new();
        let mut snd = w.open();
        w.send(b"x");
        w.timers(1_000);
        assert_eq!(w.sent.pop().unwrap().payload, b"x", "retransmitted at 1 s");
        // The ACK could answer either copy: no sample, and the 2 s backoff stays.
        w.now += 5;
        snd = snd.wrapping_add(1);
        w.segment(TcpControl::None, Some(snd), 64240, &[]);
        assert_eq!(w.tcp.conns.get(&ID).unwrap().rtt, None);
        w.sent.clear();
        w.send(b"y");
        w.sent.clear();
        w.timers(1_999);
        assert!(w.sent.is_empty(), "the backed-off RTO");
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().payload, b"y");
        // "y" went out twice: its ACK times nothing either. New data is timed: 20 ms.
        snd = snd.wrapping_add(1);
        w.segment(TcpControl::None, Some(snd), 64240, &[]);
        w.send(b"z");
        w.now += 20;
        snd = snd.wrapping_add(1);
        w.segment(TcpControl::None, Some(snd), 64240, &[]);
        assert_eq!(
            w.tcp.conns.get(&ID).unwrap().rtt,
            Some(Rtt {
                srtt: 20,
                rttvar: 10
            })
        );
        assert_eq!(w.tcp.conns.get(&ID).unwrap().rto_ms, RTO_MIN_MS);
    }

    #[test]
    fn unacknowledged_data_is_retransmitted_with_backoff_then_the_connection_is_reset() {
        let mut w = World::new();
        let snd = w.open();
        w.send(b"hello");
        assert_eq!(w.sent.pop().unwrap().seq, snd);
        w.timers(999);
        assert!(w.sent.is_empty());
        w.timers(1);
        assert_eq!(
            w.sent.pop().unwrap(),
            Out {
                control: TcpControl::Psh,
                seq: snd,
                ack: Some(w.seq),
                payload: b"hello".to_vec(),
                mss: None
            }
        );
        w.timers(1_999);
        assert!(w.sent.is_empty(), "the second wait is twice the first");
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().seq, snd);
        w.timers(4_000);
        assert_eq!(w.sent.pop().unwrap().seq, snd);
        assert_eq!(w.tcp.stats().retransmits, 3);
        w.timers(8_000);
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Rst);
        assert_eq!(w.events, [Ev::Closed]);
        assert!(w.tcp.is_empty());
    }

    #[test]
    fn a_late_ack_for_the_flight_before_a_retransmission_is_taken_with_its_data() {
        let mut w = World::new();
        let snd = w.open();
        w.send(&[b'x'; 3000]);
        w.segment(TcpControl::None, Some(snd), 100, &[]); // nothing acked; the window shrinks
        w.sent.clear();
        w.timers(1_000);
        assert_eq!(
            w.sent.pop().unwrap().payload.len(),
            100,
            "go back: what the window allows"
        );
        // The first flight's ACK arrives late, with a request.
        w.segment(
            TcpControl::Psh,
            Some(snd.wrapping_add(3000)),
            64240,
            b"next",
        );
        assert_eq!(w.events, [Ev::Data(b"next".to_vec())]);
        w.timers(10_000);
        assert!(
            w.sent.iter().all(|o| o.payload.is_empty()),
            "nothing left to resend: {:?}",
            w.sent
        );
        assert_eq!(w.tcp.len(), 1);
    }

    #[test]
    fn a_peer_answering_zero_window_probes_is_never_given_up_on() {
        let mut w = World::new();
        let snd = w.open();
        w.segment(TcpControl::None, Some(snd), 0, &[]);
        w.send(b"waiting");
        let mut wait = 1_000;
        for round in 0..5 {
            w.timers(wait);
            let probe = w.sent.pop();
            assert_eq!(
                probe.as_ref().map(|o| o.payload.len()),
                Some(1),
                "a probe in round {round}: {probe:?}"
            );
            w.segment(TcpControl::None, Some(snd), 0, &[]); // still closed
            wait = (wait * 2).min(RTO_MAX_MS);
        }
        assert_eq!(
            w.tcp.len(),
            1,
            "probes answered: the connection stays (max_retries is 3)"
        );
    }

    #[test]
    fn a_segment_out_of_order_is_held_answered_with_a_duplicate_ack_and_delivered_after_the_gap() {
        let mut w = World::new();
        let snd = w.open();
        let expected = w.seq;
        w.segment_at(
            expected.wrapping_add(6),
            TcpControl::Psh,
            Some(snd),
            64240,
            b"later",
        );
        assert!(w.events.is_empty());
        w.flush();
        assert_eq!(w.sent.pop().unwrap().ack, Some(expected));
        assert_eq!(w.tcp.stats().held, 1);
        // A retransmission overlapping what was delivered gives only the new bytes, and the
        // held segment follows once the gap is filled; one ACK covers all of it.
        w.segment(TcpControl::Psh, Some(snd), 64240, b"abc");
        w.segment_at(expected, TcpControl::Psh, Some(snd), 64240, b"abcdef");
        assert_eq!(
            w.events,
            [
                Ev::Data(b"abc".to_vec()),
                Ev::Data(b"def".to_vec()),
                Ev::Data(b"later".to_vec())
            ]
        );
        w.sent.clear();
        w.flush();
        assert_eq!(w.sent.pop().unwrap().ack, Some(expected.wrapping_add(11)));
    }

    /// A ClientHello with a post-quantum key share in four segments (a 536-byte MSS), the last
    /// first, the second twice, the first last: delivered once, whole and in order, with no
    /// retransmission asked of the client beyond the gap's.
    #[test]
    fn a_client_hello_in_segments_reordered_and_repeated_is_reassembled() {
        let mut w = World::new();
        let snd = w.open();
        let start = w.seq;
        let hello: Vec<u8> = (0..1_800u32).map(|i| (i * 7 % 251) as u8).collect();
        let pieces: Vec<(u32, &[u8])> = hello
            .chunks(536)
            .enumerate()
            .map(|(i, p)| (start.wrapping_add(i as u32 * 536), p))
            .collect();
        for i in [3, 1, 2, 1] {
            let (seq, p) = pieces[i];
            w.segment_at(seq, TcpControl::Psh, Some(snd), 64240, p);
        }
        assert!(w.events.is_empty(), "nothing before the first segment");
        w.flush();
        assert!(
            w.sent.iter().all(|o| o.ack == Some(start)),
            "duplicate ACKs"
        );
        let (seq, p) = pieces[0];
        w.segment_at(seq, TcpControl::Psh, Some(snd), 64240, p);
        let got: Vec<u8> = w
            .events
            .drain(..)
            .flat_map(|e| match e {
                Ev::Data(d) => d,
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(got, hello);
        w.sent.clear();
        w.flush();
        assert_eq!(
            w.sent.pop().unwrap().ack,
            Some(start.wrapping_add(hello.len() as u32))
        );
        assert_eq!(w.tcp.stats().held, 3, "the repeated segment held once");
        // Nothing is held now: a later segment in order is delivered alone.
        w.segment_at(
            start.wrapping_add(1800),
            TcpControl::Psh,
            Some(snd),
            64240,
            b"GET",
        );
        assert_eq!(w.events, [Ev::Data(b"GET".to_vec())]);
    }

    #[test]
    fn a_held_fin_closes_once_the_gap_fills_and_holding_is_bounded() {
        let mut w = World::new();
        let snd = w.open();
        let start = w.seq;
        // The last bytes and the FIN arrive before the first.
        w.segment_at(
            start.wrapping_add(4),
            TcpControl::Fin,
            Some(snd),
            64240,
            b"tail",
        );
        w.segment_at(start, TcpControl::Psh, Some(snd), 64240, b"head");
        assert_eq!(
            w.events,
            [
                Ev::Data(b"head".to_vec()),
                Ev::Data(b"tail".to_vec()),
                Ev::PeerClosed
            ]
        );
        // Past the allowance: segments beyond HELD_SEGMENTS (or outside the window) are
        // dropped, and the client's retransmission brings them.
        let mut w = World::new();
        let snd = w.open();
        let start = w.seq;
        for i in 1..=HELD_SEGMENTS as u32 + 2 {
            w.segment_at(
                start.wrapping_add(i * 10),
                TcpControl::Psh,
                Some(snd),
                64240,
                &[i as u8; 10],
            );
        }
        w.segment_at(
            start.wrapping_add(70_000),
            TcpControl::Psh,
            Some(snd),
            64240,
            b"far",
        );
        assert_eq!(w.tcp.stats().held, HELD_SEGMENTS as u64);
        w.segment_at(start, TcpControl::Psh, Some(snd), 64240, &[0; 10]);
        let got: usize = w
            .events
            .iter()
            .map(|e| match e {
                Ev::Data(d) => d.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(got, 10 * (HELD_SEGMENTS + 1));
    }

    #[test]
    fn the_peer_closes_first_then_the_application() {
        let mut w = World::new();
        let snd = w.open();
        w.segment(TcpControl::Fin, Some(snd), 64240, b"bye");
        assert_eq!(
            w.events.drain(..).collect::<Vec<_>>(),
            [Ev::Data(b"bye".to_vec()), Ev::PeerClosed]
        );
        w.send(b"ok");
        w.close();
        let fin = w.sent.pop().unwrap();
        assert_eq!(
            (fin.control, fin.seq, fin.ack),
            (TcpControl::Fin, snd.wrapping_add(2), Some(w.seq))
        );
        w.segment(TcpControl::None, Some(snd.wrapping_add(3)), 64240, &[]);
        assert_eq!(w.events, [Ev::Closed]);
        assert!(w.tcp.is_empty());
    }

    #[test]
    fn the_application_closes_first_then_the_peer() {
        let mut w = World::new();
        let snd = w.open();
        w.close();
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Fin);
        w.segment(TcpControl::None, Some(snd.wrapping_add(1)), 64240, &[]);
        assert_eq!(w.tcp.len(), 1, "waiting for the peer's FIN");
        w.timers(10_000);
        assert!(w.sent.is_empty(), "an acknowledged FIN is not resent");
        w.segment(TcpControl::Fin, Some(snd.wrapping_add(1)), 64240, &[]);
        let ack = w.sent.pop().unwrap();
        assert_eq!((ack.control, ack.ack), (TcpControl::None, Some(w.seq)));
        assert_eq!(w.events, [Ev::PeerClosed, Ev::Closed]);
        assert!(w.tcp.is_empty());
    }

    #[test]
    fn a_lost_fin_is_retransmitted() {
        let mut w = World::new();
        let snd = w.open();
        w.send(b"x");
        w.close();
        assert_eq!(
            w.sent.iter().map(|o| o.control).collect::<Vec<_>>(),
            [TcpControl::Psh, TcpControl::Fin]
        );
        w.sent.clear();
        w.segment(TcpControl::None, Some(snd.wrapping_add(1)), 64240, &[]); // the byte, not the FIN
        w.timers(1_000);
        let again = w.sent.pop().unwrap();
        assert_eq!(
            (again.control, again.seq),
            (TcpControl::Fin, snd.wrapping_add(1))
        );
    }

    #[test]
    fn a_reset_is_believed_only_at_the_expected_sequence() {
        let mut w = World::new();
        w.open();
        w.segment_at(w.seq.wrapping_add(10), TcpControl::Rst, None, 0, &[]);
        assert_eq!(w.tcp.len(), 1);
        w.segment_at(w.seq, TcpControl::Rst, None, 0, &[]);
        assert_eq!(w.events, [Ev::Closed]);
        assert!(w.tcp.is_empty() && w.sent.is_empty());
    }

    #[test]
    fn an_idle_connection_is_reset() {
        let mut w = World::new();
        w.open();
        w.timers(29_999);
        assert_eq!(w.tcp.len(), 1);
        w.timers(1);
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Rst);
        assert_eq!(w.events, [Ev::Closed]);
    }

    #[test]
    fn a_zero_window_is_probed_and_sending_resumes_when_it_opens() {
        let mut w = World::new();
        let snd = w.open();
        w.segment(TcpControl::None, Some(snd), 0, &[]);
        w.send(b"waiting");
        assert!(w.sent.is_empty(), "nothing fits a zero window");
        w.timers(1_000);
        let probe = w.sent.pop().unwrap();
        assert_eq!((probe.seq, probe.payload.as_slice()), (snd, &b"w"[..]));
        // The window opens without acknowledging the probe: the rest follows it.
        w.segment(TcpControl::None, Some(snd), 1000, &[]);
        let rest = w.sent.pop().unwrap();
        assert_eq!(
            (rest.seq, rest.payload.as_slice()),
            (snd.wrapping_add(1), &b"aiting"[..])
        );
    }

    #[test]
    fn segments_for_other_ports_and_strangers_without_ack_are_refused_or_reset() {
        let mut w = World::new();
        let mut frame = vec![0u8; 100];
        let repr = TcpRepr {
            src_port: 1,
            dst_port: 81,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(1),
            ack_number: None,
            window_len: 1,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let n =
            wire::write_frame(CLIENT_MAC, SERVER_MAC, CLIENT, SERVER, &repr, &mut frame).unwrap();
        let r = w.tcp.receive(
            &frame[..n],
            w.now,
            &mut |_| panic!("no answer"),
            &mut |_| panic!("no event"),
        );
        assert_eq!(r, Err(FrameError::NotOurs));
        // Data without ACK from a stranger: reset.
        w.segment(TcpControl::Psh, None, 100, b"x");
        assert_eq!(w.sent.pop().unwrap().control, TcpControl::Rst);
    }

    proptest! {
        #[test]
        fn garbage_never_panics_and_never_opens_a_connection(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..20),
        ) {
            let mut w = World::new();
            for f in frames {
                let _ = w.tcp.receive(&f, w.now, &mut |_| {}, &mut |_| {});
            }
            prop_assert!(w.tcp.is_empty());
        }

        /// Segments in any order, some twice, then the client's retransmission of them all
        /// in order: the application hears the stream exactly once, whole and in order.
        #[test]
        fn segments_in_any_order_are_delivered_once_and_in_order(
            sizes in proptest::collection::vec(1usize..700, 1..12),
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 0..24),
        ) {
            let mut w = World::new();
            let snd = w.open();
            let start = w.seq;
            let total: usize = sizes.iter().sum();
            let stream: Vec<u8> = (0..total).map(|i| (i * 13 % 251) as u8).collect();
            let mut pieces = Vec::new();
            let mut at = 0;
            for n in sizes {
                pieces.push((start.wrapping_add(at as u32), &stream[at..at + n]));
                at += n;
            }
            for i in order.iter().map(|i| i.index(pieces.len())).chain(0..pieces.len()) {
                let (seq, p) = pieces[i];
                w.segment_at(seq, TcpControl::Psh, Some(snd), 64240, p);
            }
            let got: Vec<u8> = w.events.drain(..).flat_map(|e| match e {
                Ev::Data(d) => d,
                _ => Vec::new(),
            }).collect();
            prop_assert_eq!(got, stream);
        }

        #[test]
        fn any_segment_sequence_on_an_open_connection_keeps_the_endpoint_consistent(
            steps in proptest::collection::vec((0u8..6, any::<u16>(), proptest::collection::vec(any::<u8>(), 0..40)), 1..40),
        ) {
            let mut w = World::new();
            let snd = w.open();
            for (kind, n, data) in steps {
                match kind {
                    0 => w.segment(TcpControl::Psh, Some(snd), 64240, &data),
                    1 => { let seq = w.seq.wrapping_add(u32::from(n)); w.segment_at(seq, TcpControl::Psh, Some(snd.wrapping_add(u32::from(n))), n, &data) }
                    2 => { w.send(&data); }
                    3 => w.timers(u64::from(n)),
                    4 => w.close(),
                    _ => w.segment(TcpControl::Fin, Some(snd), 64240, &[]),
                }
                w.flush();
            }
            // Whatever happened, every frame written parsed (checked in `out`) and the timer
            // heap holds at most a live entry per connection plus stale ones.
            prop_assert!(w.tcp.len() <= 1);
        }
    }
}
