//! Process signals, taken synchronously on the control thread: SIGHUP (swap in a new snapshot),
//! SIGTERM/SIGINT (drain and exit). Blocking them before any other thread starts means every
//! thread inherits the mask and only `wait` ever sees them.
#![allow(unsafe_code)]

use std::io;

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Reload,
    Stop,
}

fn set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Blocks SIGHUP, SIGTERM and SIGINT in this thread and every thread it spawns later.
pub fn block() -> io::Result<()> {
    let set = set();
    // SAFETY: set is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for the next blocked signal.
pub fn wait() -> io::Result<Signal> {
    let set = set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: set is initialised and blocked in this thread; sig is valid for writes.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        match sig {
            libc::SIGHUP => return Ok(Signal::Reload),
            libc::SIGTERM | libc::SIGINT => return Ok(Signal::Stop),
            _ => continue,
        }
    }
}
