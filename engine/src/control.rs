//! The control planes an engine may use (`--control`, repeatable), in the order given, and which
//! one is in use.
//!
//! They share one store, so any of them serves the same feed (the same sequence numbers, so a
//! subscription resumes on another from the applied sequence), the same snapshots (by id) and
//! the same read-through answers. The engine uses one at a time: it starts with the first and
//! stays on whichever works; when the one in use fails (the feed's connection or heartbeat, a
//! snapshot download, an origin fetch that cannot connect, times out or answers 5xx) it moves to
//! the next, round-robin. Whoever retries keeps its own pace: the feed reader backs off only
//! after a full round, the read-through retries once on the next (see [`crate::feed`] and
//! [`crate::origin`]).
//!
//! Several threads report failures at once (feed reader, downloads, origin workers), so a
//! failure names the index it saw fail, and moves the one in use only if that is still it: two
//! workers failing on the same control plane move on by one, not two. A subscription that
//! opens makes its control plane the one in use ([`ControlPlanes::working`]), so the
//! read-through follows the feed back once an outage is over.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::prom::{family, sample};

/// Why a `--control` list was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("control URL {url:?} must be http://host:port or https://host:port (the control plane's edge listener)")]
    BadUrl { url: String },
    #[error("no control plane URL given")]
    Empty,
}

/// Checks one control-plane URL (`http://host:port` or `https://host:port`, the edge listener)
/// and returns it without its trailing slashes.
pub fn parse_url(url: &str) -> Result<String, ControlError> {
    let base = url.trim().trim_end_matches('/');
    let rest = base
        .strip_prefix("https://")
        .or_else(|| base.strip_prefix("http://"));
    if rest.is_none_or(str::is_empty) {
        return Err(ControlError::BadUrl {
            url: url.to_string(),
        });
    }
    Ok(base.to_string())
}

