//! The edge feed stream, `GET /edge/v1/feed` (core/FEED.md, "The feed stream").
//!
//! Each subscription is one task that writes NDJSON lines into a small bounded channel
//! ([`crate::body_stream`]) the response body drains. It sends, in this order: `hello`, the
//! standing `denylist`, the newest `snapshot` frame, every change after the subscriber's `after`
//! (read from the store in pages of [`PAGE`]), and then, for as long as the client reads, each
//! new change as it commits, each new snapshot as it is published, and a `heartbeat` whenever
//! nothing else went out for a heartbeat interval.
//!
//! Why a task per subscriber reading the store itself, not one shared fan-out queue: the store
//! *is* the queue. A subscriber sleeps on the store's commit watch ([`Store::commits`]), which
//! the writer bumps the moment a commit is durable, and then reads the changes it has not sent,
//! so a takedown reaches every connected engine within one read after its fsync. A slow client
//! only slows its own task: the task waits on its full channel (memory stays at the channel's
//! capacity plus one page) and resumes from its own position; nothing is ever queued for it.
//! A client that accepts nothing for [`STALL_TIMEOUT`] is dropped; the engine reconnects with
//! the sequence it has applied and resumes. The cost is one small read per subscriber per group
//! commit, which is cheap for the tens of engines a PoP fleet has; a shared reader would be the
//! next step for thousands.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use lasthop_core::feed::{
    denylist_frames, encode_frame, DenyEntry, Frame, LinkFrame, SnapshotFrame, MAX_FRAME_LEN,
};
use lasthop_core::Change;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::body_stream::{self, Chunk};
use crate::clock::now_ms;
use crate::store::{Store, StoreError, StoredLink};

/// Most changes read per store call while catching up.
pub const PAGE: usize = 1000;
/// Chunks (a frame, or a batch of catch-up frames) waiting for a client at most.
const BUFFERED_CHUNKS: usize = 64;
/// Catch-up frames are batched into chunks of about this size.
const CHUNK_BYTES: usize = 64 * 1024;
/// A client that takes nothing for this long is dropped (it reconnects and resumes).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a subscription needs; cheap to clone.
#[derive(Clone)]
pub struct Feed {
    store: Arc<dyn Store>,
    heartbeat: Duration,
    /// Announced in hello and heartbeat frames (`--max-mint-rate`).
    mint_rate: Option<u64>,
    snapshots: Option<watch::Receiver<Option<SnapshotFrame>>>,
    stop: Option<watch::Receiver<bool>>,
    /// The windows of peer regions out of touch (`--peer`), announced in hello and heartbeat
    /// frames (`widen`).
    windows: Option<Windows>,
    /// The domains' generation, read by one task for every subscriber of this feed (started
    /// by the first subscription), so engines cost the store nothing more per second.
    certificates: Arc<std::sync::OnceLock<watch::Receiver<u64>>>,
}

/// What tells the feed, at a time (Unix ms), which peer regions' windows to widen
/// ([`crate::peers::Peers::windows`] in `serve`).
pub type Windows = Arc<dyn Fn(i64) -> Vec<lasthop_core::feed::Window> + Send + Sync>;

/// Every setting of a feed, given once (`serve` builds it; [`Feed::new`] is the plain one).
pub struct FeedParts {
    pub store: Arc<dyn Store>,
    /// A heartbeat at least this often when idle.
    pub heartbeat: Duration,
    /// Announced in hello and heartbeat frames: codes per second the region mints at most
    /// (`None` or 0: unbounded).
    pub mint_rate: Option<u64>,
    /// Published snapshots to announce (the newest on subscription, then each new one).
    pub snapshots: Option<watch::Receiver<Option<SnapshotFrame>>>,
    /// Ends every stream once this turns true (graceful shutdown: streams never end otherwise,
    /// and the server waits for open responses).
    pub stop: Option<watch::Receiver<bool>>,
    pub windows: Option<Windows>,
}

impl FeedParts {
    /// A feed of `store`'s changes with a heartbeat at least every `heartbeat`, and nothing else.
    pub fn new(store: Arc<dyn Store>, heartbeat: Duration) -> FeedParts {
        FeedParts {
            store,
            heartbeat,
            mint_rate: None,
            snapshots: None,
            stop: None,
            windows: None,
        }
    }
}

impl std::fmt::Debug for FeedParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedParts")
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

