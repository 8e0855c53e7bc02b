//! The byte cursor the sketch and rollup decoders read untrusted bytes with.
//!
//! Every read is bounds-checked and returns [`SketchError::Truncated`] instead of indexing, so a
//! decoder built on it cannot panic however the bytes are mangled (docs/ARCHITECTURE.md, "Code").

use crate::SketchError;

/// A read position in a byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], SketchError> {
        if self.buf.len() < n {
            return Err(SketchError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], SketchError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, SketchError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, SketchError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, SketchError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// An unsigned LEB128 integer, at most 10 bytes, in its shortest form (one encoding per
    /// value, so a decoded rollup re-encodes to the same bytes).
    pub(crate) fn varint(&mut self) -> Result<u64, SketchError> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.u8()?;
            if i == 9 && byte > 1 {
                return Err(SketchError::Malformed("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if byte == 0 && i > 0 {
                    return Err(SketchError::Malformed("varint not in shortest form"));
                }
                return Ok(value);
            }
        }
        Err(SketchError::Malformed("varint longer than 10 bytes"))
    }

    /// How many bytes are left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Refuses trailing bytes: an encoding has exactly one length.
    pub(crate) fn finish(&self) -> Result<(), SketchError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(SketchError::Malformed("trailing bytes"))
        }
    }
}

/// Appends `v` as unsigned LEB128 (what [`Reader::varint`] reads).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let mut r = Reader::new(&[1, 3, 0, 0, 0, 9]);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(r.remaining(), 1);
        assert_eq!(r.finish(), Err(SketchError::Malformed("trailing bytes")));
        assert_eq!(r.u32(), Err(SketchError::Truncated));
        assert_eq!(r.u8().unwrap(), 9);
        assert!(r.finish().is_ok());
    }

    #[test]
    fn varint_edges() {
        for (v, len) in [(0u64, 1usize), (127, 1), (128, 2), (u64::MAX, 10)] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), len);
        }
        assert!(Reader::new(&[0x80, 0x00]).varint().is_err());
        assert!(Reader::new(&[0xff; 10]).varint().is_err());
        assert_eq!(Reader::new(&[0x80]).varint(), Err(SketchError::Truncated));
    }

    proptest! {
        #[test]
        fn varints_round_trip(v in any::<u64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out);
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn varint_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            let mut r = Reader::new(&bytes);
            if let Ok(v) = r.varint() {
                let mut again = Vec::new();
                put_varint(&mut again, v);
                prop_assert_eq!(&again[..], &bytes[..bytes.len() - r.remaining()]);
            }
        }
    }
}
