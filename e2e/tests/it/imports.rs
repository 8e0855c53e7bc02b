//! Moving in (issue 44) over real sockets: `lasthop-control links import` against a serving
//! control plane keeps every old code answering at an engine, whatever its shape (legacy
//! codes of 1-6 characters, with `_`/`-`, all digits; an alias's shape; a 7-character base62
//! code far above the high-water mark, claimed), from the overlay and then from a snapshot
//! with its legacy set; a scanner's junk of a legacy code's shape still costs no lookup; a
//! re-run imports nothing; listed destinations and malformed rows are refused and reported;
//! the export is the generic import format.

use std::process::Command;

use lasthop_testkit::{
    control_bin, curl, in_sync, location_of, subscribed_engine, wait_until, Control, Engine, Site,
};

/// Status and `Location` of `GET /code` at `engine`.
fn get(engine: &Engine, code: &str) -> (u16, String) {
    location_of(&[&format!("http://{}/{code}", engine.addr)])
}

/// The old codes and where they went; `zZ9yX8w` is a 7-character base62 code whose counter
/// value under the test key is far above any mark (62^7 codes, a few thousand issued).
const KEPT: [(&str, &str); 6] = [
    ("a", "https://old.example/one-letter"),
    ("Q9", "https://old.example/two"),
    ("abc-_", "https://old.example/punct"),
    ("12345678", "https://old.example/digits"),
    ("spring-sale-2019", "https://old.example/alias-shaped"),
    ("zZ9yX8w", "https://old.example/seven"),
];

/// `lasthop-control links import ARGS...`: whether it succeeded, its stdout and its stderr.
fn links_import(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(control_bin())
        .args(["links", "import"])
        .args(args)
        .output()
        .expect("run links import");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `file` (`--from format`) imported for `mover` through `control`'s API, with `extra`.
fn import_as(
    control: &Control,
    format: &str,
    file: &std::path::Path,
    extra: &[&str],
) -> (bool, String, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--from".as_ref(), format.as_ref(), file.as_ref()];
    for a in [
        "--owner",
        "mover",
        "--api",
        &control.api,
        "--api-key",
        &control.admin_key,
    ]
    .into_iter()
    .chain(extra.iter().copied())
    {
        args.push(a.as_ref());
    }
    links_import(&args)
}

/// `mover`'s links exported in `format` by an admin through `control`'s API.
fn export(control: &Control, format: &str) -> String {
    let (status, _, body) = curl(&[
        "-H",
        &format!("Authorization: Bearer {}", control.admin_key),
        &format!(
            "{}/v1/exports/links?format={format}&owner=mover",
            control.api
        ),
    ]);
    assert_eq!(status, 200, "{body}");
    body
}

fn import(control: &Control, file: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
    import_as(control, "csv", file, extra)
}

#[test]
fn old_codes_keep_answering_and_a_rerun_imports_nothing() {
    let site = Site::new();
    let list = site.dir.path().join("list.txt");
    std::fs::write(&list, "listed.example\n").unwrap();
    let control = Control::start(&site, &["--reputation-list", list.to_str().unwrap()]);
    let e = subscribed_engine(&site, &control, &[]);
    wait_until(std::time::Duration::from_secs(10), "in sync", || {
        in_sync(&e)
    });
    // Issue a few codes first, so the mark is not zero.
    for i in 0..3 {
        control.create(&format!("https://native.example/{i}"));
    }

    let file = site.dir.path().join("old.csv");
    let mut csv = String::from("code,long_url,created_at,tags,expires_at\n");
    for (code, url) in KEPT {
        csv.push_str(&format!("{code},{url},2019-03-04T05:06:07Z,moved|old,\n"));
    }
    csv.push_str("bad1,https://listed.example/phish,,,\n");
    csv.push_str("a b,https://old.example/space,,,\n");
    std::fs::write(&file, &csv).unwrap();

    let (ok, out, err) = import(&control, &file, &["--dry-run"]);
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("6 would import"), "{out}{err}");
    assert_eq!(get(&e, "a").0, 404, "a dry run writes nothing");

    let (ok, out, err) = import(&control, &file, &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("6 imported, 0 already there, 2 refused"),
        "{out}{err}"
    );
    assert!(
        err.contains("bad1") && err.contains("destination_blocked"),
        "{err}"
    );
    assert!(err.contains("malformed code"), "{err}");

    // From the overlay (the feed), then from a snapshot with its legacy set.
    for (code, url) in KEPT {
        wait_until(
            std::time::Duration::from_secs(10),
            "the import at the engine",
            || get(&e, code) == (302, url.to_string()),
        );
    }
    let (status, v) = control.call("GET", "/v1/links/abc-_", &control.admin_key, None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["created_at"], "2019-03-04T05:06:07.000Z", "{v}");
    assert_eq!(v["tags"], serde_json::json!(["moved", "old"]), "{v}");
    control.publish_and_swap(&e);
    for (code, url) in KEPT {
        assert_eq!(
            get(&e, code),
            (302, url.to_string()),
            "{code} from the snapshot"
        );
    }

    // A scanner's codes of a legacy code's shape: 404, answered before any table.
    let before = e
        .metric("lasthop_engine_answers_total{layer=\"invalid\"}")
        .unwrap_or(0.0);
    let origin_before = e
        .metric("lasthop_engine_answers_total{layer=\"origin\"}")
        .unwrap_or(0.0);
    for junk in ["b", "Q8", "abc-x", "87654321", "zz_zz"] {
        assert_eq!(get(&e, junk).0, 404, "{junk}");
    }
    let after = e
        .metric("lasthop_engine_answers_total{layer=\"invalid\"}")
        .unwrap_or(0.0);
    assert!(
        after - before >= 5.0,
        "junk answered without a lookup: {before} -> {after}"
    );
    assert_eq!(
        e.metric("lasthop_engine_answers_total{layer=\"origin\"}")
            .unwrap_or(0.0),
        origin_before,
        "no read-through for junk"
    );

    // A re-run imports nothing.
    let (ok, out, err) = import(&control, &file, &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("0 imported, 6 already there, 2 refused"),
        "{out}{err}"
    );

    // The export is the generic import format, and holds every imported code.
    let body = export(&control, "csv");
    assert!(
        body.starts_with("code,long_url,created_at,tags,expires_at\n"),
        "{body}"
    );
    for (code, url) in KEPT {
        assert!(body.contains(&format!("{code},{url},")), "{code} in {body}");
    }
    let exported = site.dir.path().join("exported.csv");
    std::fs::write(&exported, &body).unwrap();
    let (ok, out, err) = import(&control, &exported, &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("0 imported, 6 already there, 0 refused"),
        "{out}{err}"
    );
}

