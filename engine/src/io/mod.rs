//! The engine's syscalls, and the only modules allowed `unsafe` (each says so for itself, and
//! every block carries a `SAFETY:` comment): [`uring`], the per-core io_uring loop; [`epoll`],
//! its fallback; [`socket`], SO_REUSEPORT listeners and addresses; [`signals`], SIGHUP/SIGTERM
//! on the control thread; [`eventfd`], the wakeup origin replies ring; `xdp` (the `xdp`
//! feature), the AF_XDP path's XDP program and sockets.

pub mod epoll;
pub mod eventfd;
pub mod signals;
pub mod socket;
pub mod udp;
pub mod uring;
#[cfg(feature = "xdp")]
pub mod xdp;

/// How long a serving loop's turn may work through TLS handshakes before it sends what is
/// ready. A full handshake's crypto is ~100–200 µs, so a turn that took a burst of ClientHellos
/// would hold every flight until the last was computed (16 of them: ~3 ms, the clients idle
/// meanwhile): past this, after each handshake step, the flights ready so far go out at once.
pub(crate) const EARLY_SEND: std::time::Duration = std::time::Duration::from_micros(100);

/// A libc return code as a `Result`: negative means `errno` says why.
fn cvt(rc: libc::c_int) -> std::io::Result<libc::c_int> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
