//! The per-core io_uring loop.
//!
//! One ring per serving core, created with SINGLE_ISSUER | DEFER_TASKRUN (completions are only
//! processed when this thread asks, never by interrupting it) and COOP_TASKRUN, with its fd
//! registered. A multishot accept puts connections straight into the ring's fixed-file table; a
//! multishot recv per connection reads into a provided-buffer ring; answers rendered during a
//! turn are sent with one SQE per connection, all submitted by the next `submit_and_wait`. A
//! multishot timeout ticks every `tick` so an idle core still wakes to run its timers (and to see
//! a new tables generation or the stop flag). Why this shape: see `engine/DESIGN.md`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use io_uring::types::{Fd, Fixed, TimeoutFlags, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring};

use std::sync::Arc;

use super::EARLY_SEND;
use crate::origin::OriginInbox;

mod bufring;
use crate::session::{CoreCtx, Drive as _, Session};
use crate::tls::conn::{self, TlsConn};
use crate::tls::TlsServe;
use bufring::{BufRing, BGID};

/// The HTTPS listener of a core and what its connections need.
#[derive(Debug)]
pub struct TlsListen {
    pub listener: OwnedFd,
    pub serve: TlsServe,
}

const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const CLOSE: u64 = 4;
const TICK: u64 = 5;
const WAKE: u64 = 6;
const CANCEL: u64 = 7;
const ACCEPT_TLS: u64 = 8;
const INSTALL: u64 = 9;
/// The QUIC socket is readable (a multishot poll).
const QUIC: u64 = 10;
/// The generation of [`QUIC`]'s no-op (a batch left datagrams waiting), beside its poll's 0.
const QUIC_AGAIN: u32 = 1;

/// A connection whose unanswered input grows past this is dropped (it is not speaking HTTP to us
/// the way a client would).
const MAX_INBUF: usize = 1 << 20;

/// An `io_uring_enter`'s result, where a signal (EINTR) or a full completion queue (EBUSY:
/// the turn reaps it next) are not errors.
fn enter_ok(r: io::Result<usize>) -> io::Result<()> {
    match r {
        Err(e) if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Err(e),
        _ => Ok(()),
    }
}

fn user_data(kind: u64, gen: u32, idx: u32) -> u64 {
    (kind << 56) | ((u64::from(gen) & 0xff_ffff) << 32) | u64::from(idx)
}

fn split(ud: u64) -> (u64, u32, u32) {
    (ud >> 56, ((ud >> 32) & 0xff_ffff) as u32, ud as u32)
}

/// Ring settings.
#[derive(Debug, Clone)]
pub struct UringConfig {
    /// Submission queue entries.
    pub entries: u32,
    /// Provided receive buffers (a power of two) and their size.
    pub buffers: u16,
    pub buffer_size: u32,
    /// Fixed-file slots, i.e. the most connections this core holds.
    pub max_conns: u32,
    /// Multishot timeout period.
    pub tick: Duration,
    /// Close connections idle this long.
    pub idle_timeout_ms: i64,
    /// Close connections that have not finished a request head in this long (slowloris).
    pub header_timeout_ms: i64,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            entries: 1024,
            buffers: 1024,
            buffer_size: 4096,
            max_conns: 16_384,
            tick: Duration::from_millis(10),
            idle_timeout_ms: 60_000,
            header_timeout_ms: 10_000,
        }
    }
}

fn build_ring(entries: u32) -> io::Result<IoUring> {
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .setup_submit_all()
        .setup_cqsize(entries * 8)
        .build(entries)?;
    ring.submitter().register_ring_fd()?;
    Ok(ring)
}

/// Whether this kernel gives us the ring we need (io_uring enabled, DEFER_TASKRUN, buffer
/// rings): decided once at start; `Err` says why the epoll loop will serve instead.
pub fn probe() -> io::Result<()> {
    let ring = build_ring(8)?;
    let bufs = BufRing::new(&ring, 8, 64)?;
    drop(bufs);
    drop(ring);
    Ok(())
}

struct Conn {
    gen: u32,
    session: Session,
    /// Set on connections from the HTTPS listener.
    tls: Option<Box<TlsConn>>,
    /// Bytes being sent (stable while a SEND is in flight) and how far the kernel got.
    sending: Vec<u8>,
    sent: usize,
    in_flight: bool,
    recv_armed: bool,
    closing: bool,
    /// The record layer was handed to the kernel (kTLS): sends are plaintext into kTLS.
    ktls: bool,
}

