//! The rollup store's contract, one suite run on the embedded store and on a real ClickHouse:
//! upserts, ranges, the hot-set ranking, source positions, day states and recompute's
//! generation switch; on ClickHouse also the partition positions several processors rely on.

use lasthop_analytics::{BotReason, Device, Rollup, Verdict};
use lasthop_control::clicks::store::{FlushBatch, Pos, RollupRow};
use lasthop_control::clicks::{Day, DayState, RollupStore, StoreLocation};
use lasthop_core::click::{ClickEvent, EventId, Method};
use lasthop_testkit::ClickHouse;

/// `n` clicks, every second one a bot, each from its own visitor.
fn rollup_of(n: u64, seed: u64) -> Rollup {
    let mut r = Rollup::default();
    for i in 0..n {
        let e = ClickEvent {
            id: EventId::new(seed, i),
            at_ms: 1_764_504_000_000,
            code: "Ab3dE9x",
            domain: "",
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor: seed * 1000 + i,
            net: None,
            user_agent: "Mozilla/5.0",
            referrer_host: "",
        };
        let verdict = Verdict {
            bot: (i % 2 == 1).then_some(BotReason::UserAgent),
            device: Device::Desktop,
            browser: "Firefox",
            os: "Linux",
        };
        r.add(&e, &verdict);
    }
    r
}

fn row<'a>(day: Day, code: &str, r: &'a Rollup, at: Option<Pos>) -> RollupRow<'a> {
    RollupRow::new(day, code.into(), r, at)
}