/// `--data-dir`: a stopped embedded store takes the import (with the reputation list the
/// command is given), and the control plane serves the old codes once it is back; the old
/// click totals are kept apart in the stats with `--with-clicks`.
#[test]
fn a_stopped_store_takes_an_import() {
    let site = Site::new();
    let list = site.dir.path().join("list.txt");
    std::fs::write(&list, "listed.example\n").unwrap();
    let mut control = Control::start(&site, &[]);
    control.create("https://native.example/");
    control.kill();

    let file = site.dir.path().join("old.csv");
    std::fs::write(
        &file,
        "code,long_url\nold1,https://old.example/1\nZz_9,https://old.example/2\n\
         bad2,https://listed.example/x\n",
    )
    .unwrap();
    let key_file = site.key_file();
    let (ok, stdout, stderr) = links_import(&[
        "--from".as_ref(),
        "csv".as_ref(),
        file.as_ref(),
        "--owner".as_ref(),
        "mover".as_ref(),
        "--data-dir".as_ref(),
        control.data.as_ref(),
        "--key-file".as_ref(),
        key_file.as_ref(),
        "--reputation-list".as_ref(),
        list.as_ref(),
    ]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.starts_with("2 imported, 0 already there, 1 refused"),
        "{stdout}{stderr}"
    );
    assert!(
        stderr.contains("bad2") && stderr.contains("destination_blocked"),
        "{stderr}"
    );

    control.restart();
    let e = subscribed_engine(&site, &control, &[]);
    wait_until(std::time::Duration::from_secs(10), "in sync", || {
        in_sync(&e)
    });
    assert_eq!(get(&e, "old1"), (302, "https://old.example/1".into()));
    assert_eq!(get(&e, "Zz_9"), (302, "https://old.example/2".into()));
}

/// An old shortener the test runs: `/old-N` answers 301 to `https://moved.example/N`, `/gone`
/// 404, `/slow` a 301 after 3 s, `/phish` a 301 to a listed host, `/rel` a scheme-relative
/// `Location`; every ask is counted by path.
struct OldProvider {
    url: String,
    asked: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
}

