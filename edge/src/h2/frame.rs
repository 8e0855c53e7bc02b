//! HTTP/2 frames (RFC 9113 §4, §6): the 9-byte header read from untrusted bytes, and the
//! frames a server writes, appended to an output buffer.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame header length.
pub const HEADER_LEN: usize = 9;

/// The smallest (and default) SETTINGS_MAX_FRAME_SIZE: what we advertise and accept.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

/// The default flow-control window of a stream and of the connection (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: i64 = 65_535;

/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// Frame types (RFC 9113 §6).
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers (RFC 9113 §6.5.2, RFC 9218 §2.1).
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    pub const NO_RFC7540_PRIORITIES: u16 = 0x9;
}

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum ErrorCode {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    SettingsTimeout = 0x4,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    Compression = 0x9,
    Connect = 0xa,
    EnhanceYourCalm = 0xb,
    InadequateSecurity = 0xc,
    Http11Required = 0xd,
}

impl ErrorCode {
    /// Every code, in order (metrics label them by name).
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::NoError,
        ErrorCode::Protocol,
        ErrorCode::Internal,
        ErrorCode::FlowControl,
        ErrorCode::SettingsTimeout,
        ErrorCode::StreamClosed,
        ErrorCode::FrameSize,
        ErrorCode::RefusedStream,
        ErrorCode::Cancel,
        ErrorCode::Compression,
        ErrorCode::Connect,
        ErrorCode::EnhanceYourCalm,
        ErrorCode::InadequateSecurity,
        ErrorCode::Http11Required,
    ];

    /// The RFC's name for the code.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NoError => "NO_ERROR",
            ErrorCode::Protocol => "PROTOCOL_ERROR",
            ErrorCode::Internal => "INTERNAL_ERROR",
            ErrorCode::FlowControl => "FLOW_CONTROL_ERROR",
            ErrorCode::SettingsTimeout => "SETTINGS_TIMEOUT",
            ErrorCode::StreamClosed => "STREAM_CLOSED",
            ErrorCode::FrameSize => "FRAME_SIZE_ERROR",
            ErrorCode::RefusedStream => "REFUSED_STREAM",
            ErrorCode::Cancel => "CANCEL",
            ErrorCode::Compression => "COMPRESSION_ERROR",
            ErrorCode::Connect => "CONNECT_ERROR",
            ErrorCode::EnhanceYourCalm => "ENHANCE_YOUR_CALM",
            ErrorCode::InadequateSecurity => "INADEQUATE_SECURITY",
            ErrorCode::Http11Required => "HTTP_1_1_REQUIRED",
        }
    }

    /// The code for a number a peer sent; unknown codes read as INTERNAL_ERROR (RFC 9113 §7:
    /// they MUST NOT trigger special behaviour).
    pub fn from_u32(n: u32) -> ErrorCode {
        ErrorCode::ALL
            .get(n as usize)
            .copied()
            .unwrap_or(ErrorCode::Internal)
    }
}

/// A frame header as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    /// The stream identifier, reserved bit cleared.
    pub stream: u32,
}

impl Header {
    /// Reads a header from the first [`HEADER_LEN`] bytes of `b`; `None` if there are fewer.
    #[inline]
    pub fn read(b: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_LEN] = b.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Header {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        })
    }

    #[inline]
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Appends a frame header.
#[inline]
pub fn write_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// Appends a SETTINGS frame with `pairs`.
pub fn write_settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    write_header(out, pairs.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, value) in pairs {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn write_settings_ack(out: &mut Vec<u8>) {
    write_header(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends the acknowledgement of a PING.
pub fn write_ping_ack(out: &mut Vec<u8>, opaque: &[u8; 8]) {
    write_header(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(opaque);
}

/// Appends a GOAWAY.
pub fn write_goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode) {
    write_header(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

/// Appends a RST_STREAM.
pub fn write_rst(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    write_header(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

/// Appends a WINDOW_UPDATE.
pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_header(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends a header block as HEADERS (and CONTINUATION frames when it is longer than
/// `max_frame`), with END_STREAM when `end`.
pub fn write_headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end: bool, max_frame: usize) {
    let max_frame = max_frame.max(1);
    let mut chunks = block.chunks(max_frame);
    let first = chunks.next().unwrap_or(&[]);
    let rest = block.len().saturating_sub(first.len());
    let mut flags = if end { flag::END_STREAM } else { 0 };
    if rest == 0 {
        flags |= flag::END_HEADERS;
    }
    write_header(out, first.len(), kind::HEADERS, flags, stream);
    out.extend_from_slice(first);
    let mut left = rest;
    for chunk in chunks {
        left -= chunk.len();
        let flags = if left == 0 { flag::END_HEADERS } else { 0 };
        write_header(out, chunk.len(), kind::CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
    }
}

/// Appends one DATA frame.
pub fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool) {
    let flags = if end { flag::END_STREAM } else { 0 };
    write_header(out, data.len(), kind::DATA, flags, stream);
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_the_reserved_bit_is_ignored() {
        let mut out = Vec::new();
        write_header(&mut out, 0x12_3456, kind::HEADERS, 0x25, 7);
        let h = Header::read(&out).unwrap();
        assert_eq!(
            h,
            Header {
                len: 0x12_3456,
                kind: kind::HEADERS,
                flags: 0x25,
                stream: 7
            }
        );
        out[5] |= 0x80;
        assert_eq!(Header::read(&out).unwrap().stream, 7);
        assert_eq!(Header::read(&out[..8]), None);
    }

    #[test]
    fn a_long_header_block_is_split_into_continuations() {
        let block: Vec<u8> = (0..40u8).collect();
        let mut out = Vec::new();
        write_headers(&mut out, 3, &block, true, 16);
        let mut at = 0;
        let mut seen = Vec::new();
        let mut frames = Vec::new();
        while at < out.len() {
            let h = Header::read(&out[at..]).unwrap();
            seen.extend_from_slice(&out[at + 9..at + 9 + h.len as usize]);
            frames.push((h.kind, h.flags));
            at += 9 + h.len as usize;
        }
        assert_eq!(seen, block);
        assert_eq!(
            frames,
            [
                (kind::HEADERS, flag::END_STREAM),
                (kind::CONTINUATION, 0),
                (kind::CONTINUATION, flag::END_HEADERS)
            ]
        );
    }

    #[test]
    fn unknown_error_codes_read_as_internal() {
        assert_eq!(ErrorCode::from_u32(0xb), ErrorCode::EnhanceYourCalm);
        assert_eq!(ErrorCode::from_u32(0xff), ErrorCode::Internal);
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
