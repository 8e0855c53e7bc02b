//! The internal edge listener: through its router on a real store, and over a real socket beside
//! the public API (separate listeners, separate routes).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use lasthop_control::edge::{self, EdgeState};
use lasthop_control::{
    CreateOutcome, CreateRequest, DeleteOutcome, EmbeddedStore, EmbeddedStoreConfig, Store,
};
use lasthop_core::{CodeScheme, PermutationKey};
use serde_json::Value;
use tower::ServiceExt;

use crate::harness::{call, json, Site};

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
        Edge {
            app: edge::router(EdgeState::new(Arc::clone(&store))),
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
                alias: alias.map(str::to_string),
                expires_at_ms,
                idempotency: None,
                now_ms: lasthop_control::clock::now_ms(),
            })
            .unwrap();
        match out {
            CreateOutcome::Created(s) => s.link.code,
            other => panic!("create: {other:?}"),
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
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
    assert_eq!(edge.store.delete(&code).unwrap(), DeleteOutcome::Deleted);
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

    // No API key: the edge listener is for engines (an edge token comes later).
    let (status, body) = call(
        "GET",
        &server.edge_url(&format!("/edge/v1/links/{code}")),
        None,
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let got = json(&body);
    assert_eq!(got["code"], code.as_str());
    assert_eq!(got["long_url"], "https://example.com/edge");
    assert_eq!(got["status"], "active");
    assert_eq!(got["warn"], false);

    let (status, body) = call(
        "GET",
        &server.edge_url("/edge/v1/links/zzzzzzz"),
        None,
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
        Some(&site.api_key),
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
