//! The per-core io_uring loop.
//!
//! One ring per serving core, created with SINGLE_ISSUER | DEFER_TASKRUN (completions are only
//! processed when this thread asks, never by interrupting it) and COOP_TASKRUN, with its fd
//! registered. A multishot accept puts connections straight into the ring's fixed-file table; a
//! multishot recv per connection reads into a provided-buffer ring; answers rendered during a
//! turn are sent with one SQE per connection, all submitted by the next `submit_and_wait`. A
//! multishot timeout ticks every `tick` so an idle core still wakes to run its timers and to
//! yield to glommio. Why this shape: see `engine/DESIGN.md`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use io_uring::types::{Fd, Fixed, TimeoutFlags, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring};

use crate::origin::OriginInbox;
use crate::session::{CoreCtx, Session};

const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const CLOSE: u64 = 4;
const TICK: u64 = 5;
const WAKE: u64 = 6;
const CANCEL: u64 = 7;

const BGID: u16 = 0;
/// A connection whose unanswered input grows past this is dropped (it is not speaking HTTP to us
/// the way a client would).
const MAX_INBUF: usize = 1 << 20;

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

/// A provided-buffer ring: `count` buffers of `size` bytes, registered as group `BGID`.
struct BufRing {
    /// The ring of `io_uring_buf` entries, page-aligned (mmap).
    ring: *mut io_uring::types::BufRingEntry,
    ring_bytes: usize,
    mem: Vec<u8>,
    count: u16,
    size: u32,
    tail: u16,
}

