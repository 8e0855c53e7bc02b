//! The base62 alphabet of codes: `0-9A-Za-z`, in ASCII order so that codes of one length sort
//! like the integers they spell.

/// The 62 numerals, index = value.
pub const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

const INVALID: u8 = 0xff;

/// Byte → numeral value, `INVALID` for bytes outside the alphabet.
static DECODE: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut i = 0;
    while i < 62 {
        t[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Writes `value` as exactly `out.len()` numerals, most significant first. Returns `false` (and
/// leaves `out` unspecified) when the value does not fit.
#[inline]
pub fn encode_into(mut value: u64, out: &mut [u8]) -> bool {
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(value % 62) as usize];
        value /= 62;
    }
    value == 0
}

/// Reads a numeral string; `None` if any byte is outside the alphabet or the value overflows.
#[inline]
pub fn decode(s: &[u8]) -> Option<u64> {
    let mut acc: u64 = 0;
    for &byte in s {
        let digit = DECODE[byte as usize];
        if digit == INVALID {
            return None;
        }
        acc = acc.checked_mul(62)?.checked_add(u64::from(digit))?;
    }
    Some(acc)
}

/// True when every byte is a base62 numeral.
#[inline]
pub fn is_base62(s: &[u8]) -> bool {
    s.iter().all(|&b| DECODE[b as usize] != INVALID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        let mut out = [0u8; 7];
        assert!(encode_into(0, &mut out));
        assert_eq!(&out, b"0000000");
        assert!(encode_into(61, &mut out));
        assert_eq!(&out, b"000000z");
        assert!(encode_into(62u64.pow(7) - 1, &mut out));
        assert_eq!(&out, b"zzzzzzz");
        assert!(!encode_into(62u64.pow(7), &mut out));
        assert_eq!(decode(b"zzzzzzz"), Some(62u64.pow(7) - 1));
        assert_eq!(decode(b"00000-0"), None);
        assert_eq!(decode("0000é".as_bytes()), None);
        assert_eq!(decode(b"zzzzzzzzzzzzzzzzzzzzzz"), None, "overflow is None");
    }

    proptest::proptest! {
        #[test]
        fn round_trip(v in 0u64..3_521_614_606_208) {
            let mut out = [0u8; 7];
            proptest::prop_assert!(encode_into(v, &mut out));
            proptest::prop_assert_eq!(decode(&out), Some(v));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..16)) {
            let _ = decode(&bytes);
        }
    }
}
