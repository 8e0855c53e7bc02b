//! The engine's syscalls, and the only modules allowed `unsafe` (each says so for itself, and
//! every block carries a `SAFETY:` comment): [`uring`], the per-core io_uring loop; [`epoll`],
//! its fallback; [`socket`], SO_REUSEPORT listeners and addresses; [`signals`], SIGHUP/SIGTERM
//! on the control thread; [`eventfd`], the wakeup origin replies ring.

pub mod epoll;
pub mod eventfd;
pub mod signals;
pub mod socket;
pub mod uring;