impl Feed {
    /// A feed of `store`'s changes, with a heartbeat at least every `heartbeat` when idle.
    pub fn new(store: Arc<dyn Store>, heartbeat: Duration) -> Feed {
        Feed::from_parts(FeedParts::new(store, heartbeat))
    }

    /// A feed with every setting given.
    pub fn from_parts(parts: FeedParts) -> Feed {
        Feed {
            store: parts.store,
            heartbeat: parts.heartbeat.max(Duration::from_millis(1)),
            mint_rate: parts.mint_rate.filter(|&r| r > 0),
            snapshots: parts.snapshots,
            stop: parts.stop,
            windows: parts.windows,
            certificates: Arc::default(),
        }
    }

    /// The domains' generation as the watcher last read it; the first call starts the watcher
    /// (a task reading it every heartbeat interval until the feed stops).
    fn certificates(&self, now: u64) -> watch::Receiver<u64> {
        self.certificates
            .get_or_init(|| {
                let (tx, rx) = watch::channel(now);
                let (store, every, mut stop) =
                    (Arc::clone(&self.store), self.heartbeat, self.stop.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            open = changed(&mut stop) => {
                                if !open {
                                    stop = None;
                                } else if stop.as_ref().is_some_and(|s| *s.borrow()) {
                                    return;
                                }
                            }
                            () = tokio::time::sleep(every) => {
                                let store = Arc::clone(&store);
                                match blocking(move || store.domains_generation()).await {
                                    Ok(g) => {
                                        tx.send_if_modified(|held| {
                                            let moved = *held != g;
                                            *held = g;
                                            moved
                                        });
                                    }
                                    Err(_) => tracing::warn!(
                                        "feed: the domains' generation could not be read; retried"
                                    ),
                                }
                            }
                        }
                    }
                });
                rx
            })
            .clone()
    }

    fn windows(&self) -> Vec<lasthop_core::feed::Window> {
        self.windows
            .as_ref()
            .map(|w| w(now_ms()))
            .unwrap_or_default()
    }

    /// Starts a subscription from change `after` and returns the response body it writes.
    pub fn subscribe(&self, after: u64, engine: String, pop: String) -> Body {
        let (tx, body) = body_stream::channel(BUFFERED_CHUNKS);
        let feed = self.clone();
        tokio::spawn(async move {
            tracing::info!(%engine, %pop, after, "feed subscriber connected");
            let mut out = Out {
                tx,
                last_sent: Instant::now(),
            };
            match feed.stream(after, &mut out).await {
                Ok(()) => tracing::info!(%engine, %pop, "feed stream ended (shutdown)"),
                Err(End::Gone) => tracing::info!(%engine, %pop, "feed subscriber disconnected"),
                Err(End::Stalled) => tracing::warn!(
                    %engine, %pop, timeout_s = STALL_TIMEOUT.as_secs(),
                    "feed subscriber took nothing for too long; dropped (it may resume)"
                ),
                Err(End::Store(e)) => {
                    tracing::error!(%engine, %pop, error = %e, "feed: store failure; ending the stream");
                    // Abort the body so the client sees a broken stream, not a clean end.
                    let _ = out
                        .tx
                        .try_send(Err(std::io::Error::other("store unavailable")));
                }
            }
        });
        body
    }

    async fn stream(&self, after: u64, out: &mut Out) -> Result<(), End> {
        let mut commits = self.store.commits();
        let mut snapshots = self.snapshots.clone();
        let mut stop = self.stop.clone();
        if stop.as_ref().is_some_and(|s| *s.borrow()) {
            return Ok(());
        }
        // Marked seen before the reads below: any commit from here on wakes the loop.
        commits.borrow_and_update();
        let store = Arc::clone(&self.store);
        let (last_seq, (deny_seq, denied), mut certificates) = blocking(move || {
            Ok((
                store.last_seq()?,
                store.denied()?,
                store.domains_generation()?,
            ))
        })
        .await?;
        if after > last_seq {
            tracing::warn!(
                after,
                last_seq,
                "feed subscriber is ahead of the change log"
            );
        }
        out.send(&Frame::Hello {
            last_seq,
            time_ms: now_ms(),
            mint_rate: self.mint_rate,
            widen: self.windows(),
        })
        .await?;
        let entries = denied
            .into_iter()
            .map(|(code, deny)| DenyEntry { code, deny })
            .collect();
        for frame in denylist_frames(deny_seq, entries) {
            out.send(&frame).await?;
        }
        let newest = snapshots
            .as_mut()
            .and_then(|s| s.borrow_and_update().clone());
        if let Some(s) = newest {
            out.send(&Frame::Snapshot(s)).await?;
        }
        out.send(&Frame::Certificates {
            generation: certificates,
        })
        .await?;
        // Domain writes are not changes of the log: their generation comes from the feed's
        // watcher, which reads it once a heartbeat interval for every subscriber.
        let mut generations = Some(self.certificates(certificates));
        // Only what the watcher reads from now on: this subscription read the store itself.
        if let Some(g) = generations.as_mut() {
            g.borrow_and_update();
        }
        // A subscriber ahead of this log (the store was restored from an older backup) resumes
        // from the log's end, so changes made from here on reach it under their new numbers.
        let mut cursor = after.min(last_seq);
        let mut caught_up_to = 0;
        loop {
            let committed = *commits.borrow_and_update();
            if committed > caught_up_to {
                self.catch_up(&mut cursor, out).await?;
                caught_up_to = committed;
            }
            let idle = tokio::time::sleep_until(out.last_sent + self.heartbeat);
            tokio::select! {
                biased;
                open = changed(&mut stop) => {
                    if !open {
                        stop = None;
                    } else if stop.as_ref().is_some_and(|s| *s.borrow()) {
                        return Ok(());
                    }
                }
                // Before commits: rare, and never starved by a steady stream of writes.
                open = changed(&mut snapshots) => {
                    let newest = snapshots.as_mut().and_then(|s| s.borrow_and_update().clone());
                    match (open, newest) {
                        (true, Some(s)) => out.send(&Frame::Snapshot(s)).await?,
                        (true, None) => {}
                        (false, _) => snapshots = None,
                    }
                }
                open = changed(&mut generations) => {
                    let now = generations.as_mut().map(|g| *g.borrow_and_update());
                    match (open, now) {
                        (true, Some(now)) if now != certificates => {
                            certificates = now;
                            out.send(&Frame::Certificates { generation: now }).await?;
                        }
                        (true, _) => {}
                        (false, _) => generations = None,
                    }
                }
                alive = commits.changed() => {
                    if alive.is_err() {
                        return Err(End::Store(StoreError::ShuttingDown));
                    }
                }
                () = idle => {
                    let last_seq = *commits.borrow();
                    out.send(&Frame::Heartbeat {
                        last_seq,
                        time_ms: now_ms(),
                        mint_rate: self.mint_rate,
                        widen: self.windows(),
                    })
                    .await?;
                }
            }
        }
    }

    /// Sends every change after `cursor` committed by now, page by page.
    async fn catch_up(&self, cursor: &mut u64, out: &mut Out) -> Result<(), End> {
        loop {
            let store = Arc::clone(&self.store);
            let from = *cursor;
            let page = blocking(move || read_page(&*store, from)).await?;
            for chunk in page.chunks {
                out.send_chunk(chunk).await?;
            }
            match page.last_seq {
                Some(last) => *cursor = last,
                None => return Ok(()),
            }
            if page.count < PAGE {
                return Ok(());
            }
        }
    }
}