fn contract(store: &RollupStore) {
    let d = Day(20_000);
    store
        .commit(&FlushBatch {
            rollups: vec![
                row(d, "abc", &rollup_of(4, 1), None),
                row(d.next(), "abc", &rollup_of(2, 2), None),
                row(d, "other", &rollup_of(1, 3), None),
            ],
            offsets: vec![("spool/w.0000000000".into(), Some(99))],
            touched_days: vec![d, d.next()],
            closed_through: None,
        })
        .unwrap();
    assert_eq!(store.rollup(d, "abc").unwrap(), Some(rollup_of(4, 1)));
    assert_eq!(store.rollup(d, "nope").unwrap(), None);
    let range = store.range("abc", d.minus(3), d.next()).unwrap();
    assert_eq!(range.len(), 2);
    assert_eq!(range[0].day, d);
    assert_eq!(range[1].rollup, rollup_of(2, 2));
    assert_eq!(range[0].state, DayState::Open);
    // Two of its four clicks are human, each its own visitor.
    assert_eq!(
        range[0].rollup.uniques.estimate(),
        2,
        "unique visitors kept"
    );
    assert_eq!(
        store.offsets("spool/").unwrap(),
        vec![("spool/w.0000000000".to_string(), 99)]
    );
    // A second flush of the same row replaces it.
    store
        .commit(&FlushBatch {
            rollups: vec![row(d, "abc", &rollup_of(6, 1), None)],
            offsets: vec![("spool/w.0000000000".into(), Some(150))],
            touched_days: vec![d],
            closed_through: None,
        })
        .unwrap();
    assert_eq!(store.rollup(d, "abc").unwrap(), Some(rollup_of(6, 1)));
    assert_eq!(
        store.offsets("spool/").unwrap(),
        vec![("spool/w.0000000000".to_string(), 150)]
    );
    // Human clicks summed over the days asked, most first, ties by code.
    assert_eq!(
        store.top_codes(d, d.next(), 10).unwrap(),
        vec![("abc".to_string(), 4), ("other".to_string(), 1)]
    );
    assert_eq!(
        store.top_codes(d, d, 1).unwrap(),
        vec![("abc".to_string(), 3)]
    );

    // Close the first day, forget the position.
    store
        .commit(&FlushBatch {
            offsets: vec![("spool/w.0000000000".into(), None)],
            closed_through: Some(d),
            ..FlushBatch::default()
        })
        .unwrap();
    assert_eq!(store.day_state(d).unwrap(), Some(DayState::Closed));
    assert_eq!(store.day_state(d.next()).unwrap(), Some(DayState::Open));
    assert_eq!(store.day_state(d.minus(5)).unwrap(), None);
    assert!(store.offsets("spool/").unwrap().is_empty());

    // A recompute replaces the whole day: "other" is gone, and the ranking follows.
    let fresh = rollup_of(3, 4);
    assert_eq!(
        store.replace_day(d, [("abc", &fresh)].into_iter()).unwrap(),
        DayState::Recomputed
    );
    assert_eq!(store.rollup(d, "abc").unwrap(), Some(fresh.clone()));
    assert_eq!(store.rollup(d, "other").unwrap(), None);
    assert_eq!(
        store.rollup(d.next(), "abc").unwrap(),
        Some(rollup_of(2, 2))
    );
    assert_eq!(store.day_state(d).unwrap(), Some(DayState::Recomputed));
    assert_eq!(
        store.top_codes(d, d, 10).unwrap(),
        vec![("abc".to_string(), 2)]
    );
    // Recomputed twice: the later one stands.
    let again = rollup_of(5, 5);
    store.replace_day(d, [("abc", &again)].into_iter()).unwrap();
    assert_eq!(store.rollup(d, "abc").unwrap(), Some(again));
    // An open day, recomputed, stays open.
    assert_eq!(
        store
            .replace_day(d.next(), [("abc", &fresh)].into_iter())
            .unwrap(),
        DayState::Open
    );

    // Rows go by link key: the same alias on the default domain and on a branded one is two
    // rows, each read, ranked and replaced by its own key.
    let b = Day(20_020);
    let branded = "go.example.com/spring-sale";
    store
        .commit(&FlushBatch {
            rollups: vec![
                row(b, "spring-sale", &rollup_of(2, 8), None),
                row(b, branded, &rollup_of(4, 9), None),
            ],
            touched_days: vec![b],
            ..FlushBatch::default()
        })
        .unwrap();
    assert_eq!(
        store.rollup(b, "spring-sale").unwrap(),
        Some(rollup_of(2, 8))
    );
    assert_eq!(store.rollup(b, branded).unwrap(), Some(rollup_of(4, 9)));
    assert_eq!(store.rollup(b, "lh.example/spring-sale").unwrap(), None);
    let range = store.range(branded, b.minus(1), b).unwrap();
    assert_eq!((range.len(), &range[0].rollup), (1, &rollup_of(4, 9)));
    assert_eq!(
        store.top_codes(b, b, 10).unwrap(),
        vec![(branded.to_string(), 2), ("spring-sale".to_string(), 1)]
    );
    store
        .replace_day(b, [(branded, &rollup_of(6, 10))].into_iter())
        .unwrap();
    assert_eq!(store.rollup(b, branded).unwrap(), Some(rollup_of(6, 10)));
    assert_eq!(store.rollup(b, "spring-sale").unwrap(), None);

    if !store.shared() {
        return;
    }
    // Partition positions: the row that counted further wins, whoever wrote it last (a
    // processor that lost the partition and flushed late); the partition's position never
    // goes back; a code's partitions are merged in reads.
    let e = Day(20_010);
    let at = |part, next| Some(Pos { part, next });
    store
        .commit(&FlushBatch {
            rollups: vec![row(e, "k", &rollup_of(5, 6), at(3, 100))],
            offsets: vec![("kafka/t/3".into(), Some(100))],
            touched_days: vec![e],
            closed_through: None,
        })
        .unwrap();
    store
        .commit(&FlushBatch {
            rollups: vec![
                row(e, "k", &rollup_of(2, 6), at(3, 60)),
                row(e, "k", &rollup_of(1, 7), at(4, 7)),
            ],
            offsets: vec![
                ("kafka/t/3".into(), Some(60)),
                ("kafka/t/4".into(), Some(7)),
            ],
            touched_days: vec![e],
            closed_through: None,
        })
        .unwrap();
    let stored = store.stored(e, "k", Some(3)).unwrap().unwrap();
    assert_eq!(stored.rollup, rollup_of(5, 6));
    assert_eq!(stored.at, at(3, 100));
    let stored = store.stored(e, "k", Some(4)).unwrap().unwrap();
    assert_eq!((stored.rollup, stored.at), (rollup_of(1, 7), at(4, 7)));
    assert!(store.stored(e, "k", Some(5)).unwrap().is_none());
    // A processor loads a (day, partition) at once.
    let day_rows = store.stored_day(e, Some(3)).unwrap();
    assert_eq!(day_rows.len(), 1);
    let (code, row) = &day_rows[0];
    let row = row.as_ref().unwrap();
    assert_eq!(
        (&**code, &row.rollup, row.at),
        ("k", &rollup_of(5, 6), at(3, 100))
    );
    assert!(store.stored_day(e, Some(5)).unwrap().is_empty());
    assert_eq!(
        store.offsets("kafka/t/").unwrap(),
        vec![("kafka/t/3".to_string(), 100), ("kafka/t/4".to_string(), 7)]
    );
    let mut merged = rollup_of(5, 6);
    merged.merge(&rollup_of(1, 7));
    assert_eq!(store.rollup(e, "k").unwrap(), Some(merged));
    assert_eq!(
        store.top_codes(e, e, 10).unwrap(),
        vec![("k".to_string(), 4)]
    );
}

