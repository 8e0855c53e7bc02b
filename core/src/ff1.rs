//! FF1 (NIST SP 800-38G, Algorithm 7 and 8) over integers.
//!
//! A numeral string `X` of length `n` in radix `r` is the integer `NUM_r(X)`, so FF1 can be run
//! on integers directly: `A = x / r^v`, `B = x mod r^v`. Every quantity the algorithm needs fits
//! in a `u128` as long as `r^n < 2^120`, which covers our domain (62^7 ≈ 2^41.7) and the NIST
//! samples (36^19 ≈ 2^96.8). No bignum.
//!
//! [`Ff1Domain`] fixes radix, length and tweak, and precomputes the CBC-MAC state after the
//! constant block `P`, so each Feistel round of the hot path costs one AES block for an empty
//! tweak.

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use strength_reduce::StrengthReducedU64;

/// Rounds in FF1.
const ROUNDS: u8 = 10;
/// Longest tweak we accept; keeps `Q` on the stack.
pub const MAX_TWEAK_LEN: usize = 64;
/// `r^n` must stay below this so `A + (y mod r^m)` cannot overflow a `u128`.
const MAX_DOMAIN: u128 = 1 << 120;

/// Why an FF1 instance could not be built or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Ff1Error {
    #[error("AES key must be 16, 24 or 32 bytes, got {len}")]
    KeyLength { len: usize },
    #[error("radix {radix} is outside 2..=65536")]
    Radix { radix: u32 },
    #[error(
        "length {len} is invalid for radix {radix} (need 2 <= n, radix^n >= 100, radix^n < 2^120)"
    )]
    Length { radix: u32, len: u32 },
    #[error("tweak of {len} bytes is longer than {MAX_TWEAK_LEN}")]
    Tweak { len: usize },
    #[error("value {value} is outside the domain 0..{domain}")]
    OutOfDomain { value: u128, domain: u128 },
    #[error("numeral {numeral} is not below the radix {radix}")]
    Numeral { numeral: u16, radix: u32 },
}

#[derive(Clone)]
enum Cipher {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
}

impl Cipher {
    #[inline]
    fn encrypt(&self, block: &mut [u8; 16]) {
        let b = GenericArray::from_mut_slice(block);
        match self {
            Cipher::Aes128(c) => c.encrypt_block(b),
            Cipher::Aes192(c) => c.encrypt_block(b),
            Cipher::Aes256(c) => c.encrypt_block(b),
        }
    }
}

/// An FF1 key: AES-128, -192 or -256.
#[derive(Clone)]
pub struct Ff1 {
    cipher: Cipher,
    /// The same AES-128 key for the fast path's inlined AES-NI rounds (see `aesni.rs`).
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "aes",
        target_feature = "sse4.1"
    ))]
    ni: Option<crate::aesni::Aes128Ni>,
}

impl std::fmt::Debug for Ff1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str("Ff1 { .. }")
    }
}

impl Ff1 {
    /// Builds FF1 under an AES key of 16, 24 or 32 bytes.
    pub fn new(key: &[u8]) -> Result<Self, Ff1Error> {
        let cipher = match key.len() {
            16 => Cipher::Aes128(aes::Aes128::new(GenericArray::from_slice(key))),
            24 => Cipher::Aes192(aes::Aes192::new(GenericArray::from_slice(key))),
            32 => Cipher::Aes256(aes::Aes256::new(GenericArray::from_slice(key))),
            len => return Err(Ff1Error::KeyLength { len }),
        };
        Ok(Ff1 {
            cipher,
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "aes",
                target_feature = "sse4.1"
            ))]
            ni: <&[u8; 16]>::try_from(key).ok().map(|k| {
                // SAFETY: compiled only where the build enables aes and sse4.1 (the `cfg`
                // above), so the whole binary already requires those instructions.
                #[allow(unsafe_code)]
                unsafe {
                    crate::aesni::Aes128Ni::new(k)
                }
            }),
        })
    }

    /// Fixes radix, length and tweak: the object the hot path keeps.
    pub fn domain(&self, radix: u32, len: u32, tweak: &[u8]) -> Result<Ff1Domain, Ff1Error> {
        Ff1Domain::new(self.clone(), radix, len, tweak)
    }

    /// Encrypts a numeral string (most significant numeral first).
    pub fn encrypt_numerals(
        &self,
        radix: u32,
        tweak: &[u8],
        x: &[u16],
    ) -> Result<Vec<u16>, Ff1Error> {
        let d = self.domain(radix, x.len() as u32, tweak)?;
        let v = d.encrypt(numerals_to_int(radix, x)?)?;
        Ok(int_to_numerals(radix, x.len(), v))
    }

    /// Decrypts a numeral string (most significant numeral first).
    pub fn decrypt_numerals(
        &self,
        radix: u32,
        tweak: &[u8],
        x: &[u16],
    ) -> Result<Vec<u16>, Ff1Error> {
        let d = self.domain(radix, x.len() as u32, tweak)?;
        let v = d.decrypt(numerals_to_int(radix, x)?)?;
        Ok(int_to_numerals(radix, x.len(), v))
    }
}

