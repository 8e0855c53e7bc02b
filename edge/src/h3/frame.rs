//! HTTP/3 framing (RFC 9114 §7): QUIC variable-length integers, frame headers, and the few
//! frames the server writes (SETTINGS, HEADERS, DATA, GOAWAY).

/// Frame types (RFC 9114 §7.2).
pub mod kind {
    pub const DATA: u64 = 0x0;
    pub const HEADERS: u64 = 0x1;
    pub const CANCEL_PUSH: u64 = 0x3;
    pub const SETTINGS: u64 = 0x4;
    pub const PUSH_PROMISE: u64 = 0x5;
    pub const GOAWAY: u64 = 0x7;
    pub const MAX_PUSH_ID: u64 = 0xd;

    /// HTTP/2's frame types that HTTP/3 reserves: receiving one is a connection error
    /// (§7.2.8).
    pub fn reserved_h2(t: u64) -> bool {
        matches!(t, 0x2 | 0x6 | 0x8 | 0x9)
    }
}

/// Unidirectional stream types (RFC 9114 §6.2, RFC 9204 §4.2).
pub mod stream {
    pub const CONTROL: u64 = 0x00;
    pub const PUSH: u64 = 0x01;
    pub const QPACK_ENCODER: u64 = 0x02;
    pub const QPACK_DECODER: u64 = 0x03;
}

/// Settings identifiers (RFC 9114 §7.2.4.1, RFC 9204 §5).
pub mod setting {
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;

    /// HTTP/2's settings that HTTP/3 reserves: a connection error (§7.2.4.1).
    pub fn reserved_h2(id: u64) -> bool {
        matches!(id, 0x02..=0x05)
    }
}

/// The largest value a QUIC variable-length integer holds.
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// A variable-length integer at the start of `b` (RFC 9000 §16): (value, bytes used), or
/// `None` when `b` ends before it does.
pub fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let len = 1usize << (first >> 6);
    let bytes = b.get(..len)?;
    let mut v = u64::from(first & 0x3f);
    for &x in &bytes[1..] {
        v = (v << 8) | u64::from(x);
    }
    Some((v, len))
}

/// Appends `v` (at most [`VARINT_MAX`]) in the shortest form.
pub fn put_varint(out: &mut Vec<u8>, v: u64) {
    debug_assert!(v <= VARINT_MAX);
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.extend_from_slice(&(v as u16 | 0x4000).to_be_bytes());
    } else if v < 1 << 30 {
        out.extend_from_slice(&(v as u32 | 0x8000_0000).to_be_bytes());
    } else {
        out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes());
    }
}

/// A frame's type and payload length, and the bytes its header took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u64,
    pub len: u64,
    pub header_len: usize,
}

/// The frame header at the start of `b`, `None` while it is not all there.
pub fn header(b: &[u8]) -> Option<Header> {
    let (kind, n) = varint(b)?;
    let (len, m) = varint(&b[n..])?;
    Some(Header {
        kind,
        len,
        header_len: n + m,
    })
}

/// Appends a frame header.
pub fn put_header(out: &mut Vec<u8>, kind: u64, len: usize) {
    put_varint(out, kind);
    put_varint(out, len as u64);
}

/// Appends a frame whose payload is `payload`.
pub fn put_frame(out: &mut Vec<u8>, kind: u64, payload: &[u8]) {
    put_header(out, kind, payload.len());
    out.extend_from_slice(payload);
}

/// The settings a peer sent (what this server reads of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    pub max_field_section_size: Option<u64>,
    pub qpack_max_table_capacity: u64,
    pub qpack_blocked_streams: u64,
}

/// Why a SETTINGS payload is refused (H3_SETTINGS_ERROR or H3_FRAME_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsError {
    /// Truncated inside an identifier or value.
    Frame,
    /// A reserved HTTP/2 identifier, or one sent twice.
    Settings,
}

/// Parses a SETTINGS payload; unknown identifiers (GREASE among them) are ignored (§7.2.4).
pub fn settings(mut p: &[u8]) -> Result<Settings, SettingsError> {
    let mut s = Settings::default();
    let mut seen: Vec<u64> = Vec::new();
    while !p.is_empty() {
        let (id, n) = varint(p).ok_or(SettingsError::Frame)?;
        let (value, m) = varint(&p[n..]).ok_or(SettingsError::Frame)?;
        p = &p[n + m..];
        if setting::reserved_h2(id) || seen.contains(&id) {
            return Err(SettingsError::Settings);
        }
        if seen.len() < 64 {
            seen.push(id);
        }
        match id {
            setting::MAX_FIELD_SECTION_SIZE => s.max_field_section_size = Some(value),
            setting::QPACK_MAX_TABLE_CAPACITY => s.qpack_max_table_capacity = value,
            setting::QPACK_BLOCKED_STREAMS => s.qpack_blocked_streams = value,
            _ => {}
        }
    }
    Ok(s)
}

/// The opening of the server's control stream: its type, then SETTINGS announcing the
/// largest field section it takes and a GREASE setting (§7.2.4.1), the QPACK dynamic table
/// left at its default, 0 (static table only).
pub fn control_preamble(max_field_section_size: u64, out: &mut Vec<u8>) {
    put_varint(out, stream::CONTROL);
    let mut p = Vec::with_capacity(16);
    put_varint(&mut p, setting::MAX_FIELD_SECTION_SIZE);
    put_varint(&mut p, max_field_section_size);
    // A reserved identifier (0x1f * N + 0x21) a peer must ignore: keeps them honest.
    put_varint(&mut p, 0x1f * 7 + 0x21);
    put_varint(&mut p, 0);
    put_frame(out, kind::SETTINGS, &p);
}

/// A GOAWAY frame naming `id`, the first request stream that will not be processed.
pub fn goaway(id: u64, out: &mut Vec<u8>) {
    let mut p = Vec::with_capacity(8);
    put_varint(&mut p, id);
    put_frame(out, kind::GOAWAY, &p);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc_9000_appendix_a_1_samples() {
        for (hex, v) in [
            ("c2197c5eff14e88c", 151_288_809_941_952_652u64),
            ("9d7f3e7d", 494_878_333),
            ("7bbd", 15_293),
            ("25", 37),
            ("4025", 37),
        ] {
            let b: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(varint(&b), Some((v, b.len())), "{hex}");
        }
        assert_eq!(varint(&[0x40]), None, "truncated");
    }

    #[test]
    fn settings_refuse_h2_ids_and_repeats_and_skip_unknown() {
        let mut p = Vec::new();
        for (id, v) in [(0x06u64, 4096u64), (0x21, 1), (0x01, 0)] {
            put_varint(&mut p, id);
            put_varint(&mut p, v);
        }
        let s = settings(&p).unwrap();
        assert_eq!(s.max_field_section_size, Some(4096));
        let mut bad = p.clone();
        put_varint(&mut bad, 0x06);
        put_varint(&mut bad, 1);
        assert_eq!(settings(&bad), Err(SettingsError::Settings));
        let mut h2 = Vec::new();
        put_varint(&mut h2, 0x03);
        put_varint(&mut h2, 100);
        assert_eq!(settings(&h2), Err(SettingsError::Settings));
        assert_eq!(settings(&p[..p.len() - 1]), Err(SettingsError::Frame));
    }

    proptest! {
        #[test]
        fn varints_round_trip(v in 0u64..=VARINT_MAX) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            prop_assert_eq!(varint(&b), Some((v, b.len())));
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = header(&b);
            let _ = settings(&b);
        }
    }
}
