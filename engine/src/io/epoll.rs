//! The fallback loop, for kernels where io_uring is missing or disabled
//! (`kernel.io_uring_disabled`, seccomp, old kernels): level-triggered epoll over non-blocking
//! sockets, the same [`Session`] protocol as the ring, and HTTP/3 through the same
//! [`QuicCore`] as the ring's (its UDP socket level-triggered: a batch that leaves datagrams
//! waiting is simply ready again).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::cvt;
use crate::origin::OriginInbox;
use crate::quic::QuicCore;
use crate::session::{CoreCtx, Drive as _, Session};

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;
const QUIC: u64 = u64::MAX - 2;

struct Conn {
    fd: OwnedFd,
    gen: u32,
    session: Session,
    pending: Vec<u8>,
    want_write: bool,
}

/// One core's epoll loop.
pub struct EpollLoop {
    epfd: OwnedFd,
    listener: OwnedFd,
    conns: HashMap<RawFd, Conn>,
    next_gen: u32,
    inbox: Option<OriginInbox>,
    replies: Vec<crate::origin::OriginReply>,
    buf: Vec<u8>,
    events: Vec<libc::epoll_event>,
    tick: Duration,
    idle_timeout_ms: i64,
    header_timeout_ms: i64,
    last_sweep_ms: i64,
    quic: Option<QuicCore>,
    /// When the QUIC timers last ran.
    quic_tick: std::time::Instant,
}

impl std::fmt::Debug for EpollLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpollLoop")
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn ctl(epfd: RawFd, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: ev is valid for the call; epfd and fd are open descriptors we own.
    cvt(unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) }).map(drop)
}

/// (token, fd) pairs: the token carries the fd and a generation so a reply for a connection
/// that closed (and whose fd number was reused) is dropped.
fn token(fd: RawFd, gen: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(fd as u32)
}

