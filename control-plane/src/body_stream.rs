//! A response body fed from a bounded channel: the edge feed and snapshot downloads.
//!
//! The producer (a task, or a blocking reader) waits while the channel is full, so a slow client
//! holds at most the channel's capacity in memory, never a growing queue; when the client goes
//! away the body is dropped, the producer's next send fails and it stops.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use tokio::sync::mpsc;

/// What producers send: a chunk, or an error that aborts the response mid-body (the client sees
/// a broken transfer, never a silently short one).
pub type Chunk = Result<Bytes, std::io::Error>;

/// A bounded channel and the body that streams what is sent into it.
pub fn channel(capacity: usize) -> (mpsc::Sender<Chunk>, Body) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, Body::from_stream(ChannelStream(rx)))
}

struct ChannelStream(mpsc::Receiver<Chunk>);

impl futures_core::Stream for ChannelStream {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        self.0.poll_recv(cx)
    }
}
