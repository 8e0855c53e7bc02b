//! A Linux eventfd, the wakeup a serving core's loop watches for replies from other threads.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A Linux eventfd: an origin worker adds one after pushing a reply, the core's loop polls it.
#[derive(Debug)]
pub struct EventFd(File);

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd at zero.
    pub fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd(2) takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd(2), is valid, and nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd(File::from(owned)))
    }

    /// Adds one to the counter (wakes a poller). The only failure, EAGAIN at a counter of
    /// 2^64 - 2, means a wakeup is already pending.
    pub fn notify(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Reads and zeroes the counter; `None` if it was zero.
    pub fn reset(&self) -> Option<u64> {
        let mut buf = [0u8; 8];
        match (&self.0).read(&mut buf) {
            Ok(8) => Some(u64::from_ne_bytes(buf)),
            _ => None,
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
