//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B), decoded four bits at a time.
//!
//! Ours rather than a crate's: loona-hpack (our first decoder) builds a hash map of the whole
//! code for every string it decodes, which took ~80 % of the engine's CPU under
//! `h2load -m 10` (perf, `HuffmanDecoder::new` and its hashing). Here the code's tree is turned
//! once, at first use, into a table of (state, nibble) → (next state, symbol) transitions, the
//! approach of nghttp2's and the `h2` crate's decoders: two lookups a byte, no allocation but
//! the output.

use std::sync::OnceLock;

/// (code, bit length) of each symbol 0..=255 and EOS (256), as Appendix B lists them.
#[rustfmt::skip]
pub const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// A transition: the next state, the symbol emitted on the way (if any), and flags.
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    next: u8,
    sym: u8,
    flags: u8,
}

/// A symbol was completed on this nibble.
const EMIT: u8 = 1;
/// The nibble walked into EOS or off the code: not a valid string.
const FAIL: u8 = 2;
/// The state reached is a valid end: at most 7 bits, all ones, past the last symbol.
const ACCEPT: u8 = 4;

struct Table {
    steps: Vec<[Step; 16]>,
}

/// The tree: node 0 is the root; `children[n] = [zero, one]`, each a node index or, with the
/// high bit set, a symbol.
fn tree() -> Vec<[u16; 2]> {
    const LEAF: u16 = 0x8000;
    let mut nodes: Vec<[u16; 2]> = vec![[0, 0]];
    for (sym, &(code, len)) in CODES.iter().enumerate() {
        let mut at = 0usize;
        for i in (0..len).rev() {
            let bit = ((code >> i) & 1) as usize;
            if i == 0 {
                nodes[at][bit] = LEAF | sym as u16;
            } else {
                if nodes[at][bit] == 0 {
                    nodes.push([0, 0]);
                    let n = (nodes.len() - 1) as u16;
                    nodes[at][bit] = n;
                }
                at = usize::from(nodes[at][bit]);
            }
        }
    }
    nodes
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let nodes = tree();
        // A node is an accepting end when it is reached from the root by ones only, at most
        // seven of them (the padding is a prefix of EOS, §5.2).
        let mut accepting = vec![false; nodes.len()];
        let mut at = 0usize;
        accepting[0] = true;
        for _ in 0..7 {
            let next = nodes[at][1];
            if next & 0x8000 != 0 {
                break;
            }
            at = usize::from(next);
            accepting[at] = true;
        }
        let mut steps = vec![[Step::default(); 16]; nodes.len()];
        for (state, row) in steps.iter_mut().enumerate() {
            for (nibble, step) in row.iter_mut().enumerate() {
                let mut at = state;
                let mut out = Step::default();
                for i in (0..4).rev() {
                    let bit = (nibble >> i) & 1;
                    let child = nodes[at][bit];
                    if child & 0x8000 != 0 {
                        let sym = child & 0x7fff;
                        if sym == 256 || out.flags & EMIT != 0 {
                            out.flags = FAIL;
                            break;
                        }
                        out.sym = sym as u8;
                        out.flags |= EMIT;
                        at = 0;
                    } else if child == 0 {
                        out.flags = FAIL;
                        break;
                    } else {
                        at = usize::from(child);
                    }
                }
                if out.flags & FAIL == 0 {
                    out.next = at as u8;
                    if accepting[at] {
                        out.flags |= ACCEPT;
                    }
                }
                *step = out;
            }
        }
        Table { steps }
    })
}

/// Why bytes are not a Huffman-coded string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HuffmanError;

/// Appends the decoding of `src` to `out`.
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let t = table();
    let mut state = 0usize;
    // The empty string is a valid end.
    let mut accept = true;
    out.reserve(src.len() * 8 / 5 + 1);
    for &b in src {
        for nibble in [b >> 4, b & 0x0f] {
            let step = t.steps[state][usize::from(nibble)];
            if step.flags & FAIL != 0 {
                return Err(HuffmanError);
            }
            if step.flags & EMIT != 0 {
                out.push(step.sym);
            }
            state = usize::from(step.next);
            accept = step.flags & ACCEPT != 0;
        }
    }
    if accept {
        Ok(())
    } else {
        Err(HuffmanError)
    }
}

/// The Huffman coding of `src` (tests and the encoder's choice).
pub fn encode(src: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &b in src {
        let (code, len) = CODES[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        // Padding: the most significant bits of EOS (all ones).
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7541_c4_examples_decode() {
        // C.4.1: "www.example.com".
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut out = Vec::new();
        decode(&www, &mut out).unwrap();
        assert_eq!(out, b"www.example.com");
        // C.4.2: "no-cache".
        out.clear();
        decode(&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf], &mut out).unwrap();
        assert_eq!(out, b"no-cache");
        let mut enc = Vec::new();
        encode(b"www.example.com", &mut enc);
        assert_eq!(enc, www);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // Padding of zeros.
        assert_eq!(decode(&[0x00], &mut out), Err(HuffmanError));
        // Eight ones of padding (more than seven).
        assert_eq!(decode(&[0xff], &mut out), Err(HuffmanError));
        // EOS itself, 30 ones.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xfc], &mut out),
            Err(HuffmanError)
        );
        assert_eq!(decode(&[], &mut out), Ok(()));
    }

    proptest::proptest! {
        #[test]
        fn every_string_round_trips(s in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut enc = Vec::new();
            encode(&s, &mut enc);
            let mut out = Vec::new();
            decode(&enc, &mut out).unwrap();
            proptest::prop_assert_eq!(out, s);
        }

        #[test]
        fn garbage_never_panics(s in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut out = Vec::new();
            let _ = decode(&s, &mut out);
        }
    }
}
