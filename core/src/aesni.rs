//! AES-128 single-block encryption with the AES-NI instructions inlined, for FF1's fast path.
//!
//! The `aes` crate computes the same function, but every `encrypt_block` call goes through its
//! runtime CPU dispatch and a backend closure that reloads the round keys, and a code decode is
//! ten such calls in a dependent chain: that call overhead was ~30% of a decode (`perf` on the
//! request bench). Here the eleven round keys stay in registers across the ten rounds and each
//! block is ten `aesenc` instructions. Compiled only where the build enables AES-NI and SSE4.1
//! (`.cargo/config.toml` does for x86-64); elsewhere FF1 uses the crate. The tests check this
//! against the `aes` crate on random keys and blocks, and FF1's NIST samples run through it.
//!
//! The functions carry `#[target_feature]`; Rust still asks for `unsafe` at the call from code
//! without the attribute even though the whole build enables the features. The two call sites
//! (`Ff1::new`, `Ff1Domain::round_fast`) are compiled only under the same `cfg`, so the
//! instructions are ones this binary already requires of its CPU.

use core::arch::x86_64::{
    __m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_aeskeygenassist_si128, _mm_cvtsi128_si64,
    _mm_extract_epi64, _mm_set_epi64x, _mm_shuffle_epi32, _mm_slli_si128, _mm_xor_si128,
};

/// An expanded AES-128 key.
#[derive(Clone, Copy)]
pub(crate) struct Aes128Ni {
    round_keys: [__m128i; 11],
}

/// One step of the AES-128 key schedule (FIPS 197 §5.2) in its AES-NI form.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn next_round_key<const RCON: i32>(key: __m128i) -> __m128i {
    let word = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<RCON>(key));
    let mut k = key;
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    _mm_xor_si128(k, word)
}

/// The 16 bytes of a block, first byte first, as the register AES-NI reads them.
#[inline]
#[target_feature(enable = "sse4.1")]
fn load(bytes_be: u128) -> __m128i {
    let first = (bytes_be >> 64) as u64;
    let second = bytes_be as u64;
    // The low lane holds bytes 0..8 in memory order, i.e. little-endian.
    _mm_set_epi64x(second.swap_bytes() as i64, first.swap_bytes() as i64)
}

#[inline]
#[target_feature(enable = "sse4.1")]
fn store(block: __m128i) -> u128 {
    let first = (_mm_cvtsi128_si64(block) as u64).swap_bytes();
    let second = (_mm_extract_epi64::<1>(block) as u64).swap_bytes();
    (u128::from(first) << 64) | u128::from(second)
}

impl Aes128Ni {
    #[target_feature(enable = "aes,sse4.1")]
    pub(crate) fn new(key: &[u8; 16]) -> Aes128Ni {
        let k0 = load(u128::from_be_bytes(*key));
        let k1 = next_round_key::<0x01>(k0);
        let k2 = next_round_key::<0x02>(k1);
        let k3 = next_round_key::<0x04>(k2);
        let k4 = next_round_key::<0x08>(k3);
        let k5 = next_round_key::<0x10>(k4);
        let k6 = next_round_key::<0x20>(k5);
        let k7 = next_round_key::<0x40>(k6);
        let k8 = next_round_key::<0x80>(k7);
        let k9 = next_round_key::<0x1b>(k8);
        let k10 = next_round_key::<0x36>(k9);
        Aes128Ni {
            round_keys: [k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10],
        }
    }

    /// Encrypts one block given as the big-endian integer of its 16 bytes.
    #[inline]
    #[target_feature(enable = "aes,sse4.1")]
    pub(crate) fn encrypt_be(&self, block: u128) -> u128 {
        let rk = &self.round_keys;
        let mut b = _mm_xor_si128(load(block), rk[0]);
        for k in &rk[1..10] {
            b = _mm_aesenc_si128(b, *k);
        }
        store(_mm_aesenclast_si128(b, rk[10]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
    use proptest::prelude::*;

    #[allow(unsafe_code)]
    fn encrypt(key: &[u8; 16], block: u128) -> u128 {
        // SAFETY: this module only exists where the build enables aes and sse4.1.
        unsafe { Aes128Ni::new(key).encrypt_be(block) }
    }

    #[test]
    fn fips_197_appendix_c1() {
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let plain = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff_u128;
        let want = 0x69c4_e0d8_6a7b_0430_d8cd_b780_70b4_c55a_u128;
        assert_eq!(encrypt(&key, plain), want);
    }

    proptest! {
        #[test]
        fn matches_the_aes_crate(key in any::<[u8; 16]>(), block in any::<[u8; 16]>()) {
            let mut want = GenericArray::clone_from_slice(&block);
            aes::Aes128::new(GenericArray::from_slice(&key)).encrypt_block(&mut want);
            let got = encrypt(&key, u128::from_be_bytes(block));
            prop_assert_eq!(got.to_be_bytes(), <[u8; 16]>::from(want));
        }
    }
}
