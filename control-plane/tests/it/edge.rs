//! The internal edge listener: through its router on a real store, and over a real socket beside
//! the public API (separate listeners, separate routes), behind the edge token.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use lasthop_control::edge::{self, EdgeState};
use lasthop_control::edge_token::EdgeToken;
use lasthop_control::feed::Feed;
use lasthop_control::fleet::Fleet;
use lasthop_control::{
    CreateOutcome, CreateRequest, DeleteOutcome, EmbeddedStore, EmbeddedStoreConfig, Store,
};
use lasthop_core::{CodeScheme, PermutationKey};
use serde_json::Value;
use tower::ServiceExt;

use crate::harness::{call, json, Site};

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct Edge {
    app: axum::Router,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

impl Edge {
    fn new() -> Edge {
        let dir = tempfile::tempdir().unwrap();
        let key = PermutationKey::generate(16).unwrap();
        let scheme = CodeScheme::new(&key).unwrap();
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::open(
                EmbeddedStoreConfig::new(dir.path().join("links.redb"), scheme),
                None,
            )
            .unwrap(),
        );
        let state = EdgeState::new(
            Arc::clone(&store),
            EdgeToken::new(TOKEN),
            Feed::new(Arc::clone(&store), Duration::from_secs(1)),
            Arc::new(Fleet::new()),
            None,
        );
        Edge {
            app: edge::router(state),
            store,
            _dir: dir,
        }
    }

    fn create(&self, url: &str, alias: Option<&str>, expires_at_ms: Option<i64>) -> String {
        let out = self
            .store
            .create(CreateRequest {
                owner: "alice".into(),
                long_url: url.into(),
                domain: None,
                alias: alias.map(str::to_string),
                expires_at_ms,
                idempotency: None,
                now_ms: lasthop_control::clock::now_ms(),
                hold: None,
                options: Default::default(),
                tags: Vec::new(),
                destination: None,
                actor: lasthop_control::Actor::System,
                imported: None,
            })
            .unwrap();
        match out {
            CreateOutcome::Created(s) => s.link.code,
            other => panic!("create: {other:?}"),
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send("GET", path, Some(TOKEN), Body::empty()).await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Body,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(body).unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }
}

#[tokio::test]
async fn active_link_answers_everything_an_engine_needs() {
    let edge = Edge::new();
    let code = edge.create("https://example.com/a", None, None);
    let (status, body) = edge.get(&format!("/edge/v1/links/{code}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        serde_json::json!({
            "code": code,
            "long_url": "https://example.com/a",
            "expires_at_ms": null,
            "status": "active",
            "warn": false,
        })
    );
}

#[tokio::test]
async fn expired_and_deleted_links_still_answer_200() {
    let edge = Edge::new();
    let past = lasthop_control::clock::now_ms() - 1_000;
    let code = edge.create("https://example.com/old", Some("old-alias"), Some(past));
    assert_eq!(code, "old-alias");
    let (status, body) = edge.get("/edge/v1/links/old-alias").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "expired");
    assert_eq!(body["expires_at_ms"], past);
    assert_eq!(body["long_url"], "https://example.com/old");

    let code = edge.create("https://example.com/gone", None, None);
    assert_eq!(
        edge.store
            .delete(&code, &lasthop_control::Actor::System)
            .unwrap(),
        DeleteOutcome::Deleted
    );
    let (status, body) = edge.get(&format!("/edge/v1/links/{code}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "deleted");
    assert_eq!(body["long_url"], "");
}

#[tokio::test]
async fn never_existed_is_not_found_and_other_misses_are_not() {
    let edge = Edge::new();
    for path in [
        "/edge/v1/links/zzzzzzz",
        "/edge/v1/links/no-such-alias",
        "/edge/v1/links/bad%20code",
    ] {
        let (status, body) = edge.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["error"]["code"], "not_found", "{path}");
    }
    let long = format!("/edge/v1/links/{}", "a".repeat(65));
    assert_eq!(edge.get(&long).await.1["error"]["code"], "not_found");
    // Only "not_found" means "no such link": an unknown route says something else, so an engine
    // pointed at the wrong path never caches a false 404.
    let (status, body) = edge.get("/v1/links/abcdefg").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "no_route");
    let (status, body) = edge.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "ok\n");
}

