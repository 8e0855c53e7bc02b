//! One TLS connection on rustls, the layer every I/O loop drives (the io_uring loop today, the
//! kernel-bypass one to come): received bytes in through rustls, plaintext (0-RTT early data
//! first, flagged) to the connection's [`Session`], the session's answers out through rustls,
//! and, once the handshake is done and nothing is half-read, the record layer handed to the
//! kernel where it takes the suite (kTLS, [`super::ktls`]).
//!
//! An error from rustls closes the connection after whatever rustls queued (its alert, when it
//! chose one) is written: the loop keeps flushing [`output`] until then. Where rustls queues no
//! alert, the connection closes bare; `engine/DESIGN.md` ("HTTPS", conformance) lists the cases
//! and shows a plain rustls server does the same.

use std::io::{self, BufRead as _, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use rustls::{ServerConfig, ServerConnection};

use super::{ktls_install, Handshake, KtlsSupport, TlsStats};
use crate::session::{CoreCtx, Drive as _, Session};

/// A TLS connection's userspace state.
pub struct TlsConn {
    pub conn: ServerConnection,
    pub accepted_ms: i64,
    /// Still counted among this core's handshakes in flight.
    pub handshaking: bool,
    /// A TLS error: close once the alert is out.
    pub failed: bool,
    /// A regular descriptor for the socket (installed from the fixed slot at accept when kTLS
    /// is available), for the `setsockopt` calls of the hand-off.
    pub raw_fd: Option<OwnedFd>,
    /// Where the received byte stream stands in TLS records, so the kTLS hand-off happens only
    /// between records (a half-read record in rustls would be lost to the kernel).
    pub records: RecordTrack,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn")
            .field("handshaking", &self.handshaking)
            .field("failed", &self.failed)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl TlsConn {
    /// A new connection's TLS state, or `None` when it must be refused: past this core's
    /// handshake cap (`handshakes` in flight), or if rustls cannot set it up.
    pub fn start(
        config: &Mutex<Arc<ServerConfig>>,
        stats: &TlsStats,
        max_handshakes: usize,
        handshakes: usize,
        now_ms: i64,
    ) -> io::Result<Option<Box<TlsConn>>> {
        if handshakes >= max_handshakes {
            stats.failure(2); // handshake_cap
            return Ok(None);
        }
        let config = config
            .lock()
            .map(|c| Arc::clone(&c))
            .map_err(|_| io::Error::other("TLS config lock poisoned"))?;
        let mut conn = match ServerConnection::new(config) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "TLS connection setup failed");
                return Ok(None);
            }
        };
        // The session already bounds its output (MAX_PENDING_OUT); rustls' own 64 KiB limit
        // would make `write_all` fail past it.
        conn.set_buffer_limit(None);
        stats.userspace_conn();
        Ok(Some(Box::new(TlsConn {
            conn,
            accepted_ms: now_ms,
            handshaking: true,
            failed: false,
            raw_fd: None,
            records: RecordTrack::default(),
        })))
    }

    /// Takes the connection out of its core's handshakes in flight: true the first time while
    /// it is counted (the loop then lowers its count), false once its handshake ended or it
    /// was taken out already.
    pub fn uncount(&mut self) -> bool {
        std::mem::replace(&mut self.handshaking, false)
    }
}

/// Follows TLS record framing (5-byte header with a big-endian length) over a byte stream.
#[derive(Debug, Default)]
pub struct RecordTrack {
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
}

impl RecordTrack {
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.body_left > 0 {
                let take = self.body_left.min(data.len());
                self.body_left -= take;
                data = &data[take..];
            } else {
                self.header[self.header_len] = data[0];
                self.header_len += 1;
                data = &data[1..];
                if self.header_len == 5 {
                    self.body_left =
                        usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                    self.header_len = 0;
                }
            }
        }
    }

    pub fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }
}

/// How a kTLS hand-off went.
#[derive(Debug)]
pub enum HandOff {
    /// The kernel does not take this connection's suite: it stays in userspace for good.
    Kept(Box<TlsConn>),
    /// The kernel has the record layer now.
    Kernel,
    /// The secrets left rustls but the kernel refused them: the connection must close.
    Failed(io::Error),
}

/// Gives a finished, drained TLS connection's record layer to the kernel, if `support` says it
/// takes the negotiated version and suite.
pub fn hand_off(mut t: Box<TlsConn>, support: Option<&KtlsSupport>) -> HandOff {
    let tls13 = t.conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
    let takes = match (support, t.conn.negotiated_cipher_suite()) {
        (Some(k), Some(suite)) => k.takes(tls13, suite.suite()),
        _ => false,
    };
    if !takes {
        t.raw_fd = None;
        return HandOff::Kept(t);
    }
    let TlsConn {
        conn: server,
        raw_fd,
        ..
    } = *t;
    let handed = match (server.dangerous_extract_secrets(), raw_fd) {
        (Ok(secrets), Some(fd)) => ktls_install(&fd, tls13, secrets),
        (Err(e), _) => Err(io::Error::other(e)),
        (_, None) => Err(io::Error::other("no descriptor")),
    };
    match handed {
        Ok(()) => HandOff::Kernel,
        Err(e) => HandOff::Failed(e),
    }
}

/// Why a TLS connection's input ends it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// rustls refused the bytes (its alert, if it chose one, is queued).
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    /// The record layer's buffer refused them (a message over rustls' limits, for one).
    #[error("TLS input: {0}")]
    Io(io::Error),
}