/// The `--control` list and the one in use.
#[derive(Debug)]
pub struct ControlPlanes {
    /// Checked by [`parse_url`]; never empty.
    urls: Box<[String]>,
    current: AtomicUsize,
    failovers: AtomicU64,
    /// How `https://` control planes are verified (`--control-ca`) and how this engine
    /// authenticates itself to them (`--control-client-cert`); `None`: ureq's defaults.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl ControlPlanes {
    /// The list, in order (each checked by [`parse_url`]); the first is in use.
    pub fn new<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
    ) -> Result<ControlPlanes, ControlError> {
        let urls = urls
            .into_iter()
            .map(|u| parse_url(u.as_ref()))
            .collect::<Result<Box<[String]>, _>>()?;
        if urls.is_empty() {
            return Err(ControlError::Empty);
        }
        Ok(ControlPlanes {
            urls,
            current: AtomicUsize::new(0),
            failovers: AtomicU64::new(0),
            tls: None,
        })
    }

    /// The same list, reaching `https://` control planes with `tls`.
    #[must_use]
    pub fn with_tls(self, tls: Arc<rustls::ClientConfig>) -> ControlPlanes {
        ControlPlanes {
            tls: Some(tls),
            ..self
        }
    }

    /// URLs of the list that are plain `http://`.
    pub fn plain(&self) -> impl Iterator<Item = &str> {
        self.urls
            .iter()
            .filter(|u| u.starts_with("http://"))
            .map(String::as_str)
    }

    /// An HTTP client builder for these control planes: with the `--control-ca` verification
    /// and client certificate when given, and no redirects followed (an edge listener never
    /// redirects; one that does is not one).
    pub fn agent(&self) -> ureq::AgentBuilder {
        let builder = ureq::AgentBuilder::new().redirects(0);
        match &self.tls {
            Some(tls) => builder.tls_config(Arc::clone(tls)),
            None => builder,
        }
    }

    /// How many there are (at least one).
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Never: the list has at least one URL (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The index of the one in use.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// The URL at `index` (taken modulo the length), `http://host:port`, no trailing slash.
    pub fn url(&self, index: usize) -> &str {
        // In bounds: the list is never empty (`new`), so the remainder is below its length.
        &self.urls[index % self.urls.len()]
    }

    /// Every index once, in the order to try them: `from`, then round-robin.
    pub fn order(&self, from: usize) -> impl Iterator<Item = usize> {
        let n = self.urls.len();
        (0..n).map(move |i| (from + i) % n)
    }

    /// The control plane at `index` failed (`why`): if it is still the one in use, the next one
    /// is now (logged and counted). Returns the index in use afterwards. With a single control
    /// plane nothing moves.
    pub fn failed(&self, index: usize, why: &str) -> usize {
        let n = self.urls.len();
        let index = index % n;
        if n == 1 {
            return index;
        }
        let next = (index + 1) % n;
        match self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.failovers.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    from = self.url(index),
                    to = self.url(next),
                    index = next,
                    reason = why,
                    "control plane failed: failing over to the next"
                );
                next
            }
            // Someone else moved on already (or another control plane is in use).
            Err(now) => now,
        }
    }

    /// The control plane at `index` works (the feed subscribed to it): it is the one in use,
    /// whatever another thread moved to meanwhile.
    pub fn working(&self, index: usize) {
        let index = index % self.urls.len();
        let before = self.current.swap(index, Ordering::AcqRel);
        if before != index {
            tracing::info!(
                control = self.url(index),
                index,
                "control plane in use (the feed's)"
            );
        }
    }

    /// Failovers so far.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Prometheus families (appended to the engine's `/metrics`).
    pub(crate) fn render(&self, o: &mut String) {
        for (name, kind, help, v) in [
            (
                "lasthop_engine_control_planes",
                "gauge",
                "Control planes configured (--control).",
                self.urls.len() as u64,
            ),
            (
                "lasthop_engine_control_current",
                "gauge",
                "Index (in --control order, from 0) of the control plane in use.",
                self.current() as u64,
            ),
            (
                "lasthop_engine_control_failovers_total",
                "counter",
                "Moves to the next control plane after the one in use failed.",
                self.failovers(),
            ),
        ] {
            family(o, name, kind, help);
            sample(o, name, "", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_trimmed() {
        let c = ControlPlanes::new(["http://a:1/", "https://b:2"]).unwrap();
        assert_eq!(
            (c.len(), c.url(0), c.url(1)),
            (2, "http://a:1", "https://b:2")
        );
        assert_eq!(c.url(2), "http://a:1", "indexes wrap");
        assert_eq!(c.plain().collect::<Vec<_>>(), ["http://a:1"]);
        for bad in [
            "ftp://control:8082",
            "https://",
            "control:8082",
            "http://",
            "",
            "http:///",
        ] {
            assert!(
                matches!(parse_url(bad), Err(ControlError::BadUrl { .. })),
                "{bad:?}"
            );
            assert!(ControlPlanes::new(["http://ok:1", bad]).is_err(), "{bad:?}");
        }
        assert!(matches!(
            ControlPlanes::new(Vec::<String>::new()),
            Err(ControlError::Empty)
        ));
    }

    #[test]
    fn rotation_is_round_robin_from_the_failed_one() {
        let c = ControlPlanes::new(["http://a:1", "http://b:2", "http://c:3"]).unwrap();
        assert_eq!(c.order(0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(c.order(2).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(c.current(), 0, "the first is used first");
        assert_eq!(c.failed(0, "down"), 1);
        assert_eq!(c.failed(1, "down"), 2);
        assert_eq!(c.failed(2, "down"), 0, "wraps around");
        assert_eq!(c.failovers(), 3);
    }

    #[test]
    fn concurrent_reports_of_one_failure_move_on_once() {
        let c = ControlPlanes::new(["http://a:1", "http://b:2", "http://c:3"]).unwrap();
        assert_eq!(c.failed(0, "down"), 1);
        // A second thread saw 0 fail too: 1 stays in use.
        assert_eq!(c.failed(0, "down"), 1);
        // A failure of one not in use moves nothing.
        assert_eq!(c.failed(2, "down"), 1);
        assert_eq!((c.current(), c.failovers()), (1, 1));
    }

    #[test]
    fn the_feeds_control_plane_is_the_one_in_use() {
        let c = ControlPlanes::new(["http://a:1", "http://b:2"]).unwrap();
        // The feed subscribed to 0 while an origin worker saw 0 fail and moved to 1.
        c.failed(0, "a timeout");
        c.working(0);
        assert_eq!((c.current(), c.failovers()), (0, 1));
    }

    #[test]
    fn a_single_control_plane_never_fails_over() {
        let c = ControlPlanes::new(["http://a:1"]).unwrap();
        assert_eq!(c.failed(0, "down"), 0);
        assert_eq!((c.current(), c.failovers()), (0, 0));
        assert_eq!(c.order(0).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn renders_the_index_in_use_and_the_failovers() {
        let c = ControlPlanes::new(["http://a:1", "http://b:2"]).unwrap();
        c.failed(0, "down");
        let mut o = String::new();
        c.render(&mut o);
        assert!(o.contains("lasthop_engine_control_planes 2\n"), "{o}");
        assert!(o.contains("lasthop_engine_control_current 1\n"), "{o}");
        assert!(
            o.contains("lasthop_engine_control_failovers_total 1\n"),
            "{o}"
        );
        assert!(!o.contains("http://"), "no URLs in labels: {o}");
    }
}
