//! The shared record on a real PostgreSQL pair: a primary with a synchronous streaming standby
//! (`pg_basebackup -R`, `synchronous_standby_names`), the control plane pointed at both hosts
//! with `target_session_attrs=read-write`, over TLS (`sslmode=verify-full`). The primary is SIGKILLed under load and the standby
//! promoted: every link that got a 201 is there with its exact URL, no code was issued twice,
//! and creates resume without restarting the control plane.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lasthop_testkit::Postgres;

use crate::harness::{call, json, Site};

#[test]
fn failover_to_a_synchronous_standby_loses_no_acknowledged_link() {
    let Some(primary) = Postgres::start("replication::failover") else {
        return;
    };
    primary.psql("CREATE DATABASE lasthop");
    let standby = Postgres::standby_of(&primary);
    // Commits wait for the standby from here on: a 201 is on both servers.
    primary.psql("ALTER SYSTEM SET synchronous_standby_names = '*'");
    primary.psql("SELECT pg_reload_conf()");
    let deadline = Instant::now() + Duration::from_secs(20);
    while primary
        .psql("SELECT sync_state FROM pg_stat_replication")
        .trim()
        != "sync"
    {
        assert!(
            Instant::now() < deadline,
            "the standby never became synchronous"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Over TLS, both hosts verified (the standby's base backup has the primary's certificate).
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/lasthop?target_session_attrs=read-write\
         &sslmode=verify-full&sslrootcert={}",
        primary.port,
        standby.port,
        primary.ca().display()
    );
    let site = Site::shared(&url);
    let server = site.start(&["--scanner", "off"]);

    let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let refused = Arc::new(Mutex::new(0u64));
    let unexpected = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|c| {
            let (acked, refused, stop, unexpected) = (
                Arc::clone(&acked),
                Arc::clone(&refused),
                Arc::clone(&stop),
                Arc::clone(&unexpected),
            );
            let (base, key) = (server.base.clone(), site.api_key.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let url = format!("https://example.com/failover/{c}/{i}");
                    let body = format!(r#"{{"long_url":"{url}"}}"#);
                    match call("POST", &format!("{base}/v1/links"), Some(&key), Some(&body)) {
                        Ok((201, body)) => {
                            let code = json(&body)["code"].as_str().unwrap().to_string();
                            acked.lock().unwrap().push((code, url));
                        }
                        Ok((503, body)) => {
                            assert!(body.contains("storage_unavailable"), "{body}");
                            *refused.lock().unwrap() += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        other => {
                            unexpected.lock().unwrap().push(format!("{other:?}"));
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            })
        })
        .collect();
    let count = || acked.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count() < 300 {
        assert!(Instant::now() < deadline, "load too small: {}", count());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The primary dies mid-load; the standby takes over.
    primary.kill();
    let at_kill = count();
    std::thread::sleep(Duration::from_millis(300));
    standby.promote();
    let promoted = Instant::now();
    let deadline = promoted + Duration::from_secs(30);
    while count() < at_kill + 200 {
        assert!(
            Instant::now() < deadline,
            "creates did not resume after the promotion: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let resumed = promoted.elapsed();
    // The connections the control plane made to the promoted standby are TLS too.
    let rows = standby.psql(
        "SELECT s.ssl, count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.datname = 'lasthop' AND a.backend_type = 'client backend' GROUP BY s.ssl",
    );
    assert!(
        rows.trim().starts_with("t|") && rows.trim().lines().count() == 1,
        "plain connections to the promoted standby: {rows}"
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    eprintln!(
        "acked {} links ({} before the kill), {} refusals during the failover, creates back {resumed:?} after the promotion",
        count(),
        at_kill,
        refused.lock().unwrap()
    );

    let unexpected = unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "answers other than 201 and 503: {unexpected:?}"
    );
    let all = acked.lock().unwrap().clone();
    for chunk in all.chunks(100) {
        let codes: Vec<&str> = chunk.iter().map(|(c, _)| c.as_str()).collect();
        let body = serde_json::json!({ "codes": codes }).to_string();
        let (status, resp) = call(
            "POST",
            &server.url("/v1/resolve"),
            Some(&site.api_key),
            Some(&body),
        )
        .unwrap();
        assert_eq!(status, 200, "{resp}");
        for ((code, url), r) in chunk.iter().zip(json(&resp)["results"].as_array().unwrap()) {
            assert_eq!(r["status"], "active", "{code} was lost in the failover");
            assert_eq!(
                r["long_url"],
                url.as_str(),
                "{code} changed in the failover"
            );
        }
    }
    let unique: HashSet<&str> = all.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(unique.len(), all.len(), "a code was issued twice");
}
