//! The feed's reader thread: holds the subscription to the control plane in use, reads its
//! NDJSON frames as untrusted bytes (each line bounded), hands them to the applier, and fails
//! over and backs off when the feed is lost (see [`crate::feed`]).

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::Duration;

use lasthop_core::feed::{parse_frame, MAX_FRAME_LEN};

use super::{Event, FeedConfig, FeedStats};

/// Reads `r` up to and including the next `\n` into `out` (cleared first), refusing lines
/// longer than `max`. Returns the bytes read; 0 at end of stream.
fn read_line_bounded(
    r: &mut impl BufRead,
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    out.clear();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(out.len());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if out.len() + take > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("feed line over {max} bytes"),
            ));
        }
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            return Ok(out.len());
        }
    }
}

/// Reads frames from an open subscription until it fails; returns why.
fn read_frames(body: impl Read, stats: &FeedStats, tx: &Sender<Event>) -> String {
    let mut r = BufReader::with_capacity(64 * 1024, body);
    let mut line = Vec::with_capacity(1024);
    loop {
        match read_line_bounded(&mut r, &mut line, MAX_FRAME_LEN + 2) {
            Ok(0) => return "the control plane closed the feed".into(),
            Ok(_) if line.last() != Some(&b'\n') => return "the feed ended mid-line".into(),
            Ok(_) => match parse_frame(&line) {
                Ok(frame) => {
                    stats.frames.fetch_add(1, Ordering::Relaxed);
                    if tx.send(Event::Frame(frame)).is_err() {
                        return "stopping".into();
                    }
                }
                Err(e) => {
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    return format!("refused a feed line: {e}");
                }
            },
            Err(e) => return format!("reading the feed: {e}"),
        }
    }
}

pub(super) fn reader(cfg: &FeedConfig, stats: &FeedStats, tx: &Sender<Event>) {
    let agent = cfg
        .control
        .agent()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(cfg.timeout)
        .build();
    let controls = &*cfg.control;
    let mut backoff = Duration::from_millis(50);
    let mut jitter = std::process::id() as u64 | 1;
    // Control planes that failed in a row: every one is tried once before a backoff.
    let mut failures = 0usize;
    loop {
        let control = controls.current();
        let after = stats.applied_seq();
        let query = format!(
            "/edge/v1/feed?after={after}&engine={}&pop={}",
            cfg.engine_id, cfg.pop
        );
        let lost = match cfg.get(&agent, control, &query).call() {
            Ok(resp) => {
                controls.working(control);
                if tx.send(Event::Connected(control)).is_err() {
                    return;
                }
                tracing::info!(
                    control = controls.url(control),
                    index = control,
                    after,
                    "feed subscribed"
                );
                backoff = Duration::from_millis(50);
                failures = 0;
                read_frames(resp.into_reader(), stats, tx)
            }
            Err(ureq::Error::Status(status, _)) => format!("the feed answered {status}"),
            Err(e) => format!("connecting to the feed: {e}"),
        };
        if tx.send(Event::Lost(lost.clone())).is_err() {
            return;
        }
        controls.failed(control, &lost);
        failures += 1;
        if failures % controls.len() != 0 {
            continue; // the next control plane, at once
        }
        // xorshift jitter of up to half the backoff, so engines do not reconnect in lockstep.
        jitter ^= jitter << 13;
        jitter ^= jitter >> 7;
        jitter ^= jitter << 17;
        let half = backoff.as_millis() as u64 / 2;
        std::thread::sleep(backoff + Duration::from_millis(jitter % (half + 1)));
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let mut r = BufReader::with_capacity(4, &b"ab\ncdef\nghijklmnop\ntail"[..]);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).unwrap(), 3);
        assert_eq!(line, b"ab\n");
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).unwrap(), 5);
        assert_eq!(line, b"cdef\n");
        assert!(read_line_bounded(&mut r, &mut line, 8).is_err(), "11 bytes");
    }
}
