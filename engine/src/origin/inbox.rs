//! A serving core's end of the read-through and the workers' end of it: replies travel over a
//! channel and an eventfd tells the core's loop there are some.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use super::OriginReply;
use crate::io::eventfd::EventFd;

/// A serving core's end of the read-through: replies to its submits, and an eventfd that
/// becomes readable when there are some.
#[derive(Debug)]
pub struct OriginInbox {
    rx: Receiver<OriginReply>,
    pub(super) efd: Arc<EventFd>,
}

impl OriginInbox {
    /// The descriptor to watch for readability (io_uring poll or read, epoll). It is
    /// non-blocking and close-on-exec; [`OriginInbox::drain`] resets it.
    pub fn eventfd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Moves every waiting reply into `out` and resets the eventfd; never blocks. Returns how
    /// many were moved. The counter is reset before the queue is read, so a reply pushed during
    /// the drain either is taken now or leaves the eventfd readable: no wakeup is lost.
    pub fn drain(&self, out: &mut Vec<OriginReply>) -> usize {
        self.efd.reset();
        let before = out.len();
        out.extend(self.rx.try_iter());
        out.len() - before
    }

    /// One waiting reply, if any; does not touch the eventfd (use [`OriginInbox::drain`] when
    /// woken by it).
    pub fn try_recv(&self) -> Option<OriginReply> {
        self.rx.try_recv().ok()
    }
}

/// A core's outbox: the sending half of its inbox.
#[derive(Debug)]
pub(super) struct Outbox {
    tx: Sender<OriginReply>,
    pub(super) efd: Arc<EventFd>,
}

impl Outbox {
    /// Hands `reply` to the core and wakes its loop. A send fails only when the core dropped its
    /// inbox (shutting down).
    pub(super) fn deliver(&self, reply: OriginReply) {
        if self.tx.send(reply).is_ok() {
            self.efd.notify();
        }
    }
}

/// One core's inbox and outbox.
pub(super) fn pair() -> std::io::Result<(OriginInbox, Outbox)> {
    let efd = Arc::new(EventFd::new()?);
    let (tx, rx) = mpsc::channel();
    Ok((
        OriginInbox {
            rx,
            efd: Arc::clone(&efd),
        },
        Outbox { tx, efd },
    ))
}
