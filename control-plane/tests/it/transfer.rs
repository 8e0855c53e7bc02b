//! `export` and `import` between the two backends: embedded → PostgreSQL → embedded is exact
//! (every record the same; each backend keeps its own key order), the moved record serves (its
//! links, states and keys), and bad imports are refused without touching the target.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};

use lasthop_testkit::Postgres;

use crate::harness::{call, json, Site, BIN};

fn cli(args: &[&str], dir: Option<&Path>, key: &Path, store: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--key-file").arg(key);
    if let Some(dir) = dir {
        cmd.arg("--data-dir").arg(dir);
    }
    if let Some(url) = store {
        cmd.args(["--store", url]);
    }
    cmd.output().expect("lasthop-control runs")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn refused(out: Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "accepted; wanted a refusal with {want:?}"
    );
    assert!(err.contains(want), "wanted {want:?} in: {err}");
}

/// The lines of an export without its header (whose time and source differ).
fn lines_of(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("export file");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header = lines.remove(0);
    assert!(header.contains(r#""type":"header""#), "{header}");
    lines
}

/// Every link and its history as the API shows them, and the owner's listing (newest first,
/// from the owner index import rebuilds).
fn view(
    server: &crate::harness::Server,
    codes: &[String],
    admin: &str,
    owner: &str,
) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for code in codes {
        for path in [
            format!("/v1/links/{code}"),
            format!("/v1/links/{code}/history"),
        ] {
            out.push(call("GET", &server.url(&path), Some(admin), None).expect("get"));
        }
    }
    out.push(call("GET", &server.url("/v1/links?limit=100"), Some(owner), None).expect("list"));
    out
}

fn post(url: &str, key: &str, body: &str) -> (u16, String) {
    call("POST", url, Some(key), Some(body)).expect("request")
}

#[test]
fn export_and_import_move_the_record_between_backends_exactly() {
    let Some(pg) = Postgres::shared("transfer::round_trip") else {
        return;
    };
    let mut site = Site::new();
    let admin = site.new_key("ops", true);
    let bob = site.new_key("bob", false);
    let gone = site.new_key("carol", false);
    let server = site.start(&["--scanner", "off"]);
    let mut codes = Vec::new();
    for i in 0..30 {
        let (status, body) = post(
            &server.url("/v1/links"),
            &site.api_key,
            &format!(r#"{{"long_url":"https://example.com/moved/{i}?q=é"}}"#),
        );
        assert_eq!(status, 201, "{body}");
        codes.push(json(&body)["code"].as_str().unwrap().to_string());
    }
    let (status, body) = post(
        &server.url("/v1/links"),
        &bob,
        r#"{"long_url":"https://bob.example/a","alias":"bobs-alias","expires_at":"2031-01-01T00:00:00Z"}"#,
    );
    assert_eq!(status, 201, "{body}");
    // States of every kind, with their audit records.
    let (status, body) = post(
        &server.url(&format!("/v1/links/{}/takedown", codes[0])),
        &admin,
        r#"{"reason":"phishing"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &server.url(&format!("/v1/links/{}/takedown", codes[1])),
        &admin,
        r#"{"reason":"suspicious","warn":true}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        "PATCH",
        &server.url(&format!("/v1/links/{}", codes[2])),
        Some(&site.api_key),
        Some(r#"{"disabled":true}"#),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = call(
        "DELETE",
        &server.url(&format!("/v1/links/{}", codes[3])),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);
    let (status, body) = post(
        &server.url("/v1/reports"),
        &site.api_key,
        &format!(r#"{{"code":"{}","reason":"phishing"}}"#, codes[4]),
    );
    assert!(status == 201 || status == 202, "{status} {body}");
    let (status, body) = post(
        &server.url("/v1/admin/owners/bob/suspend"),
        &admin,
        r#"{"reason":"spam run","takedown_links":true}"#,
    );
    assert_eq!(status, 200, "{body}");
    let gone_id = call("GET", &server.url("/v1/admin/apikeys"), Some(&admin), None)
        .map(|(_, b)| json(&b))
        .unwrap()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["owner"] == "carol")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = call(
        "DELETE",
        &server.url(&format!("/v1/admin/apikeys/{gone_id}")),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);
    // Branded domains, with settings and a suspension.
    let (status, body) = post(
        &server.url("/v1/domains"),
        &site.api_key,
        r#"{"domain":"go.example.com"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        "PATCH",
        &server.url("/v1/domains/go.example.com"),
        Some(&site.api_key),
        Some(r#"{"root_redirect":"https://example.com/","hsts":{"max_age":600}}"#),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let pki = tempfile::tempdir().unwrap();
    lasthop_testkit::ca_and_server(
        pki.path(),
        "Transfer CA",
        "DNS:go.example.com",
        "go.example.com",
        "srv.key",
        "srv.pem",
    );
    let read = |f: &str| std::fs::read_to_string(pki.path().join(f)).unwrap();
    let (status, body) = call(
        "PUT",
        &server.url("/v1/domains/go.example.com/certificate"),
        Some(&site.api_key),
        Some(
            &serde_json::json!({"certificate": read("srv.pem"), "key": read("srv.key")})
                .to_string(),
        ),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["status"], "active");
    let (status, body) = post(
        &server.url("/v1/domains"),
        &admin,
        r#"{"domain":"b.example","owner":"bob"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(
        &server.url("/v1/admin/domains/b.example/suspend"),
        &admin,
        r#"{"reason":"spam run"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let domains = |cp: &crate::harness::Server| {
        call("GET", &cp.url("/v1/domains"), Some(&admin), None).unwrap()
    };
    let domains_before = domains(&server);
    assert_eq!(domains_before.0, 200);
    codes.push("bobs-alias".to_string());
    let before = view(&server, &codes, &admin, &site.api_key);
    let shown = before.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(shown, before.len(), "every view answers: {before:?}");
    server.terminate();

    let key = site.key_file();
    let dir = site.dir.path().to_path_buf();
    let dir = dir.as_path();
    let data = dir.join("data");
    let a = dir.join("a.ndjson");
    let b = dir.join("b.ndjson");
    let c = dir.join("c.ndjson");
    let said = ok(
        cli(
            &["export", "--out", a.to_str().unwrap()],
            Some(&data),
            &key,
            None,
        ),
        "export from embedded",
    );
    assert!(said.contains("exported 31 links"), "{said}");
    let url = pg.database("transfer");
    ok(
        cli(
            &["import", "--in", a.to_str().unwrap()],
            None,
            &key,
            Some(&url),
        ),
        "import into postgres",
    );
    ok(
        cli(
            &["export", "--out", b.to_str().unwrap()],
            None,
            &key,
            Some(&url),
        ),
        "export from postgres",
    );
    let back = dir.join("back");
    ok(
        cli(
            &["import", "--in", b.to_str().unwrap()],
            Some(&back),
            &key,
            None,
        ),
        "import into embedded",
    );
    ok(
        cli(
            &["export", "--out", c.to_str().unwrap()],
            Some(&back),
            &key,
            None,
        ),
        "export from embedded again",
    );
    // Exact: the same records both ways; through the same backend, the same bytes.
    let (a_lines, b_lines, c_lines) = (lines_of(&a), lines_of(&b), lines_of(&c));
    assert_eq!(
        a_lines, c_lines,
        "embedded → postgres → embedded changed the file"
    );
    let sorted = |l: &[String]| {
        let mut l = l.to_vec();
        l.sort();
        l
    };
    assert_eq!(sorted(&a_lines), sorted(&b_lines));
    let kinds: HashSet<String> = a_lines
        .iter()
        .map(|l| json(l)["type"].as_str().unwrap().to_string())
        .collect();
    for kind in [
        "counter", "link", "audit", "code_set", "report", "owner", "domain", "api_key", "end",
    ] {
        assert!(kinds.contains(kind), "no {kind} line in {a_lines:#?}");
    }
    let text = std::fs::read_to_string(&a).unwrap();
    assert!(
        !text.contains("https://example.com/moved/3?"),
        "a deleted URL was exported"
    );
    assert!(
        !text.contains(&site.api_key),
        "an API key's secret was exported"
    );

    // The moved record serves: links, states, keys (a revoked one stays revoked), and new
    // codes never repeat an imported one.
    site.store = Some(url.clone());
    let cp = site.start_in("pg", &["--scanner", "off"]);
    assert_eq!(view(&cp, &codes, &admin, &site.api_key), before);
    assert_eq!(domains(&cp), domains_before);
    let (status, body) = call("GET", &cp.url("/v1/links"), Some(&bob), None).unwrap();
    assert_eq!(status, 401, "bob is suspended: {body}");
    let (status, _) = call("GET", &cp.url("/v1/links"), Some(&gone), None).unwrap();
    assert_eq!(status, 401, "carol's key was revoked");
    let (status, body) = call(
        "GET",
        &cp.url(&format!("/v1/links/{}/history", codes[0])),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("phishing"), "{body}");
    for i in 0..20 {
        let (status, body) = post(
            &cp.url("/v1/links"),
            &site.api_key,
            &format!(r#"{{"long_url":"https://example.com/after/{i}"}}"#),
        );
        assert_eq!(status, 201, "{body}");
        let code = json(&body)["code"].as_str().unwrap().to_string();
        assert!(!codes.contains(&code), "{code} issued twice");
    }
    cp.terminate();

    // Refusals, each leaving the target as it was.
    refused(
        cli(
            &["import", "--in", a.to_str().unwrap()],
            None,
            &key,
            Some(&url),
        ),
        "import writes only into an empty store",
    );
    let other_key = dir.join("other-key");
    let out = Command::new(BIN)
        .args(["keygen", "--out"])
        .arg(&other_key)
        .output()
        .unwrap();
    assert!(out.status.success());
    let fresh = dir.join("fresh");
    refused(
        cli(
            &["import", "--in", a.to_str().unwrap()],
            Some(&fresh),
            &other_key,
            None,
        ),
        "permutation key",
    );
    let all = std::fs::read_to_string(&a).unwrap();
    let cut = dir.join("cut.ndjson");
    let lines: Vec<&str> = all.lines().collect();
    std::fs::write(&cut, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    refused(
        cli(
            &["import", "--in", cut.to_str().unwrap()],
            Some(&fresh),
            &key,
            None,
        ),
        "truncated",
    );
    assert!(
        !fresh.join("links.redb").exists(),
        "a refused import left a store behind"
    );
    let pg_fresh = pg.database("transfer_cut");
    refused(
        cli(
            &["import", "--in", cut.to_str().unwrap()],
            None,
            &key,
            Some(&pg_fresh),
        ),
        "truncated",
    );
    let db = pg_fresh.rsplit('/').next().unwrap();
    assert_eq!(pg.psql_on(db, "SELECT count(*) FROM links").trim(), "0");
}