/// One core's ring, listener and connections.
pub struct UringLoop {
    // Field order matters: the ring must be dropped before the buffer ring it uses.
    ring: IoUring,
    bufs: BufRing,
    _listener: OwnedFd,
    listener_fd: RawFd,
    conns: Vec<Option<Conn>>,
    next_gen: u32,
    cqes: Vec<(u64, i32, u32)>,
    dirty: Vec<u32>,
    tick_ts: Box<Timespec>,
    wake_buf: Box<u64>,
    inbox: Option<OriginInbox>,
    replies: Vec<crate::origin::OriginReply>,
    config: UringConfig,
    last_sweep_ms: i64,
    accepting: bool,
    draining: bool,
    tls: Option<TlsListen>,
    tls_accepting: bool,
    /// This core's TLS connections still in their handshake.
    handshakes: usize,
    /// When this turn last entered the ring (see [`EARLY_SEND`]).
    entered: Instant,
    /// Send buffers of closed connections whose SEND has not completed yet, by that SEND's
    /// user_data: the kernel may still read them, so they live until the completion arrives
    /// (the fixed slot itself may already serve a new connection).
    graveyard: Vec<(u64, Vec<u8>)>,
    /// This core's QUIC endpoint, with `--quic-listen` (or `--tls-listen`).
    quic: Option<crate::quic::QuicCore>,
}

impl std::fmt::Debug for UringLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringLoop")
            .field("listener_fd", &self.listener_fd)
            .finish_non_exhaustive()
    }
}

impl UringLoop {
    /// Sets up the ring, registers files and buffers, arms accept, the tick and the origin wake.
    pub fn new(
        listener: OwnedFd,
        inbox: Option<OriginInbox>,
        config: UringConfig,
        tls: Option<TlsListen>,
        quic: Option<crate::quic::QuicCore>,
    ) -> io::Result<Self> {
        let ring = build_ring(config.entries)?;
        ring.submitter().register_files_sparse(config.max_conns)?;
        let bufs = BufRing::new(&ring, config.buffers, config.buffer_size)?;
        let tick_ts = Box::new(
            Timespec::new()
                .sec(config.tick.as_secs())
                .nsec(config.tick.subsec_nanos()),
        );
        let listener_fd = listener.as_raw_fd();
        let mut this = UringLoop {
            ring,
            bufs,
            _listener: listener,
            listener_fd,
            conns: (0..config.max_conns).map(|_| None).collect(),
            next_gen: 1,
            cqes: Vec::with_capacity(1024),
            dirty: Vec::with_capacity(1024),
            tick_ts,
            wake_buf: Box::new(0),
            inbox,
            replies: Vec::new(),
            config,
            last_sweep_ms: 0,
            accepting: false,
            draining: false,
            tls,
            tls_accepting: false,
            handshakes: 0,
            entered: Instant::now(),
            graveyard: Vec::new(),
            quic,
        };
        this.arm_quic()?;
        this.arm_accept()?;
        this.arm_accept_tls()?;
        let tick = opcode::Timeout::new(&*this.tick_ts)
            .flags(TimeoutFlags::MULTISHOT)
            .build()
            .user_data(user_data(TICK, 0, 0));
        this.push(tick)?;
        this.arm_wake()?;
        Ok(this)
    }