/// The real binary: the edge line follows the api line, the two listeners serve their own routes
/// only, and SIGTERM drains both.
#[test]
fn edge_listener_over_a_real_socket() {
    let site = Site::new();
    let server = site.start(&[]);
    assert_ne!(server.base, server.edge_base);
    let (status, body) = call(
        "POST",
        &server.url("/v1/links"),
        Some(&site.api_key),
        Some(r#"{"long_url":"https://example.com/edge"}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let code = json(&body)["code"].as_str().unwrap().to_string();

    // The edge listener is for engines: the edge token, not an API key.
    let token = site.edge_token();
    let link_url = server.edge_url(&format!("/edge/v1/links/{code}"));
    let (status, body) = call("GET", &link_url, Some(&token), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let got = json(&body);
    assert_eq!(got["code"], code.as_str());
    assert_eq!(got["long_url"], "https://example.com/edge");
    assert_eq!(got["status"], "active");
    assert_eq!(got["warn"], false);

    let (status, body) = call(
        "GET",
        &server.edge_url("/edge/v1/links/zzzzzzz"),
        Some(&token),
        None,
    )
    .unwrap();
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "not_found");

    // The public API does not serve edge routes, and the edge listener not the API's.
    let (status, body) = call(
        "GET",
        &server.url(&format!("/edge/v1/links/{code}")),
        None,
        None,
    )
    .unwrap();
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "no_route");
    let (status, body) = call(
        "GET",
        &server.edge_url(&format!("/v1/links/{code}")),
        Some(&token),
        None,
    )
    .unwrap();
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "no_route");
    assert_eq!(
        call("GET", &server.edge_url("/healthz"), None, None).unwrap(),
        (200, "ok\n".to_string())
    );
    server.terminate();
}

/// An explicit --edge-listen is honoured (the harness adds :0 only when none is given).
#[test]
fn edge_listen_flag_is_honoured() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let site = Site::new();
    let server = site.start(&["--edge-listen", &addr]);
    assert_eq!(server.edge_base, format!("http://{addr}"));
    assert_eq!(
        call("GET", &server.edge_url("/healthz"), None, None)
            .unwrap()
            .0,
        200
    );
}

#[tokio::test]
async fn the_edge_token_is_required_except_for_healthz() {
    let edge = Edge::new();
    let code = edge.create("https://example.com/t", None, None);
    let path = format!("/edge/v1/links/{code}");
    for token in [None, Some("wrong"), Some(&TOKEN[..63]), Some("")] {
        let (status, body) = edge.send("GET", &path, token, Body::empty()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(body["error"]["code"], "edge_unauthorized");
    }
    let (status, _) = edge
        .send("GET", "/no-such-route", None, Body::empty())
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "unknown routes reveal nothing"
    );
    assert_eq!(edge.get(&path).await.0, StatusCode::OK);
    let (status, body) = edge.send("GET", "/healthz", None, Body::empty()).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, Value::String("ok\n".into()))
    );
}

#[tokio::test]
async fn without_a_publisher_there_is_no_snapshot() {
    let edge = Edge::new();
    let (status, body) = edge.get("/edge/v1/snapshots/latest").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("no_snapshot"))
    );
    let (status, body) = edge
        .get("/edge/v1/snapshots/0000000000000001-abcdef01")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_snapshot"))
    );
}

#[tokio::test]
async fn status_reports_are_validated() {
    let edge = Edge::new();
    let good = serde_json::json!({
        "engine": "host-1:8080", "pop": "ams", "applied_seq": 0,
        "feed_connected": true, "safe_mode": false, "time_ms": 1,
    });
    let post = |body: String| edge.send("POST", "/edge/v1/status", Some(TOKEN), Body::from(body));
    assert_eq!(post(good.to_string()).await.0, StatusCode::NO_CONTENT);
    let mut bad_id = good.clone();
    bad_id["snapshot_id"] = "../../etc/passwd".into();
    let mut bad_pop = good.clone();
    bad_pop["pop"] = "".into();
    for (body, code) in [
        (bad_id.to_string(), "invalid_report"),
        (bad_pop.to_string(), "invalid_engine"),
        ("not json".to_string(), "invalid_report"),
        (" ".repeat(4097), "body_too_large"),
    ] {
        let (status, v) = post(body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code))
        );
    }
}

#[tokio::test]
async fn certificates_are_not_sent_in_clear_to_a_peer_off_loopback() {
    // A plain listener, and no peer address known: refused.
    let edge = Edge::new();
    let (status, body) = edge.get("/edge/v1/certificates").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "plain_certificate_distribution");

    // By peer address and policy: loopback always; another address over TLS or when allowed.
    let ask = |policy: edge::CertificatePolicy, peer: &str| {
        let app = edge::router(EdgeState::from_parts(edge::EdgeParts {
            store: Arc::clone(&edge.store),
            token: EdgeToken::new(TOKEN),
            feed: Feed::new(Arc::clone(&edge.store), Duration::from_secs(1)),
            fleet: Arc::new(Fleet::new()),
            snapshots: None,
            client_certs: false,
            peering: None,
            certificates: policy,
            legacy: None,
        }));
        let mut req = Request::builder()
            .uri("/edge/v1/certificates")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap();
        let addr: std::net::SocketAddr = peer.parse().unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        async move { app.oneshot(req).await.unwrap().status() }
    };
    let plain = edge::CertificatePolicy {
        over_tls: false,
        allow_plain: false,
    };
    assert_eq!(ask(plain, "127.0.0.1:4000").await, StatusCode::OK);
    assert_eq!(ask(plain, "[::1]:4000").await, StatusCode::OK);
    assert_eq!(ask(plain, "198.18.0.5:4000").await, StatusCode::FORBIDDEN);
    let allowed = edge::CertificatePolicy {
        over_tls: false,
        allow_plain: true,
    };
    assert_eq!(ask(allowed, "198.18.0.5:4000").await, StatusCode::OK);
    let tls = edge::CertificatePolicy {
        over_tls: true,
        allow_plain: false,
    };
    assert_eq!(ask(tls, "198.18.0.5:4000").await, StatusCode::OK);
}

