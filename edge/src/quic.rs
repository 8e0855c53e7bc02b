//! What a QUIC datagram carries, read from its long headers alone (RFC 9000 §17.2): which packet
//! types are coalesced in it and how many bytes of 0-RTT. quinn-proto decrypts and routes; the
//! engine reads this beside it for what quinn does not report on a server: whether a client
//! tried 0-RTT (and so whether it was rejected), when its address is validated (its first
//! Handshake packet, §8.1), and how many 0-RTT bytes a core holds for handshakes in flight.
//!
//! Only the invariant header fields are read (§17.2: version, connection IDs, and for v1 the
//! token and Length fields); nothing is decrypted. A datagram that is not a well-formed
//! sequence of long-header packets is read as far as it is, never past its end.

/// Long-header packet types of QUIC v1 (RFC 9000 §17.2, Table 5).
const INITIAL: u8 = 0;
const ZERO_RTT: u8 = 1;
const HANDSHAKE: u8 = 2;

/// QUIC version 1.
const V1: u32 = 1;

/// The long-header packets found in one datagram.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Packets {
    pub initial: bool,
    pub handshake: bool,
    /// Bytes of 0-RTT packets (headers included); 0 when there are none.
    pub zero_rtt: usize,
}

impl Packets {
    /// Only 0-RTT packets: nothing the handshake needs.
    pub fn only_zero_rtt(&self) -> bool {
        self.zero_rtt > 0 && !self.initial && !self.handshake
    }
}

/// Reads the coalesced long-header packets of QUIC v1 at the start of `datagram` (a short
/// header packet, which can only be last, ends the walk, as does anything malformed or of
/// another version).
pub fn packets(datagram: &[u8]) -> Packets {
    let mut found = Packets::default();
    let mut rest = datagram;
    while let Some((&first, _)) = rest.split_first() {
        // Short header, or the fixed bit clear (not QUIC v1): nothing more to read.
        if first & 0xc0 != 0xc0 {
            break;
        }
        let Some((kind, len)) = long_packet(rest) else {
            break;
        };
        match kind {
            INITIAL => found.initial = true,
            ZERO_RTT => found.zero_rtt += len,
            HANDSHAKE => found.handshake = true,
            // Retry: a server's, with no Length; nothing follows it.
            _ => break,
        }
        rest = &rest[len..];
    }
    found
}

/// The type and whole length of the long-header packet at the start of `b`, if it is a
/// well-formed QUIC v1 one that fits in `b`.
fn long_packet(b: &[u8]) -> Option<(u8, usize)> {
    let mut c = Cursor { b, at: 0 };
    let first = c.byte()?;
    let version = u32::from_be_bytes(c.take(4)?.try_into().ok()?);
    if version != V1 {
        return None;
    }
    let kind = (first >> 4) & 0x3;
    let dcid = usize::from(c.byte()?);
    let scid = c.take(dcid).and_then(|_| c.byte()).map(usize::from)?;
    if dcid > 20 || scid > 20 {
        return None;
    }
    c.take(scid)?;
    match kind {
        INITIAL => {
            let token = c.varint()?;
            c.take(usize::try_from(token).ok()?)?;
        }
        ZERO_RTT | HANDSHAKE => {}
        _ => return None,
    }
    let length = usize::try_from(c.varint()?).ok()?;
    c.take(length)?;
    Some((kind, c.at))
}

/// A read position in a packet.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }

    /// A variable-length integer (RFC 9000 §16).
    fn varint(&mut self) -> Option<u64> {
        let first = self.byte()?;
        let len = 1usize << (first >> 6);
        let mut v = u64::from(first & 0x3f);
        for &x in self.take(len - 1)? {
            v = (v << 8) | u64::from(x);
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn varint(v: u64) -> Vec<u8> {
        match v {
            0..=63 => vec![v as u8],
            64..=16_383 => ((v as u16) | 0x4000).to_be_bytes().to_vec(),
            _ => ((v as u32) | 0x8000_0000).to_be_bytes().to_vec(),
        }
    }

    /// A long-header v1 packet of `kind` with a payload of `payload` bytes.
    fn packet(kind: u8, token: &[u8], payload: usize) -> Vec<u8> {
        let mut p = vec![0xc0 | (kind << 4), 0, 0, 0, 1, 8];
        p.extend([7u8; 8]);
        p.push(8);
        p.extend([9u8; 8]);
        if kind == INITIAL {
            p.extend(varint(token.len() as u64));
            p.extend(token);
        }
        p.extend(varint(payload as u64));
        p.extend(std::iter::repeat_n(0xaa, payload));
        p
    }

    #[test]
    fn coalesced_initial_and_zero_rtt() {
        let zero = packet(ZERO_RTT, &[], 300);
        let mut d = packet(INITIAL, b"token", 900);
        d.extend(&zero);
        let p = packets(&d);
        assert_eq!(
            p,
            Packets {
                initial: true,
                handshake: false,
                zero_rtt: zero.len()
            }
        );
        assert!(!p.only_zero_rtt());
        let two = [zero.clone(), zero.clone()].concat();
        assert!(packets(&two).only_zero_rtt());
        assert_eq!(packets(&two).zero_rtt, 2 * zero.len());
    }

    #[test]
    fn a_handshake_packet_then_a_short_header() {
        let mut d = packet(HANDSHAKE, &[], 50);
        d.extend([0x40, 1, 2, 3, 4, 5]);
        assert_eq!(
            packets(&d),
            Packets {
                handshake: true,
                ..Packets::default()
            }
        );
    }

    #[test]
    fn short_headers_other_versions_and_truncations_read_as_nothing() {
        assert_eq!(packets(&[]), Packets::default());
        assert_eq!(packets(&[0x41, 0, 0]), Packets::default());
        let mut v2 = packet(ZERO_RTT, &[], 20);
        v2[4] = 2;
        assert_eq!(packets(&v2), Packets::default());
        let whole = packet(ZERO_RTT, &[], 20);
        for cut in 0..whole.len() {
            assert_eq!(packets(&whole[..cut]), Packets::default(), "cut at {cut}");
        }
        // A packet that fits is counted; the truncated one after it is not.
        let mut d = whole.clone();
        d.extend(&whole[..10]);
        assert_eq!(packets(&d).zero_rtt, whole.len());
    }

    proptest! {
        #[test]
        fn garbage_never_panics_and_never_reads_past_the_end(b in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let p = packets(&b);
            prop_assert!(p.zero_rtt <= b.len());
        }

        #[test]
        fn built_datagrams_read_back(kinds in proptest::collection::vec(0u8..3, 1..5), sizes in proptest::collection::vec(0usize..2000, 5), token in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut d = Vec::new();
            let mut want = Packets::default();
            for (k, n) in kinds.iter().zip(&sizes) {
                let p = packet(*k, &token, *n);
                match *k {
                    INITIAL => want.initial = true,
                    ZERO_RTT => want.zero_rtt += p.len(),
                    _ => want.handshake = true,
                }
                d.extend(p);
            }
            prop_assert_eq!(packets(&d), want);
        }
    }
}