    fn push(&mut self, sqe: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE points at (send buffers, timespec, wake buffer) is
            // owned by this loop and outlives the operation: send buffers are only touched again
            // after their completion, the others live as long as the ring.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Pushes a chain of linked SQEs whole: a chain split across two submissions would run
    /// its tail unlinked.
    fn push_linked(&mut self, sqes: &[squeue::Entry]) -> io::Result<()> {
        loop {
            // SAFETY: as in `push`, for every entry of the chain.
            if unsafe { self.ring.submission().push_multiple(sqes) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn arm_accept(&mut self) -> io::Result<()> {
        if self.draining {
            return Ok(());
        }
        let sqe = opcode::AcceptMulti::new(Fd(self.listener_fd))
            .allocate_file_index(true)
            .build()
            .user_data(user_data(ACCEPT, 0, 0));
        self.accepting = true;
        self.push(sqe)
    }

    fn arm_accept_tls(&mut self) -> io::Result<()> {
        if self.draining {
            return Ok(());
        }
        let Some(fd) = self.tls.as_ref().map(|t| t.listener.as_raw_fd()) else {
            return Ok(());
        };
        let sqe = opcode::AcceptMulti::new(Fd(fd))
            .allocate_file_index(true)
            .build()
            .user_data(user_data(ACCEPT_TLS, 0, 0));
        self.tls_accepting = true;
        self.push(sqe)
    }

    /// Waits for datagrams on the QUIC socket (readiness only: they are read with `recvmsg`,
    /// which GRO needs, in [`crate::quic::QuicCore::on_readable`]).
    fn arm_quic(&mut self) -> io::Result<()> {
        let Some(fd) = self.quic.as_ref().map(|q| q.socket().as_raw_fd()) else {
            return Ok(());
        };
        let sqe = opcode::PollAdd::new(Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(QUIC, 0, 0));
        self.push(sqe)
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let Some(fd) = self.inbox.as_ref().map(|i| i.eventfd()) else {
            return Ok(());
        };
        let ptr = (&mut *self.wake_buf as *mut u64).cast::<u8>();
        let sqe = opcode::Read::new(Fd(fd), ptr, 8)
            .build()
            .user_data(user_data(WAKE, 0, 0));
        self.push(sqe)
    }

    fn arm_recv(&mut self, idx: u32) -> io::Result<()> {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        conn.recv_armed = true;
        let sqe = opcode::RecvMulti::new(Fixed(idx), BGID)
            .build()
            .user_data(user_data(RECV, conn.gen, idx));
        self.push(sqe)
    }

    fn close(&mut self, idx: u32, ctx: &CoreCtx) -> io::Result<()> {
        if self.begin_close(idx, ctx) {
            self.release(idx, None)?;
        }
        Ok(())
    }

    /// Marks a connection closing, once: its handshake slot goes back and the close is
    /// counted. False if it was closing already.
    fn begin_close(&mut self, idx: u32, ctx: &CoreCtx) -> bool {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return false;
        };
        if conn.closing {
            return false;
        }
        conn.closing = true;
        if conn.tls.as_mut().is_some_and(|t| t.uncount()) {
            self.handshakes = self.handshakes.saturating_sub(1);
        }
        ctx.metrics.connection_closed();
        true
    }

    /// Closes a closing connection's slot, cancelling what it still has in flight; with
    /// `last`, a SEND of its last bytes goes first in the same chain.
    fn release(&mut self, idx: u32, last: Option<squeue::Entry>) -> io::Result<()> {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        let gen = conn.gen;
        let recv_armed = conn.recv_armed;
        // The kTLS hand-off's regular descriptor would keep the socket open past the CLOSE
        // (and a last answer's MSG_MORE tail unsent until the connection is dropped).
        if let Some(t) = conn.tls.as_mut() {
            t.raw_fd = None;
        }
        let was_sending = conn.in_flight;
        conn.in_flight |= last.is_some();
        if was_sending {
            // A SEND waiting for socket space would keep reading `sending`: cancel it (its
            // completion, whatever it says, releases the buffer; see `graveyard`).
            let cancel = opcode::AsyncCancel::new(user_data(SEND, gen, idx))
                .build()
                .user_data(user_data(CANCEL, gen, idx));
            self.push(cancel)?;
        }
        // Hard links: each step runs whatever the one before it returned.
        let mut chain = Vec::with_capacity(3);
        if let Some(send) = last {
            chain.push(send.flags(squeue::Flags::IO_HARDLINK));
        }
        if recv_armed {
            // A multishot recv holds a reference to the socket: cancel it, then close the slot
            // (the close runs even if the recv already ended).
            let cancel = opcode::AsyncCancel::new(user_data(RECV, gen, idx))
                .build()
                .flags(squeue::Flags::IO_HARDLINK)
                .user_data(user_data(CANCEL, gen, idx));
            chain.push(cancel);
        }
        let close = opcode::Close::new(Fixed(idx))
            .build()
            .user_data(user_data(CLOSE, gen, idx));
        chain.push(close);
        self.push_linked(&chain)
    }

    /// Stops accepting (drain on SIGTERM): cancels the multishot accept; HTTP/2 connections
    /// say GOAWAY and close once their streams are answered.
    pub fn stop_accepting(&mut self, ctx: &CoreCtx) -> io::Result<()> {
        if let Some(q) = self.quic.as_mut() {
            q.drain(ctx);
        }
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            if let Some(conn) = slot.as_mut().filter(|c| c.session.is_h2() && !c.closing) {
                let token = user_data(0, conn.gen, idx as u32);
                conn.session.drain_h2(ctx, token);
                self.dirty.push(idx as u32);
            }
        }
        let sqe = opcode::AsyncCancel::new(user_data(ACCEPT, 0, 0))
            .build()
            .user_data(user_data(CANCEL, 0, 0));
        self.accepting = true; // never re-arm
        self.tls_accepting = true;
        self.draining = true;
        self.push(sqe)?;
        if self.tls.is_some() {
            let sqe = opcode::AsyncCancel::new(user_data(ACCEPT_TLS, 0, 0))
                .build()
                .user_data(user_data(CANCEL, 0, 0));
            self.push(sqe)?;
        }
        Ok(())
    }

    /// Connections still open.
    pub fn open_conns(&self) -> usize {
        self.conns.iter().filter(|c| c.is_some()).count()
            + self.quic.as_ref().map_or(0, crate::quic::QuicCore::open)
    }

    /// One turn: submit what is queued, wait for at least one completion (the tick bounds the
    /// wait), handle every completion, queue the answers.
    pub fn turn(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        enter_ok(self.ring.submit_and_wait(1))?;
        self.entered = Instant::now();
        ctx.refresh_clock();
        self.cqes.clear();
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        let mut recycled = false;
        for &(ud, res, flags) in &cqes {
            let (kind, gen, idx) = split(ud);
            match kind {
                ACCEPT => self.on_accept(res, flags, false, ctx)?,
                ACCEPT_TLS => self.on_accept(res, flags, true, ctx)?,
                RECV => {
                    recycled |= cqueue::buffer_select(flags).is_some();
                    self.on_recv(gen, idx, res, flags, ctx)?;
                }
                SEND => self.on_send(gen, idx, res, ctx)?,
                CLOSE => {
                    if let Some(slot) = self.conns.get_mut(idx as usize) {
                        if slot.as_ref().is_some_and(|c| c.gen == gen) {
                            if let Some(old) = slot.take() {
                                bury(&mut self.graveyard, idx, old);
                            }
                        }
                    }
                    if !self.accepting {
                        self.arm_accept()?;
                    }
                    if !self.tls_accepting {
                        self.arm_accept_tls()?;
                    }
                }
                TICK => {
                    if let Some(q) = self.quic.as_mut() {
                        q.on_tick(ctx);
                    }
                    self.on_tick(ctx)?;
                }
                QUIC => {
                    let more = self.quic.as_mut().is_some_and(|q| q.on_readable(ctx));
                    if more {
                        // Datagrams are still waiting: the poll fires only on new arrivals, so
                        // a no-op completes at once and brings the next batch next turn.
                        let sqe = opcode::Nop::new()
                            .build()
                            .user_data(user_data(QUIC, QUIC_AGAIN, 0));
                        self.push(sqe)?;
                    }
                    if gen != QUIC_AGAIN && !cqueue::more(flags) {
                        self.arm_quic()?;
                    }
                }
                INSTALL => self.on_install(gen, idx, res),
                WAKE => {
                    self.on_wake(ctx)?;
                    self.arm_wake()?;
                }
                _ => {}
            }
        }
        if recycled {
            self.bufs.publish();
        }
        cqes.clear();
        self.cqes = cqes;
        self.flush(ctx)
    }

    /// After a handshake step: once the turn has run [`EARLY_SEND`] since it entered the ring,
    /// queues what every connection has ready (as the turn's end would) and submits it now.
    fn send_early(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        if self.entered.elapsed() < EARLY_SEND {
            return Ok(());
        }
        self.flush(ctx)?;
        enter_ok(self.ring.submit())?;
        self.entered = Instant::now();
        Ok(())
    }

    fn rearm_accept(&mut self, tls: bool) -> io::Result<()> {
        if tls {
            self.arm_accept_tls()
        } else {
            self.arm_accept()
        }
    }

    fn on_accept(&mut self, res: i32, flags: u32, tls: bool, ctx: &mut CoreCtx) -> io::Result<()> {
        let more = cqueue::more(flags);
        if !more {
            if tls {
                self.tls_accepting = false;
            } else {
                self.accepting = false;
            }
        }
        if res < 0 {
            // ENFILE/ENOMEM/table full: stop accepting until a slot frees (CLOSE re-arms).
            if res != -libc::ENFILE && res != -libc::ENOMEM {
                tracing::warn!(error = res, more, "accept failed");
            }
            if !more && res != -libc::ENFILE {
                self.rearm_accept(tls)?;
            }
            return Ok(());
        }
        if !more {
            self.rearm_accept(tls)?;
        }
        let idx = res as u32;
        let gen = self.next_gen;
        self.next_gen = (self.next_gen + 1) & 0xff_ffff;
        let mut session = Session::new(ctx.now_ms);
        let tls_conn = match (tls, &self.tls) {
            (true, Some(listen)) => {
                let conn = TlsConn::start(
                    &listen.serve.config,
                    &listen.serve.stats,
                    listen.serve.max_handshakes,
                    self.handshakes,
                    ctx.now_ms,
                )?;
                if conn.is_some() {
                    self.handshakes += 1;
                    session.https = true;
                }
                conn
            }
            _ => None,
        };
        if tls && tls_conn.is_none() {
            // Refused (handshake cap or setup failure): close the slot straight away.
            let close = opcode::Close::new(Fixed(idx))
                .build()
                .user_data(user_data(CLOSE, gen, idx));
            return self.push(close);
        }
        let ktls = tls_conn.is_some() && self.tls.as_ref().is_some_and(|t| t.serve.ktls.is_some());
        if ktls || ctx.clicks.is_some() {
            // A regular fd: for the kTLS hand-off's setsockopt calls, ready long before the
            // handshake ends (it needs a round trip from the client), and for the peer address
            // click events need (a multishot accept into fixed files returns none). Submitted
            // before the first receive, so its completion comes first.

            let sqe = opcode::FixedFdInstall::new(Fixed(idx), 0)
                .build()
                .user_data(user_data(INSTALL, gen, idx));
            self.push(sqe)?;
        }
        if let Some(slot) = self.conns.get_mut(idx as usize) {
            if let Some(old) = slot.take() {
                bury(&mut self.graveyard, idx, old);
            }
            *slot = Some(Conn {
                gen,
                session,
                tls: tls_conn,
                sending: Vec::new(),
                sent: 0,
                in_flight: false,
                recv_armed: false,
                closing: false,
                ktls: false,
            });
            ctx.metrics.connection_opened();
            self.arm_recv(idx)?;
        }
        Ok(())
    }

    fn on_recv(
        &mut self,
        gen: u32,
        idx: u32,
        res: i32,
        flags: u32,
        ctx: &mut CoreCtx,
    ) -> io::Result<()> {
        let bid = cqueue::buffer_select(flags);
        let more = cqueue::more(flags);
        let token = user_data(0, gen, idx);
        let live =
            matches!(self.conns.get(idx as usize), Some(Some(c)) if c.gen == gen && !c.closing);
        // Whether these bytes moved a TLS handshake (its crypto: see `send_early`).
        let mut handshake_step = false;
        if let (Some(bid), true, true) = (bid, live, res > 0) {
            let data = self.bufs.data(bid, res as usize);
            ctx.metrics.bytes_in(res as u64);
            if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                match conn.tls.as_mut() {
                    None => conn.session.receive(data, ctx, token),
                    Some(tls) => {
                        handshake_step = tls.conn.is_handshaking();
                        let stats = self.tls.as_ref().map(|t| &*t.serve.stats);
                        match conn::input(tls, &mut conn.session, data, ctx, token, stats) {
                            Ok(true) => self.handshakes = self.handshakes.saturating_sub(1),
                            Ok(false) => {}
                            Err(_) => {
                                tls.failed = true;
                                conn.session.close_after_send = true;
                            }
                        }
                    }
                }
                if conn.session.inbuf.len() > MAX_INBUF {
                    conn.session.close_after_send = true;
                    conn.session.out.clear();
                }
                self.dirty.push(idx);
            }
        }
        if let Some(bid) = bid {
            self.bufs.push(bid);
        }
        if handshake_step {
            self.send_early(ctx)?;
        }
        if !live {
            return Ok(());
        }
        if res == 0 || (res < 0 && res != -libc::ENOBUFS) {
            // Peer closed or the socket failed.
            return self.close(idx, ctx);
        }
        if !more {
            if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                conn.recv_armed = false;
            }
            self.arm_recv(idx)?;
        }
        Ok(())
    }

