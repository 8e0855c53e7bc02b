//! The sketch and rollup decoders read untrusted bytes with core's one cursor
//! ([`lasthop_core::cursor`]): every read is bounds-checked and returns an error instead of
//! indexing, so a decoder built on it cannot panic however the bytes are mangled
//! (docs/ARCHITECTURE.md, "Code"). This module maps its errors into [`SketchError`].

use lasthop_core::cursor::{Truncated, VarintError};

use crate::SketchError;

pub(crate) use lasthop_core::cursor::{put_varint, Cursor as Reader};

/// Longest varint the sketches write (any u64).
pub(crate) const VARINT: u32 = 10;

impl From<Truncated> for SketchError {
    fn from(_: Truncated) -> Self {
        SketchError::Truncated
    }
}

impl From<VarintError> for SketchError {
    fn from(e: VarintError) -> Self {
        match e {
            VarintError::Truncated => SketchError::Truncated,
            VarintError::NotShortest => SketchError::Malformed("varint not in shortest form"),
            _ => SketchError::Malformed("varint longer than 10 bytes"),
        }
    }
}

/// Refuses trailing bytes: an encoding has exactly one length.
pub(crate) fn finish(r: &Reader<'_>) -> Result<(), SketchError> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(SketchError::Malformed("trailing bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn errors_map_into_sketch_errors() {
        let mut r = Reader::new(&[1, 3, 0, 0, 0, 9]);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(finish(&r), Err(SketchError::Malformed("trailing bytes")));
        assert_eq!(
            r.u32().map_err(SketchError::from),
            Err(SketchError::Truncated)
        );
        assert_eq!(r.u8().unwrap(), 9);
        assert!(finish(&r).is_ok());
        let varint = |b: &[u8]| Reader::new(b).varint(VARINT).map_err(SketchError::from);
        assert!(varint(&[0x80, 0x00]).is_err());
        assert!(varint(&[0xff; 10]).is_err());
        assert_eq!(varint(&[0x80]), Err(SketchError::Truncated));
    }

    proptest! {
        #[test]
        fn varint_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            let mut r = Reader::new(&bytes);
            if let Ok(v) = r.varint(VARINT) {
                let mut again = Vec::new();
                put_varint(&mut again, v);
                prop_assert_eq!(&again[..], &bytes[..bytes.len() - r.remaining()]);
            }
        }
    }
}