fn numerals_to_int(radix: u32, x: &[u16]) -> Result<u128, Ff1Error> {
    let mut acc: u128 = 0;
    for &numeral in x {
        if u32::from(numeral) >= radix {
            return Err(Ff1Error::Numeral { numeral, radix });
        }
        // Cannot overflow: the domain check in Ff1Domain::new bounds radix^len below 2^120,
        // and it runs before any caller sees a result.
        acc = acc
            .wrapping_mul(u128::from(radix))
            .wrapping_add(u128::from(numeral));
    }
    Ok(acc)
}

fn int_to_numerals(radix: u32, len: usize, mut v: u128) -> Vec<u16> {
    let mut out = vec![0u16; len];
    for slot in out.iter_mut().rev() {
        *slot = (v % u128::from(radix)) as u16;
        v /= u128::from(radix);
    }
    out
}

/// FF1 with radix, length and tweak fixed, acting on integers in `0..radix^len`.
#[derive(Clone)]
pub struct Ff1Domain {
    ff1: Ff1,
    u: u32,
    v: u32,
    /// Bytes of `NUM(B)` in `Q`.
    b: usize,
    /// Bytes of `S` taken as `y`.
    d: usize,
    radix_pow_u: u128,
    radix_pow_v: u128,
    domain: u128,
    /// CBC-MAC state after the constant block `P`, as bytes and as a big-endian integer.
    p_mac: [u8; 16],
    p_mac_be: u128,
    tweak: [u8; MAX_TWEAK_LEN],
    tweak_len: usize,
    /// Zero bytes between the tweak and the round number in `Q`.
    pad: usize,
    /// Set when the tweak is empty, `b <= 4` and the domain fits a `u64` (our 7-char codes):
    /// then `Q` is one block, `y` fits a `u64`, and the moduli are strength-reduced.
    fast: Option<FastPath>,
}

/// Precomputed divisors for the single-block, 64-bit path.
#[derive(Clone, Copy)]
struct FastPath {
    pow_u: StrengthReducedU64,
    pow_v: StrengthReducedU64,
}

impl std::fmt::Debug for Ff1Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ff1Domain")
            .field("u", &self.u)
            .field("v", &self.v)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

fn checked_pow(radix: u32, exp: u32) -> Option<u128> {
    u128::from(radix).checked_pow(exp)
}

impl Ff1Domain {
    fn new(ff1: Ff1, radix: u32, len: u32, tweak: &[u8]) -> Result<Self, Ff1Error> {
        if !(2..=65536).contains(&radix) {
            return Err(Ff1Error::Radix { radix });
        }
        let len_err = Ff1Error::Length { radix, len };
        let domain = checked_pow(radix, len).ok_or(len_err.clone())?;
        if len < 2 || !(100..MAX_DOMAIN).contains(&domain) {
            return Err(len_err);
        }
        if tweak.len() > MAX_TWEAK_LEN {
            return Err(Ff1Error::Tweak { len: tweak.len() });
        }
        let u = len / 2;
        let v = len - u;
        let radix_pow_u = checked_pow(radix, u).ok_or(len_err.clone())?;
        let radix_pow_v = checked_pow(radix, v).ok_or(len_err)?;
        // b = ceil(ceil(v * log2(radix)) / 8); ceil(log2(x)) is the bit length of x - 1.
        let bits = 128 - (radix_pow_v - 1).leading_zeros() as usize;
        let b = bits.div_ceil(8);
        let d = 4 * b.div_ceil(4) + 4;
        let t = tweak.len();
        let pad = (16 - ((t + b + 1) % 16)) % 16;

        let mut p = [0u8; 16];
        p[0] = 1;
        p[1] = 2;
        p[2] = 1;
        p[3..6].copy_from_slice(&radix.to_be_bytes()[1..4]);
        p[6] = 10;
        p[7] = (u % 256) as u8;
        p[8..12].copy_from_slice(&len.to_be_bytes());
        p[12..16].copy_from_slice(&(t as u32).to_be_bytes());
        ff1.cipher.encrypt(&mut p);

        let mut tw = [0u8; MAX_TWEAK_LEN];
        tw[..t].copy_from_slice(tweak);
        let fast = (t == 0 && b <= 4 && domain <= u128::from(u64::MAX)).then(|| FastPath {
            // Both powers are >= 2 (radix >= 2, u >= 1) and below 2^64 (domain check above).
            pow_u: StrengthReducedU64::new(radix_pow_u as u64),
            pow_v: StrengthReducedU64::new(radix_pow_v as u64),
        });
        Ok(Ff1Domain {
            fast,
            ff1,
            u,
            v,
            b,
            d,
            radix_pow_u,
            radix_pow_v,
            domain,
            p_mac: p,
            p_mac_be: u128::from_be_bytes(p),
            tweak: tw,
            tweak_len: t,
            pad,
        })
    }