/// Feeds received TLS bytes to rustls and the plaintext (early data included) to the session.
/// `Ok(true)`: these bytes finished the handshake, and the loop lowers its count of handshakes
/// in flight ([`TlsConn::uncount`]). An error means the connection must close (its alert, if
/// any, is already queued in rustls).
pub fn input(
    tls: &mut TlsConn,
    session: &mut Session,
    mut data: &[u8],
    ctx: &CoreCtx,
    token: u64,
    stats: Option<&TlsStats>,
) -> Result<bool, InputError> {
    let was_handshaking = tls.conn.is_handshaking();
    if tls.raw_fd.is_some() {
        tls.records.feed(data);
    }
    while !data.is_empty() {
        match tls.conn.read_tls(&mut data) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                if let Some(s) = stats {
                    s.failure(3); // io
                }
                return Err(InputError::Io(e));
            }
        }
        if let Err(e) = tls.conn.process_new_packets() {
            if let Some(s) = stats {
                if tls.conn.is_handshaking() {
                    s.failure(0); // alert
                }
            }
            tracing::debug!(error = %e, "TLS error");
            return Err(InputError::Tls(e));
        }
        // ALPN is settled once the ClientHello is read: HTTP/2 from the first byte on.
        if !session.is_h2() && tls.conn.alpn_protocol() == Some(b"h2") {
            session.alpn_h2(tls.conn.server_name(), ctx, token);
        }
        // An ACME TLS-ALPN-01 validation: the handshake was all it asked for (RFC 8737 §3
        // forbids application data); close once it is done.
        if tls.conn.alpn_protocol() == Some(super::sni::ACME_TLS_ALPN) {
            if !tls.conn.is_handshaking() {
                tls.conn.send_close_notify();
                session.close_after_send = true;
            }
            continue;
        }
        // 0-RTT: the resumed client's early flight, readable before the handshake ends.
        if let Some(mut early) = tls.conn.early_data() {
            let mut buf = Vec::new();
            if early.read_to_end(&mut buf).is_ok() && !buf.is_empty() {
                if let Some(s) = stats {
                    s.early_data();
                }
                session.early = true;
                session.receive(&buf, ctx, token);
                session.early = false;
            }
        }
        // The plaintext is handed over where rustls holds it (no copy).
        loop {
            let mut reader = tls.conn.reader();
            match reader.fill_buf() {
                Ok([]) => {
                    // close_notify: answer what is buffered, then close.
                    session.close_after_send = true;
                    break;
                }
                Ok(chunk) => {
                    let n = chunk.len();
                    session.receive(chunk, ctx, token);
                    reader.consume(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(InputError::Io(e)),
            }
        }
    }
    if was_handshaking && !tls.conn.is_handshaking() {
        if let Some(s) = stats {
            let kind = match tls.conn.handshake_kind() {
                Some(rustls::HandshakeKind::Resumed) => Handshake::Resumed,
                _ => Handshake::Full,
            };
            s.handshake(kind);
            s.key_exchange(tls.conn.negotiated_key_exchange_group().map(|g| g.name()));
        }
    }
    Ok(!tls.conn.is_handshaking() && tls.uncount())
}

/// Whether the connection ends once what it has is sent: its session said close (a
/// `Connection: close` answer, the client's close_notify, garbage) and awaits no origin reply,
/// and its handshake is over (answers to 0-RTT early data wait in rustls for the client's
/// Finished) or failed.
pub fn done(tls: &TlsConn, session: &Session) -> bool {
    session.close_after_send
        && !session.waiting_origin()
        && (tls.failed || !tls.conn.is_handshaking())
}

/// Moves the session's rendered answers into rustls and everything rustls has to send
/// (handshake flights, records, alerts) onto `sending`. A write rustls refuses closes the
/// connection once the rest is out. A connection that is [`done`] ends with close_notify
/// after its last answer (RFC 8446 §6.1, RFC 9112 §9.8: a clean closure, so the client can
/// tell the end from a truncation); a failed one has its alert instead.
pub fn output(tls: &mut TlsConn, session: &mut Session, sending: &mut Vec<u8>) {
    if !session.out.is_empty() {
        if tls.conn.writer().write_all(&session.out).is_err() {
            session.close_after_send = true;
        }
        session.out.clear();
    }
    if !tls.failed && done(tls, session) {
        // Once only: rustls ignores it after the first (or after a fatal alert).
        tls.conn.send_close_notify();
    }
    while tls.conn.wants_write() {
        if tls.conn.write_tls(sending).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RecordTrack;

    #[test]
    fn record_boundaries_across_reads() {
        let mut t = RecordTrack::default();
        assert!(t.at_boundary());
        // Two records (3 and 2 body bytes), fed in awkward pieces.
        let stream = [23u8, 3, 3, 0, 3, 1, 2, 3, 23, 3, 3, 0, 2, 9, 9];
        t.feed(&stream[..2]);
        assert!(!t.at_boundary(), "inside a header");
        t.feed(&stream[2..7]);
        assert!(!t.at_boundary(), "inside a body");
        t.feed(&stream[7..8]);
        assert!(t.at_boundary());
        t.feed(&stream[8..14]);
        assert!(!t.at_boundary());
        t.feed(&stream[14..]);
        assert!(t.at_boundary());
    }
}
