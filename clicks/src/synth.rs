//! Synthetic click streams for tests and `perf/clicks.sh`: a realistic mix of ~200 browser user
//! agents, crawlers and preview fetchers, HEAD requests, referrers, countries, a skewed code
//! popularity and ~1% duplicate deliveries, written as a pre-filled spool or produced to a topic.
//! Deterministic for a given seed and start time.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use lasthop_core::click::{spool, ClickEvent, EventId, Method, Net};
use serde::Serialize;

use super::Day;

#[cfg(feature = "kafka")]
mod producer;

pub use producer::produce_kafka;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthConfig {
    /// Events, duplicates included.
    pub events: u64,
    /// Distinct codes.
    pub codes: u32,
    /// These codes instead of generated ones (real links' codes, so their stats can be read).
    pub fixed_codes: Vec<String>,
    /// Distinct visitors.
    pub visitors: u64,
    /// Share of events from bots (crawler agents and HEAD requests).
    pub bot_share: f64,
    /// Days the events span, ending now (today counts as one).
    pub days: u32,
    /// PRNG seed.
    pub seed: u64,
    /// "Now", Unix milliseconds.
    pub now_ms: u64,
}

/// What was written.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SynthReport {
    /// Events written (duplicates included).
    pub events: u64,
    /// Of which duplicates of an earlier id.
    pub duplicates: u64,
    /// Spool files written.
    pub files: u64,
    /// Encoded bytes.
    pub bytes: u64,
    /// Messages the broker refused (Kafka).
    pub failed: u64,
}

/// Why synthesis failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynthError {
    /// Writing the spool failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The producer failed.
    #[cfg(feature = "kafka")]
    #[error("kafka producer: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// This build has no Kafka producer.
    #[error("--kafka: this build of lasthop-clicks has no `kafka` feature")]
    NotBuilt,
}

/// splitmix64: small, fast, good enough for test data.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n.max(1))) >> 64) as u64
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The `i`-th synthetic code: 7 base62 characters.
pub fn code(seed: u64, i: u32) -> String {
    let mut v = mix(seed ^ u64::from(i).wrapping_mul(0x1000_0000_01b3));
    (0..7)
        .map(|_| {
            let c = BASE62[(v % 62) as usize];
            v /= 62;
            char::from(c)
        })
        .collect()
}

