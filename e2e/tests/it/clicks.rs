//! Clicks through the whole system: real redirects at an engine subscribed to a control plane
//! reach the control plane's processor, by the spool or by a Kafka-protocol broker, and become
//! its stats. (What the engine records, alone, is tested in the engine's `clicks`.)

use std::time::Duration;

use lasthop_testkit::{curl, engine_bin, wait_until, Control, Engine, Site, Tansu};

fn metric(engine: &Engine, name: &str) -> f64 {
    engine.metric(name).unwrap_or(0.0)
}

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

/// Redirects of `code` at `engine`: four by one Firefox visitor (two referrers), one by an
/// iPhone, one by Googlebot, one HEAD, one Firefox prefetch. Five human clicks, two visitors,
/// three bot clicks.
fn click_mix(engine: &Engine, code: &str) {
    let url = format!("http://{}/{code}", engine.addr);
    for referer in [
        "https://news.example.com/a",
        "https://news.example.com/b",
        "https://blog.example.org/",
        "",
    ] {
        let mut args = vec!["-A", FIREFOX];
        if !referer.is_empty() {
            args.extend(["-e", referer]);
        }
        args.push(&url);
        assert_eq!(curl(&args).0, 302);
    }
    assert_eq!(curl(&["-A", IPHONE, &url]).0, 302);
    assert_eq!(curl(&["-A", GOOGLEBOT, &url]).0, 302);
    assert_eq!(curl(&["-I", "-A", FIREFOX, &url]).0, 302);
    let prefetch = ["-A", FIREFOX, "-H", "Sec-Purpose: prefetch;prerender", &url];
    assert_eq!(curl(&prefetch).0, 302);
}

fn assert_mix_counted(control: &Control, code: &str) {
    let mut last = serde_json::Value::Null;
    wait_until(Duration::from_secs(30), "the clicks in the stats", || {
        last = control.stats(code);
        last["clicks"] == 5 && last["bot_clicks"] == 3
    });
    let s = last;
    assert_eq!(s["visitor_days"], 2, "{s}");
    assert_eq!(s["referrers"]["news.example.com"], 2, "{s}");
    assert_eq!(s["referrers"]["blog.example.org"], 1, "{s}");
    assert_eq!(s["browsers"]["Firefox"], 4, "{s}");
    assert_eq!(s["browsers"]["Safari"], 1, "{s}");
    assert_eq!(s["devices"]["mobile"], 1, "{s}");
    assert_eq!(s["os"]["iOS"], 1, "{s}");
    assert_eq!(s["bot_reasons"]["user_agent"], 1, "{s}");
    assert_eq!(s["bot_reasons"]["head"], 1, "{s}");
    assert_eq!(s["bot_reasons"]["prefetch"], 1, "{s}");
    let days = s["days"].as_array().expect("days");
    assert_eq!(days.len(), 1, "{s}");
    assert_eq!(days[0]["clicks"], 5, "{s}");
}

