//! The log files of the processes a test starts: each writes its stderr to a file in the test's
//! temp dir, read back for assertions and shown when the test fails.

use std::path::Path;
use std::process::Stdio;

/// A new (truncated) log file at `path`, as a child's stdout or stderr.
pub fn create(path: &Path) -> Stdio {
    let file = std::fs::File::create(path)
        .unwrap_or_else(|e| panic!("creating the log {}: {e}", path.display()));
    Stdio::from(file)
}

/// The log file at `path` opened for appending (created if new), as a child's stdout or
/// stderr: a process restarted on the same state keeps one log.
pub fn append(path: &Path) -> Stdio {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening the log {}: {e}", path.display()));
    Stdio::from(file)
}

/// What was logged at `path` so far (empty when nothing was).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// When the current thread is panicking (a failed test), prints the log at `path` under a
/// header naming `what`, so the failure shows what the process said.
pub fn show_if_failing(what: &str, path: &Path) {
    if std::thread::panicking() {
        eprintln!("--- log of {what} ---\n{}", read(path));
    }
}
