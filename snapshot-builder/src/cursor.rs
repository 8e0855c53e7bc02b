//! A forward-only reader over untrusted bytes: every read is bounds-checked and returns `None`
//! rather than panicking (STYLE rule 7). The hot path (entry parsing on lookup) uses it too, so
//! it is all `#[inline]` and allocation-free.

/// Reads little-endian fields off the front of a byte slice.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    #[inline]
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { rest: bytes }
    }

    /// The next `n` bytes, or `None` when fewer remain.
    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|b| b.try_into().ok())
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let (&first, tail) = self.rest.split_first()?;
        self.rest = tail;
        Some(first)
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    #[inline]
    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }

    /// An unsigned LEB128 of at most three bytes (values below 2^21), the URL length.
    /// Longer or unterminated encodings are `None`.
    #[inline]
    pub(crate) fn varint21(&mut self) -> Option<usize> {
        let mut value = 0usize;
        for shift in [0u32, 7, 14] {
            let byte = self.u8()?;
            value |= usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// Everything not read yet.
    #[inline]
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

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

    #[test]
    fn fields_in_order() {
        let mut bytes = vec![7u8];
        bytes.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&(-5i64).to_le_bytes());
        bytes.push(1);
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u8(), Some(7));
        assert_eq!(c.u32(), Some(0xdead_beef));
        assert_eq!(c.u64(), Some(u64::MAX));
        assert_eq!(c.i64(), Some(-5));
        assert_eq!(c.rest(), &[1]);
        assert_eq!(c.u32(), None, "short reads fail");
        assert_eq!(c.take(2), None);
        assert_eq!(c.take(1), Some(&[1u8][..]));
        assert_eq!(c.u8(), None);
    }

    #[test]
    fn varint_round_trip_and_limits() {
        for v in [0usize, 1, 127, 128, 300, 16_383, 16_384, (1 << 21) - 1] {
            let mut buf = [0u8; 3];
            let n = put_varint21(v, &mut buf);
            let mut c = Cursor::new(&buf[..n]);
            assert_eq!(c.varint21(), Some(v), "{v}");
            assert!(c.rest().is_empty());
        }
        assert_eq!(Cursor::new(&[0x80, 0x80, 0x80, 0x01]).varint21(), None);
        assert_eq!(Cursor::new(&[0x80]).varint21(), None);
    }
}
