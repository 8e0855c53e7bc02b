//! The click processor inside the real binary: events injected as real spool segment files (or
//! produced to a real Kafka-protocol broker), stats read over HTTP.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lasthop_core::click::{spool, ClickEvent, EventId, Method, Net};
use lasthop_testkit::{free_port, KillOnDrop, Tansu};
use serde_json::Value;

use crate::harness::{call, json, Server, Site, BIN};

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
const DAY_MS: u64 = 86_400_000;
/// Flush often so tests see counts quickly.
const FAST: &[&str] = &["--clicks-flush-ms", "200"];

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn day_string(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap()
        .format("%Y-%m-%d")
        .to_string()
}

/// An event builder with sensible defaults: a human on Firefox.
#[derive(Clone)]
struct Ev {
    id: u64,
    code: String,
    at_ms: u64,
    ua: &'static str,
    method: Method,
    visitor: u64,
    net: Net,
    prefetch: bool,
    early: bool,
}

impl Ev {
    fn human(id: u64, code: &str, at_ms: u64) -> Ev {
        Ev {
            id,
            code: code.to_string(),
            at_ms,
            ua: FIREFOX,
            method: Method::Get,
            visitor: 1000 + id,
            net: Net::V4([198, 51, 100]),
            prefetch: false,
            early: false,
        }
    }

    /// In 0-RTT early data, from visitor `visitor`.
    fn early(mut self, visitor: u64) -> Ev {
        self.early = true;
        self.visitor = visitor;
        self
    }

    fn net(mut self, net: Net) -> Ev {
        self.net = net;
        self
    }

    fn prefetch(mut self) -> Ev {
        self.prefetch = true;
        self
    }

    fn ua(mut self, ua: &'static str) -> Ev {
        self.ua = ua;
        self
    }

    fn head(mut self) -> Ev {
        self.method = Method::Head;
        self
    }

    fn encode(&self, out: &mut Vec<u8>) {
        // `code` is a link key: the code, or `domain/code` on a branded domain.
        let (domain, code) = lasthop_core::split_key_str(&self.code);
        ClickEvent {
            id: EventId::new(0x7e57, self.id),
            at_ms: self.at_ms,
            code,
            domain: domain.unwrap_or_default(),
            pop: "test1",
            country: Some(*b"DE"),
            method: self.method,
            tls: true,
            prefetch: self.prefetch,
            protocol: Default::default(),
            early: self.early,
            visitor: self.visitor,
            net: Some(self.net),
            user_agent: self.ua,
            referrer_host: "news.example.com",
        }
        .encode(out)
    }
}

fn spool_dir(site: &Site) -> PathBuf {
    site.dir.path().join("data").join("clicks").join("spool")
}

/// Segment file bytes: the magic, then one frame per slice of events.
fn segment(frames: &[&[Ev]]) -> Vec<u8> {
    let mut bytes = spool::SEGMENT_MAGIC.to_vec();
    for events in frames {
        let mut payload = Vec::new();
        for e in *events {
            e.encode(&mut payload);
        }
        spool::encode_frame(&mut bytes, &payload, events.len() as u32);
    }
    bytes
}