impl OldProvider {
    fn start() -> OldProvider {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let counts = std::sync::Arc::clone(&asked);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let counts = std::sync::Arc::clone(&counts);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let n = conn.read(&mut buf).unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let path = head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("/")
                        .trim_start_matches('/')
                        .to_string();
                    *counts.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
                    let redirect = |to: &str| {
                        format!(
                            "HTTP/1.1 301 Moved Permanently\r\nLocation: {to}\r\n\
                             Content-Length: 0\r\nConnection: close\r\n\r\n"
                        )
                    };
                    let answer = match path.as_str() {
                        p if p.starts_with("old-") => {
                            redirect(&format!("https://moved.example/{}", &p[4..]))
                        }
                        "slow" => {
                            std::thread::sleep(std::time::Duration::from_secs(3));
                            redirect("https://moved.example/slow")
                        }
                        "phish" => redirect("https://listed.example/kit"),
                        "rel" => redirect("//moved.example/rel"),
                        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_string(),
                    };
                    let _ = conn.write_all(answer.as_bytes());
                });
            }
        });
        OldProvider { url, asked }
    }

    fn asked(&self, path: &str) -> u32 {
        self.asked.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// The lazy fallback: a domain points at lasthop before its links move. The first visit of an
/// old code asks the old provider, imports the link (owned by the domain's owner) and answers
/// it; later visits never ask again; its 404s are remembered; a slow provider costs at most the
/// timeout; a listed destination is refused; a code of a generated code's shape is never asked
/// about; a branded domain's own `legacy_fallback` applies to its Host.
#[test]
fn the_old_provider_answers_first_visits() {
    let old = OldProvider::start();
    let site = Site::new();
    let list = site.dir.path().join("list.txt");
    std::fs::write(&list, "listed.example\n").unwrap();
    let template = format!("{}/{{code}}", old.url);
    let control = Control::start(
        &site,
        &[
            "--reputation-list",
            list.to_str().unwrap(),
            "--legacy-fallback",
            &template,
            "--legacy-fallback-timeout-ms",
            "200",
        ],
    );
    let e = subscribed_engine(&site, &control, &[]);
    wait_until(std::time::Duration::from_secs(10), "in sync", || {
        in_sync(&e)
    });

    // A legacy-shaped code and an alias-shaped one, each asked once.
    for (code, to) in [
        ("old-1", "https://moved.example/1"),
        ("old-abcdefgh", "https://moved.example/abcdefgh"),
    ] {
        assert_eq!(get(&e, code), (302, to.to_string()), "{code}");
        assert_eq!(get(&e, code), (302, to.to_string()), "{code} again");
        assert_eq!(old.asked(code), 1, "{code} asked once");
        let (status, v) = control.call(
            "GET",
            &format!("/v1/links/{code}"),
            &control.admin_key,
            None,
        );
        assert_eq!((status, v["owner"].as_str()), (200, Some("legacy")), "{v}");
    }
    // A relative Location is resolved against the URL asked.
    assert_eq!(
        get(&e, "rel"),
        (302, "http://moved.example/rel".to_string())
    );

    // Its 404s: answered 404, remembered (asked once for several visits).
    for _ in 0..3 {
        assert_eq!(get(&e, "gone").0, 404);
    }
    assert_eq!(old.asked("gone"), 1);

    // A slow provider: the ask gives up at the timeout (under the engine's origin timeout),
    // and the visitor gets a 404, not a wait.
    let started = std::time::Instant::now();
    assert_eq!(get(&e, "slow").0, 404);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // A destination the lists refuse is never served nor imported.
    assert_eq!(get(&e, "phish").0, 404);
    let (status, _) = control.call("GET", "/v1/links/phish", &control.admin_key, None);
    assert_eq!(status, 404);

    // A code of a generated code's shape is the generator's: never asked about.
    assert_eq!(get(&e, "zZ9yX8w").0, 404);
    assert_eq!(old.asked("zZ9yX8w"), 0);

    // A branded domain with its own old provider.
    let (status, v) = control.call(
        "POST",
        "/v1/domains",
        &control.admin_key,
        Some(serde_json::json!({"domain": "go.example.com"})),
    );
    assert_eq!(status, 201, "{v}");
    let (status, v) = control.call(
        "PATCH",
        "/v1/domains/go.example.com",
        &control.admin_key,
        Some(serde_json::json!({"legacy_fallback": format!("{}/old-{{code}}", old.url)})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["settings"]["legacy_fallback"],
        format!("{}/old-{{code}}", old.url),
        "{v}"
    );
    let (status, v) = control.call(
        "PATCH",
        "/v1/domains/go.example.com",
        &control.admin_key,
        Some(serde_json::json!({"legacy_fallback": "ftp://old.example/"})),
    );
    assert_eq!(status, 400, "{v}");
    let branded = |path: &str| {
        location_of(&[
            "-H",
            "Host: go.example.com",
            &format!("http://{}/{path}", e.addr),
        ])
    };
    wait_until(
        std::time::Duration::from_secs(10),
        "the branded fallback",
        || branded("b7") == (302, "https://moved.example/b7".to_string()),
    );
    let (status, v) = control.call(
        "GET",
        "/v1/links/b7?domain=go.example.com",
        &control.admin_key,
        None,
    );
    assert_eq!(
        (status, v["domain"].as_str()),
        (200, Some("go.example.com")),
        "{v}"
    );
    assert_eq!(
        control.call("GET", "/metrics", &control.admin_key, None).0,
        200
    );
}

/// The fixture of `--from NAME` (`control-plane/tests/fixtures/import/`).
fn fixture(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../control-plane/tests/fixtures/import")
        .join(file)
}

/// Every format's fixture (written from its documentation: unicode titles, duplicate codes, a
/// listed destination, codes of every length, `_`/`-`, all digits, malformed rows; the counts
/// are the fixtures' README's) imported at a serving control plane: every row the parser reads
/// is imported but the listed destination's and a duplicate code's second; the export then
/// lists them, and each of its codes redirects at an engine, from the feed and then from a
/// snapshot; the old click totals show in the stats; a re-run imports nothing.
#[test]
fn every_formats_codes_answer_at_an_engine() {
    // (format, file, rows the parser reads, records it refuses, rows whose destination a
    // create refuses besides the listed one: a URL with a space in it)
    for (format, file, rows, refused, unservable) in [
        ("bitly", "bitly.json", 32, 4, 0),
        ("bitly", "bitly.csv", 29, 4, 1),
        ("yourls", "yourls.csv", 27, 4, 0),
        ("kutt", "kutt.json", 28, 3, 0),
        ("shlink", "shlink.csv", 26, 4, 0),
        ("dub", "dub.csv", 26, 5, 0),
        ("csv", "generic.csv", 30, 4, 1),
    ] {
        let path = fixture(file);
        let site = Site::new();
        let list = site.dir.path().join("list.txt");
        std::fs::write(&list, "listed.example\n").unwrap();
        let control = Control::start(&site, &["--reputation-list", list.to_str().unwrap()]);
        let e = subscribed_engine(&site, &control, &[]);
        wait_until(std::time::Duration::from_secs(10), "in sync", || {
            in_sync(&e)
        });
        let run = || {
            let (ok, stdout, stderr) = import_as(&control, format, &path, &["--with-clicks"]);
            assert!(ok, "{file}: {stdout}{stderr}");
            (stdout, stderr)
        };
        let (stdout, stderr) = run();
        // All but the listed row, a duplicate code's second (another destination: a collision)
        // and the unservable ones.
        let imported = rows - 2 - unservable;
        assert!(
            stdout.starts_with(&format!(
                "{imported} imported, 0 already there, {} refused",
                refused + 2 + unservable
            )),
            "{file}: {stdout}{stderr}"
        );
        assert!(stderr.contains(": collision: "), "{file}: {stderr}");
        assert!(
            stderr.contains("destination_blocked (list:list)"),
            "{file}: {stderr}"
        );
        // The export holds what was imported: each of its codes answers at the engine.
        let body = export(&control, "ndjson");
        let exported: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(exported.len(), imported, "{file}: {body}");
        // (code, the status it answers: an old expiry in the past answers 410, as it did)
        let codes: Vec<(String, u16)> = exported
            .iter()
            .map(|v| {
                let expired = v["status"] == "expired";
                (
                    v["code"].as_str().unwrap().to_string(),
                    if expired { 410 } else { 302 },
                )
            })
            .collect();
        assert!(
            codes.iter().filter(|(_, s)| *s == 302).count() >= 20,
            "{file}"
        );
        for (code, want) in &codes {
            wait_until(
                std::time::Duration::from_secs(10),
                &format!("{file}: {code} at the engine"),
                || get(&e, code).0 == *want,
            );
        }
        control.publish_and_swap(&e);
        for (code, want) in &codes {
            assert_eq!(get(&e, code).0, *want, "{file}: {code} from the snapshot");
        }
        // YOURLS carries click totals: kept apart in the stats.
        if format == "yourls" {
            let with_clicks = codes
                .iter()
                .filter(|(code, _)| {
                    let (_, v) = control.call(
                        "GET",
                        &format!("/v1/links/{code}/stats"),
                        &control.admin_key,
                        None,
                    );
                    v["imported_clicks"].as_u64().is_some_and(|n| n > 0)
                })
                .count();
            assert!(
                with_clicks > 20,
                "{file}: {with_clicks} links with imported clicks"
            );
        }
        let (again, _) = run();
        assert!(
            again.starts_with("0 imported"),
            "{file}: {again} (first: {stdout})"
        );
    }
}
