//! The click processor's per-event work: classify, dedup, roll up, count uniques. The processor
//! must keep up with 350,000 events/s on one core (about 2.9 µs an event for everything,
//! decoding and flushing included), so each of these should be a small fraction of that.
//!
//! The traffic is synthetic but shaped like the real thing: 90% browsers spread over ~200
//! distinct user-agent strings, 10% bots (crawlers, previews, libraries), visitors and codes
//! drawn from large pools, networks random, event time advancing 350 events per millisecond.
//! The classifier caches a verdict per distinct user agent, so `classify/mix` is mostly cache
//! hits; `classify/agent_rules/*` is the rules' own pass over one user agent (a cache miss:
//! ~1,800 rules, substrings in one Aho-Corasick automaton and regexes in one `RegexSet`), for
//! a browser (no rule matches: the common miss) and a bot (spans looked up for the rules that
//! matched).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_analytics::{Classifier, Dedup, Rollup, Rules, Uniques, Verdict};
use lasthop_core::click::{ClickEvent, EventId, Method, Net};

const EVENTS: usize = 1 << 16;
const START_MS: u64 = 1_764_504_000_000;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn browser_agents() -> Vec<String> {
    let mut out = Vec::new();
    for v in 100..140 {
        out.push(format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Safari/537.36"));
        out.push(format!("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Mobile Safari/537.36"));
        out.push(format!(
            "Mozilla/5.0 (X11; Linux x86_64; rv:{v}.0) Gecko/20100101 Firefox/{v}.0"
        ));
        out.push(format!("Mozilla/5.0 (iPhone; CPU iPhone OS 17_{} like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.{} Mobile/15E148 Safari/604.1", v % 7, v % 7));
        out.push(format!("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Safari/537.36 Edg/{v}.0.0.0"));
    }
    out
}

const BOT_AGENTS: &[&str] = &[
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
    "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
    "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
    "Twitterbot/1.0",
    "WhatsApp/2.23.20.0",
    "curl/8.5.0",
    "python-requests/2.31.0",
    "Go-http-client/2.0",
    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
];

/// Owned strings, so events can borrow them.
struct Traffic {
    agents: Vec<String>,
    codes: Vec<String>,
    rows: Vec<(usize, usize, u64, Net, u64)>,
}

impl Traffic {
    fn new() -> Traffic {
        let mut agents = browser_agents();
        let browsers = agents.len();
        agents.extend(BOT_AGENTS.iter().map(|s| s.to_string()));
        let codes: Vec<String> = (0..10_000).map(|i| format!("c{i:06}")).collect();
        let mut rng = 7u64;
        let rows = (0..EVENTS)
            .map(|i| {
                let r = splitmix(&mut rng);
                let agent = if r % 10 == 0 {
                    browsers + (r / 10) as usize % BOT_AGENTS.len()
                } else {
                    (r / 10) as usize % browsers
                };
                let code = splitmix(&mut rng) as usize % codes.len();
                let visitor = splitmix(&mut rng) % 200_000;
                let n = splitmix(&mut rng).to_le_bytes();
                let net = Net::V4([n[0], n[1], n[2]]);
                (
                    agent,
                    code,
                    splitmix(&mut visitor.clone()),
                    net,
                    START_MS + i as u64 / 350,
                )
            })
            .collect();
        Traffic {
            agents,
            codes,
            rows,
        }
    }

    fn event(&self, i: usize) -> ClickEvent<'_> {
        let (agent, code, visitor, net, at_ms) = self.rows[i % EVENTS];
        ClickEvent {
            id: EventId::new(0xfeed, i as u64),
            at_ms,
            code: &self.codes[code],
            domain: "",
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor,
            net: Some(net),
            user_agent: &self.agents[agent],
            referrer_host: if code % 3 == 0 {
                ""
            } else {
                "news.example.com"
            },
        }
    }
}

fn clicks(c: &mut Criterion) {
    let traffic = Traffic::new();
    let rules = Arc::new(Rules::builtin());
    let mut group = c.benchmark_group("clicks");
    group.throughput(Throughput::Elements(1));

    let mut classifier = Classifier::new(rules.clone());
    let mut i = 0usize;
    group.bench_function("classify/mix", |b| {
        b.iter(|| {
            i += 1;
            black_box(classifier.classify(&traffic.event(i)))
        })
    });

    // The same, with the burst rule off: what its per-network hash probe costs.
    let mut no_burst = Rules::builtin();
    no_burst.burst_codes = 0;
    let mut classifier = Classifier::new(Arc::new(no_burst));
    let mut i = 0usize;
    group.bench_function("classify/mix_no_burst", |b| {
        b.iter(|| {
            i += 1;
            black_box(classifier.classify(&traffic.event(i)))
        })
    });

    for (name, agents) in [
        ("classify/agent_rules/browser", browser_agents()),
        (
            "classify/agent_rules/bot",
            BOT_AGENTS.iter().map(|s| s.to_string()).collect(),
        ),
    ] {
        let mut k = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                k += 1;
                black_box(rules.match_agent(&agents[k % agents.len()]))
            })
        });
    }

    let mut warm = Classifier::new(rules);
    let verdicts: Vec<Verdict> = (0..EVENTS)
        .map(|i| warm.classify(&traffic.event(i)))
        .collect();
    let mut rollups: Vec<Rollup> = (0..1_000).map(|_| Rollup::default()).collect();
    let mut j = 0usize;
    group.bench_function("rollup/add", |b| {
        b.iter(|| {
            j += 1;
            let k = j % EVENTS;
            let (_, code, ..) = traffic.rows[k];
            rollups[code % 1_000].add(&traffic.event(k), &verdicts[k]);
        })
    });

    // A 10-minute window over simulated arrivals of ~3,000 events/s holds about 2-4M ids.
    // dedup/first: the spool's case, eight engine cores' runs interleaved; dedup/first_sixteenth:
    // one Kafka partition of 16, a random sixteenth of each core's sequence.
    let mut dedup = Dedup::new(600_000);
    let mut n = 0u64;
    group.bench_function("dedup/first", |b| {
        b.iter(|| {
            n += 1;
            black_box(dedup.first(EventId::new(0xfeed + n % 8, n / 8), START_MS + n / 3))
        })
    });
    let mut dedup = Dedup::new(600_000);
    let (mut n, mut x) = (0u64, 1u64);
    group.bench_function("dedup/first_sixteenth", |b| {
        b.iter(|| {
            // The next sequence number of the share: a geometric gap of mean 16.
            loop {
                n += 1;
                if splitmix(&mut x) % 16 == 0 {
                    break;
                }
            }
            black_box(dedup.first(EventId::new(0xfeed + n % 8, n / 8), START_MS + n / 48))
        })
    });

    let mut uniques = Uniques::new();
    let mut v = 0u64;
    group.bench_function("uniques/insert", |b| {
        b.iter(|| {
            uniques.insert(splitmix(&mut v));
        })
    });
    group.finish();
}

criterion_group!(benches, clicks);
criterion_main!(benches);
