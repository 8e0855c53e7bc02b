//! `lasthop-clicks`, the program a processor host installs alone: a synthetic stream into a
//! spool, then `process --exit-when-idle` drains it into rollups and the archive. (The same
//! commands under `lasthop-control clicks` are tested in the control plane's suite.)

use std::path::Path;
use std::process::Command;

const CLICKS: &str = env!("CARGO_BIN_EXE_lasthop-clicks");

fn run(args: &[&str], data: &Path) -> serde_json::Value {
    let out = Command::new(CLICKS)
        .args(args)
        .env("LASTHOP_DATA_DIR", data)
        .output()
        .expect("lasthop-clicks runs");
    assert!(
        out.status.success(),
        "lasthop-clicks {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn synth_then_process_from_the_program_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let spool = data.join("clicks").join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let spool_arg = spool.to_str().unwrap();
    let synth = run(
        &[
            "synth", "--spool", spool_arg, "--events", "3000", "--codes", "50",
        ],
        data,
    );
    assert_eq!(synth["events"], 3000);
    let duplicates = synth["duplicates"].as_u64().unwrap();
    let summary = run(&["process", "--exit-when-idle"], data);
    assert_eq!(summary["events"], 3000, "{summary}");
    let outcomes = &summary["outcomes"];
    assert_eq!(
        outcomes["duplicate"].as_u64(),
        Some(duplicates),
        "{summary}"
    );
    let counted = outcomes["human"].as_u64().unwrap() + outcomes["bot"].as_u64().unwrap();
    assert!(counted > 0 && counted <= 3000 - duplicates, "{summary}");
    // The spool is consumed, the archive written.
    let left = std::fs::read_dir(&spool).unwrap().count();
    assert_eq!(left, 0, "the processor deleted the segments it consumed");
    assert!(data.join("clicks").join("archive").is_dir());
    assert!(data.join("clicks").join("rollups.redb").is_file());
}

/// `process --metrics-listen ADDR`: the standalone processor's Prometheus metrics over HTTP,
/// counting the events of a real spool as it drains them; SIGTERM stops it.
#[test]
fn the_standalone_processor_serves_its_metrics() {
    use std::io::{BufRead, BufReader, Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let spool = data.join("clicks").join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let synth = run(
        &[
            "synth",
            "--spool",
            spool.to_str().unwrap(),
            "--events",
            "2000",
            "--codes",
            "20",
        ],
        data,
    );
    assert_eq!(synth["events"], 2000);
    let mut child = Command::new(CLICKS)
        .args(["process", "--metrics-listen", "127.0.0.1:0"])
        .env("LASTHOP_DATA_DIR", data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lasthop-clicks runs");
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("metrics listening on http://")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let events = |text: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with("lasthop_clicks_events_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    let gauge = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    };
    let mut text = String::new();
    for _ in 0..400 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        text.clear();
        s.read_to_string(&mut text).unwrap();
        if events(&text) == 2000 && gauge(&text, "lasthop_clicks_rollups_held") > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(events(&text), 2000, "{text}");
    assert!(
        text.contains("lasthop_clicks_spool_pending_bytes 0"),
        "{text}"
    );
    // What it holds: a rollup per link and day counted (20 links), each with its sketch and
    // breakdowns (at least a slot of each of the five human breakdowns).
    let held = gauge(&text, "lasthop_clicks_rollups_held");
    assert!((1..=20 * 8).contains(&held), "{text}");
    assert!(
        gauge(&text, "lasthop_clicks_rollups_held_bytes") > held * 5 * 25,
        "{text}"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    // Its summary line, then its exit.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"events\":2000"), "{rest}");
    assert!(child.wait().unwrap().success());
}

/// The same alias on the default domain and on a branded one is two links: real spool segments
/// (as an engine writes them) through `process`, then the day rebuilt from the archive by
/// `recompute`; each link's stats read by its key count its own click only, and the early-data
/// rule (one per visitor, link and minute) keeps them apart too.
#[test]
fn one_alias_on_two_domains_is_two_links() {
    use lasthop_clicks::{stats, Day, RollupStore};
    use lasthop_core::click::{spool, ClickEvent, EventId, Method, Net};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let spool_dir = data.join("clicks").join("spool");
    std::fs::create_dir_all(&spool_dir).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // A whole minute, so the early-data pair falls in one.
    let at = (now - 60_000) / 60_000 * 60_000;
    let day = Day::of_ms(at);
    let firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
    let event = |seq: u64, key: &'static str, visitor: u64, early: bool| {
        let (domain, code) = lasthop_core::split_key_str(key);
        ClickEvent {
            id: EventId::new(0xd0d0, seq),
            at_ms: at + seq,
            code,
            domain: domain.unwrap_or_default(),
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early,
            visitor,
            net: Some(Net::V4([198, 51, 100])),
            user_agent: firefox,
            referrer_host: "",
        }
    };
    let events = [
        event(1, "spring-sale", 1, false),
        event(2, "go.example.com/spring-sale", 2, false),
        // One visitor, one minute, early data: two links, so neither is the other's replay.
        event(3, "early-bird", 3, true),
        event(4, "go.example.com/early-bird", 3, true),
    ];
    let mut payload = Vec::new();
    for e in &events {
        e.encode(&mut payload);
    }
    assert_eq!(payload[0], 1, "the default domain's click is version 1");
    let mut segment = spool::SEGMENT_MAGIC.to_vec();
    spool::encode_frame(&mut segment, &payload, events.len() as u32);
    // Sealed the way an engine seals one: written elsewhere, renamed into place.
    let tmp = data.join("segment.tmp");
    std::fs::write(&tmp, &segment).unwrap();
    std::fs::rename(
        &tmp,
        spool_dir.join("edge-1-00000000000000d0.0000000000.seg"),
    )
    .unwrap();

    let summary = run(&["process", "--exit-when-idle"], data);
    let outcomes = &summary["outcomes"];
    assert_eq!(summary["events"], 4, "{summary}");
    assert_eq!(outcomes["human"], 4, "{summary}");
    assert_eq!(outcomes["invalid"], 0, "{summary}");
    assert_eq!(outcomes["early_replay"], 0, "{summary}");
    // The archive consumer beside it may have been stopped before it read the segment: a
    // run of its own reads whatever it has not (and nothing twice).
    run(&["archive", "--exit-when-idle"], data);

    let keys = [
        "spring-sale",
        "go.example.com/spring-sale",
        "early-bird",
        "go.example.com/early-bird",
    ];
    let check = |when: &str| {
        let store = RollupStore::open(&data.join("clicks").join("rollups.redb")).unwrap();
        for key in keys {
            let v = stats::stats(&store, key, day, day).unwrap();
            assert_eq!(v["clicks"], 1, "{when}: {key}: {v}");
            assert_eq!(v["visitor_days"], 1, "{when}: {key}: {v}");
            assert_eq!(v["code"], key, "{when}");
        }
        // Another domain's alias, or the alias with no domain, is nobody's.
        let none = stats::stats(&store, "lh.example/spring-sale", day, day).unwrap();
        assert_eq!(none["clicks"], 0, "{when}: {none}");
        let mut top = store.top_codes(day, day, 10).unwrap();
        top.sort();
        let mut want: Vec<(String, u64)> = keys.iter().map(|k| (k.to_string(), 1)).collect();
        want.sort();
        assert_eq!(top, want, "{when}");
    };
    check("streamed");

    // The archive keeps the domain (`d`, version 2) and a recompute keys by it again.
    let report = run(&["recompute", "--day", &day.to_string()], data);
    assert_eq!(report["events"], 4, "{report}");
    assert_eq!(report["codes"], 4, "{report}");
    assert_eq!(report["invalid_lines"], 0, "{report}");
    assert_eq!(report["early_replays"], 0, "{report}");
    check("recomputed");
}

/// A build that left a backend out (`--no-default-features`) still takes its flags, and fails
/// at start with an error naming the Cargo feature it lacks.
#[cfg(not(all(feature = "kafka", feature = "clickhouse")))]
#[test]
fn a_backend_left_out_fails_at_start_naming_its_feature() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], bool, &str); 3] = [
        (
            &["process", "--exit-when-idle", "--kafka", "127.0.0.1:9"],
            cfg!(feature = "kafka"),
            "no `kafka` feature",
        ),
        (
            &["synth", "--kafka", "127.0.0.1:9", "--events", "1"],
            cfg!(feature = "kafka"),
            "--kafka: this build of lasthop-clicks has no `kafka` feature",
        ),
        (
            &[
                "process",
                "--exit-when-idle",
                "--clicks-store",
                "clickhouse://127.0.0.1:9/lasthop",
            ],
            cfg!(feature = "clickhouse"),
            "--clicks-store clickhouse://: this build of lasthop-clicks has no `clickhouse` feature",
        ),
    ];
    for (args, built, message) in cases {
        if built {
            continue;
        }
        let out = Command::new(CLICKS)
            .args(args)
            .env("LASTHOP_DATA_DIR", dir.path())
            .output()
            .expect("lasthop-clicks runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