/// Writes a sealed segment the way an engine does: elsewhere first, then renamed into place.
fn put_file(site: &Site, name: &str, bytes: &[u8]) {
    let dir = spool_dir(site);
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = site.dir.path().join(format!("{name}.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn put_segment(site: &Site, writer: &str, n: u64, events: &[Ev]) {
    put_file(site, &format!("{writer}.{n:010}.seg"), &segment(&[events]));
}

fn create_link(server: &Server, key: &str) -> String {
    let (status, body) = call(
        "POST",
        &server.url("/v1/links"),
        Some(key),
        Some(r#"{"long_url":"https://example.com/clicked"}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    json(&body)["code"].as_str().unwrap().to_string()
}

fn stats(server: &Server, key: &str, code: &str, query: &str) -> (u16, Value) {
    let (status, body) = call(
        "GET",
        &server.url(&format!("/v1/links/{code}/stats{query}")),
        Some(key),
        None,
    )
    .unwrap();
    (status, json(&body))
}

/// `POST /v1/admin/clicks/recompute` with `body` as `key`.
fn recompute(server: &Server, key: &str, body: &str) -> (u16, String) {
    call(
        "POST",
        &server.url("/v1/admin/clicks/recompute"),
        Some(key),
        Some(body),
    )
    .unwrap()
}

/// Polls `f` until it returns `Some`, for up to `secs`.
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the stats show `clicks` human and `bots` bot clicks over `query`.
fn wait_counts(
    server: &Server,
    key: &str,
    code: &str,
    query: &str,
    clicks: u64,
    bots: u64,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = stats(server, key, code, query);
        assert_eq!(status, 200, "{body}");
        if body["clicks"] == clicks && body["bot_clicks"] == bots {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {clicks} clicks and {bots} bot clicks; last {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(server: &Server, line_prefix: &str) -> Option<f64> {
    server.metric(line_prefix)
}

fn outcome(server: &Server, outcome: &str) -> f64 {
    metric(
        server,
        &format!("lasthop_clicks_events_total{{outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// A public network opening six links within a second (a mail scanner) counts from the fifth
/// link on as a burst; the same from a documentation (never routed) network, and a prefetch,
/// are told apart.
#[test]
fn network_bursts_and_prefetches_are_bots() {
    let site = Site::new();
    let server = site.start(FAST);
    let codes: Vec<String> = (0..6)
        .map(|_| create_link(&server, &site.api_key))
        .collect();
    let now = now_ms();
    // The burst window is 5 s of event time: keep all six inside one window.
    let start = now - 20_000 - now % 5_000;
    let scanner = Net::V4([93, 184, 216]);
    let mut events: Vec<Ev> = codes
        .iter()
        .enumerate()
        .map(|(i, code)| Ev::human(10 + i as u64, code, start + 100 * i as u64).net(scanner))
        .collect();
    // The same burst from 198.51.100.0/24 (TEST-NET-2): exempt, six people.
    events.extend(
        codes
            .iter()
            .enumerate()
            .map(|(i, code)| Ev::human(20 + i as u64, code, start + 100 * i as u64)),
    );
    events.push(Ev::human(30, &codes[0], start + 2_000).prefetch());
    put_segment(&site, "edge-a", 0, &events);
    for (i, code) in codes.iter().enumerate() {
        let bots = u64::from(i >= 4) + u64::from(i == 0);
        let humans = 2 - u64::from(i >= 4);
        let body = wait_counts(&server, &site.api_key, code, "", humans, bots);
        if i >= 4 {
            assert_eq!(body["bot_reasons"]["burst"], 1, "{body}");
        }
        if i == 0 {
            assert_eq!(body["bot_reasons"]["prefetch"], 1, "{body}");
        }
    }
}

/// (a) counts appear within seconds; (b) a duplicate id counts once; (c) a crawler UA and a
/// HEAD count as bots, beside the human count, with their reasons.
#[test]
fn counts_dedup_and_bots() {
    let site = Site::new();
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    let events = [
        Ev::human(1, &code, now - 3000),
        Ev::human(2, &code, now - 2000),
        Ev::human(3, &code, now - 1000),
        Ev::human(1, &code, now - 3000), // delivered twice
        Ev::human(4, &code, now - 500).ua(GOOGLEBOT),
        Ev::human(5, &code, now - 400).head(),
    ];
    let started = Instant::now();
    put_segment(&site, "edge-a", 0, &events);
    let body = wait_counts(&server, &site.api_key, &code, "", 3, 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body["code"], code.as_str());
    assert_eq!(body["visitor_days"], 3, "{body}");
    assert_eq!(body["bot_reasons"]["user_agent"], 1, "{body}");
    assert_eq!(body["bot_reasons"]["head"], 1, "{body}");
    assert_eq!(body["countries"]["DE"], 3, "{body}");
    assert_eq!(body["referrers"]["news.example.com"], 3, "{body}");
    assert_eq!(body["browsers"]["Firefox"], 3, "{body}");
    let today = day_string(now);
    assert_eq!(body["to"], today.as_str());
    let days = body["days"].as_array().unwrap();
    assert_eq!(days.len(), 1, "{body}");
    assert_eq!(days[0]["day"], today.as_str());
    assert_eq!(days[0]["clicks"], 3);
    assert_eq!(days[0]["bot_clicks"], 2);
    assert_eq!(days[0]["state"], "open");
    wait_for(5, "the duplicate in metrics", || {
        (outcome(&server, "duplicate") == 1.0).then_some(())
    });
    assert_eq!(outcome(&server, "human"), 3.0);
    assert_eq!(outcome(&server, "bot"), 2.0);
    // The consumed segment is deleted once its progress is committed.
    wait_for(5, "the consumed segment to be deleted", || {
        (!spool_dir(&site).join("edge-a.0000000000.seg").exists()).then_some(())
    });
}

/// A replayed 0-RTT request is a new event with a new id: the processor counts one early-data
/// click per visitor, code and minute, and a recompute of the day applies the same rule.
#[test]
fn early_data_replays_count_once_per_visitor_code_and_minute() {
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "root", true);
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    // Two whole minutes back, so every event is in the past and within one UTC day or two.
    let minute = (now / 60_000) * 60_000 - 120_000;
    let events = [
        Ev::human(1, &code, minute + 1_000).early(77),
        Ev::human(2, &code, minute + 5_000).early(77), // a replay: same visitor, code, minute
        Ev::human(3, &code, minute + 6_000).early(78), // another visitor
        Ev::human(4, &code, minute + 7_000).early(77).head(), // HEAD: a bot, still a replay
        Ev::human(5, &code, minute + 61_000).early(77), // the next minute
        Ev::human(6, &code, minute + 8_000),           // not early: never dropped by this rule
    ];
    put_segment(&site, "edge-a", 0, &events);
    wait_for(10, "the replays in metrics", || {
        (outcome(&server, "early_replay") == 2.0).then_some(())
    });
    assert_eq!(outcome(&server, "human"), 4.0);
    assert_eq!(outcome(&server, "bot"), 0.0);
    assert_eq!(outcome(&server, "duplicate"), 0.0);
    let day = day_string(minute + 1_000);
    if day == day_string(minute + 61_000) {
        // The archive consumer reads the spool on its own: recompute once it has all six.
        let report = wait_for(10, "a recompute over the whole archive", || {
            let (status, body) = recompute(&server, &admin, &format!(r#"{{"day":"{day}"}}"#));
            assert_eq!(status, 200, "{body}");
            let report = json(&body);
            (report["events"].as_u64().unwrap() + report["early_replays"].as_u64().unwrap() == 6)
                .then_some(report)
        });
        assert_eq!(
            (report["events"].as_u64(), report["early_replays"].as_u64()),
            (Some(4), Some(2)),
            "{report}"
        );
    }
}

/// (e) owner-only: another owner's key 403, unknown code 404, bad ranges 400.
#[test]
fn stats_access_and_ranges() {
    let site = Site::new();
    let bob = Site::create_key(site.dir.path(), "bob", false);
    let admin = Site::create_key(site.dir.path(), "root", true);
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    let (status, body) = stats(&server, &bob, &code, "");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden"))
    );
    let (status, _) = stats(&server, &admin, &code, "");
    assert_eq!(status, 200);
    let (status, body) = stats(&server, &site.api_key, "Zz9Zz9Z", "");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _) = stats(&server, "not-a-key", &code, "");
    assert_eq!(status, 401);
    for (query, want) in [
        ("?from=2026-02-30", "invalid_date"),
        ("?from=yesterday", "invalid_date"),
        ("?to=2026-1-1", "invalid_date"),
        ("?from=2026-03-02&to=2026-03-01", "invalid_range"),
        ("?from=2024-01-01&to=2026-01-01", "invalid_range"),
    ] {
        let (status, body) = stats(&server, &site.api_key, &code, query);
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], want, "{query}: {body}");
    }
    // No data yet: zeros, no days, and the default range is the last 30 days.
    let (status, body) = stats(&server, &site.api_key, &code, "");
    assert_eq!(status, 200);
    assert_eq!(body["clicks"], 0);
    assert_eq!(body["days"].as_array().unwrap().len(), 0);
    assert_eq!(body["to"], day_string(now_ms()).as_str());
    assert_eq!(body["from"], day_string(now_ms() - 29 * DAY_MS).as_str());
    // Recompute is admin-only.
    let (status, _) = recompute(&server, &site.api_key, r#"{"day":"2026-01-01"}"#);
    assert_eq!(status, 403);
    let (status, body) = recompute(&server, &admin, r#"{"day":"someday"}"#);
    assert_eq!(status, 400, "{body}");
}

/// (d) a late event inside the grace counts in its own day; one past the grace is archived but
/// not counted until a recompute of its day, through the API and offline.
#[test]
fn late_events_and_recompute() {
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "root", true);
    let now = now_ms();
    let today_start = now / DAY_MS * DAY_MS;
    // Yesterday closes an hour from now; the day before closed 23 hours ago.
    let grace_secs = (now - today_start) / 1000 + 3600;
    let grace = grace_secs.to_string();
    let server = site.start(&["--clicks-flush-ms", "200", "--clicks-grace-secs", &grace]);
    let code = create_link(&server, &site.api_key);
    let yesterday = today_start - DAY_MS / 2;
    let before = today_start - DAY_MS - DAY_MS / 2;
    put_segment(
        &site,
        "edge-a",
        0,
        &[
            Ev::human(1, &code, yesterday),
            Ev::human(2, &code, before),
            Ev::human(3, &code, before + 1000).ua(GOOGLEBOT),
        ],
    );
    let range = format!("?from={}", day_string(before));
    let body = wait_counts(&server, &site.api_key, &code, &range, 1, 0);
    let days = body["days"].as_array().unwrap();
    assert_eq!(days.len(), 1, "{body}");
    assert_eq!(days[0]["day"], day_string(yesterday).as_str());
    wait_for(5, "late events in metrics", || {
        (outcome(&server, "late") == 2.0).then_some(())
    });

    // The offline recompute refuses while the server holds the store.
    let out = Command::new(BIN)
        .args(["clicks", "recompute", "--data-dir"])
        .arg(site.dir.path().join("data"))
        .args(["--day", &day_string(before)])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by another process"), "{stderr}");

    // The admin API recomputes the closed day from the archive.
    let (status, body) = recompute(
        &server,
        &admin,
        &format!(r#"{{"day":"{}"}}"#, day_string(before)),
    );
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    assert_eq!(report["events"], 2, "{report}");
    assert_eq!(report["human"], 1, "{report}");
    assert_eq!(report["bot"], 1, "{report}");
    assert_eq!(report["codes"], 1, "{report}");
    let body = wait_counts(&server, &site.api_key, &code, &range, 2, 1);
    let days = body["days"].as_array().unwrap();
    assert_eq!(days.len(), 2, "{body}");
    assert_eq!(days[0]["day"], day_string(before).as_str());
    assert_eq!(days[0]["state"], "recomputed");
    assert_eq!(days[1]["state"], "open");
    // A day without an archive is refused, not wiped.
    let (status, body) = recompute(&server, &admin, r#"{"day":"2001-01-01"}"#);
    assert_eq!(status, 404, "{body}");

    // Offline, with the server stopped: the same day again gives the same numbers.
    server.terminate();
    let out = Command::new(BIN)
        .args(["clicks", "recompute", "--data-dir"])
        .arg(site.dir.path().join("data"))
        .args(["--day", &day_string(before)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        (report["events"].as_u64(), report["duplicates"].as_u64()),
        (Some(2), Some(0))
    );
    let server = site.start(&["--clicks-flush-ms", "200", "--clicks-grace-secs", &grace]);
    wait_counts(&server, &site.api_key, &code, &range, 2, 1);
}

/// (f) counts survive restarts, graceful and SIGKILL, and the consumed spool is not counted again.
#[test]
fn restarts_do_not_double_count() {
    let site = Site::new();
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    let batch = |from: u64, n: u64| -> Vec<Ev> {
        (from..from + n)
            .map(|i| Ev::human(i, &code, now - 10_000 + i))
            .collect()
    };
    put_segment(&site, "edge-a", 0, &batch(0, 10));
    wait_counts(&server, &site.api_key, &code, "", 10, 0);
    server.terminate();

    let server = site.start(FAST);
    wait_counts(&server, &site.api_key, &code, "", 10, 0);
    // An open file that a writer keeps appending to, across a hard kill.
    let open = spool_dir(&site).join("edge-b.0000000000.open");
    std::fs::write(&open, segment(&[&batch(100, 5)])).unwrap();
    wait_counts(&server, &site.api_key, &code, "", 15, 0);
    std::thread::sleep(Duration::from_millis(500)); // a few flushes: progress committed
    server.kill();

    let server = site.start(FAST);
    std::thread::sleep(Duration::from_millis(1000));
    wait_counts(&server, &site.api_key, &code, "", 15, 0);
    // The writer appends another frame to the same file, then seals it.
    let mut bytes = std::fs::read(&open).unwrap();
    let more = segment(&[&batch(200, 3)]);
    bytes.extend_from_slice(&more[spool::SEGMENT_MAGIC.len()..]);
    std::fs::write(&open, &bytes).unwrap();
    std::fs::rename(&open, spool_dir(&site).join("edge-b.0000000000.seg")).unwrap();
    wait_counts(&server, &site.api_key, &code, "", 18, 0);
    std::thread::sleep(Duration::from_millis(1000));
    wait_counts(&server, &site.api_key, &code, "", 18, 0);
    wait_for(5, "the spool to be emptied", || {
        let left: Vec<_> = std::fs::read_dir(spool_dir(&site)).unwrap().collect();
        left.is_empty().then_some(())
    });
}

/// (g) garbage files and a corrupt frame are counted and skipped; the processor keeps going.
#[test]
fn garbage_and_corruption_are_skipped() {
    let site = Site::new();
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    put_file(&site, "notes.txt", b"an operator's notes");
    put_file(
        &site,
        "edge-x.0000000000.seg",
        b"definitely not a spool segment",
    );
    // Frame 1 good (2 events), frame 2 corrupted (skipped with the rest of the file).
    let mut bytes = segment(&[
        &[
            Ev::human(1, &code, now - 100),
            Ev::human(2, &code, now - 90),
        ],
        &[Ev::human(3, &code, now - 80)],
        &[Ev::human(4, &code, now - 70)],
    ]);
    let first_len = {
        let mut one = Vec::new();
        Ev::human(1, &code, now - 100).encode(&mut one);
        Ev::human(2, &code, now - 90).encode(&mut one);
        spool::SEGMENT_MAGIC.len() + spool::FRAME_HEADER + one.len()
    };
    bytes[first_len + spool::FRAME_HEADER + 5] ^= 0x55;
    put_file(&site, "edge-y.0000000000.seg", &bytes);
    // A frame whose second event is garbage: the first counts, the rest of the frame not.
    let mut payload = Vec::new();
    Ev::human(10, &code, now - 60).encode(&mut payload);
    payload.extend_from_slice(b"\x01\x00garbage-garbage-garbage-garbage-garbage-garbage");
    let mut bad_event = spool::SEGMENT_MAGIC.to_vec();
    spool::encode_frame(&mut bad_event, &payload, 2);
    put_file(&site, "edge-z.0000000000.seg", &bad_event);
    wait_counts(&server, &site.api_key, &code, "", 3, 0);
    wait_for(5, "corrupt and invalid in metrics", || {
        (outcome(&server, "corrupt") == 2.0 && outcome(&server, "invalid") == 1.0).then_some(())
    });
    // Still going: a later segment counts.
    put_segment(&site, "edge-z", 1, &[Ev::human(20, &code, now - 50)]);
    wait_counts(&server, &site.api_key, &code, "", 4, 0);
    assert!(
        spool_dir(&site).join("notes.txt").exists(),
        "foreign files are left alone"
    );
    // An event past both the grace and the archive's retention (90 days) is invalid, and opens
    // no archive day that retention would have to delete.
    let ancient = now - 100 * DAY_MS;
    put_segment(&site, "edge-z", 2, &[Ev::human(30, &code, ancient)]);
    wait_for(5, "the ancient event in metrics", || {
        (outcome(&server, "invalid") == 2.0).then_some(())
    });
    let archive = site.dir.path().join("data").join("clicks").join("archive");
    wait_for(10, "today's objects in the archive", || {
        archive
            .join(format!("day={}", day_string(now)))
            .exists()
            .then_some(())
    });
    assert!(!archive
        .join(format!("day={}", day_string(ancient)))
        .exists());
}

/// A rollup row that does not decode is never counted on nor overwritten: stats answer 500
/// `corrupt_rollup`, its events count as `corrupt_rollup`, and a recompute of the (still open)
/// day repairs it.
#[test]
fn a_corrupt_rollup_is_reported_not_replaced() {
    use lasthop_control::clicks::store::{FlushBatch, RollupRow, RowBody};
    use lasthop_control::clicks::{Day, RollupStore};
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "root", true);
    let server = site.start(FAST);
    let code = create_link(&server, &site.api_key);
    server.terminate();
    let now = now_ms();
    let today = Day::of_ms(now);
    let store = RollupStore::open(&site.dir.path().join("data/clicks/rollups.redb")).unwrap();
    store
        .commit(&FlushBatch {
            rollups: vec![RollupRow {
                day: today,
                code: code.as_str().into(),
                body: RowBody::Bytes(b"\x01garbage".to_vec()),
                human: 0,
                bot: 0,
                at: None,
            }],
            touched_days: vec![today],
            ..FlushBatch::default()
        })
        .unwrap();
    drop(store);

    let server = site.start(FAST);
    let (status, body) = stats(&server, &site.api_key, &code, "");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (500, Some("corrupt_rollup")),
        "{body}"
    );
    put_segment(
        &site,
        "edge-a",
        0,
        &[
            Ev::human(1, &code, now - 1000),
            Ev::human(2, &code, now - 900),
        ],
    );
    wait_for(10, "corrupt_rollup in metrics", || {
        (outcome(&server, "corrupt_rollup") == 2.0).then_some(())
    });
    // The segment is consumed (its flush committed) and the row was left as it was.
    wait_for(5, "the consumed segment to be deleted", || {
        (!spool_dir(&site).join("edge-a.0000000000.seg").exists()).then_some(())
    });
    assert_eq!(outcome(&server, "human"), 0.0);
    let (status, _) = stats(&server, &site.api_key, &code, "");
    assert_eq!(status, 500);

    // Recomputing today from the archive repairs it; the day is still within its grace, so it
    // stays open.
    let (status, body) = recompute(
        &server,
        &admin,
        &format!(r#"{{"day":"{}"}}"#, day_string(now)),
    );
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    assert_eq!(report["events"], 2, "{report}");
    assert_eq!(report["state"], "open", "{report}");
    let body = wait_counts(&server, &site.api_key, &code, "", 2, 0);
    assert_eq!(body["days"][0]["state"], "open", "{body}");
    // Streaming counts go on on top of the recomputed numbers.
    put_segment(&site, "edge-a", 1, &[Ev::human(3, &code, now - 800)]);
    wait_counts(&server, &site.api_key, &code, "", 3, 0);
}

/// `--clicks-spool-stale-secs` below the minimum is refused: a live writer's `.open` file must
/// never look dead.
#[test]
fn a_short_spool_stale_period_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["clicks", "process", "--exit-when-idle", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--spool")
        .arg(dir.path().join("spool"))
        .args(["--clicks-spool-stale-secs", "60"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--clicks-spool-stale-secs must be at least 120"),
        "{stderr}"
    );
}

/// `--clicks off`: no processor, stats answer 503.
#[test]
fn clicks_off() {
    let site = Site::new();
    let server = site.start(&["--clicks", "off"]);
    let code = create_link(&server, &site.api_key);
    let (status, body) = stats(&server, &site.api_key, &code, "");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("stats_unavailable"))
    );
}

/// `clicks synth` then `clicks process --exit-when-idle`: the standalone processor drains a
/// spool and reports what it did.
#[test]
fn standalone_process_drains_a_synthetic_spool() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let out = Command::new(BIN)
        .args(["clicks", "synth", "--spool"])
        .arg(&spool)
        .args(["--events", "20000", "--codes", "50"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let synth = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(synth["events"], 20000);
    let out = Command::new(BIN)
        .args(["clicks", "process", "--exit-when-idle", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--spool")
        .arg(&spool)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = json(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(summary["events"], 20000, "{summary}");
    let o = &summary["outcomes"];
    assert_eq!(o["duplicate"], synth["duplicates"], "{summary}");
    let counted = o["human"].as_u64().unwrap() + o["bot"].as_u64().unwrap();
    assert_eq!(
        counted + o["duplicate"].as_u64().unwrap(),
        20000,
        "{summary}"
    );
    let bots = o["bot"].as_u64().unwrap() as f64 / counted as f64;
    assert!((0.05..0.2).contains(&bots), "bot share {bots}: {summary}");
    assert!(
        std::fs::read_dir(&spool).unwrap().next().is_none(),
        "spool drained"
    );
}

fn produce(brokers: &str, topic: &str, events: &[Ev]) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "1")
        // One record per batch: tansu 0.6 answers a fetch that starts inside a record batch
        // with the next batch, skipping the rest of that one (a partition taken over at a
        // stored position mid-batch would lose records to the broker, not to the processor).
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .create()
        .expect("producer");
    for e in events {
        let mut value = Vec::new();
        e.encode(&mut value);
        producer
            .send(BaseRecord::to(topic).key(&e.code).payload(&value))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer.flush(Duration::from_secs(30)).expect("delivered");
}

/// (h) the Kafka source: a real Kafka-protocol broker (tansu), events produced with rdkafka,
/// stats over HTTP; a restart neither loses nor double counts.
#[test]
fn kafka_source() {
    let Some(tansu) = Tansu::find() else {
        lasthop_testkit::skip(
            "kafka_source",
            "tansu is not installed (~/.cargo/bin/tansu or PATH)",
        );
        return;
    };
    let topic = "lasthop.clicks";
    let broker = Tansu::on(&tansu, topic, 2);
    let site = Site::new();
    let args = [
        "--clicks-flush-ms",
        "200",
        "--clicks-kafka",
        broker.addr.as_str(),
    ];
    let server = site.start(&args);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    let mut events: Vec<Ev> = (0..20)
        .map(|i| Ev::human(i, &code, now - 5000 + i))
        .collect();
    events.push(Ev::human(3, &code, now - 5000 + 3)); // a duplicate delivery
    events.push(Ev::human(50, &code, now - 100).ua(GOOGLEBOT));
    produce(&broker.addr, topic, &events);
    wait_for(30, "kafka events in stats", || {
        let (_, body) = stats(&server, &site.api_key, &code, "");
        (body["clicks"] == 20 && body["bot_clicks"] == 1).then_some(())
    });
    server.terminate();
    let server = site.start(&args);
    produce(&broker.addr, topic, &[Ev::human(60, &code, now - 50)]);
    wait_for(30, "the next event after a restart", || {
        let (_, body) = stats(&server, &site.api_key, &code, "");
        (body["clicks"] == 21).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    wait_counts(&server, &site.api_key, &code, "", 21, 1);

    // The topic is recreated (a fresh broker): the stored offset of the code's partition is past
    // its end. It is reset (a warning, a Kafka error counted) instead of skipping for ever.
    server.terminate();
    drop(broker);
    let broker = Tansu::on(&tansu, topic, 2);
    let args = [
        "--clicks-flush-ms",
        "200",
        "--clicks-kafka",
        broker.addr.as_str(),
    ];
    let server = site.start(&args);
    produce(
        &broker.addr,
        topic,
        &[
            Ev::human(70, &code, now - 40),
            Ev::human(71, &code, now - 30),
        ],
    );
    wait_for(30, "events of the recreated topic", || {
        let (_, body) = stats(&server, &site.api_key, &code, "");
        (body["clicks"] == 23).then_some(())
    });
    assert!(
        metric(&server, "lasthop_clicks_kafka_errors_total").unwrap_or(0.0) >= 1.0,
        "the reset is counted"
    );
}

/// A Kafka source whose broker is down: the control plane serves on, the processor retries, and
/// the errors show in metrics.
#[test]
fn kafka_broker_down_is_counted() {
    let site = Site::new();
    let dead = format!("127.0.0.1:{}", free_port());
    let server = site.start(&["--clicks-kafka", &dead]);
    let code = create_link(&server, &site.api_key);
    wait_for(20, "kafka errors in metrics", || {
        metric(&server, "lasthop_clicks_kafka_errors_total").filter(|n| *n > 0.0)
    });
    let (status, body) = stats(&server, &site.api_key, &code, "");
    assert_eq!((status, body["clicks"].as_u64()), (200, Some(0)), "{body}");
    server.terminate();
}

/// Sum of `clicks` over `codes` (stats over HTTP).
fn total_clicks(server: &Server, key: &str, codes: &[String]) -> Option<Vec<u64>> {
    codes
        .iter()
        .map(|c| {
            let (status, body) = stats(server, key, c, "");
            (status == 200).then(|| body["clicks"].as_u64()).flatten()
        })
        .collect()
}

/// (i) Several processors share one Kafka consumer group and one ClickHouse store: `serve` and
/// two `clicks process`, six partitions split among them. One is SIGKILLed while clicks keep
/// arriving (with what it had not flushed), and a replacement joins (as a supervisor restarts
/// it); the rebalance moves partitions between the live processors too. Each counts a
/// partition it gains from the positions in ClickHouse: every click is counted exactly once,
/// and stays so. Stats (clicks, unique visitors) come from ClickHouse through the API.
///
/// The replacement is what makes the dead member's partitions move on this broker: tansu 0.6
/// drops a member that stopped heartbeating but completes the next rebalance with the dead
/// member's assignment still in it, so the survivors alone never take its partitions (a Kafka
/// broker hands them over after `session.timeout.ms`; the processor's handling is the same).
#[test]
fn processors_share_a_group_into_clickhouse() {
    let test = "processors_share_a_group_into_clickhouse";
    let Some(tansu) = Tansu::find() else {
        lasthop_testkit::skip(test, "tansu is not installed (~/.cargo/bin/tansu or PATH)");
        return;
    };
    let Some(ch) = lasthop_testkit::ClickHouse::shared(test) else {
        return;
    };
    let topic = "lasthop.clicks";
    let broker = Tansu::on(&tansu, topic, 6);
    let store = ch.url("shared_group");
    let tuning = [
        "--clicks-flush-ms",
        "300",
        "--clicks-store",
        store.as_str(),
        "--clicks-kafka-session-ms",
        "6000",
    ];
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "root", true);
    let mut args = vec!["--clicks-kafka", broker.addr.as_str()];
    args.extend(tuning);
    // Kafka partitions never end: archive objects close by age.
    args.extend(["--clicks-archive-object-secs", "1"]);
    let server = site.start(&args);
    let codes: Vec<String> = (0..12)
        .map(|_| create_link(&server, &site.api_key))
        .collect();
    let spawn = |name: &str| {
        let log = site.dir.path().join(format!("{name}.log"));
        let child = Command::new(BIN)
            .args(["clicks", "process", "--data-dir"])
            .arg(site.dir.path().join(name))
            .args(["--kafka", broker.addr.as_str(), "--topic", topic])
            // The archive consumer runs in `serve` (one archive host).
            .args(["--clicks-archive", "off"])
            .args(tuning)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("clicks process starts");
        (KillOnDrop(child), log)
    };
    // The partitions a processor's log says it holds now.
    let holds = |log: &str| -> Vec<u32> {
        log.lines()
            .rev()
            .find(|l| {
                l.contains("kafka rebalance")
                    && l.contains("group=lasthop-clicks ")
                    && l.contains("Assigned(")
            })
            .and_then(|l| l.split("Assigned([").nth(1))
            .and_then(|rest| rest.split(']').next())
            .map(|list| list.split(", ").filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default()
    };
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let (mut p1, p1_log) = spawn("p1");
    let (p2, p2_log) = spawn("p2");
    // Each standalone processor holds partitions of its own before any click is sent.
    wait_for(60, "both processors to hold partitions", || {
        (!holds(&read(&p1_log)).is_empty() && !holds(&read(&p2_log)).is_empty()).then_some(())
    });

    let now = now_ms();
    let batch = |from: u64, to: u64| -> Vec<Ev> {
        (from..to)
            .map(|i| Ev::human(i, &codes[(i % 12) as usize], now - 60_000 + i))
            .collect()
    };
    let mut expected = [0u64; 12];
    let mut send = |events: &[Ev], counted: bool| {
        produce(&broker.addr, topic, events);
        if counted {
            for e in events {
                expected[(e.id % 12) as usize] += 1;
            }
        }
    };
    send(&batch(0, 600), true);
    send(&batch(0, 30), false); // duplicate deliveries
    wait_for(60, "the first clicks counted", || {
        let t = total_clicks(&server, &site.api_key, &codes)?;
        (t.iter().sum::<u64>() == 600).then_some(())
    });
    // Clicks keep arriving while one processor is killed mid-interval, then replaced.
    send(&batch(600, 1200), true);
    std::thread::sleep(Duration::from_millis(150));
    p1.0.kill().unwrap();
    p1.0.wait().unwrap();
    send(&batch(1200, 1500), true);
    // Past the session timeout the broker has dropped the dead member; the replacement's join
    // rebalances the live ones.
    std::thread::sleep(Duration::from_secs(7));
    let (p3, _) = spawn("p3");
    send(&batch(1500, 1800), true);
    let done = wait_for(90, "every click counted after the kill", || {
        let t = total_clicks(&server, &site.api_key, &codes)?;
        (t.iter().sum::<u64>() >= 1800).then_some(t)
    });
    assert_eq!(done, expected, "per code, exactly once");
    // Which live processor ended up with the dead one's partitions is the broker's choice
    // (tansu may leave the replacement none); that every click counted once is ours.
    // Several flush intervals later (the group settled), still exactly once.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        total_clicks(&server, &site.api_key, &codes).unwrap(),
        expected
    );
    // Unique visitors (every click its own visitor) from the sketches in ClickHouse.
    let (_, body) = stats(&server, &site.api_key, &codes[0], "");
    let uniques = body["days"][0]["unique_visitors"].as_u64().unwrap();
    assert!(
        (uniques as f64 - 150.0).abs() <= 6.0,
        "unique visitors {uniques} of 150: {body}"
    );
    assert!(body["visitor_days"].as_u64().unwrap() >= uniques, "{body}");
    // The rows really are in ClickHouse, from more than one partition.
    let parts = ch.query(
        "SELECT uniqExact(part) FROM shared_group.rollups WHERE day > 0 FORMAT TabSeparated",
    );
    assert!(parts.trim().parse::<u32>().unwrap() >= 2, "{parts}");
    // The archive consumer in `serve` (its own group) has every click, whoever counted it.
    wait_for(30, "every click in the archive", || {
        let mut ids = Vec::new();
        let first = lasthop_control::clicks::Day::of_ms(now - 60_000);
        for day in [first, first.next()] {
            ids.extend(archived_ids(&site, day));
        }
        ids.sort_unstable();
        ids.dedup();
        (ids == (0..1800).collect::<Vec<_>>()).then_some(())
    });
    // Today is still open, counted by three processors at once: a recompute would race them.
    let (status, body) = recompute(
        &server,
        &admin,
        &format!(r#"{{"day":"{}"}}"#, day_string(now)),
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["error"]["code"], "day_open", "{body}");
    drop((p2, p3));
    server.terminate();
}

/// The ids in the day archive of `day` under the site's data dir (its Parquet objects).
fn archived_ids(site: &Site, day: lasthop_control::clicks::Day) -> Vec<u64> {
    use lasthop_control::clicks::objects::{ArchiveLocation, Objects};
    let root = site.dir.path().join("data/clicks/archive");
    let objects = Objects::open(&ArchiveLocation::local(&root), None).unwrap();
    let mut ids = Vec::new();
    lasthop_control::clicks::recompute::day_events(&objects, day, |event| {
        let (e, _) = lasthop_core::click::ClickEvent::decode(event).unwrap();
        // The low 64 bits of the 128-bit id are the test's counter.
        ids.push(e.id.0 as u64);
    })
    .unwrap();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// (j) The archive stands alone: `clicks archive` reads the spool at its own position while the
/// processor (in `serve`, `--clicks-archive off`) is stopped and clicks keep arriving; nothing
/// is lost from the archive, and the processor counts the same clicks when it is back. A spool
/// file goes only once both have read it: neither one's stop loses the other's events.
#[test]
fn the_archive_consumer_stands_alone() {
    let site = Site::new();
    let args = ["--clicks-flush-ms", "200", "--clicks-archive", "off"];
    let server = site.start(&args);
    let code = create_link(&server, &site.api_key);
    let archiver = || {
        KillOnDrop(
            Command::new(BIN)
                .args(["clicks", "archive", "--data-dir"])
                .arg(site.dir.path().join("data"))
                .args(["--clicks-flush-ms", "200"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("clicks archive starts"),
        )
    };
    let mut archive = archiver();
    let now = now_ms();
    let today = lasthop_control::clicks::Day::of_ms(now);
    let events = |ids: std::ops::Range<u64>| -> Vec<Ev> {
        ids.map(|i| Ev::human(i, &code, now - 10_000 + i)).collect()
    };
    let seg = |n: u64| spool_dir(&site).join(format!("edge-a.{n:010}.seg"));
    put_segment(&site, "edge-a", 0, &events(1..4));
    wait_counts(&server, &site.api_key, &code, "", 3, 0);
    wait_for(10, "the first segment archived and deleted", || {
        (archived_ids(&site, today) == vec![1, 2, 3] && !seg(0).exists()).then_some(())
    });

    // The processor stops; clicks keep arriving and go into the archive all the same.
    server.terminate();
    put_segment(&site, "edge-a", 1, &events(4..7));
    put_segment(&site, "edge-a", 2, &events(7..9));
    wait_for(10, "clicks archived while the processor is down", || {
        (archived_ids(&site, today) == (1..9).collect::<Vec<_>>()).then_some(())
    });
    // Kept for the processor, which has not read them.
    assert!(seg(1).exists() && seg(2).exists());
    let server = site.start(&args);
    wait_counts(&server, &site.api_key, &code, "", 8, 0);
    wait_for(10, "segments read by both deleted, markers too", || {
        let left: Vec<_> = std::fs::read_dir(spool_dir(&site))
            .unwrap()
            .filter_map(|e| e.ok())
            .collect();
        left.is_empty().then_some(())
    });

    // The other way round: the archive consumer stops, the processor counts on, and the file
    // waits for the archive.
    archive.0.kill().unwrap();
    archive.0.wait().unwrap();
    put_segment(&site, "edge-a", 3, &events(9..11));
    wait_counts(&server, &site.api_key, &code, "", 10, 0);
    std::thread::sleep(Duration::from_millis(600));
    assert!(seg(3).exists(), "kept for the archive consumer");
    archive = archiver();
    wait_for(10, "archived after the restart, then deleted", || {
        (archived_ids(&site, today) == (1..11).collect::<Vec<_>>() && !seg(3).exists())
            .then_some(())
    });
    drop(archive);
    server.terminate();
}

/// (k) The scheduled recompute: a day past its grace is rebuilt from the archive by itself
/// ("fresh, then correct"), late events included, once the archive consumer has caught up.
#[test]
fn days_past_their_grace_are_recomputed_by_themselves() {
    let site = Site::new();
    let now = now_ms();
    let today_start = now / DAY_MS * DAY_MS;
    // Yesterday closes an hour from now; the day before closed 23 hours ago.
    let grace = ((now - today_start) / 1000 + 3600).to_string();
    let server = site.start(&[
        "--clicks-flush-ms",
        "200",
        "--clicks-grace-secs",
        &grace,
        "--clicks-recompute-every-secs",
        "1",
    ]);
    let code = create_link(&server, &site.api_key);
    let yesterday = today_start - DAY_MS / 2;
    let before = today_start - DAY_MS - DAY_MS / 2;
    put_segment(
        &site,
        "edge-a",
        0,
        &[
            Ev::human(1, &code, yesterday),
            Ev::human(2, &code, before),
            Ev::human(3, &code, before + 1000).ua(GOOGLEBOT),
        ],
    );
    // The late clicks of the closed day count once the scheduler rebuilt it; yesterday, still
    // in its grace, streams and is left alone.
    let range = format!("?from={}", day_string(before));
    let body = wait_for(30, "the closed day rebuilt by the scheduler", || {
        let (_, body) = stats(&server, &site.api_key, &code, &range);
        (body["days"][0]["state"] == "recomputed").then_some(body)
    });
    let days = body["days"].as_array().unwrap();
    assert_eq!(days.len(), 2, "{body}");
    assert_eq!(days[0]["day"], day_string(before).as_str());
    assert_eq!(
        (days[0]["clicks"].as_u64(), days[0]["bot_clicks"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(days[1]["state"], "open", "{body}");
    assert!(server.log().contains("scheduled recompute done"));
    // Once: later runs leave it alone.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(server.log().matches("scheduled recompute done").count(), 1);
    server.terminate();
}

/// (l) ClickHouse is SIGKILLed while clicks keep arriving, of today and of a day the processor
/// has not loaded yet: the rows cannot be read, so the partition is read again from its stored
/// position (what it counted since dropped, its ids forgotten) until they can. When the server
/// is back every click is counted, once. (Without forgetting the ids of the events whose load
/// failed, all seven were lost as "duplicates" on the re-read.)
#[test]
fn clickhouse_down_and_back_loses_nothing() {
    let test = "clickhouse_down_and_back_loses_nothing";
    let Some(tansu) = Tansu::find() else {
        lasthop_testkit::skip(test, "tansu is not installed (~/.cargo/bin/tansu or PATH)");
        return;
    };
    let Some(mut ch) = lasthop_testkit::ClickHouse::start(test) else {
        return;
    };
    let topic = "lasthop.clicks";
    let broker = Tansu::on(&tansu, topic, 2);
    let store = ch.url("blink");
    let site = Site::new();
    let server = site.start(&[
        "--clicks-kafka",
        broker.addr.as_str(),
        "--clicks-store",
        store.as_str(),
        "--clicks-flush-ms",
        "200",
        // Yesterday still counts.
        "--clicks-grace-secs",
        "172800",
    ]);
    let code = create_link(&server, &site.api_key);
    let now = now_ms();
    let yesterday = now - DAY_MS;
    produce(
        &broker.addr,
        topic,
        &(1..=5)
            .map(|i| Ev::human(i, &code, now - 1000 + i))
            .collect::<Vec<_>>(),
    );
    wait_counts(&server, &site.api_key, &code, "", 5, 0);

    ch.kill();
    let mut late: Vec<Ev> = (6..=8)
        .map(|i| Ev::human(i, &code, now - 500 + i))
        .collect();
    late.extend((9..=12).map(|i| Ev::human(i, &code, yesterday + i)));
    produce(&broker.addr, topic, &late);
    // Loads fail meanwhile: the partition is read again and again, nothing is committed.
    wait_for(20, "failed loads while ClickHouse is down", || {
        server
            .log()
            .contains("loading the day's rollups failed")
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    ch.restart();
    let range = format!("?from={}", day_string(yesterday));
    let body = wait_for(30, "every click once ClickHouse is back", || {
        let (status, body) = stats(&server, &site.api_key, &code, &range);
        (status == 200 && body["clicks"] == 12).then_some(body)
    });
    assert_eq!(body["days"].as_array().unwrap().len(), 2, "{body}");
    std::thread::sleep(Duration::from_millis(1500));
    let (_, body) = stats(&server, &site.api_key, &code, &range);
    assert_eq!(body["clicks"], 12, "still once: {body}");
    server.terminate();
}

/// The archive's flags for the object store `s3` under `prefix`.
fn s3_args(s3: &lasthop_testkit::S3, endpoint: &str, prefix: &str) -> Vec<String> {
    vec![
        "--clicks-archive-url".into(),
        format!("s3://{}/{prefix}", s3.bucket),
        "--clicks-archive-endpoint".into(),
        endpoint.into(),
        "--clicks-archive-credentials-file".into(),
        s3.credentials_file().display().to_string(),
    ]
}

/// (l) The archive on real object storage (SeaweedFS on loopback, SigV4 checked): spool clicks
/// land as Parquet objects under Hive-style keys; ClickHouse (chdb) reads them on S3 and counts
/// per code what the processor counted (humans plus bots, duplicates dropped by id); a
/// recompute from S3 reproduces the rollups; a damaged object is counted, named and skipped.
#[test]
fn the_archive_on_s3_is_parquet_a_query_engine_reads() {
    let Some(s3) = lasthop_testkit::S3::start("the_archive_on_s3_is_parquet_a_query_engine_reads")
    else {
        return;
    };
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "root", true);
    let mut args: Vec<String> = FAST.iter().map(|s| s.to_string()).collect();
    args.extend(s3_args(&s3, &s3.endpoint(), "clicks/eu"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = site.start(&args);
    let codes: Vec<String> = (0..3)
        .map(|_| create_link(&server, &site.api_key))
        .collect();
    let now = now_ms();
    let today = lasthop_control::clicks::Day::of_ms(now);
    // Two hours of the day when it has two behind it.
    let earlier = if lasthop_control::clicks::Day::of_ms(now - 3_600_000) == today {
        now - 3_600_000
    } else {
        now - 5_000
    };
    let mut events = Vec::new();
    for (i, code) in codes.iter().enumerate() {
        for k in 0..(10 * (i as u64 + 1)) {
            let at = if k % 2 == 0 { earlier } else { now - 5_000 } + k;
            events.push(Ev::human(100 * i as u64 + k, code, at));
        }
        events.push(Ev::human(100 * i as u64 + 90, code, now - 4_000).ua(GOOGLEBOT));
    }
    let (a, b) = events.split_at(events.len() / 2);
    put_segment(&site, "edge-a", 0, a);
    // edge-b delivers three of edge-a's events again: archived twice, counted once.
    let mut again = b.to_vec();
    again.extend(a[..3].iter().cloned());
    put_segment(&site, "edge-b", 0, &again);
    let mut want = Vec::new();
    for (i, code) in codes.iter().enumerate() {
        let humans = 10 * (i as u64 + 1);
        wait_counts(&server, &site.api_key, code, "", humans, 1);
        want.push((code.clone(), humans + 1));
    }
    want.sort();

    // Hive-style keys, one object per segment and hour, named by the segment's byte range.
    let keys = wait_for(20, "both segments' objects on S3", || {
        let keys = s3.keys("clicks/eu/");
        (keys.iter().any(|k| k.contains("spool-edge-b.0000000000-"))).then_some(keys)
    });
    for k in &keys {
        let rest = k
            .strip_prefix(&format!("clicks/eu/day={}/hour=", day_string(now)))
            .unwrap_or_else(|| panic!("{k}"));
        let (hour, name) = rest.split_once('/').unwrap();
        assert!(hour.len() == 2 && hour.parse::<u8>().unwrap() < 24, "{k}");
        assert!(
            name.starts_with("spool-edge-a.0000000000-0-")
                || name.starts_with("spool-edge-b.0000000000-0-"),
            "{k}"
        );
        assert!(name.ends_with(".parquet"), "{k}");
    }
    let hours = if earlier == now - 5_000 { 1 } else { 2 };
    assert!(keys.len() >= 2 && keys.len() <= 2 * hours, "{keys:?}");

    // A query engine reads the archive on S3: per code, distinct event ids are the processor's
    // humans plus bots; every row is there, the repeated ones too.
    let table = s3.table("clicks/eu/day=*/hour=*/*.parquet");
    let csv = s3.chdb(
        &format!("SELECT code, count(DISTINCT id) FROM {table} GROUP BY code ORDER BY code"),
        "CSV",
    );
    let got: Vec<(String, u64)> = csv
        .lines()
        .map(|l| {
            let (c, n) = l.split_once(',').unwrap();
            (c.trim_matches('"').to_string(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(got, want, "{csv}");
    let rows = s3.chdb(&format!("SELECT count() FROM {table}"), "CSV");
    assert_eq!(rows.trim(), (events.len() + 3).to_string());
    // Typed columns: a timestamp, a domain that is null on the default domain.
    let typed = s3.chdb(
        &format!("SELECT toTypeName(t), countIf(d IS NULL), min(t) > now64(3) - INTERVAL 1 DAY FROM {table}"),
        "CSV",
    );
    assert!(typed.starts_with("\"DateTime64(3, 'UTC')\","), "{typed}");
    assert!(
        typed.trim().ends_with(&format!(",{},1", events.len() + 3)),
        "{typed}"
    );

    // A recompute from S3 reproduces the rollups.
    let (status, body) = recompute(
        &server,
        &admin,
        &format!(r#"{{"day":"{}"}}"#, day_string(now)),
    );
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    assert_eq!(report["events"], events.len() as u64, "{body}");
    assert_eq!(report["duplicates"], 3, "{body}");
    assert_eq!(report["corrupt_objects"], 0, "{body}");
    assert_eq!(report["objects"], keys.len() as u64, "{body}");
    for (i, code) in codes.iter().enumerate() {
        wait_counts(&server, &site.api_key, code, "", 10 * (i as u64 + 1), 1);
    }

    // A damaged object: counted, named in the log, skipped; the others still count.
    let victim = keys
        .iter()
        .find(|k| k.contains("spool-edge-a."))
        .unwrap()
        .clone();
    s3.boto(&format!(
        "b = bytearray(s3.get_object(Bucket={:?}, Key={victim:?})['Body'].read())\n\
         b[100] ^= 0xff\n\
         s3.put_object(Bucket={:?}, Key={victim:?}, Body=bytes(b))",
        s3.bucket, s3.bucket
    ));
    let (status, body) = recompute(
        &server,
        &admin,
        &format!(r#"{{"day":"{}"}}"#, day_string(now)),
    );
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    assert_eq!(report["corrupt_objects"], 1, "{body}");
    assert!(
        report["events"].as_u64().unwrap() < events.len() as u64,
        "{body}"
    );
    let log = server.log();
    assert!(
        log.contains("damaged archive object skipped") && log.contains(&victim),
        "{log}"
    );
    server.terminate();
}

/// A TCP relay to `to` that passes each client's bytes at most `rate` bytes a second (the
/// object store behind a slow link), so a kill lands mid-upload.
fn slow_relay(to: u16, rate: usize) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = vec![0u8; 16 << 10];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
                }
                let _ = s_write.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_read, mut c_write) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_read, &mut c_write);
                let _ = c_write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

/// `n` events of one hour, varied like real traffic (so an object is megabytes), from writer
/// `writer`'s ids `first..first+n`.
fn varied_events(writer: u64, first: u64, n: u64, hour_start: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ first;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let codes: Vec<String> = (0..500).map(|i| format!("Ab{i:05}")).collect();
    let agents: Vec<String> = (0..40)
        .map(|i| format!("Mozilla/5.0 (X11; Linux x86_64; rv:{i}.0) Gecko/20100101 Firefox/{i}.0"))
        .collect();
    for i in first..first + n {
        let r = next();
        ClickEvent {
            id: EventId::new(writer, i),
            at_ms: hour_start + r % 3_600_000,
            code: &codes[(r >> 24) as usize % codes.len()],
            domain: "",
            pop: "test1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor: next(),
            net: Some(Net::V4([198, (r >> 40) as u8, (r >> 48) as u8])),
            user_agent: &agents[(r >> 32) as usize % agents.len()],
            referrer_host: "news.example.com",
        }
        .encode(&mut out);
    }
    out
}

/// Segment bytes of `events` (encoded), in frames of at most 1,000.
fn segment_of(events: &[u8]) -> Vec<u8> {
    let mut bytes = spool::SEGMENT_MAGIC.to_vec();
    let (mut rest, mut frame, mut count) = (events, Vec::new(), 0u32);
    while !rest.is_empty() {
        let (_, n) = ClickEvent::decode(rest).unwrap();
        frame.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        count += 1;
        if count == 1000 || rest.is_empty() {
            spool::encode_frame(&mut bytes, &frame, count);
            frame.clear();
            count = 0;
        }
    }
    bytes
}

/// (m) The archive consumer on object storage under faults: SIGKILLed mid multipart upload, it
/// leaves no partial object, aborts its own unfinished upload at the next start and writes the
/// interval once; with the object store down for a minute it retries, the spool holds the
/// events, and nothing is lost or duplicated after.
#[test]
fn the_archive_on_s3_rides_out_a_kill_and_an_outage() {
    let Some(mut s3) =
        lasthop_testkit::S3::start("the_archive_on_s3_rides_out_a_kill_and_an_outage")
    else {
        return;
    };
    let site = Site::new();
    let data = site.dir.path().join("data");
    let relay = slow_relay(
        s3.endpoint().rsplit(':').next().unwrap().parse().unwrap(),
        3 << 20,
    );
    let mut flags = s3_args(&s3, &format!("http://127.0.0.1:{relay}"), "raw");
    flags.extend([
        "--clicks-archive-part-bytes".into(),
        (5u64 << 20).to_string(),
    ]);
    flags.extend(["--clicks-flush-ms".into(), "200".into()]);
    let log = site.dir.path().join("archive.log");
    let archiver = |log: &Path| {
        KillOnDrop(
            Command::new(BIN)
                .args(["clicks", "archive", "--data-dir"])
                .arg(&data)
                .args(&flags)
                .env("RUST_LOG", "info")
                .stdout(std::process::Stdio::null())
                .stderr(lasthop_testkit::logs::create(log))
                .spawn()
                .expect("clicks archive starts"),
        )
    };
    let now = now_ms();
    // The hour before this one: every event in the past.
    let hour_start = (now / 3_600_000 - 1) * 3_600_000;
    let big = 500_000u64;
    put_file(
        &site,
        "edge-a.0000000000.seg",
        &segment_of(&varied_events(7, 0, big, hour_start)),
    );
    let mut first = archiver(&log);
    wait_for(60, "a multipart upload started", || {
        lasthop_testkit::logs::read(&log)
            .contains("multipart upload started")
            .then_some(())
    });
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    // Killed mid-upload: the upload is unfinished, and no object is visible.
    assert_eq!(s3.multipart_uploads("raw/").len(), 1);
    assert!(s3.keys("raw/").is_empty(), "no partial object");

    let log2 = site.dir.path().join("archive2.log");
    let second = archiver(&log2);
    let table = s3.table("raw/day=*/hour=*/*.parquet");
    wait_for(120, "the interval written after the restart", || {
        (!s3.keys("raw/").is_empty()
            && s3
                .chdb(&format!("SELECT count() FROM {table}"), "CSV")
                .trim()
                == big.to_string())
        .then_some(())
    });
    let text = lasthop_testkit::logs::read(&log2);
    assert!(
        text.contains("aborted an unfinished multipart upload"),
        "{text}"
    );
    assert!(
        s3.multipart_uploads("raw/").is_empty(),
        "its own upload aborted"
    );
    let distinct = s3.chdb(&format!("SELECT count(DISTINCT id) FROM {table}"), "CSV");
    assert_eq!(distinct.trim(), big.to_string(), "written once");

    // The store goes down for a minute while clicks arrive: retried, held, then written once.
    s3.kill();
    put_file(
        &site,
        "edge-a.0000000001.seg",
        &segment_of(&varied_events(7, big, 1000, hour_start)),
    );
    std::thread::sleep(Duration::from_secs(60));
    let text = lasthop_testkit::logs::read(&log2);
    assert!(text.contains("archive upload failed; retrying"), "{text}");
    assert!(
        spool_dir(&site).join("edge-a.0000000001.seg").exists(),
        "held in the spool"
    );
    s3.restart();
    wait_for(120, "the outage's events written", || {
        (s3.chdb(&format!("SELECT count() FROM {table}"), "CSV")
            .trim()
            == (big + 1000).to_string())
        .then_some(())
    });
    let distinct = s3.chdb(&format!("SELECT count(DISTINCT id) FROM {table}"), "CSV");
    assert_eq!(
        distinct.trim(),
        (big + 1000).to_string(),
        "nothing lost, nothing twice"
    );
    assert!(lasthop_testkit::logs::read(&log2).contains("archive uploads recovered"));
    drop(second);
}

/// (n) Clicks through Kafka land on S3 too: objects per partition and hour, named by their
/// offsets, closed by age (a partition never ends); the query engine counts what the processor
/// counted.
#[test]
fn kafka_clicks_land_on_s3_as_parquet() {
    let Some(tansu) = Tansu::find() else {
        lasthop_testkit::skip(
            "kafka_clicks_land_on_s3_as_parquet",
            "tansu is not installed (~/.cargo/bin/tansu or PATH)",
        );
        return;
    };
    let Some(s3) = lasthop_testkit::S3::start("kafka_clicks_land_on_s3_as_parquet") else {
        return;
    };
    let topic = "lasthop.clicks";
    let broker = Tansu::on(&tansu, topic, 2);
    let site = Site::new();
    let mut args: Vec<String> = [
        "--clicks-flush-ms",
        "200",
        "--clicks-kafka",
        broker.addr.as_str(),
        "--clicks-archive-object-secs",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(s3_args(&s3, &s3.endpoint(), "k"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = site.start(&args);
    let codes = [
        create_link(&server, &site.api_key),
        create_link(&server, &site.api_key),
    ];
    let now = now_ms();
    let mut events: Vec<Ev> = (0..20)
        .map(|i| Ev::human(i, &codes[(i % 2) as usize], now - 5000 + i))
        .collect();
    events.push(Ev::human(3, &codes[1], now - 5000 + 3)); // a duplicate delivery
    events.push(Ev::human(50, &codes[0], now - 100).ua(GOOGLEBOT));
    produce(&broker.addr, topic, &events);
    wait_counts(&server, &site.api_key, &codes[0], "", 10, 1);
    wait_counts(&server, &site.api_key, &codes[1], "", 10, 0);
    let table = s3.table("k/day=*/hour=*/*.parquet");
    wait_for(30, "every Kafka click on S3", || {
        (s3.try_chdb(&format!("SELECT count(DISTINCT id) FROM {table}"), "CSV")
            .is_ok_and(|n| n.trim() == "21"))
        .then_some(())
    });
    for key in s3.keys("k/") {
        let name = key.rsplit('/').next().unwrap();
        let rest = name
            .strip_prefix("lasthop.clicks-")
            .and_then(|n| n.strip_suffix(".parquet"))
            .unwrap_or_else(|| panic!("{key}"));
        let parts: Vec<u64> = rest.split('-').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{key}");
        assert!(parts[0] < 2 && parts[1] <= parts[2], "{key}");
    }
    let csv = s3.chdb(
        &format!("SELECT code, count(DISTINCT id) FROM {table} GROUP BY code ORDER BY code"),
        "CSV",
    );
    let mut want = [(codes[0].clone(), 11), (codes[1].clone(), 10)];
    want.sort();
    let want: String = want.iter().map(|(c, n)| format!("\"{c}\",{n}\n")).collect();
    assert_eq!(csv, want);
    server.terminate();
}
