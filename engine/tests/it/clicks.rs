//! Click recording at the edge: real redirects over real sockets become events in the spool
//! (what they carry, on both socket backends; country from a MaxMind database or a trusted
//! header) or go to a Kafka-protocol broker, whose outage costs redirects nothing. (Through the
//! control plane's processor into stats: the whole-system tests, `lasthop-e2e`'s `clicks`.)

use std::path::Path;
use std::time::Duration;

use lasthop_core::click::{spool, ClickEvent, Method, Net};

#[cfg(feature = "kafka")]
use lasthop_testkit::Tansu;
use lasthop_testkit::{curl, wait_until, Engine, Site};

/// Every event in the spool directory `dir`, in file order (owned copies).
pub fn spool_events(dir: &Path) -> Vec<(ClickEvent<'static>, String)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let bytes: &'static [u8] = Box::leak(std::fs::read(&f).expect("read").into_boxed_slice());
        let mut body = spool::segment_body(bytes).expect("segment header");
        while let Ok(spool::Next::Frame {
            payload,
            count,
            len,
        }) = spool::next_frame(body)
        {
            let events: Vec<_> = spool::events(payload).map(|e| e.expect("event")).collect();
            assert_eq!(events.len(), count as usize);
            out.extend(events.into_iter().map(|e| (e, f.display().to_string())));
            body = &body[len..];
        }
    }
    out
}

fn fixture() -> (Site, String) {
    let site = Site::new();
    let code = site.scheme().encode_string(1).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), "https://example.com/landing".into(), None)],
    );
    (site, code)
}

fn metric(engine: &Engine, name: &str) -> f64 {
    engine.metric(name).unwrap_or(0.0)
}

fn events_carry_the_request(io: &str) {
    let (site, code) = fixture();
    let spool_dir = site.dir.path().join("spool");
    let engine = site.start(&[
        "--io",
        io,
        "--click-spool",
        spool_dir.to_str().unwrap(),
        "--click-flush-ms",
        "20",
        "--country-header",
        "CF-IPCountry",
        "--pop",
        "fra1",
    ]);
    let url = format!("http://{}/{code}?utm_source=x", engine.addr);
    let ua = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
    let (status, _, _) = curl(&[
        "-A",
        ua,
        "-e",
        "https://News.Example.com/story?id=1",
        "-H",
        "CF-IPCountry: fr",
        &url,
    ]);
    assert_eq!(status, 302);
    let (status, _, _) = curl(&["-I", "-A", ua, &url]);
    assert_eq!(status, 302);
    // Not redirects: no events.
    assert_eq!(curl(&[&format!("http://{}/{code}+", engine.addr)]).0, 200);
    assert_eq!(curl(&[&format!("http://{}/nope", engine.addr)]).0, 404);

    wait_until(Duration::from_secs(10), "two events in the spool", || {
        spool_events(&spool_dir).len() == 2
    });
    // The two requests may land on either core, whose batches reach the spool in either order.
    let events = spool_events(&spool_dir);
    let find = |m: Method| events.iter().find(|(e, _)| e.method == m).expect("event");
    let (get, file) = find(Method::Get);
    assert!(file.ends_with(".open"), "{file}");
    assert_eq!(get.code, code);
    assert_eq!(get.pop, "fra1");
    assert_eq!(get.method, Method::Get);
    assert!(!get.tls);
    assert_eq!(get.country, Some(*b"FR"));
    assert_eq!(get.referrer_host, "news.example.com");
    assert_eq!(get.user_agent, ua);
    // The address itself never leaves the engine; its /24 does.
    assert_eq!(get.net, Some(Net::V4([127, 0, 0])));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(get.at_ms <= now && now - get.at_ms < 60_000);
    let (head, _) = find(Method::Head);
    assert_eq!(head.method, Method::Head);
    assert_eq!(head.country, None);
    assert_ne!(head.id, get.id);
    // Same address and user agent, same day: the same visitor.
    assert_eq!(head.visitor, get.visitor);

    assert_eq!(metric(&engine, "lasthop_engine_clicks_recorded_total"), 2.0);
    assert_eq!(
        metric(&engine, "lasthop_engine_clicks_without_peer_total"),
        0.0
    );
    assert_eq!(
        metric(&engine, "lasthop_engine_clicks_sent_total{sink=\"spool\"}"),
        2.0
    );
}

#[test]
fn events_carry_the_request_on_io_uring() {
    events_carry_the_request("uring");
}

#[test]
fn events_carry_the_request_on_epoll() {
    events_carry_the_request("epoll");
}

