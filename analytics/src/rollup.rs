//! Per-(link, day) counters. A link is its key (`lasthop_core::link_key`): its code on the
//! default domain, `domain/code` on a branded one, so the same alias on two domains keeps two
//! rollups.
//!
//! A rollup is what an owner's dashboard reads: clicks by people and by bots, unique visitors,
//! and breakdowns by country, referrer, device, browser and OS (people only: bots would swamp
//! them), plus bot clicks by reason so an operator can see what the filter does. Rollups of the
//! same code and day from several processors, or of several days, [`merge`](Rollup::merge) by
//! addition. Counters saturate rather than wrap: a corrupt stored count must not panic a merge.
//!
//! Breakdowns keep at most [`Breakdown::MAX_KEYS`] keys, past which new keys count under
//! "other", because the referrer host is set by whoever links to the code and a store row must
//! not grow with every host on the internet. 256 holds every ISO country and far more referrers
//! than a dashboard shows. Which keys win the slots depends on arrival order, so merging capped
//! breakdowns in different orders can split the tail differently; totals are always exact.
//!
//! Encoding (version 1): `version: u8 = 1`, `human` and `bot` as LEB128 varints, the six
//! breakdowns in field order (countries, referrers, devices, browsers, oses, bot_reasons), each
//! `entries: varint` then per entry `key length: varint`, UTF-8 key bytes, `count: varint`, keys
//! strictly ascending; then the [`Uniques`] encoding; nothing after. Varints because most counts
//! are small and a store holds one row per code per day.

use std::collections::BTreeMap;

use lasthop_core::click::ClickEvent;

use crate::codec::{finish, put_varint, Reader, VARINT};
use crate::{SketchError, Uniques, Verdict};

/// The encoding version [`Rollup::to_bytes`] writes.
pub const ROLLUP_VERSION: u8 = 1;

/// Counts by key, capped: past the cap, new keys count under "other".
///
/// A hash map, not a sorted one: `add` runs five times per human click on the processor's one
/// thread, and ordered string compares were its largest cost (measured with `perf record` on
/// `clicks process`). Whatever leaves the process (the store encoding, the stats answer) is
/// sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breakdown {
    counts: hashbrown::HashMap<Box<str>, u64>,
}

impl Breakdown {
    /// Distinct keys kept before new ones count under [`OTHER`](Self::OTHER).
    pub const MAX_KEYS: usize = 256;
    /// The key past-the-cap counts go to.
    pub const OTHER: &'static str = "other";

    /// Counts `n` under `key` (or under "other" once the cap is reached). Allocates only for a
    /// key not seen before.
    pub fn add(&mut self, key: &str, n: u64) {
        if let Some(count) = self.counts.get_mut(key) {
            *count = count.saturating_add(n);
            return;
        }
        let key = if self.counts.len() < Self::MAX_KEYS {
            key
        } else if let Some(count) = self.counts.get_mut(Self::OTHER) {
            *count = count.saturating_add(n);
            return;
        } else {
            Self::OTHER
        };
        self.counts.insert(key.into(), n);
    }

    /// Adds every count of `other`, keeping the cap. When the cap may bite, keys are taken in
    /// order, so which ones keep a slot of their own does not depend on hashing.
    pub fn merge(&mut self, other: &Breakdown) {
        if self.counts.len() + other.counts.len() <= Self::MAX_KEYS {
            for (key, &n) in &other.counts {
                self.add(key, n);
            }
        } else {
            for (key, n) in other.sorted() {
                self.add(key, n);
            }
        }
    }

    /// The counts, by key.
    pub fn sorted(&self) -> BTreeMap<&str, u64> {
        self.counts.iter().map(|(k, &n)| (&**k, n)).collect()
    }

    /// Distinct keys held (at most [`MAX_KEYS`](Self::MAX_KEYS) + 1, with "other").
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Heap bytes held: the table (its capacity, a control byte a slot) and the keys.
    pub fn heap_bytes(&self) -> usize {
        if self.counts.capacity() == 0 {
            return 0;
        }
        let slot = std::mem::size_of::<(Box<str>, u64)>() + 1;
        self.counts.capacity() * slot + self.counts.keys().map(|k| k.len()).sum::<usize>()
    }

    /// The count under `key`.
    pub fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    /// The sum of all counts.
    pub fn total(&self) -> u64 {
        self.counts.values().fold(0u64, |a, &b| a.saturating_add(b))
    }