/// An engine subscribed to `control` (flushing clicks every 50 ms, plus `extra`) and a new link
/// it already serves.
fn edge_with_a_link(site: &Site, control: &Control, extra: &[&str]) -> (Engine, String) {
    let mut args = control.engine_args();
    args.extend(["--click-flush-ms", "50"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let engine = Engine::launch(std::process::Command::new(engine_bin()), site, &args);
    let code = control.create("https://example.com/spring-launch");
    wait_until(Duration::from_secs(10), "the link at the edge", || {
        curl(&[
            "-o",
            "/dev/null",
            &format!("http://{}/{code}+", engine.addr),
        ])
        .0 == 200
    });
    (engine, code)
}

#[test]
fn redirects_become_stats_through_the_spool() {
    let site = Site::new();
    let control = Control::start(&site, &["--clicks-flush-ms", "200"]);
    let spool_dir = control.data.join("clicks").join("spool");
    let (engine, code) = edge_with_a_link(
        &site,
        &control,
        &["--click-spool", spool_dir.to_str().unwrap()],
    );
    click_mix(&engine, &code);
    assert_mix_counted(&control, &code);
}

/// The same over TLS: the engine's producer and the processor's consumer reach the broker
/// only through a TLS front (`security.protocol=SSL`, the test CA as `ssl.ca.location`),
/// configured with `--click-kafka-option` and `--clicks-kafka-option`.
#[test]
fn redirects_become_stats_through_kafka_over_tls() {
    let site = Site::new();
    let Some(broker) = Tansu::start_tls(
        "redirects_become_stats_through_kafka_over_tls",
        "lasthop.clicks",
    ) else {
        return;
    };
    let ca = format!("ssl.ca.location={}", broker.ca().display());
    let control = Control::start(
        &site,
        &[
            "--clicks-kafka",
            &broker.brokers(),
            "--clicks-kafka-option",
            "security.protocol=SSL",
            "--clicks-kafka-option",
            &ca,
            "--clicks-flush-ms",
            "200",
        ],
    );
    let (engine, code) = edge_with_a_link(
        &site,
        &control,
        &[
            "--clicks",
            "kafka",
            "--click-kafka",
            &broker.brokers(),
            "--click-kafka-option",
            "security.protocol=SSL",
            "--click-kafka-option",
            &ca,
        ],
    );
    click_mix(&engine, &code);
    assert_mix_counted(&control, &code);
    assert_eq!(
        metric(&engine, "lasthop_engine_clicks_sent_total{sink=\"kafka\"}"),
        8.0
    );
}

/// A librdkafka property it does not know, or a value it refuses, stops the start naming it.
#[test]
fn a_bad_kafka_option_stops_the_start() {
    let site = Site::new();
    let out = std::process::Command::new(lasthop_testkit::control_bin())
        .args(["clicks", "process", "--exit-when-idle", "--data-dir"])
        .arg(site.dir.path().join("cp"))
        .args([
            "--kafka",
            "127.0.0.1:9",
            "--clicks-kafka-option",
            "security.protocol=NOPE",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("security.protocol"),
        "{stderr}"
    );
}

#[test]
fn redirects_become_stats_through_kafka() {
    let site = Site::new();
    let Some(broker) = Tansu::start("redirects_become_stats_through_kafka", "lasthop.clicks")
    else {
        return;
    };
    let control = Control::start(
        &site,
        &[
            "--clicks-kafka",
            &broker.brokers(),
            "--clicks-flush-ms",
            "200",
        ],
    );
    let (engine, code) = edge_with_a_link(
        &site,
        &control,
        &["--clicks", "kafka", "--click-kafka", &broker.brokers()],
    );
    click_mix(&engine, &code);
    assert_mix_counted(&control, &code);
    assert_eq!(
        metric(&engine, "lasthop_engine_clicks_sent_total{sink=\"kafka\"}"),
        8.0
    );
}

/// The control plane's archive flags for `s3`, objects closing a second after their first
/// event (an engine's spool segment stays open for 30 s, a Kafka partition never ends).
fn archive_on(s3: &lasthop_testkit::S3, prefix: &str) -> Vec<String> {
    vec![
        "--clicks-archive-url".into(),
        format!("s3://{}/{prefix}", s3.bucket),
        "--clicks-archive-endpoint".into(),
        s3.endpoint(),
        "--clicks-archive-credentials-file".into(),
        s3.credentials_file().display().to_string(),
        "--clicks-archive-object-secs".into(),
        "1".into(),
    ]
}

/// Every click of the mix (five human, three bot) is a row on S3, each once, for `code`.
fn assert_mix_archived(s3: &lasthop_testkit::S3, prefix: &str, code: &str) {
    let table = s3.table(&format!("{prefix}/day=*/hour=*/*.parquet"));
    let query = format!(
        "SELECT count(DISTINCT id), countIf(m = 'HEAD'), countIf(pf) FROM {table} WHERE code = '{code}'"
    );
    wait_until(
        Duration::from_secs(30),
        "the clicks on S3 (8 rows, 1 HEAD, 1 prefetch)",
        || {
            s3.try_chdb(&query, "CSV")
                .is_ok_and(|r| r.trim() == "8,1,1")
        },
    );
}

/// Real redirects through the spool land in the archive on S3 (SeaweedFS) as Parquet rows.
#[test]
fn redirects_reach_the_s3_archive_through_the_spool() {
    let Some(s3) = lasthop_testkit::S3::start("redirects_reach_the_s3_archive_through_the_spool")
    else {
        return;
    };
    let site = Site::new();
    let mut args = vec!["--clicks-flush-ms".to_string(), "200".to_string()];
    args.extend(archive_on(&s3, "spool"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let control = Control::start(&site, &args);
    let spool_dir = control.data.join("clicks").join("spool");
    let (engine, code) = edge_with_a_link(
        &site,
        &control,
        &["--click-spool", spool_dir.to_str().unwrap()],
    );
    click_mix(&engine, &code);
    assert_mix_counted(&control, &code);
    assert_mix_archived(&s3, "spool", &code);
}

/// Real redirects through Kafka land in the archive on S3 as Parquet rows.
#[test]
fn redirects_reach_the_s3_archive_through_kafka() {
    let Some(broker) = Tansu::start(
        "redirects_reach_the_s3_archive_through_kafka",
        "lasthop.clicks",
    ) else {
        return;
    };
    let Some(s3) = lasthop_testkit::S3::start("redirects_reach_the_s3_archive_through_kafka")
    else {
        return;
    };
    let site = Site::new();
    let mut args = vec![
        "--clicks-kafka".to_string(),
        broker.brokers(),
        "--clicks-flush-ms".into(),
        "200".into(),
    ];
    args.extend(archive_on(&s3, "kafka"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let control = Control::start(&site, &args);
    let (engine, code) = edge_with_a_link(
        &site,
        &control,
        &["--clicks", "kafka", "--click-kafka", &broker.brokers()],
    );
    click_mix(&engine, &code);
    assert_mix_counted(&control, &code);
    assert_mix_archived(&s3, "kafka", &code);
}