impl EpollLoop {
    /// Registers the listener (and the origin wake eventfd, and the QUIC socket) with a new
    /// epoll instance.
    pub fn new(
        listener: OwnedFd,
        inbox: Option<OriginInbox>,
        tick: Duration,
        idle_timeout_ms: i64,
        header_timeout_ms: i64,
        quic: Option<QuicCore>,
    ) -> io::Result<Self> {
        // SAFETY: epoll_create1 returns a new descriptor or -1 (checked), owned right away.
        let epfd = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
        ctl(
            epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            libc::EPOLLIN as u32,
            LISTENER,
        )?;
        if let Some(inbox) = &inbox {
            ctl(
                epfd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                inbox.eventfd(),
                libc::EPOLLIN as u32,
                WAKE,
            )?;
        }
        if let Some(q) = &quic {
            ctl(
                epfd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                q.socket().as_raw_fd(),
                libc::EPOLLIN as u32,
                QUIC,
            )?;
        }
        Ok(EpollLoop {
            epfd,
            listener,
            conns: HashMap::new(),
            next_gen: 1,
            inbox,
            replies: Vec::new(),
            buf: vec![0u8; 16 * 1024],
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 256],
            tick,
            idle_timeout_ms,
            header_timeout_ms,
            last_sweep_ms: 0,
            quic,
            quic_tick: std::time::Instant::now(),
        })
    }

    /// Stops accepting (drain on SIGTERM); HTTP/2 connections say GOAWAY and close once
    /// their streams are answered.
    pub fn stop_accepting(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        if let Some(q) = self.quic.as_mut() {
            q.drain(ctx);
        }
        let h2: Vec<RawFd> = self
            .conns
            .iter()
            .filter(|(_, c)| c.session.is_h2())
            .map(|(fd, _)| *fd)
            .collect();
        for fd in h2 {
            if let Some(conn) = self.conns.get_mut(&fd) {
                let token = token(fd, conn.gen);
                conn.session.drain_h2(ctx, token);
            }
            if self.write(fd, ctx) {
                self.close(fd, ctx);
            }
        }
        ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            self.listener.as_raw_fd(),
            0,
            0,
        )
    }

    /// Connections still open.
    pub fn open_conns(&self) -> usize {
        self.conns.len() + self.quic.as_ref().map_or(0, QuicCore::open)
    }

    /// One turn: wait up to one tick, then serve every ready socket.
    pub fn turn(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        // SAFETY: `events` has `len` initialised slots that epoll_wait may overwrite.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                self.tick.as_millis() as i32,
            )
        };
        ctx.refresh_clock();
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(())
            } else {
                Err(e)
            };
        }
        for i in 0..n as usize {
            let ev = self.events[i];
            match ev.u64 {
                LISTENER => self.accept_all(ctx)?,
                WAKE => self.on_wake(ctx),
                QUIC => {
                    if let Some(q) = self.quic.as_mut() {
                        q.on_readable(ctx);
                    }
                }
                data => self.on_ready(data as RawFd, ev.events, ctx),
            }
        }
        if let Some(q) = self.quic.as_mut() {
            if self.quic_tick.elapsed() >= self.tick {
                self.quic_tick = std::time::Instant::now();
                q.on_tick(ctx);
            }
        }
        self.sweep(ctx);
        Ok(())
    }

    fn accept_all(&mut self, ctx: &mut CoreCtx) -> io::Result<()> {
        loop {
            // SAFETY: accept4 with null address arguments; the result is checked and owned.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::ECONNABORTED) | Some(libc::EINTR) => Ok(()),
                    Some(libc::EMFILE) | Some(libc::ENFILE) => {
                        tracing::warn!("out of file descriptors; accept paused for this turn");
                        Ok(())
                    }
                    _ => Err(e),
                };
            }
            // SAFETY: accept4 returned a fresh descriptor that nothing else owns.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            ctl(
                self.epfd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
                fd as u64,
            )?;
            let gen = self.next_gen;
            // 24 bits, so a token's top byte (QUIC's kind) is always 0 here.
            self.next_gen = ((self.next_gen + 1) & 0xff_ffff).max(1);
            let mut session = Session::new(ctx.now_ms);
            session.peer = ctx
                .clicks
                .as_ref()
                .and_then(|_| crate::io::socket::peer_addr(fd).ok())
                .map(|a| a.ip());
            self.conns.insert(
                fd,
                Conn {
                    fd: owned,
                    gen,
                    session,
                    pending: Vec::new(),
                    want_write: false,
                },
            );
            ctx.metrics.connection_opened();
        }
    }

    fn on_ready(&mut self, fd: RawFd, events: u32, ctx: &mut CoreCtx) {
        let mut close = events & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if !close && events & libc::EPOLLIN as u32 != 0 {
            close = self.read(fd, ctx);
        }
        if !close {
            close = self.write(fd, ctx);
        }
        if close {
            self.close(fd, ctx);
        }
    }

    /// Reads what is there; true when the connection should close.
    fn read(&mut self, fd: RawFd, ctx: &mut CoreCtx) -> bool {
        let Some(conn) = self.conns.get_mut(&fd) else {
            return false;
        };
        if conn.session.paused() {
            return false;
        }
        let tok = token(fd, conn.gen);
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(fd, self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
        if n == 0 {
            return true;
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            return !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR));
        }
        ctx.metrics.bytes_in(n as u64);
        conn.session.receive(&self.buf[..n as usize], ctx, tok);
        false
    }

    /// Sends what is rendered; true when the connection should close.
    fn write(&mut self, fd: RawFd, ctx: &mut CoreCtx) -> bool {
        let epfd = self.epfd.as_raw_fd();
        let Some(conn) = self.conns.get_mut(&fd) else {
            return false;
        };
        if conn.pending.is_empty() {
            std::mem::swap(&mut conn.pending, &mut conn.session.out);
        }
        while !conn.pending.is_empty() {
            // SAFETY: pending is valid for reads of its length; MSG_NOSIGNAL avoids SIGPIPE.
            let n = unsafe {
                libc::send(
                    conn.fd.as_raw_fd(),
                    conn.pending.as_ptr().cast(),
                    conn.pending.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    break;
                }
                return true;
            }
            ctx.metrics.bytes_out(n as u64);
            conn.pending.drain(..n as usize);
            if conn.pending.is_empty() {
                std::mem::swap(&mut conn.pending, &mut conn.session.out);
            }
        }
        let want_write = !conn.pending.is_empty();
        if want_write != conn.want_write {
            conn.want_write = want_write;
            let mut ev = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
            if want_write {
                ev |= libc::EPOLLOUT as u32;
            }
            if ctl(epfd, libc::EPOLL_CTL_MOD, fd, ev, fd as u64).is_err() {
                return true;
            }
        }
        conn.pending.is_empty() && conn.session.close_after_send
    }

    fn close(&mut self, fd: RawFd, ctx: &mut CoreCtx) {
        if self.conns.remove(&fd).is_some() {
            ctx.metrics.connection_closed();
        }
    }

    fn on_wake(&mut self, ctx: &mut CoreCtx) {
        let Some(inbox) = &self.inbox else {
            return;
        };
        let mut replies = std::mem::take(&mut self.replies);
        inbox.drain(&mut replies);
        for reply in replies.drain(..) {
            ctx.metrics.origin_reply(&reply.answer);
            if reply.token >> 56 == crate::quic::TOKEN_KIND {
                if let Some(q) = self.quic.as_mut() {
                    q.on_origin(reply.token, &reply.code, &reply.answer, ctx);
                }
                continue;
            }
            let fd = reply.token as u32 as RawFd;
            let gen = (reply.token >> 32) as u32;
            let close = match self.conns.get_mut(&fd) {
                Some(conn) if conn.gen == gen => {
                    conn.session
                        .origin_replied(&reply.code, &reply.answer, ctx, reply.token);
                    false
                }
                _ => continue,
            } || self.write(fd, ctx);
            if close {
                self.close(fd, ctx);
            }
        }
        self.replies = replies;
    }

    fn sweep(&mut self, ctx: &mut CoreCtx) {
        if ctx.now_ms - self.last_sweep_ms < 1000 {
            return;
        }
        self.last_sweep_ms = ctx.now_ms;
        let now = ctx.now_ms;
        let (idle, header) = (self.idle_timeout_ms, self.header_timeout_ms);
        let expired: Vec<RawFd> = self
            .conns
            .iter()
            .filter(|(_, c)| c.session.expired(now, idle, header))
            .map(|(fd, _)| *fd)
            .collect();
        for fd in expired {
            if let Some(conn) = self.conns.get_mut(&fd) {
                if conn.session.is_h2() && !conn.session.close_after_send {
                    // HTTP/2 says GOAWAY first, then closes once it is sent.
                    let token = token(fd, conn.gen);
                    conn.session.expire(ctx, token, idle, header);
                    if !self.write(fd, ctx) {
                        continue;
                    }
                }
            }
            self.close(fd, ctx);
        }
    }
}
