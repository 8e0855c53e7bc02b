//! Synthetic links for capacity tests: real codes under a key (counters `0..count` of region
//! 0), one alias per hundred codes, 3% with an expiry, and URL lengths shaped like shortener
//! traffic: log-normal around 75 bytes (σ 0.5, clamped to 30–300) plus 1% long ones of
//! 300–2000 bytes (tracking-laden links). Deterministic for a given seed.

use lasthop_core::CodeScheme;

/// One synthetic link, borrowed from the generator's buffers.
#[derive(Debug, Clone, Copy)]
pub struct SynthLink<'a> {
    pub key: &'a [u8],
    pub url: &'a [u8],
    pub expires_at_ms: Option<i64>,
    /// The counter behind a generated code; `None` for aliases.
    pub counter: Option<u64>,
}

/// SplitMix64: tiny, fast, good enough for test data.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

const HOSTS: &[&str] = &[
    "example.com",
    "www.example.org",
    "shop.example.net",
    "news.example.co.uk",
    "docs.example.io",
    "m.example.com",
    "blog.example.dev",
    "cdn.example-assets.com",
];
const WORDS: &[&str] = &[
    "spring",
    "summer",
    "launch",
    "promo",
    "webinar",
    "newsletter",
    "careers",
    "podcast",
    "event",
    "report",
    "ticket",
    "survey",
    "guide",
    "update",
    "offer",
    "store",
];
const PATH_CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnop-_/ABCDEFXYZ";

/// Deterministic generator of `count` codes plus `count / 100` aliases.
#[derive(Debug)]
pub struct Synth {
    scheme: CodeScheme,
    count: u64,
    next_counter: u64,
    aliases_made: u64,
    alias_due: bool,
    rng: Rng,
    key: Vec<u8>,
    url: Vec<u8>,
}

impl Synth {
    /// Codes for counters `0..count` under `scheme` (`count` is clamped to the code space).
    pub fn new(scheme: CodeScheme, count: u64, seed: u64) -> Synth {
        Synth {
            scheme,
            count: count.min(lasthop_core::CODE_SPACE),
            next_counter: 0,
            aliases_made: 0,
            alias_due: false,
            rng: Rng(seed),
            key: Vec::with_capacity(64),
            url: Vec::with_capacity(4096),
        }
    }

    /// Total links this generator yields.
    pub fn total(&self) -> u64 {
        self.count + self.count / 100
    }

    /// The next link, or `None` when done. (A lending iterator: the link borrows `self`.)
    pub fn next_link(&mut self) -> Option<SynthLink<'_>> {
        let counter = if self.alias_due {
            self.alias_due = false;
            self.aliases_made += 1;
            self.make_alias();
            None
        } else {
            if self.next_counter >= self.count {
                return None;
            }
            let n = self.next_counter;
            self.next_counter += 1;
            self.alias_due = self.next_counter % 100 == 0;
            // n < count <= CODE_SPACE, inside FF1's domain, so encode cannot fail.
            let code = self.scheme.encode(n).ok()?;
            self.key.clear();
            self.key.extend_from_slice(&code);
            Some(n)
        };
        self.make_url();
        let expires_at_ms = (self.rng.below(100) < 3)
            .then(|| 1_800_000_000_000 + self.rng.below(365 * 86_400_000) as i64);
        Some(SynthLink {
            key: &self.key,
            url: &self.url,
            expires_at_ms,
            counter,
        })
    }

    fn make_alias(&mut self) {
        self.key.clear();
        let a = WORDS[self.rng.below(WORDS.len() as u64) as usize];
        let b = WORDS[self.rng.below(WORDS.len() as u64) as usize];
        self.key.extend_from_slice(a.as_bytes());
        self.key.push(b'-');
        self.key.extend_from_slice(b.as_bytes());
        self.key.push(b'-');
        // The alias number in base 36 keeps every alias distinct.
        let mut n = self.aliases_made;
        let mut digits = Vec::new();
        loop {
            digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
            n /= 36;
            if n == 0 {
                break;
            }
        }
        self.key.extend(digits.iter().rev());
    }

    fn url_len(&mut self) -> usize {
        if self.rng.below(100) == 0 {
            return 300 + self.rng.below(1700) as usize;
        }
        // Box–Muller for a standard normal, then log-normal with median 75.
        let u1 = self.rng.unit().max(f64::MIN_POSITIVE);
        let u2 = self.rng.unit();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        (75.0 * (0.5 * z).exp()).clamp(30.0, 300.0) as usize
    }

    fn make_url(&mut self) {
        let len = self.url_len();
        self.url.clear();
        self.url.extend_from_slice(b"https://");
        let host = HOSTS[self.rng.below(HOSTS.len() as u64) as usize];
        self.url.extend_from_slice(host.as_bytes());
        self.url.push(b'/');
        while self.url.len() < len {
            let bits = self.rng.next();
            for i in 0..8 {
                if self.url.len() >= len {
                    break;
                }
                self.url.push(PATH_CHARS[((bits >> (i * 8)) & 63) as usize]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::{classify_key, split_key, CodeKind, PermutationKey};
    use std::collections::HashSet;

    #[test]
    fn shape_of_the_data() {
        let key = PermutationKey::from_bytes(&[3u8; 16]).unwrap();
        let scheme = CodeScheme::new(&key).unwrap();
        let mut s = Synth::new(scheme.clone(), 5_000, 1);
        assert_eq!(s.total(), 5_050);
        let (mut codes, mut aliases, mut expiring, mut url_bytes) = (0, 0, 0, 0);
        let mut keys = HashSet::new();
        while let Some(l) = s.next_link() {
            assert!(keys.insert(l.key.to_vec()), "duplicate {:?}", l.key);
            match classify_key(l.key) {
                CodeKind::Generated => {
                    codes += 1;
                    assert_eq!(scheme.decode(split_key(l.key).1), l.counter);
                }
                CodeKind::Alias => aliases += 1,
                CodeKind::Invalid | CodeKind::Legacy => panic!("bad key {:?}", l.key),
            }
            expiring += usize::from(l.expires_at_ms.is_some());
            url_bytes += l.url.len();
            assert!(l.url.len() >= 30 && l.url.len() < 2000);
        }
        assert_eq!((codes, aliases), (5_000, 50));
        assert!((50..300).contains(&expiring), "{expiring}");
        let mean = url_bytes / 5_050;
        assert!((70..130).contains(&mean), "mean URL length {mean}");
    }
}