    fn write(&self, out: &mut Vec<u8>) {
        put_varint(out, self.counts.len() as u64);
        // Sorted: the encoding is canonical (readers require ascending keys).
        for (key, n) in self.sorted() {
            put_varint(out, key.len() as u64);
            out.extend_from_slice(key.as_bytes());
            put_varint(out, n);
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Breakdown, SketchError> {
        let entries = r.varint(VARINT)?;
        // Every entry takes at least 2 bytes: refuse counts the input cannot hold before looping.
        if entries > r.remaining() as u64 / 2 {
            return Err(SketchError::Truncated);
        }
        let mut counts = hashbrown::HashMap::new();
        let mut last: Option<&str> = None;
        for _ in 0..entries {
            let len = usize::try_from(r.varint(VARINT)?).map_err(|_| SketchError::Truncated)?;
            let key = std::str::from_utf8(r.take(len)?)
                .map_err(|_| SketchError::Malformed("breakdown key not UTF-8"))?;
            if last.is_some_and(|l| key <= l) {
                return Err(SketchError::Malformed("breakdown keys not ascending"));
            }
            last = Some(key);
            counts.insert(key.into(), r.varint(VARINT)?);
        }
        Ok(Breakdown { counts })
    }
}

/// One code's numbers for one day.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rollup {
    /// Human clicks.
    pub human: u64,
    /// Bot clicks.
    pub bot: u64,
    /// Distinct human visitors.
    pub uniques: Uniques,
    /// Human clicks by country ("unknown" when none).
    pub countries: Breakdown,
    /// Human clicks by referrer host ("direct" when none).
    pub referrers: Breakdown,
    /// Human clicks by device class.
    pub devices: Breakdown,
    /// Human clicks by browser family.
    pub browsers: Breakdown,
    /// Human clicks by OS family.
    pub oses: Breakdown,
    /// Bot clicks by reason.
    pub bot_reasons: Breakdown,
}

impl Rollup {
    /// Heap bytes held beyond the struct itself: the sketch and the breakdowns (what a
    /// processor reports holding, beside its resident memory).
    pub fn heap_bytes(&self) -> usize {
        self.uniques.heap_bytes()
            + self
                .breakdowns()
                .iter()
                .map(|b| b.heap_bytes())
                .sum::<usize>()
    }

    /// Counts one event under its verdict.
    pub fn add(&mut self, event: &ClickEvent<'_>, verdict: &Verdict) {
        if let Some(reason) = verdict.bot {
            self.bot = self.bot.saturating_add(1);
            self.bot_reasons.add(reason.as_str(), 1);
            return;
        }
        self.human = self.human.saturating_add(1);
        self.uniques.insert(event.visitor);
        self.countries
            .add(event.country_str().unwrap_or("unknown"), 1);
        let referrer = if event.referrer_host.is_empty() {
            "direct"
        } else {
            event.referrer_host
        };
        self.referrers.add(referrer, 1);
        self.devices.add(verdict.device.as_str(), 1);
        self.browsers.add(verdict.browser, 1);
        self.oses.add(verdict.os, 1);
    }

    /// Adds `other` (another partial of the same code, or another day for a range).
    pub fn merge(&mut self, other: &Rollup) {
        self.human = self.human.saturating_add(other.human);
        self.bot = self.bot.saturating_add(other.bot);
        self.uniques.merge(&other.uniques);
        for (mine, theirs) in self.breakdowns_mut().into_iter().zip(other.breakdowns()) {
            mine.merge(theirs);
        }
    }

    fn breakdowns(&self) -> [&Breakdown; 6] {
        [
            &self.countries,
            &self.referrers,
            &self.devices,
            &self.browsers,
            &self.oses,
            &self.bot_reasons,
        ]
    }

    fn breakdowns_mut(&mut self) -> [&mut Breakdown; 6] {
        [
            &mut self.countries,
            &mut self.referrers,
            &mut self.devices,
            &mut self.browsers,
            &mut self.oses,
            &mut self.bot_reasons,
        ]
    }

    /// Versioned binary form for the store (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    /// Appends [`to_bytes`](Self::to_bytes)'s form to `out` (a store writing many rows into
    /// one buffer).
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(ROLLUP_VERSION);
        put_varint(out, self.human);
        put_varint(out, self.bot);
        for b in self.breakdowns() {
            b.write(out);
        }
        self.uniques.write(out);
    }