/// About 200 browser user agents: Chrome, Firefox, Safari, Edge, Samsung Internet, Opera and
/// in-app browsers, across desktop, phone and tablet platforms.
pub fn browser_agents() -> Vec<String> {
    let mut out = Vec::new();
    let desktops = [
        "Windows NT 10.0; Win64; x64",
        "Macintosh; Intel Mac OS X 10_15_7",
        "X11; Linux x86_64",
    ];
    for v in 111..=133 {
        for os in desktops {
            out.push(format!("Mozilla/5.0 ({os}) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Safari/537.36"));
        }
    }
    for v in 124..=135 {
        for os in [
            "Windows NT 10.0; Win64; x64; rv:{v}.0",
            "Macintosh; Intel Mac OS X 10.15; rv:{v}.0",
            "X11; Ubuntu; Linux x86_64; rv:{v}.0",
        ] {
            let os = os.replace("{v}", &v.to_string());
            out.push(format!("Mozilla/5.0 ({os}) Gecko/20100101 Firefox/{v}.0"));
        }
    }
    for v in 122..=133 {
        out.push(format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Safari/537.36 Edg/{v}.0.0.0"));
    }
    let phones = [
        "SM-S918B",
        "Pixel 8",
        "Pixel 7a",
        "SM-A546B",
        "moto g 5G",
        "2201116SG",
    ];
    for v in [124, 126, 128, 130, 131, 132] {
        for p in phones {
            out.push(format!("Mozilla/5.0 (Linux; Android 14; {p}) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Mobile Safari/537.36"));
        }
    }
    for (ios, safari) in [
        ("16_6", "16.6"),
        ("17_1", "17.1"),
        ("17_4", "17.4"),
        ("17_6", "17.6"),
        ("18_0", "18.0"),
        ("18_1", "18.1"),
        ("18_2", "18.2"),
        ("18_3", "18.3"),
    ] {
        out.push(format!("Mozilla/5.0 (iPhone; CPU iPhone OS {ios} like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{safari} Mobile/15E148 Safari/604.1"));
        out.push(format!("Mozilla/5.0 (iPad; CPU OS {ios} like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{safari} Mobile/15E148 Safari/604.1"));
        out.push(format!("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{safari} Safari/605.1.15"));
        out.push(format!("Mozilla/5.0 (iPhone; CPU iPhone OS {ios} like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1"));
    }
    for v in ["23.0", "24.0", "25.0", "26.0", "27.0"] {
        out.push(format!("Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/{v} Chrome/115.0.0.0 Mobile Safari/537.36"));
    }
    for v in ["112", "113", "114", "115", "116"] {
        out.push(format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36 OPR/{v}.0.0.0"));
    }
    out.push("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Instagram 339.0.3.12.108".into());
    out.push("Mozilla/5.0 (Linux; Android 14; Pixel 8 Build/AP2A; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/131.0.0.0 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/490.0.0.0;]".into());
    out.push("Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36".into());
    out
}

/// Crawler, preview-fetcher and automation user agents.
pub const BOT_AGENTS: &[&str] = &[
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
    "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
    "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
    "Twitterbot/1.0",
    "LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
    "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
    "TelegramBot (like TwitterBot)",
    "WhatsApp/2.23.20.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.1.1 Safari/605.1.15 (Applebot/0.1; +http://www.apple.com/go/applebot)",
    "Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)",
    "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
    "Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)",
    "curl/8.5.0",
    "python-requests/2.31.0",
    "Go-http-client/1.1",
    "Wget/1.21.4",
];

const REFERRERS: &[&str] = &[
    "",
    "",
    "",
    "t.co",
    "www.google.com",
    "news.ycombinator.com",
    "www.facebook.com",
    "l.instagram.com",
    "www.reddit.com",
    "mail.google.com",
    "lnkd.in",
    "duckduckgo.com",
    "www.bing.com",
    "out.reddit.com",
];

const COUNTRIES: &[&[u8; 2]] = &[
    b"US", b"US", b"US", b"US", b"DE", b"DE", b"GB", b"GB", b"FR", b"IN", b"IN", b"BR", b"JP",
    b"CA", b"NL", b"ES", b"IT", b"PL", b"SE", b"AU", b"MX", b"KR", b"ID", b"TR",
];

const POPS: &[&str] = &["fra1", "iad1", "sin1", "gru1", "lhr1"];

/// The event generator.
#[derive(Debug)]
pub struct Synth {
    cfg: SynthConfig,
    rng: Rng,
    codes: Vec<String>,
    browsers: Vec<String>,
    nonce: u64,
    seq: u64,
    start_ms: u64,
    span_ms: u64,
    made: u64,
    last: Vec<u8>,
    /// Duplicates emitted so far.
    pub duplicates: u64,
}

impl Synth {
    /// A generator for `cfg`.
    pub fn new(cfg: SynthConfig) -> Synth {
        let codes = if cfg.fixed_codes.is_empty() {
            (0..cfg.codes.max(1)).map(|i| code(cfg.seed, i)).collect()
        } else {
            cfg.fixed_codes.clone()
        };
        let today = Day::of_ms(cfg.now_ms);
        let start_ms = today.minus(cfg.days.max(1) - 1).start_ms();
        Synth {
            rng: Rng(cfg.seed),
            codes,
            browsers: browser_agents(),
            nonce: mix(cfg.seed ^ cfg.now_ms),
            seq: 0,
            start_ms,
            span_ms: cfg.now_ms.saturating_sub(start_ms).max(1),
            made: 0,
            last: Vec::new(),
            duplicates: 0,
            cfg,
        }
    }

    /// The codes events are drawn from.
    pub fn codes(&self) -> &[String] {
        &self.codes
    }

    /// Appends the next event's binary form to `out`; returns its code index.
    pub fn next_into(&mut self, out: &mut Vec<u8>) -> usize {
        let rng = &mut self.rng;
        let i = self.made;
        self.made += 1;
        if !self.last.is_empty() && rng.chance(0.01) {
            // A duplicate delivery: the previous event again, same id.
            self.duplicates += 1;
            out.extend_from_slice(&self.last);
            return 0;
        }
        // Quadratic skew: a few codes get most clicks.
        let r = rng.below(1 << 32) as f64 / (1u64 << 32) as f64;
        let code_i = ((r * r) * self.codes.len() as f64) as usize % self.codes.len();
        let visitor_i = rng.below(self.cfg.visitors.max(1));
        let visitor = mix(visitor_i ^ 0x5eed);
        let bot = rng.chance(self.cfg.bot_share);
        let (user_agent, method) = if bot {
            if rng.chance(0.2) {
                let b = &self.browsers[(visitor % self.browsers.len() as u64) as usize];
                (b.as_str(), Method::Head)
            } else {
                (
                    BOT_AGENTS[rng.below(BOT_AGENTS.len() as u64) as usize],
                    Method::Get,
                )
            }
        } else {
            let b = &self.browsers[(visitor % self.browsers.len() as u64) as usize];
            (b.as_str(), Method::Get)
        };
        let events = self.cfg.events.max(1);
        let at_ms =
            self.start_ms + (u128::from(i) * u128::from(self.span_ms) / u128::from(events)) as u64;
        let net_bits = mix(visitor_i);
        // A link key: the code, or `domain/code` on a branded domain.
        let (domain, code) = lasthop_core::split_key_str(&self.codes[code_i]);
        let event = ClickEvent {
            id: EventId::new(self.nonce, self.seq),
            at_ms,
            code,
            domain: domain.unwrap_or_default(),
            pop: POPS[(net_bits % POPS.len() as u64) as usize],
            country: Some(*COUNTRIES[((net_bits >> 8) % COUNTRIES.len() as u64) as usize]),
            method,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor,
            net: Some(Net::V4([
                (net_bits >> 16) as u8 | 1,
                (net_bits >> 24) as u8,
                (net_bits >> 32) as u8,
            ])),
            user_agent,
            referrer_host: REFERRERS[rng.below(REFERRERS.len() as u64) as usize],
        };
        self.seq += 1;
        let start = out.len();
        event.encode(out);
        self.last.clear();
        self.last.extend_from_slice(&out[start..]);
        code_i
    }
}

/// Writes `cfg.events` events into `dir` as sealed segments of writer `writer` (each written as
/// `.open`, fsynced, then renamed, as an engine does).
pub fn write_spool(dir: &Path, writer: &str, cfg: SynthConfig) -> Result<SynthReport, SynthError> {
    const FRAME_EVENTS: u32 = 1000;
    const FILE_BYTES: usize = 64 << 20;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| SynthError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let total = cfg.events;
    let mut synth = Synth::new(cfg);
    let mut report = SynthReport::default();
    let mut file_buf = spool::SEGMENT_MAGIC.to_vec();
    let mut payload = Vec::new();
    let mut n = 0u64;
    let seal = |buf: &mut Vec<u8>, n: &mut u64, report: &mut SynthReport| {
        let open = dir.join(format!("{}.open", spool::stem(writer, *n)));
        let mut f = std::fs::File::create(&open).map_err(io(&open))?;
        f.write_all(buf).map_err(io(&open))?;
        f.sync_all().map_err(io(&open))?;
        let sealed = dir.join(format!("{}.seg", spool::stem(writer, *n)));
        std::fs::rename(&open, &sealed).map_err(io(&sealed))?;
        report.files += 1;
        report.bytes += buf.len() as u64;
        *n += 1;
        buf.clear();
        buf.extend_from_slice(spool::SEGMENT_MAGIC);
        Ok::<(), SynthError>(())
    };
    let mut made = 0u64;
    while made < total {
        let count = FRAME_EVENTS.min(u32::try_from(total - made).unwrap_or(FRAME_EVENTS));
        payload.clear();
        for _ in 0..count {
            synth.next_into(&mut payload);
        }
        made += u64::from(count);
        spool::encode_frame(&mut file_buf, &payload, count);
        if file_buf.len() >= FILE_BYTES {
            seal(&mut file_buf, &mut n, &mut report)?;
        }
    }
    if file_buf.len() > spool::SEGMENT_MAGIC.len() {
        seal(&mut file_buf, &mut n, &mut report)?;
    }
    report.events = made;
    report.duplicates = synth.duplicates;
    Ok(report)
}

/// Without the `kafka` feature: no producer.
#[cfg(not(feature = "kafka"))]
mod producer {
    use super::{SynthConfig, SynthError, SynthReport};

    /// Always [`SynthError::NotBuilt`].
    pub fn produce_kafka(
        _: &str,
        _: &str,
        _: &str,
        _: SynthConfig,
    ) -> Result<SynthReport, SynthError> {
        Err(SynthError::NotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_valid_events() {
        let agents = browser_agents();
        assert!((180..=230).contains(&agents.len()), "{}", agents.len());
        let now = 1_764_504_000_000;
        let mut s = Synth::new(SynthConfig {
            fixed_codes: Vec::new(),
            events: 10_000,
            codes: 50,
            visitors: 1000,
            bot_share: 0.1,
            days: 1,
            seed: 7,
            now_ms: now,
        });
        let mut buf = Vec::new();
        for _ in 0..10_000 {
            s.next_into(&mut buf);
        }
        let mut rest = &buf[..];
        let mut n = 0;
        while !rest.is_empty() {
            let (e, used) = ClickEvent::decode(rest).unwrap();
            assert!(e.at_ms <= now && Day::of_ms(e.at_ms) == Day::of_ms(now));
            rest = &rest[used..];
            n += 1;
        }
        assert_eq!(n, 10_000);
        assert!((50..200).contains(&s.duplicates), "{}", s.duplicates);
    }
}
