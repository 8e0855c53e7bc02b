//! Waiting for a condition a real process will make true, with a limit and a message.

use std::time::{Duration, Instant};

/// Polls `f` every 10 ms until it is true; the time it took, or a panic with `what` after
/// `limit`.
pub fn wait_until(limit: Duration, what: &str, f: impl FnMut() -> bool) -> Duration {
    wait_until_every(Duration::from_millis(10), limit, what, f)
}

/// [`wait_until`], polling every `every` (for a condition that costs a request or more to
/// check).
pub fn wait_until_every(
    every: Duration,
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(every);
    }
    start.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_the_condition_holds() {
        let mut calls = 0;
        wait_until(Duration::from_secs(5), "the third call", || {
            calls += 1;
            calls == 3
        });
        assert_eq!(calls, 3);
    }

    #[test]
    #[should_panic(expected = "timed out after 30ms: never")]
    fn panics_with_what_after_the_limit() {
        wait_until(Duration::from_millis(30), "never", || false);
    }
}
