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