    /// Parses [`to_bytes`](Self::to_bytes)'s form (untrusted: never panics).
    pub fn from_bytes(bytes: &[u8]) -> Result<Rollup, SketchError> {
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if version != ROLLUP_VERSION {
            return Err(SketchError::Version(version));
        }
        let human = r.varint(VARINT)?;
        let bot = r.varint(VARINT)?;
        let countries = Breakdown::read(&mut r)?;
        let referrers = Breakdown::read(&mut r)?;
        let devices = Breakdown::read(&mut r)?;
        let browsers = Breakdown::read(&mut r)?;
        let oses = Breakdown::read(&mut r)?;
        let bot_reasons = Breakdown::read(&mut r)?;
        let uniques = Uniques::read(&mut r)?;
        finish(&r)?;
        Ok(Rollup {
            human,
            bot,
            uniques,
            countries,
            referrers,
            devices,
            browsers,
            oses,
            bot_reasons,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BotReason, Device};
    use lasthop_core::click::{EventId, Method};
    use proptest::prelude::*;

    fn event(visitor: u64, country: Option<[u8; 2]>, referrer: &str) -> ClickEvent<'_> {
        ClickEvent {
            id: EventId::new(1, visitor),
            at_ms: 0,
            code: "Ab3dE9x",
            domain: "",
            pop: "fra1",
            country,
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor,
            net: None,
            user_agent: "Mozilla/5.0",
            referrer_host: referrer,
        }
    }

    fn human() -> Verdict {
        Verdict {
            bot: None,
            device: Device::Mobile,
            browser: "Safari",
            os: "iOS",
        }
    }

    fn bot(reason: BotReason) -> Verdict {
        Verdict {
            bot: Some(reason),
            device: Device::Bot,
            browser: "Other",
            os: "Other",
        }
    }

    #[test]
    fn counts_people_and_bots_apart() {
        let mut r = Rollup::default();
        r.add(&event(1, Some(*b"DE"), "news.example.com"), &human());
        r.add(&event(1, Some(*b"DE"), ""), &human());
        r.add(&event(2, None, ""), &human());
        r.add(
            &event(3, Some(*b"US"), "x.example"),
            &bot(BotReason::UserAgent),
        );
        r.add(&event(3, Some(*b"US"), "x.example"), &bot(BotReason::Head));
        assert_eq!((r.human, r.bot, r.uniques.estimate()), (3, 2, 2));
        assert_eq!(r.countries.get("DE"), 2);
        assert_eq!(r.countries.get("unknown"), 1);
        assert_eq!(r.countries.get("US"), 0);
        assert_eq!(r.referrers.get("direct"), 2);
        assert_eq!(r.referrers.get("news.example.com"), 1);
        assert_eq!(
            (
                r.devices.get("mobile"),
                r.browsers.get("Safari"),
                r.oses.get("iOS")
            ),
            (3, 3, 3)
        );
        assert_eq!(r.bot_reasons.get("user_agent"), 1);
        assert_eq!(r.bot_reasons.get("head"), 1);
        assert_eq!(r.bot_reasons.total(), r.bot);
    }

    #[test]
    fn breakdowns_are_capped() {
        let mut b = Breakdown::default();
        for i in 0..1_000 {
            b.add(&format!("host{i}.example"), 1);
        }
        assert_eq!(b.len(), Breakdown::MAX_KEYS + 1);
        assert_eq!(b.get(Breakdown::OTHER), 1_000 - Breakdown::MAX_KEYS as u64);
        assert_eq!(b.total(), 1_000);
        // Keys already in keep counting.
        b.add("host0.example", 5);
        assert_eq!(b.get("host0.example"), 6);
        let mut merged = Breakdown::default();
        merged.merge(&b);
        merged.merge(&b);
        assert_eq!(merged.total(), 2_010);
        assert_eq!(merged.len(), Breakdown::MAX_KEYS + 1);
    }

    #[test]
    fn merge_adds_everything() {
        let mut a = Rollup::default();
        let mut b = Rollup::default();
        let mut whole = Rollup::default();
        for v in 0..100u64 {
            let e = event(v, Some(*b"FR"), if v % 2 == 0 { "" } else { "t.co" });
            let verdict = if v % 10 == 0 {
                bot(BotReason::Behaviour)
            } else {
                human()
            };
            if v < 37 {
                a.add(&e, &verdict)
            } else {
                b.add(&e, &verdict)
            }
            whole.add(&e, &verdict);
        }
        a.merge(&b);
        assert_eq!(a, whole);
        assert_eq!((a.human, a.bot, a.uniques.estimate()), (90, 10, 90));
    }

    #[test]
    fn round_trips_and_refuses_bad_bytes() {
        let mut r = Rollup::default();
        assert_eq!(Rollup::from_bytes(&r.to_bytes()).unwrap(), r);
        for v in 0..3_000u64 {
            r.add(&event(v, Some(*b"JP"), "example.org"), &human());
        }
        r.add(&event(1, None, ""), &bot(BotReason::CrawlerNet));
        let bytes = r.to_bytes();
        assert_eq!(Rollup::from_bytes(&bytes).unwrap(), r);
        assert_eq!(Rollup::from_bytes(&[]), Err(SketchError::Truncated));
        assert_eq!(Rollup::from_bytes(&[2]), Err(SketchError::Version(2)));
        for cut in 0..bytes.len() {
            assert!(Rollup::from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            Rollup::from_bytes(&long),
            Err(SketchError::Malformed("trailing bytes"))
        );
        // Small rollups are small.
        let mut tiny = Rollup::default();
        tiny.add(&event(1, Some(*b"DE"), ""), &human());
        assert!(tiny.to_bytes().len() < 80, "{}", tiny.to_bytes().len());
    }

    /// The rollups behind the checked-in fixtures: one with a sparse sketch, one dense.
    fn fixture_rollups() -> [(&'static str, Rollup); 2] {
        let mut small = Rollup::default();
        small.add(&event(1, Some(*b"DE"), "news.example.com"), &human());
        small.add(&event(2, None, ""), &human());
        small.add(&event(2, None, ""), &bot(BotReason::Head));
        let mut dense = small.clone();
        for v in 0..5_000u64 {
            dense.add(&event(v * 7_919, Some(*b"US"), "t.co"), &human());
        }
        [
            ("rollup-v1-small.bin", small),
            ("rollup-v1-dense.bin", dense),
        ]
    }

    /// A format is a promise: rollups stored by version 1 must still read, and read the same.
    /// `LASTHOP_WRITE_FIXTURES=1 cargo test -p lasthop-analytics fixtures` writes them (only
    /// when a new format version is introduced; never rewrite a released one).
    #[test]
    fn reads_checked_in_fixtures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, rollup) in fixture_rollups() {
            let path = dir.join(name);
            if std::env::var_os("LASTHOP_WRITE_FIXTURES").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, rollup.to_bytes()).unwrap();
            }
            let bytes = std::fs::read(&path).unwrap();
            let back = Rollup::from_bytes(&bytes).unwrap();
            assert_eq!(back, rollup, "{name}");
            assert_eq!(back.to_bytes(), bytes, "{name}");
        }
    }

    fn arb_rollup() -> impl Strategy<Value = Rollup> {
        let click = (
            any::<u64>(),
            prop::option::of("[A-Z]{2}"),
            "[a-z.]{0,12}",
            0u8..6,
        );
        proptest::collection::vec(click, 0..60).prop_map(|clicks| {
            let mut r = Rollup::default();
            for (visitor, cc, referrer, kind) in clicks {
                let country = cc.map(|c| {
                    let b = c.as_bytes();
                    [b[0], b[1]]
                });
                let e = event(visitor, country, &referrer);
                let verdict = match kind {
                    0 => bot(BotReason::UserAgent),
                    1 => bot(BotReason::Behaviour),
                    2 => Verdict {
                        bot: None,
                        device: Device::Desktop,
                        browser: "Firefox",
                        os: "Linux",
                    },
                    _ => human(),
                };
                r.add(&e, &verdict);
            }
            r
        })
    }

    proptest! {
        #[test]
        fn any_rollup_round_trips(r in arb_rollup()) {
            let bytes = r.to_bytes();
            prop_assert_eq!(Rollup::from_bytes(&bytes).unwrap(), r);
        }

        #[test]
        fn merge_is_commutative_under_the_cap(a in arb_rollup(), b in arb_rollup()) {
            let mut ab = a.clone();
            ab.merge(&b);
            let mut ba = b.clone();
            ba.merge(&a);
            prop_assert_eq!(ab, ba);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Rollup::from_bytes(&bytes);
            let mut prefixed = vec![ROLLUP_VERSION];
            prefixed.extend_from_slice(&bytes);
            if let Ok(r) = Rollup::from_bytes(&prefixed) {
                // Merging a decoded rollup (counts near u64::MAX included) must not panic either.
                let mut twice = r.clone();
                twice.merge(&r);
            }
        }

        #[test]
        fn mangled_rollups_never_panic(r in arb_rollup(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = r.to_bytes();
            let i = pos.index(bytes.len());
            bytes[i] = byte;
            if let Ok(back) = Rollup::from_bytes(&bytes) {
                prop_assert_eq!(back.to_bytes(), bytes);
            }
        }
    }
}