/// `true` when the watched value changed; `false` when its sender is gone. Pends forever for `None`, so an absent channel never wakes a `select!`.
async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Why a stream ended early.
enum End {
    /// The client went away.
    Gone,
    /// The client took nothing for [`STALL_TIMEOUT`].
    Stalled,
    Store(StoreError),
}

/// The sending half of one subscription.
struct Out {
    tx: mpsc::Sender<Chunk>,
    last_sent: Instant,
}

impl Out {
    async fn send(&mut self, frame: &Frame) -> Result<(), End> {
        self.send_chunk(Bytes::from(line(frame))).await
    }

    async fn send_chunk(&mut self, chunk: Bytes) -> Result<(), End> {
        match tokio::time::timeout(STALL_TIMEOUT, self.tx.send(Ok(chunk))).await {
            Ok(Ok(())) => {
                self.last_sent = Instant::now();
                Ok(())
            }
            Ok(Err(_)) => Err(End::Gone),
            Err(_) => Err(End::Stalled),
        }
    }
}

/// One frame's line. A line over the readers' limit is still sent (and logged): dropping it
/// would silently lose a change, whereas a reader that refuses it reconnects, says so and
/// falls back to asking the origin.
fn line(frame: &Frame) -> Vec<u8> {
    let line = encode_frame(frame);
    if line.len() > MAX_FRAME_LEN + 1 {
        tracing::error!(
            bytes = line.len(),
            limit = MAX_FRAME_LEN,
            "feed frame over the line limit; engines will refuse it"
        );
    }
    line
}

