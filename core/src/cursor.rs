//! The one forward-only reader every codec of untrusted bytes uses (click events and spool
//! frames here, the snapshot reader, the analytics sketches): every read is bounds-checked and
//! returns an error instead of indexing, so a decoder built on it cannot panic however the bytes
//! are mangled (docs/ARCHITECTURE.md, "Code"). Each codec turns [`Truncated`] into its own error
//! type with a `From` impl. The snapshot lookup runs it on the request path, so it is all
//! `#[inline]` and allocation-free; an error is a unit, so a `Result` costs what an `Option`
//! does.

/// Fewer bytes remain than a read needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("input ends early")]
pub struct Truncated;

/// Why a LEB128 integer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VarintError {
    #[error("input ends early")]
    Truncated,
    /// Still continued after the most bytes allowed, or past 64 bits.
    #[error("varint too long")]
    TooLong,
    /// A trailing zero byte: not the one encoding of its value.
    #[error("varint not in shortest form")]
    NotShortest,
}

impl From<Truncated> for VarintError {
    fn from(_: Truncated) -> Self {
        VarintError::Truncated
    }
}

/// Reads fields off the front of a byte slice (fixed-width integers little-endian).
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    #[inline]
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { rest: bytes }
    }

    /// The next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if n > self.rest.len() {
            return Err(Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let head = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(head);
        Ok(a)
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        let (&first, tail) = self.rest.split_first().ok_or(Truncated)?;
        self.rest = tail;
        Ok(first)
    }

    #[inline]
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.array().map(u16::from_le_bytes)
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.array().map(u64::from_le_bytes)
    }

    #[inline]
    pub fn i64(&mut self) -> Result<i64, Truncated> {
        self.array().map(i64::from_le_bytes)
    }

    /// An unsigned LEB128 integer of at most `max_bytes` bytes (at most 10), in its shortest
    /// form, so every value has one encoding.
    #[inline]
    pub fn varint(&mut self, max_bytes: u32) -> Result<u64, VarintError> {
        let mut value = 0u64;
        for i in 0..max_bytes.min(10) {
            let byte = self.u8()?;
            if i == 9 && byte > 1 {
                return Err(VarintError::TooLong);
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if byte == 0 && i > 0 {
                    return Err(VarintError::NotShortest);
                }
                return Ok(value);
            }
        }
        Err(VarintError::TooLong)
    }

    /// Everything not read yet.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// How many bytes are left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Nothing is left.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// Appends `v` as unsigned LEB128, shortest form (what [`Cursor::varint`] reads).
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_in_order() {
        let mut bytes = vec![7u8];
        bytes.extend_from_slice(&0xbeefu16.to_le_bytes());
        bytes.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&(-5i64).to_le_bytes());
        bytes.push(1);
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u8(), Ok(7));
        assert_eq!(c.u16(), Ok(0xbeef));
        assert_eq!(c.u32(), Ok(0xdead_beef));
        assert_eq!(c.u64(), Ok(u64::MAX));
        assert_eq!(c.i64(), Ok(-5));
        assert_eq!(c.rest(), &[1]);
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.u32(), Err(Truncated), "short reads fail");
        assert_eq!(c.take(2), Err(Truncated));
        assert_eq!(c.take(1), Ok(&[1u8][..]));
        assert_eq!(c.u8(), Err(Truncated));
        assert!(c.is_empty());
    }

    #[test]
    fn varints_round_trip_in_shortest_form_only() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            (1 << 21) - 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut c = Cursor::new(&out);
            assert_eq!(c.varint(10), Ok(v), "{v}");
            assert!(c.is_empty());
        }
        assert_eq!(
            Cursor::new(&[0x80, 0x80, 0x80, 0x01]).varint(3),
            Err(VarintError::TooLong)
        );
        assert_eq!(Cursor::new(&[0x80]).varint(3), Err(VarintError::Truncated));
        assert_eq!(
            Cursor::new(&[0x81, 0x00]).varint(3),
            Err(VarintError::NotShortest)
        );
        let mut eleven = vec![0xff; 9];
        eleven.push(0x02);
        assert_eq!(Cursor::new(&eleven).varint(10), Err(VarintError::TooLong));
    }

    proptest::proptest! {
        /// Whatever the bytes, reads never panic and never hand out more than there is.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                        ops in proptest::collection::vec(0u8..8, 0..32)) {
            let mut c = Cursor::new(&bytes);
            for op in ops {
                let before = c.remaining();
                let _ = match op {
                    0 => c.u8().map(u64::from).map_err(VarintError::from),
                    1 => c.u16().map(u64::from).map_err(VarintError::from),
                    2 => c.u32().map(u64::from).map_err(VarintError::from),
                    3 => c.u64().map_err(VarintError::from),
                    4 => c.varint(3),
                    5 => c.varint(10),
                    6 => c.take(5).map(|b| b.len() as u64).map_err(VarintError::from),
                    _ => c.i64().map(|v| v as u64).map_err(VarintError::from),
                };
                proptest::prop_assert!(c.remaining() <= before);
            }
        }
    }
}
