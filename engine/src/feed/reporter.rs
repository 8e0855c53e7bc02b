//! The feed's reporter thread: a status report to the control plane in use every second.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lasthop_core::feed::StatusReport;

use super::{FeedConfig, FeedStats};

pub(super) fn reporter(cfg: &FeedConfig, stats: &FeedStats) {
    let agent = cfg.control.agent().timeout(Duration::from_secs(1)).build();
    loop {
        // Whichever is in use: they share the store the reports land in.
        let url = format!("{}/edge/v1/status", cfg.control.url(cfg.control.current()));
        let report = StatusReport {
            engine: cfg.engine_id.clone(),
            pop: cfg.pop.clone(),
            applied_seq: stats.applied_seq(),
            snapshot_id: stats.snapshot_id.lock().ok().and_then(|id| id.clone()),
            snapshot_seq: stats.snapshot_seq.load(Ordering::Relaxed),
            feed_connected: stats.connected.load(Ordering::Relaxed),
            safe_mode: stats.safe_mode.load(Ordering::Relaxed),
            certificates_generation: stats.certificates_generation.load(Ordering::Relaxed),
            time_ms: now_ms(),
        };
        let mut req = agent.post(&url);
        if let Some(t) = &cfg.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        if let Err(e) = req.send_json(&report) {
            tracing::debug!(error = %e, "status report not delivered");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