/// A store call on the blocking pool ([`crate::reply::offload`]); its failure, or the task's,
/// ends the stream.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, End> {
    match crate::reply::offload("feed: store task", f).await {
        Ok(result) => result.map_err(End::Store),
        Err(e) => Err(End::Store(StoreError::Task {
            what: e.what,
            cause: Box::new(e.source),
        })),
    }
}

/// One page of changes as encoded chunks.
struct Page {
    count: usize,
    last_seq: Option<u64>,
    chunks: Vec<Bytes>,
}

fn read_page(store: &dyn Store, after: u64) -> Result<Page, StoreError> {
    let changes = store.changes_since(after, PAGE)?;
    let mut chunks = Vec::new();
    let mut chunk = Vec::with_capacity(CHUNK_BYTES);
    for (seq, change) in &changes {
        let current = match change {
            Change::StateChanged { code, .. } => store.get(code)?,
            // An edited link imported with its edit: the log has only the mark.
            Change::LinkCreated { state, link } if state.destination.is_some() => {
                store.get(&link.code)?
            }
            Change::LinkCreated { .. } => None,
        };
        chunk.extend_from_slice(&line(&frame_for(*seq, change, current.as_ref())));
        if chunk.len() >= CHUNK_BYTES {
            chunks.push(Bytes::from(std::mem::replace(
                &mut chunk,
                Vec::with_capacity(CHUNK_BYTES),
            )));
        }
    }
    if !chunk.is_empty() {
        chunks.push(Bytes::from(chunk));
    }
    Ok(Page {
        count: changes.len(),
        last_seq: changes.last().map(|(seq, _)| *seq),
        chunks,
    })
}

/// The frame for change `seq`. A state change carries the link's whole state after it and its
/// current destination, read from `current` (the change log holds only the state, and marks
/// an edited destination without its URL: [`lasthop_core::LinkState::logged`]); so does a
/// creation whose state has an edit's mark.
pub fn frame_for(seq: u64, change: &Change, current: Option<&StoredLink>) -> Frame {
    match change {
        Change::LinkCreated { link, state } => {
            let url = match (&state.destination, current) {
                (Some(_), Some(now)) => now.state.url(&now.link),
                _ => &link.long_url,
            };
            let mut f = LinkFrame::new(seq, &link.code, url, state);
            f.created_at_ms = Some(link.created_at_ms);
            Frame::LinkCreated(f)
        }
        Change::StateChanged { code, state } => {
            let url = current.map(|s| s.state.url(&s.link)).unwrap_or("");
            let mut f = LinkFrame::new(seq, code, url, state);
            f.created_at_ms = current.map(|s| s.link.created_at_ms);
            Frame::StateChanged(f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::{Link, LinkState};

    fn link(url: &str) -> Link {
        Link {
            code: "abcDEF1".into(),
            long_url: url.into(),
            owner: "alice".into(),
            created_at_ms: 7,
        }
    }

    #[test]
    fn frames_carry_the_whole_state() {
        let created = frame_for(
            3,
            &Change::LinkCreated {
                link: link("https://example.com/"),
                state: LinkState {
                    expires_at_ms: Some(99),
                    ..LinkState::default()
                },
            },
            None,
        );
        let Frame::LinkCreated(f) = created else {
            panic!("{created:?}")
        };
        assert_eq!(
            (f.seq, f.long_url.as_str(), f.created_at_ms, f.expires_at_ms),
            (3, "https://example.com/", Some(7), Some(99))
        );

        let taken = LinkState {
            takedown_reason: Some("phishing".into()),
            ..LinkState::default()
        };
        let current = StoredLink {
            link: link("https://example.com/"),
            state: taken.clone(),
            seq: 0,
        };
        let change = Change::StateChanged {
            code: "abcDEF1".into(),
            state: taken,
        };
        let Frame::StateChanged(f) = frame_for(4, &change, Some(&current)) else {
            panic!()
        };
        assert_eq!(f.takedown_reason.as_deref(), Some("phishing"));
        assert_eq!(f.long_url, "https://example.com/");
        assert!(f.gone());

        // Deleted: no destination, whatever the link record still says.
        let deleted = Change::StateChanged {
            code: "abcDEF1".into(),
            state: LinkState {
                deleted: true,
                ..LinkState::default()
            },
        };
        let Frame::StateChanged(f) = frame_for(5, &deleted, Some(&current)) else {
            panic!()
        };
        assert!(f.deleted && f.long_url.is_empty());
    }
}