#[test]
fn country_from_a_maxmind_database() {
    use mmdb_writer::{IpVersion, Writer};
    #[derive(serde::Serialize)]
    struct Country {
        iso_code: &'static str,
    }
    #[derive(serde::Serialize)]
    struct Record {
        country: Country,
    }
    let (site, code) = fixture();
    let mut w = Writer::builder("GeoLite2-Country")
        .ip_version(IpVersion::V4)
        .build();
    w.insert(
        "127.0.0.0/8".parse::<ipnet::IpNet>().unwrap(),
        &Record {
            country: Country { iso_code: "DE" },
        },
    )
    .unwrap();
    let db = site.dir.path().join("country.mmdb");
    std::fs::write(&db, w.to_bytes().unwrap()).unwrap();
    let spool_dir = site.dir.path().join("spool");
    let engine = site.start(&[
        "--click-spool",
        spool_dir.to_str().unwrap(),
        "--click-flush-ms",
        "20",
        "--geoip-db",
        db.to_str().unwrap(),
    ]);
    for _ in 0..3 {
        assert_eq!(curl(&[&format!("http://{}/{code}", engine.addr)]).0, 302);
    }
    wait_until(Duration::from_secs(10), "three events", || {
        spool_events(&spool_dir).len() == 3
    });
    for (e, _) in spool_events(&spool_dir) {
        assert_eq!(e.country, Some(*b"DE"));
    }
}

#[test]
fn a_full_spool_drops_and_counts_and_redirects_go_on() {
    let (site, code) = fixture();
    let spool_dir = site.dir.path().join("spool");
    std::fs::create_dir_all(&spool_dir).unwrap();
    // Someone else's 2 MiB already fill the 1 MiB budget.
    std::fs::write(spool_dir.join("other.0000000000.seg"), vec![0u8; 2 << 20]).unwrap();
    let engine = site.start(&[
        "--click-spool",
        spool_dir.to_str().unwrap(),
        "--click-spool-max-mib",
        "1",
        "--click-flush-ms",
        "20",
    ]);
    for _ in 0..5 {
        assert_eq!(curl(&[&format!("http://{}/{code}", engine.addr)]).0, 302);
    }
    wait_until(Duration::from_secs(10), "drops counted", || {
        metric(
            &engine,
            "lasthop_engine_clicks_dropped_total{reason=\"sink\"}",
        ) == 5.0
    });
    assert_eq!(metric(&engine, "lasthop_engine_clicks_sink_up"), 0.0);
}

#[test]
fn clicks_off_records_nothing() {
    let (site, code) = fixture();
    let spool_dir = site.dir.path().join("spool");
    let engine = site.start(&[
        "--clicks",
        "off",
        "--click-spool",
        spool_dir.to_str().unwrap(),
    ]);
    assert_eq!(curl(&[&format!("http://{}/{code}", engine.addr)]).0, 302);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!spool_dir.exists());
    assert_eq!(engine.metric("lasthop_engine_clicks_recorded_total"), None);
}

#[cfg(feature = "kafka")]
#[test]
fn a_broker_outage_costs_redirects_nothing_and_clicks_are_counted_lost() {
    let (site, code) = fixture();
    let test = "a_broker_outage_costs_redirects_nothing_and_clicks_are_counted_lost";
    let Some(mut broker) = Tansu::start(test, "lasthop.clicks") else {
        return;
    };
    let engine = site.start(&[
        "--clicks",
        "kafka",
        "--click-kafka",
        &broker.brokers(),
        "--click-kafka-timeout-ms",
        "1500",
        "--click-flush-ms",
        "20",
        "--click-kafka-option",
        "reconnect.backoff.max.ms=200",
    ]);
    let url = format!("http://{}/{code}", engine.addr);
    let burst = |n: usize| {
        for _ in 0..n {
            assert_eq!(curl(&["-m", "2", &url]).0, 302);
        }
    };
    let sent = || metric(&engine, "lasthop_engine_clicks_sent_total{sink=\"kafka\"}");
    let lost = || {
        metric(
            &engine,
            "lasthop_engine_clicks_dropped_total{reason=\"sink\"}",
        )
    };
    burst(10);
    wait_until(Duration::from_secs(20), "10 clicks delivered", || {
        sent() == 10.0
    });

    broker.down();
    // Every redirect still answers (curl gives each 2 s; the engine never waits on the sink).
    burst(50);
    wait_until(
        Duration::from_secs(20),
        "the outage's clicks counted lost",
        || lost() == 50.0,
    );
    assert_eq!(metric(&engine, "lasthop_engine_clicks_sink_up"), 0.0);
    assert_eq!(sent(), 10.0);

    broker.up("lasthop.clicks");
    wait_until(Duration::from_secs(30), "delivery resumes", || {
        burst(1);
        sent() > 10.0
    });
    assert_eq!(metric(&engine, "lasthop_engine_clicks_sink_up"), 1.0);
    assert_eq!(lost(), 50.0);
}