    /// Size of the domain, `radix^len`.
    pub fn domain_size(&self) -> u128 {
        self.domain
    }

    /// `y mod radix^m` for round `i`, where `half` is the half that feeds the PRF.
    #[inline]
    fn round_value(&self, i: u8, half: u128, modulus: u128) -> u128 {
        // Q = T || 0^pad || [i] || [half]^b, a multiple of 16 bytes. CBC-MAC continues from P.
        let mut q = [0u8; MAX_TWEAK_LEN + 32];
        let t = self.tweak_len;
        q[..t].copy_from_slice(&self.tweak[..t]);
        let qlen = t + self.pad + 1 + self.b;
        q[t + self.pad] = i;
        let half_bytes = half.to_be_bytes();
        q[qlen - self.b..qlen].copy_from_slice(&half_bytes[16 - self.b..]);

        let mut r = self.p_mac;
        for block in q[..qlen].chunks_exact(16) {
            for (acc, byte) in r.iter_mut().zip(block) {
                *acc ^= byte;
            }
            self.ff1.cipher.encrypt(&mut r);
        }

        if self.d <= 8 && modulus <= u128::from(u64::MAX) {
            // The hot path (radix 62, length 7): y fits a u64, so does the modulus.
            let mut y = [0u8; 8];
            y[8 - self.d..].copy_from_slice(&r[..self.d]);
            return u128::from(u64::from_be_bytes(y) % modulus as u64);
        }
        // d <= 16 always: r^n < 2^120 and v <= (n+1)/2 keep r^v under 2^61, so b <= 8 and
        // d <= 12. Only FF1's S-extension for d > 16 is therefore never needed.
        let mut y = [0u8; 16];
        y[16 - self.d..].copy_from_slice(&r[..self.d]);
        u128::from_be_bytes(y) % modulus
    }