/// A processor restarted after a busy one (a flush of thousands of rows, as a soak's hour of
/// 16,000 live codes makes) writes over its predecessor's rows and position: its flushes are
/// what reads see, at once. Found by the soak: ClickHouse versions were one sequence a row, so
/// a busy processor's ran hours ahead of the clock and a restarted one's lost to them; a
/// processor SIGKILLed and restarted hid 121,254 clicks.
fn restart_contract(open: &dyn Fn() -> RollupStore) {
    let d = Day(20_100);
    let file = "spool/r.0000000001";
    {
        let busy = open();
        let rollups: Vec<Rollup> = (0..5000).map(|i| rollup_of(1, i)).collect();
        let rows = (0..5000)
            .map(|i| row(d, &format!("busy{i}"), &rollups[i as usize], None))
            .collect();
        busy.commit(&FlushBatch {
            rollups: rows,
            offsets: vec![(file.into(), Some(10))],
            touched_days: vec![d],
            closed_through: None,
        })
        .unwrap();
    }
    let restarted = open();
    for (n, at) in [(3, 20), (4, 30)] {
        restarted
            .commit(&FlushBatch {
                rollups: vec![row(d, "busy4999", &rollup_of(n, 0), None)],
                offsets: vec![(file.into(), Some(at))],
                touched_days: vec![d],
                closed_through: None,
            })
            .unwrap();
        assert_eq!(
            restarted.rollup(d, "busy4999").unwrap(),
            Some(rollup_of(n, 0)),
            "flush of {n}"
        );
        assert_eq!(
            restarted.offsets("spool/r.").unwrap(),
            vec![(file.to_string(), at)]
        );
    }
    assert_eq!(restarted.rollup(d, "busy0").unwrap(), Some(rollup_of(1, 0)));
}

#[test]
fn embedded_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = RollupStore::open_at(&StoreLocation::Embedded, dir.path()).unwrap();
    assert!(!store.shared());
    contract(&store);
    drop(store);
    let other = tempfile::tempdir().unwrap();
    restart_contract(&|| RollupStore::open_at(&StoreLocation::Embedded, other.path()).unwrap());
}

#[test]
fn clickhouse_contract() {
    let Some(ch) = ClickHouse::shared("clickhouse_contract") else {
        return;
    };
    let location: StoreLocation = ch.url("contract").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = RollupStore::open_at(&location, dir.path()).unwrap();
    assert!(store.shared());
    contract(&store);
    // Opening again (another processor) finds the same numbers, and creates nothing twice.
    let other = RollupStore::open_at(&location, dir.path()).unwrap();
    assert_eq!(
        other.rollup(Day(20_000), "abc").unwrap(),
        Some(rollup_of(5, 5))
    );
    let restarts: StoreLocation = ch.url("restarts").parse().unwrap();
    restart_contract(&|| RollupStore::open_at(&restarts, dir.path()).unwrap());
}

#[test]
fn a_store_that_is_down_is_an_error() {
    let port = lasthop_testkit::free_port();
    let location: StoreLocation = format!("clickhouse://127.0.0.1:{port}/x").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = RollupStore::open_at(&location, dir.path()).unwrap_err();
    assert!(err.to_string().contains("rollup store"), "{err}");
}