impl BufRing {
    fn new(ring: &IoUring, count: u16, size: u32) -> io::Result<Self> {
        assert!(
            count.is_power_of_two(),
            "buffer count must be a power of two"
        );
        let ring_bytes = usize::from(count) * std::mem::size_of::<io_uring::types::BufRingEntry>();
        // SAFETY: anonymous private mapping, checked for MAP_FAILED; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut this = BufRing {
            ring: ptr.cast(),
            ring_bytes,
            mem: vec![0u8; usize::from(count) * size as usize],
            count,
            size,
            tail: 0,
        };
        // SAFETY: the mapping lives until Drop, which runs after the ring that uses it is
        // dropped (the loop owns both and drops the ring first); `count` entries fit in it.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(ptr as u64, count, BGID, 0)?;
        }
        for bid in 0..count {
            this.push(bid);
        }
        this.publish();
        Ok(this)
    }

    /// Queues buffer `bid` for the kernel (visible after `publish`).
    fn push(&mut self, bid: u16) {
        let idx = usize::from(self.tail & (self.count - 1));
        let addr = self.mem.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: idx < count, so the entry lies inside the mapping; only this thread writes it.
        let entry = unsafe { &mut *self.ring.add(idx) };
        entry.set_addr(addr);
        entry.set_len(self.size);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes pushed buffers visible to the kernel.
    fn publish(&self) {
        // SAFETY: the tail field lives in entry 0, inside the mapping; the kernel reads it with
        // acquire semantics, so a release store orders the entries written before it.
        unsafe {
            let tail = io_uring::types::BufRingEntry::tail(self.ring)
                as *const std::sync::atomic::AtomicU16;
            (*tail).store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        let start = usize::from(bid) * self.size as usize;
        let end = start + len.min(self.size as usize);
        self.mem.get(start..end).unwrap_or(&[])
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` with exactly this length.
        unsafe {
            libc::munmap(self.ring.cast(), self.ring_bytes);
        }
    }
}

struct Conn {
    gen: u32,
    session: Session,
    /// Bytes being sent (stable while a SEND is in flight) and how far the kernel got.
    sending: Vec<u8>,
    sent: usize,
    in_flight: bool,
    recv_armed: bool,
    closing: bool,
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
        };
        this.arm_accept()?;
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
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        if conn.closing {
            return Ok(());
        }
        conn.closing = true;
        let gen = conn.gen;
        let recv_armed = conn.recv_armed;
        ctx.metrics.connection_closed();
        if recv_armed {
            // A multishot recv holds a reference to the socket: cancel it, then close the slot
            // (hard link: the close runs even if the recv already ended).
            let cancel = opcode::AsyncCancel::new(user_data(RECV, gen, idx))
                .build()
                .flags(squeue::Flags::IO_HARDLINK)
                .user_data(user_data(CANCEL, gen, idx));
            self.push(cancel)?;
        }
        let close = opcode::Close::new(Fixed(idx))
            .build()
            .user_data(user_data(CLOSE, gen, idx));
        self.push(close)
    }

    /// Stops accepting (drain on SIGTERM): cancels the multishot accept.
    pub fn stop_accepting(&mut self) -> io::Result<()> {
        let sqe = opcode::AsyncCancel::new(user_data(ACCEPT, 0, 0))
            .build()
            .user_data(user_data(CANCEL, 0, 0));
        self.accepting = true; // never re-arm
        self.draining = true;
        self.push(sqe)
    }

    /// Connections still open.
    pub fn open_conns(&self) -> usize {
        self.conns.iter().filter(|c| c.is_some()).count()
    }

    /// One turn: submit what is queued, wait for at least one completion (the tick bounds the
    /// wait), handle every completion, queue the answers.
    pub fn turn(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
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
                ACCEPT => self.on_accept(res, flags, ctx)?,
                RECV => {
                    recycled |= cqueue::buffer_select(flags).is_some();
                    self.on_recv(gen, idx, res, flags, ctx)?;
                }
                SEND => self.on_send(gen, idx, res, ctx)?,
                CLOSE => {
                    if let Some(slot) = self.conns.get_mut(idx as usize) {
                        if slot.as_ref().is_some_and(|c| c.gen == gen) {
                            *slot = None;
                        }
                    }
                    if !self.accepting {
                        self.arm_accept()?;
                    }
                }
                TICK => self.on_tick(ctx)?,
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

    fn on_accept(&mut self, res: i32, flags: u32, ctx: &mut CoreCtx) -> io::Result<()> {
        if !cqueue::more(flags) {
            self.accepting = false;
        }
        if res < 0 {
            // ENFILE/ENOMEM/table full: stop accepting until a slot frees (CLOSE re-arms).
            if res != -libc::ENFILE && res != -libc::ENOMEM {
                tracing::debug!(error = res, "accept failed");
            }
            if !self.accepting && res != -libc::ENFILE {
                self.arm_accept()?;
            }
            return Ok(());
        }
        if !self.accepting {
            self.arm_accept()?;
        }
        let idx = res as u32;
        let gen = self.next_gen;
        self.next_gen = (self.next_gen + 1) & 0xff_ffff;
        if let Some(slot) = self.conns.get_mut(idx as usize) {
            *slot = Some(Conn {
                gen,
                session: Session::new(ctx.now_ms),
                sending: Vec::new(),
                sent: 0,
                in_flight: false,
                recv_armed: false,
                closing: false,
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
        if let (Some(bid), true, true) = (bid, live, res > 0) {
            let data = self.bufs.data(bid, res as usize);
            ctx.metrics.bytes_in(res as u64);
            if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                conn.session.on_input(data, ctx, token);
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

    fn on_send(&mut self, gen: u32, idx: u32, res: i32, ctx: &mut CoreCtx) -> io::Result<()> {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        if conn.gen != gen {
            return Ok(());
        }
        conn.in_flight = false;
        if res < 0 {
            return self.close(idx, ctx);
        }
        ctx.metrics.bytes_out(res as u64);
        conn.sent += res as usize;
        if conn.sent < conn.sending.len() {
            return self.send_rest(idx);
        }
        conn.sending.clear();
        conn.sent = 0;
        self.dirty.push(idx);
        Ok(())
    }

    fn send_rest(&mut self, idx: u32) -> io::Result<()> {
        let Some(Some(conn)) = self.conns.get_mut(idx as usize) else {
            return Ok(());
        };
        let rest = &conn.sending[conn.sent..];
        let sqe = opcode::Send::new(Fixed(idx), rest.as_ptr(), rest.len() as u32)
            .build()
            .user_data(user_data(SEND, conn.gen, idx));
        conn.in_flight = true;
        self.push(sqe)
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
            if !conn.session.out.is_empty() {
                std::mem::swap(&mut conn.sending, &mut conn.session.out);
                conn.sent = 0;
                self.send_rest(idx)?;
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
            let (_, gen, idx) = split(reply.token);
            if let Some(Some(conn)) = self.conns.get_mut(idx as usize) {
                if conn.gen == gen && !conn.closing {
                    conn.session.on_origin(&reply.answer, ctx, reply.token);
                    self.dirty.push(idx);
                }
            }
        }
        self.replies = replies;
        Ok(())
    }

    fn on_tick(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        if ctx.now_ms - self.last_sweep_ms < 1000 {
            return Ok(());
        }
        self.last_sweep_ms = ctx.now_ms;
        let idle = self.config.idle_timeout_ms;
        let header = self.config.header_timeout_ms;
        let now = ctx.now_ms;
        let expired: Vec<u32> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.as_ref()?;
                let s = &c.session;
                let stale = !c.closing
                    && !s.waiting_origin
                    && !c.in_flight
                    && (now - s.last_active_ms > idle
                        || s.partial_since_ms.is_some_and(|t| now - t > header));
                stale.then_some(i as u32)
            })
            .collect();
        for idx in expired {
            self.close(idx, ctx)?;
        }
        Ok(())
    }
}