    /// One round's `y` on the fast path: `Q` is the single block `0^(15-b) ‖ i ‖ B`, i.e. the
    /// big-endian integer `i << 8b | B`, and `y` (d = 8 bytes since b <= 4) is the first 8 bytes
    /// of `R = AES(P_mac ^ Q)`. Integer ops instead of byte loops: this chain of ten dependent
    /// rounds is the whole cost of a code decode.
    #[inline(always)]
    fn round_fast(&self, i: u8, half: u64) -> u64 {
        let q = (u128::from(i) << (8 * self.b)) | u128::from(half);
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "aes",
            target_feature = "sse4.1"
        ))]
        if let Some(ni) = &self.ff1.ni {
            // SAFETY: compiled only where the build enables aes and sse4.1 (the `cfg` above),
            // so the whole binary already requires those instructions.
            #[allow(unsafe_code)]
            let r = unsafe { ni.encrypt_be(self.p_mac_be ^ q) };
            return (r >> 64) as u64;
        }
        let mut r = (self.p_mac_be ^ q).to_be_bytes();
        self.ff1.cipher.encrypt(&mut r);
        (u128::from_be_bytes(r) >> 64) as u64
    }

    #[inline]
    fn encrypt_fast(&self, f: &FastPath, x: u64) -> u64 {
        let (mut a, mut b) = StrengthReducedU64::div_rem(x, f.pow_v);
        for i in 0..ROUNDS {
            let m = if i % 2 == 0 { f.pow_u } else { f.pow_v };
            let y = self.round_fast(i, b) % m;
            // a, y < m <= 2^32, so the sum cannot overflow and one subtraction reduces it.
            let mut c = a + y;
            if c >= m.get() {
                c -= m.get();
            }
            a = b;
            b = c;
        }
        a * f.pow_v.get() + b
    }

    #[inline]
    fn decrypt_fast(&self, f: &FastPath, x: u64, midway: impl FnOnce()) -> u64 {
        let (mut a, mut b) = StrengthReducedU64::div_rem(x, f.pow_v);
        let mut round = |i: u8| {
            let m = if i % 2 == 0 { f.pow_u } else { f.pow_v };
            let y = self.round_fast(i, a) % m;
            let c = if b >= y { b - y } else { b + m.get() - y };
            b = a;
            a = c;
        };
        for i in (ROUNDS / 2..ROUNDS).rev() {
            round(i);
        }
        midway();
        for i in (0..ROUNDS / 2).rev() {
            round(i);
        }
        a * f.pow_v.get() + b
    }

    fn check(&self, x: u128) -> Result<(), Ff1Error> {
        if x >= self.domain {
            return Err(Ff1Error::OutOfDomain {
                value: x,
                domain: self.domain,
            });
        }
        Ok(())
    }

    /// FF1.Encrypt on `x` in `0..radix^len`.
    #[inline]
    pub fn encrypt(&self, x: u128) -> Result<u128, Ff1Error> {
        self.check(x)?;
        if let Some(f) = &self.fast {
            // check() bounded x by the domain, which fits a u64 on the fast path.
            return Ok(u128::from(self.encrypt_fast(f, x as u64)));
        }
        let mut a = x / self.radix_pow_v;
        let mut b = x % self.radix_pow_v;
        for i in 0..ROUNDS {
            let m = if i % 2 == 0 {
                self.radix_pow_u
            } else {
                self.radix_pow_v
            };
            let y = self.round_value(i, b, m);
            let c = (a + y) % m;
            a = b;
            b = c;
        }
        Ok(a * self.radix_pow_v + b)
    }

    /// FF1.Decrypt on `x` in `0..radix^len`.
    #[inline]
    pub fn decrypt(&self, x: u128) -> Result<u128, Ff1Error> {
        self.decrypt_with(x, || {})
    }

    /// [`Ff1Domain::decrypt`], running `midway` once between two of its rounds (halfway on
    /// the fast path, before the first on the general one): work that waits on memory (a
    /// prefetched cache line) overlaps the remaining AES rounds. `midway` cannot change the
    /// result.
    #[inline]
    pub fn decrypt_with(&self, x: u128, midway: impl FnOnce()) -> Result<u128, Ff1Error> {
        self.check(x)?;
        if let Some(f) = &self.fast {
            return Ok(u128::from(self.decrypt_fast(f, x as u64, midway)));
        }
        midway();
        let mut a = x / self.radix_pow_v;
        let mut b = x % self.radix_pow_v;
        for i in (0..ROUNDS).rev() {
            let m = if i % 2 == 0 {
                self.radix_pow_u
            } else {
                self.radix_pow_v
            };
            let y = self.round_value(i, a, m);
            let c = (b + m - y) % m;
            b = a;
            a = c;
        }
        Ok(a * self.radix_pow_v + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K128: &str = "2B7E151628AED2A6ABF7158809CF4F3C";
    const K192: &str = "2B7E151628AED2A6ABF7158809CF4F3CEF4359D8D580AA4F";
    const K256: &str = "2B7E151628AED2A6ABF7158809CF4F3CEF4359D8D580AA4F7F036D6F04FC6A94";
    const T2: &str = "39383736353433323130";
    const T3: &str = "3737373770717273373737";

    fn digits(s: &str) -> Vec<u16> {
        s.chars()
            .map(|c| c.to_digit(36).expect("test numeral") as u16)
            .collect()
    }

    fn render(v: &[u16]) -> String {
        v.iter()
            .map(|&d| std::char::from_digit(u32::from(d), 36).expect("numeral"))
            .collect()
    }

    /// All nine NIST SP 800-38G FF1 samples.
    #[test]
    fn nist_samples() {
        let samples: [(&str, u32, &str, &str, &str); 9] = [
            (K128, 10, "", "0123456789", "2433477484"),
            (K128, 10, T2, "0123456789", "6124200773"),
            (K128, 36, T3, "0123456789abcdefghi", "a9tv40mll9kdu509eum"),
            (K192, 10, "", "0123456789", "2830668132"),
            (K192, 10, T2, "0123456789", "2496655549"),
            (K192, 36, T3, "0123456789abcdefghi", "xbj3kv35jrawxv32ysr"),
            (K256, 10, "", "0123456789", "6657667009"),
            (K256, 10, T2, "0123456789", "1001623463"),
            (K256, 36, T3, "0123456789abcdefghi", "xs8a0azh2avyalyzuwd"),
        ];
        for (n, (key, radix, tweak, pt, ct)) in samples.iter().enumerate() {
            let ff1 = Ff1::new(&hex::decode(key).unwrap()).unwrap();
            let tweak = hex::decode(tweak).unwrap();
            let got = ff1.encrypt_numerals(*radix, &tweak, &digits(pt)).unwrap();
            assert_eq!(render(&got), *ct, "sample {} encrypt", n + 1);
            let back = ff1.decrypt_numerals(*radix, &tweak, &got).unwrap();
            assert_eq!(render(&back), *pt, "sample {} decrypt", n + 1);
        }
    }

    #[test]
    fn rejects_bad_parameters() {
        assert_eq!(
            Ff1::new(&[0u8; 15]).unwrap_err(),
            Ff1Error::KeyLength { len: 15 }
        );
        let ff1 = Ff1::new(&[7u8; 16]).unwrap();
        assert!(matches!(ff1.domain(1, 7, &[]), Err(Ff1Error::Radix { .. })));
        assert!(matches!(
            ff1.domain(10, 1, &[]),
            Err(Ff1Error::Length { .. })
        ));
        assert!(matches!(
            ff1.domain(62, 40, &[]),
            Err(Ff1Error::Length { .. })
        ));
        assert!(matches!(
            ff1.domain(62, 7, &[0u8; 65]),
            Err(Ff1Error::Tweak { .. })
        ));
        let d = ff1.domain(62, 7, &[]).unwrap();
        assert!(matches!(
            d.encrypt(d.domain_size()),
            Err(Ff1Error::OutOfDomain { .. })
        ));
        assert!(matches!(
            ff1.encrypt_numerals(10, &[], &[1, 2, 3, 10]),
            Err(Ff1Error::Numeral { .. })
        ));
    }

    /// A tweak long enough to make `Q` span several blocks, over the widest domain we accept,
    /// still round-trips.
    #[test]
    fn long_tweak_and_wide_domain_round_trip() {
        let ff1 = Ff1::new(&[3u8; 32]).unwrap();
        let d = ff1.domain(2, 119, &[9u8; 40]).unwrap();
        assert!(d.d <= 16);
        for x in [0u128, 1, 12345, (1 << 109) + 77, (1 << 119) - 1] {
            let c = d.encrypt(x).unwrap();
            assert_eq!(d.decrypt(c).unwrap(), x);
        }
    }

    /// The fast path (empty tweak, 64-bit domain) and the general path give identical answers.
    #[test]
    fn fast_path_matches_general_path() {
        let ff1 = Ff1::new(&[5u8; 16]).unwrap();
        let fast = ff1.domain(62, 7, &[]).unwrap();
        assert!(fast.fast.is_some());
        let mut general = fast.clone();
        general.fast = None;
        for x in (0..3_521_614_606_208u128).step_by(17_592_186_044) {
            let c = fast.encrypt(x).unwrap();
            assert_eq!(c, general.encrypt(x).unwrap(), "encrypt {x}");
            assert_eq!(fast.decrypt(c).unwrap(), x);
            assert_eq!(general.decrypt(c).unwrap(), x);
        }
        // NIST sample 1 and 4 (radix 10, empty tweak) take the fast path too.
        assert!(ff1.domain(10, 10, &[]).unwrap().fast.is_some());
    }

    proptest::proptest! {
        #[test]
        fn round_trip(key in proptest::array::uniform16(0u8..), x in 0u128..3_521_614_606_208) {
            let d = Ff1::new(&key).unwrap().domain(62, 7, &[]).unwrap();
            let c = d.encrypt(x).unwrap();
            proptest::prop_assert!(c < d.domain_size());
            proptest::prop_assert_eq!(d.decrypt(c).unwrap(), x);
        }
    }
}