/// The scheduled recompute's lock: of several processors racing for a day, exactly one gets it.
#[test]
fn one_lock_holder() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = RollupStore::open_at(&StoreLocation::Embedded, dir.path()).unwrap();
    let ttl = std::time::Duration::from_secs(60);
    assert!(embedded.try_lock("recompute/2026-01-01", ttl).unwrap());
    let Some(ch) = ClickHouse::shared("one_lock_holder") else {
        return;
    };
    let location: StoreLocation = ch.url("locks").parse().unwrap();
    let stores: Vec<_> = (0..3)
        .map(|_| RollupStore::open_at(&location, dir.path()).unwrap())
        .collect();
    let won: Vec<bool> = std::thread::scope(|s| {
        let racers: Vec<_> = stores
            .iter()
            .map(|st| s.spawn(move || st.try_lock("recompute/2026-01-01", ttl).unwrap()))
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    // A later claimant loses while the claim lives; another lock is free.
    assert!(!stores[0].try_lock("recompute/2026-01-01", ttl).unwrap());
    assert!(stores[1].try_lock("recompute/2026-01-02", ttl).unwrap());
}

/// `clickhouses://`: the whole contract over ClickHouse's HTTPS interface, its certificate
/// verified against `--clicks-store-ca`; another CA is refused; a user's password is in no
/// message and no log line.
#[test]
fn clickhouse_over_tls() {
    let Some(ch) = ClickHouse::start_tls("clickhouse_over_tls") else {
        return;
    };
    let https = ch.https_port.expect("an HTTPS port");
    let (user, password) = lasthop_testkit::CLICKHOUSE_USER;
    let tls_url = format!("clickhouses://{user}:{password}@127.0.0.1:{https}/tls");
    let dir = tempfile::tempdir().unwrap();
    let location: StoreLocation = tls_url.parse().unwrap();
    let location = location.with_ca(Some(ch.ca())).unwrap();
    let store = RollupStore::open_at(&location, dir.path()).unwrap();
    contract(&store);
    // The rows went in over TLS: they are in the server (read here over its plain port).
    assert_ne!(ch.query("SELECT count() FROM tls.rollups").trim(), "0");

    // A CA that did not sign the server's certificate.
    let pki = tempfile::tempdir().unwrap();
    let other = lasthop_testkit::test_ca(pki.path(), "another CA", "other");
    let wrong: StoreLocation = tls_url.parse().unwrap();
    let wrong = wrong.with_ca(Some(other)).unwrap();
    let e = RollupStore::open_at(&wrong, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("UnknownIssuer") || e.contains("certificate"),
        "{e}"
    );
    assert!(!e.contains(password), "{e}");
    // A wrong password: refused by the server, the password in no message.
    let bad: StoreLocation = format!("clickhouses://{user}:wrong-{password}@127.0.0.1:{https}/tls")
        .parse()
        .unwrap();
    let e = RollupStore::open_at(&bad.with_ca(Some(ch.ca())).unwrap(), dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("clickhouse answered") && !e.contains(password),
        "{e}"
    );

    // The processor program with the flags, logging everything: counts land, the password is
    // in none of its output.
    let data = dir.path().join("data");
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let synth = std::process::Command::new(crate::harness::BIN)
        .args([
            "clicks", "synth", "--events", "200", "--codes", "5", "--spool",
        ])
        .arg(&spool)
        .output()
        .unwrap();
    assert!(synth.status.success(), "{synth:?}");
    let out = std::process::Command::new(crate::harness::BIN)
        .args(["clicks", "process", "--exit-when-idle", "--data-dir"])
        .arg(&data)
        .arg("--spool")
        .arg(&spool)
        .args([
            "--clicks-store",
            &format!("clickhouses://{user}:{password}@127.0.0.1:{https}/program"),
        ])
        .arg("--clicks-store-ca")
        .arg(ch.ca())
        .args(["--clicks-archive", "off"])
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert!(!all.contains(password), "the password was printed: {all}");
    assert_ne!(ch.query("SELECT count() FROM program.rollups").trim(), "0");
    // --clicks-store-ca beside a plain store is refused, not ignored.
    let out = std::process::Command::new(crate::harness::BIN)
        .args(["clicks", "process", "--exit-when-idle", "--data-dir"])
        .arg(&data)
        .args(["--clicks-store", &ch.url("plain"), "--clicks-store-ca"])
        .arg(ch.ca())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("only a clickhouses:// store"),
        "{stderr}"
    );
}
