//! Listening sockets: one SO_REUSEPORT listener per core, so the kernel spreads connections
//! across cores without a shared accept queue.
#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

pub(super) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` outlives the call and its size is passed exactly; fd is a socket we own.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A non-blocking TCP listener with SO_REUSEADDR, SO_REUSEPORT and TCP_NODELAY (inherited by
/// accepted sockets: answers are written whole, Nagle would only delay pipelined ones).
pub fn reuseport_listener(addr: SocketAddr, backlog: i32) -> io::Result<OwnedFd> {
    let fd = bound(addr, true)?;
    // SAFETY: listen(2) on a bound socket we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

/// Fails with `AddrInUse` where a socket of any process still listens on `addr` after
/// [`CLAIM_GRACE`] (a port of 0 is always free). SO_REUSEPORT would otherwise let a second
/// engine of the same user join the first one's group without a word, and the kernel would
/// split new connections between them. The probe binds with SO_REUSEADDR alone (a closed
/// connection's TIME_WAIT does not hold the port) and never listens, so it accepts nothing.
/// The grace is for a restart: a listener of an engine that was just killed and reaped can
/// outlive it briefly (likely its ring's teardown, which runs after the process is gone;
/// `engine/DESIGN.md`, "Thread per core").
pub fn check_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let deadline = std::time::Instant::now() + CLAIM_GRACE;
    loop {
        match bound(addr, false) {
            Ok(_probe) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if std::time::Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{addr} is already in use: another process listens there"),
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long [`check_free`] waits for a listener that is going away.
pub const CLAIM_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A non-blocking TCP socket with SO_REUSEADDR, TCP_NODELAY and, with `reuseport`,
/// SO_REUSEPORT, bound to `addr`.
fn bound(addr: SocketAddr, reuseport: bool) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the result is checked before use and owned right away.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if reuseport {
        set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    let (storage, len) = sockaddr(addr);
    // SAFETY: storage holds a valid sockaddr of `len` bytes for the call's duration.
    cvt(unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) })?;
    Ok(owned)
}

pub(super) fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address a socket is bound to (to report `:0` listeners).
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockaddr_of(fd, libc::getsockname)
}

/// The address of a connected socket's peer (the client, for click events).
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockaddr_of(fd, libc::getpeername)
}

type NameCall = unsafe extern "C" fn(RawFd, *mut libc::sockaddr, *mut libc::socklen_t) -> i32;

fn sockaddr_of(fd: RawFd, call: NameCall) -> io::Result<SocketAddr> {
    // SAFETY: zeroed sockaddr_storage is valid; the call writes at most `len` bytes.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for writes for the call's duration.
    cvt(unsafe {
        call(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    })?;
    addr_of(&storage)
}

/// The address in a `sockaddr_storage` the kernel filled in.
pub(super) fn addr_of(storage: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family checked).
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Ok(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family checked).
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Ok(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
        }
        _ => Err(io::Error::other("unknown address family")),
    }
}

/// Raises this process's open-file soft limit to its hard limit (a busy core holds thousands of
/// connections, and TLS connections on a kTLS host hold a second descriptor until their
/// hand-off). Returns the limit now in force.
#[allow(unsafe_code)]
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one `rlimit` into the live value we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit(2) reads one `rlimit` from the live value we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}
