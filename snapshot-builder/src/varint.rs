//! The snapshot writer's varint: URL lengths as LEB128 of at most three bytes (values below
//! 2^21), into a fixed buffer. The reader reads them with core's one cursor
//! ([`lasthop_core::cursor::Cursor::varint`], at most three bytes, shortest form).

/// Appends `value` (< 2^21) as LEB128; returns the number of bytes written into `out`.
#[inline]
pub(crate) fn put_varint21(value: usize, out: &mut [u8; 3]) -> usize {
    debug_assert!(value < 1 << 21);
    let mut v = value;
    let mut n = 0;
    for slot in out.iter_mut() {
        let low = (v & 0x7f) as u8;
        v >>= 7;
        n += 1;
        if v == 0 {
            *slot = low;
            return n;
        }
        *slot = low | 0x80;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::cursor::{Cursor, VarintError};

    #[test]
    fn varint_round_trip_and_limits() {
        for v in [0usize, 1, 127, 128, 300, 16_383, 16_384, (1 << 21) - 1] {
            let mut buf = [0u8; 3];
            let n = put_varint21(v, &mut buf);
            let mut c = Cursor::new(&buf[..n]);
            assert_eq!(c.varint(3), Ok(v as u64), "{v}");
            assert!(c.rest().is_empty());
        }
        let too_long = Cursor::new(&[0x80, 0x80, 0x80, 0x01]).varint(3);
        assert_eq!(too_long, Err(VarintError::TooLong));
        assert_eq!(Cursor::new(&[0x80]).varint(3), Err(VarintError::Truncated));
    }
}