    fn on_install(&mut self, gen: u32, idx: u32, res: i32) {
        if res < 0 {
            tracing::debug!(
                error = res,
                "installing a descriptor failed; no kTLS and no peer address for this connection"
            );
            return;
        }
        // SAFETY: a successful FIXED_FD_INSTALL returns a new descriptor that nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(res) };
        let ktls = self.tls.as_ref().is_some_and(|t| t.serve.ktls.is_some());
        if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
            if conn.gen == gen && !conn.closing {
                conn.session.peer = crate::io::socket::peer_addr(fd.as_raw_fd())
                    .ok()
                    .map(|a| a.ip());
                if let (Some(t), true) = (conn.tls.as_mut(), ktls) {
                    t.raw_fd = Some(fd);
                }
            }
        }
        // Otherwise (or once the address is read) `fd` drops here and closes; the fixed slot
        // keeps the connection.
    }

    fn on_send(&mut self, gen: u32, idx: u32, res: i32, ctx: &mut CoreCtx) -> io::Result<()> {
        if res > 0 {
            // Counted whatever became of the connection since (a last answer's SEND completes
            // after its connection began closing).
            ctx.metrics.bytes_out(res as u64);
        }
        let ud = user_data(SEND, gen, idx);
        if let Some(at) = self.graveyard.iter().position(|(u, _)| *u == ud) {
            // The last SEND of a connection already closed: its buffer may go now.
            self.graveyard.swap_remove(at);
            return Ok(());
        }
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        if conn.gen != gen {
            return Ok(());
        }
        conn.in_flight = false;
        if conn.closing {
            return Ok(());
        }
        if res < 0 {
            return self.close(idx, ctx);
        }
        conn.sent += res as usize;
        if conn.sent < conn.sending.len() {
            return self.send_rest(idx, false, ctx);
        }
        conn.sending.clear();
        conn.sent = 0;
        self.dirty.push(idx);
        Ok(())
    }

    /// Sends what `sending` holds past `sent`. With `last` (the connection closes after it),
    /// the send goes with MSG_MORE in one chain with the slot's close: the kernel holds the
    /// answer's tail until the close puts the FIN on it, so answer and FIN leave in one
    /// segment instead of two, with no turn of the loop between them. MSG_WAITALL has the
    /// ring finish a short send itself before the close runs.
    fn send_rest(&mut self, idx: u32, last: bool, ctx: &CoreCtx) -> io::Result<()> {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        let rest = &conn.sending[conn.sent..];
        let send = opcode::Send::new(Fixed(idx), rest.as_ptr(), rest.len() as u32);
        let ud = user_data(SEND, conn.gen, idx);
        if !last {
            conn.in_flight = true;
            return self.push(send.build().user_data(ud));
        }
        // Not over kTLS: its sendmsg keeps a MSG_MORE record open, and the close frees an open
        // record unsent.
        let more = if conn.ktls { 0 } else { libc::MSG_MORE };
        let send = send.flags(more | libc::MSG_WAITALL).build().user_data(ud);
        if self.begin_close(idx, ctx) {
            self.release(idx, Some(send))?;
        }
        Ok(())
    }

    /// Starts a send for every connection with answers waiting, closes those that are done.
    fn flush(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &idx in &dirty {
            let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
                continue;
            };
            if conn.closing || conn.in_flight {
                continue;
            }
            if let Some(tls) = conn.tls.as_mut() {
                // Plaintext answers go through rustls; whatever records it has (handshake
                // flights, answers, alerts) are sent as one buffer.
                conn::output(tls, &mut conn.session, &mut conn.sending);
                if !conn.sending.is_empty() {
                    conn.sent = 0;
                    let last = conn::done(tls, &conn.session);
                    self.send_rest(idx, last, ctx)?;
                } else if conn::done(tls, &conn.session) {
                    // Answers to 0-RTT early data wait in rustls for the client's Finished:
                    // a closing connection stays open until they are out.
                    self.close(idx, ctx)?;
                } else if tls.raw_fd.is_some()
                    && tls.records.at_boundary()
                    && !tls.failed
                    && !tls.conn.is_handshaking()
                    && !conn.session.waiting_origin()
                    && conn.session.inbuf.is_empty()
                {
                    // Everything rustls had is on the wire and nothing is half-read: hand the
                    // record layer to the kernel, and serve the connection as plain from now.
                    let stats = self.tls.as_ref().map(|t| Arc::clone(&t.serve.stats));
                    let support = self.tls.as_ref().and_then(|t| t.serve.ktls);
                    let Some(t) = conn.tls.take() else {
                        continue;
                    };
                    match conn::hand_off(t, support.as_ref()) {
                        conn::HandOff::Kept(t) => conn.tls = Some(t),
                        conn::HandOff::Kernel => {
                            conn.ktls = true;
                            if let Some(s) = &stats {
                                s.ktls_conn();
                            }
                        }
                        conn::HandOff::Failed(e) => {
                            // The secrets left rustls: the connection cannot go back.
                            tracing::debug!(error = %e, "kTLS hand-off failed; closing");
                            if let Some(s) = &stats {
                                s.failure(4);
                            }
                            self.close(idx, ctx)?;
                        }
                    }
                }
                continue;
            }
            if !conn.session.out.is_empty() {
                std::mem::swap(&mut conn.sending, &mut conn.session.out);
                conn.sent = 0;
                let last = conn.session.close_after_send && !conn.session.waiting_origin();
                self.send_rest(idx, last, ctx)?;
            } else if conn.session.close_after_send {
                self.close(idx, ctx)?;
            }
        }
        dirty.clear();
        self.dirty = dirty;
        Ok(())
    }

    fn on_wake(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        let Some(inbox) = &self.inbox else {
            return Ok(());
        };
        let mut replies = std::mem::take(&mut self.replies);
        inbox.drain(&mut replies);
        for reply in replies.drain(..) {
            ctx.metrics.origin_reply(&reply.answer);
            let (kind, gen, idx) = split(reply.token);
            if kind == crate::quic::TOKEN_KIND {
                if let Some(q) = self.quic.as_mut() {
                    q.on_origin(reply.token, &reply.code, &reply.answer, ctx);
                }
                continue;
            }
            if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                if conn.gen == gen && !conn.closing {
                    conn.session
                        .origin_replied(&reply.code, &reply.answer, ctx, reply.token);
                    self.dirty.push(idx);
                }
            }
        }
        self.replies = replies;
        Ok(())
    }

    fn on_tick(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        // An accept that ended without a connection closing since (the only other re-arm)
        // would leave this core's listener unserved while the kernel still hashes
        // connections to it: re-arm on the tick.
        if !self.accepting {
            self.arm_accept()?;
        }
        if !self.tls_accepting {
            self.arm_accept_tls()?;
        }
        if ctx.now_ms - self.last_sweep_ms < 1000 {
            return Ok(());
        }
        self.last_sweep_ms = ctx.now_ms;
        let idle = self.config.idle_timeout_ms;
        let header = self.config.header_timeout_ms;
        let handshake = self
            .tls
            .as_ref()
            .map_or(i64::MAX, |t| t.serve.handshake_timeout_ms);
        let now = ctx.now_ms;
        let expired: Vec<u32> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.as_ref()?;
                let s = &c.session;
                let slow_handshake = c
                    .tls
                    .as_ref()
                    .is_some_and(|t| t.handshaking && now - t.accepted_ms > handshake);
                let stale = !c.closing
                    && !c.in_flight
                    && (s.expired(now, idle, header) || (slow_handshake && !s.waiting_origin()));
                stale.then_some(i as u32)
            })
            .collect();
        for idx in expired {
            let handshaking = matches!(
                self.conns.get(idx as usize),
                Some(Some(Conn { tls: Some(t), .. })) if t.handshaking
            );
            if handshaking {
                if let Some(t) = &self.tls {
                    t.serve.stats.failure(1); // timeout
                }
            } else if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                if conn.session.is_h2() {
                    // HTTP/2 says GOAWAY first; the flush sends it and closes.
                    let token = user_data(0, conn.gen, idx);
                    conn.session.expire(ctx, token, idle, header);
                    self.dirty.push(idx);
                    continue;
                }
            }
            self.close(idx, ctx)?;
        }
        Ok(())
    }
}

/// Keeps a removed connection's send buffer alive while its SEND is in flight.
fn bury(graveyard: &mut Vec<(u64, Vec<u8>)>, idx: u32, conn: Conn) {
    if conn.in_flight {
        graveyard.push((user_data(SEND, conn.gen, idx), conn.sending));
    }
}
