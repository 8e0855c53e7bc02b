//! Child processes: signals, a guard that kills, and who we run as.

use std::process::{Child, Command};

/// Sends `sig` (`HUP`, `TERM`, `KILL`, ...) to `child` with kill(1), and checks it was sent.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill -{sig}");
}

/// A child process killed (if still running) and reaped when dropped, so a failed assertion
/// leaves none running.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Whether this test runs as root (`id -u` rather than libc: the tests carry no unsafe code).
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