/// A domain's certificate over the edge listener (loopback, plain HTTP), with the generation
/// the feed announces; a suspension takes it out and moves the generation.
#[test]
fn certificates_reach_the_edge_listener_with_their_generation() {
    let site = Site::new();
    let server = site.start(&[]);
    let admin = site.new_key("ops", true);
    let (status, body) = call(
        "POST",
        &server.url("/v1/domains"),
        Some(&site.api_key),
        Some(r#"{"domain":"go.example.com"}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let pki = tempfile::tempdir().unwrap();
    lasthop_testkit::ca_and_server(
        pki.path(),
        "Edge CA",
        "DNS:go.example.com",
        "go.example.com",
        "srv.key",
        "srv.pem",
    );
    let read = |f: &str| std::fs::read_to_string(pki.path().join(f)).unwrap();
    let upload = serde_json::json!({"certificate": read("srv.pem"), "key": read("srv.key")});
    let (status, body) = call(
        "PUT",
        &server.url("/v1/domains/go.example.com/certificate"),
        Some(&site.api_key),
        Some(&upload.to_string()),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");

    let token = site.edge_token();
    let fetch = |q: &str| {
        call(
            "GET",
            &server.edge_url(&format!("/edge/v1/certificates{q}")),
            Some(&token),
            None,
        )
        .unwrap()
    };
    let (status, body) = fetch("");
    assert_eq!(status, 200, "{body}");
    let got = json(&body);
    let generation = got["generation"].as_u64().unwrap();
    assert!(
        generation >= 2,
        "a create and a certificate moved it: {got}"
    );
    let certs = got["certificates"].as_array().unwrap();
    assert_eq!(certs.len(), 1);
    assert_eq!(certs[0]["domain"], "go.example.com");
    assert_eq!(certs[0]["chain"], read("srv.pem"));
    assert_eq!(certs[0]["key"], read("srv.key"));
    assert_eq!(fetch(&format!("?generation={generation}")).0, 304);
    assert_eq!(fetch("?generation=1").0, 200);
    // Without the token: nothing.
    let (status, _) = call("GET", &server.edge_url("/edge/v1/certificates"), None, None).unwrap();
    assert_eq!(status, 401);

    // The feed announces the generation after its snapshot frame.
    let feed_frames = |secs: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "--max-time", secs, "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(server.edge_url("/edge/v1/feed?engine=e1&pop=p1"))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|f| f["type"] == "certificates")
            .map(|f| f["generation"].as_u64().unwrap())
            .collect::<Vec<u64>>()
    };
    assert_eq!(feed_frames("2"), [generation]);

    // Suspended, the domain's certificate is no longer sent, and the generation moved.
    let (status, body) = call(
        "POST",
        &server.url("/v1/admin/domains/go.example.com/suspend"),
        Some(&admin),
        Some(r#"{"reason":"phishing"}"#),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = fetch(&format!("?generation={generation}"));
    assert_eq!(status, 200, "{body}");
    let got = json(&body);
    let suspended = got["generation"].as_u64().unwrap();
    assert!(suspended > generation, "{generation} -> {suspended}");
    assert_eq!(got["certificates"], serde_json::json!([]));
    assert_eq!(feed_frames("2"), [suspended]);
    // A subscriber hears of a change while it is subscribed (within a heartbeat interval).
    let (watching, unsuspend) = std::thread::scope(|s| {
        let watching = s.spawn(|| feed_frames("4"));
        std::thread::sleep(Duration::from_millis(1500));
        let unsuspend = call(
            "POST",
            &server.url("/v1/admin/domains/go.example.com/unsuspend"),
            Some(&admin),
            None,
        )
        .unwrap();
        (watching.join().unwrap(), unsuspend)
    });
    assert_eq!(unsuspend.0, 200, "{}", unsuspend.1);
    assert_eq!(watching.len(), 2, "{watching:?}");
    assert_eq!(watching[0], suspended);
    assert!(watching[1] > suspended, "{watching:?}");
    server.terminate();
}
