//! Erasure (S1): a deletion request obliges us to erase the destination, never to release the
//! code. After a delete the URL is found nowhere the record keeps it: no table of the store
//! (on both backends), not the API, not a feed replayed from the start, not an idempotent
//! replay of its create, not the next snapshot.

use std::process::Command;

use lasthop_testkit::Postgres;

use crate::harness::{call, get_bytes, json, FeedClient, Site, BIN};

#[test]
fn a_deleted_destination_is_found_nowhere() {
    erase(None);
}

#[test]
fn a_deleted_destination_is_found_nowhere_on_postgres() {
    let Some(pg) = Postgres::shared("erasure::on_postgres") else {
        return;
    };
    let url = pg.database("erasure");
    erase(Some(&url));
}

fn erase(store: Option<&str>) {
    let site = Site::for_store(store);
    let admin = site.new_key("ops", true);
    let server = site.start(&["--scanner", "off"]);
    let secret = "https://erase-me.example/private/report-8f3a2c";
    let body = format!(r#"{{"long_url":"{secret}"}}"#);
    let create = |key: &str| {
        ureq::post(&server.url("/v1/links"))
            .set("Authorization", &format!("Bearer {}", site.api_key))
            .set("Idempotency-Key", key)
            .set("Content-Type", "application/json")
            .send_string(&body)
            .expect("create")
            .into_string()
            .expect("body")
    };
    let first = json(&create("erase-1"));
    let code = first["code"].as_str().expect("code").to_string();
    // A snapshot from before the delete (kept until the usual pruning).
    let (status, _) = call(
        "POST",
        &server.url("/v1/admin/snapshots"),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 201);
    let (status, _) = call(
        "DELETE",
        &server.url(&format!("/v1/links/{code}")),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);

    // The API.
    let (_, got) = call(
        "GET",
        &server.url(&format!("/v1/links/{code}")),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert!(!got.contains(secret), "{got}");
    assert_eq!(json(&got)["status"], "deleted");
    let (_, listed) = call("GET", &server.url("/v1/links"), Some(&site.api_key), None).unwrap();
    assert!(!listed.contains(secret), "{listed}");
    // The idempotent replay answers with the code, not the URL.
    let replay = create("erase-1");
    assert_eq!(json(&replay)["code"], code.as_str());
    assert!(!replay.contains(secret), "{replay}");
    // A feed replayed from the beginning.
    let token = site.edge_token();
    let mut feed = FeedClient::connect(&server.edge_base, &token, "after=0&engine=erasure&pop=t");
    loop {
        let frame = feed.next();
        let text = serde_json::to_string(&frame).unwrap();
        assert!(!text.contains(secret), "in the feed: {text}");
        if matches!(frame, lasthop_core::feed::Frame::Heartbeat { .. }) {
            break;
        }
    }
    // The next snapshot.
    let (status, frame) = call(
        "POST",
        &server.url("/v1/admin/snapshots"),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 201, "{frame}");
    let path = json(&frame)["url"].as_str().expect("url").to_string();
    let (status, bytes, _) = get_bytes(&server.edge_url(&path), &token);
    assert_eq!(status, 200);
    assert!(
        !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "in the next snapshot"
    );
    server.terminate();

    // Every table of the store.
    let mut cmd = Command::new(BIN);
    cmd.args(["store", "find-text", "--data-dir"])
        .arg(site.dir.path().join("data"))
        .arg("--key-file")
        .arg(site.key_file())
        .arg(secret);
    if let Some(url) = store {
        cmd.args(["--store", url]);
    }
    let out = cmd.output().expect("find-text runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = String::from_utf8_lossy(&out.stdout);
    assert_eq!(found.trim(), "", "the URL is still in: {found}");
    // The same search finds what is there (the check can fail).
    let mut cmd = Command::new(BIN);
    cmd.args(["store", "find-text", "--data-dir"])
        .arg(site.dir.path().join("data"))
        .arg("--key-file")
        .arg(site.key_file())
        .arg(&code);
    if let Some(url) = store {
        cmd.args(["--store", url]);
    }
    let out = cmd.output().expect("find-text runs");
    let found = String::from_utf8_lossy(&out.stdout);
    assert!(found.contains("links"), "the code is kept: {found}");
}
