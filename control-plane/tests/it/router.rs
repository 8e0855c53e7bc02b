//! The API through the router, without a socket, on a real embedded store.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use lasthop_control::metrics::Metrics;
use lasthop_control::{
    router, ApiConfig, ApiKeys, AppState, EmbeddedStore, EmbeddedStoreConfig, Store,
};
use lasthop_core::{CodeScheme, PermutationKey};
use serde_json::{json, Value};
use tower::ServiceExt;

struct Api {
    app: axum::Router,
    fleet: Arc<lasthop_control::fleet::Fleet>,
    alice: String,
    bob: String,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Api {
    fn new() -> Api {
        Api::with(ApiConfig {
            short_base: "https://lh.test".into(),
            ..ApiConfig::default()
        })
    }

    fn with(config: ApiConfig) -> Api {
        let dir = tempfile::tempdir().unwrap();
        let key = PermutationKey::generate(16).unwrap();
        let scheme = CodeScheme::new(&key).unwrap();
        let store = EmbeddedStore::open(
            EmbeddedStoreConfig::new(dir.path().join("links.redb"), scheme),
            None,
        )
        .unwrap();
        let alice = lasthop_control::auth::create_key(dir.path(), "alice", false)
            .unwrap()
            .key;
        let bob = lasthop_control::auth::create_key(dir.path(), "bob", false)
            .unwrap()
            .key;
        let admin = lasthop_control::auth::create_key(dir.path(), "ops", true)
            .unwrap()
            .key;
        let fleet = Arc::new(lasthop_control::fleet::Fleet::new());
        let state = AppState::with_edges(
            Arc::new(store) as Arc<dyn Store>,
            ApiKeys::open(dir.path()),
            config,
            Metrics::new().unwrap(),
            Arc::clone(&fleet),
            None,
        );
        Api {
            app: router(state),
            fleet,
            alice,
            bob,
            admin,
            _dir: dir,
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Value, axum::http::HeaderMap) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, value, headers)
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
        let (s, v, _) = self
            .send(
                "POST",
                path,
                Some(key),
                &[],
                Some(body.to_string().into_bytes()),
            )
            .await;
        (s, v)
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let (s, v, _) = self.send("GET", path, Some(key), &[], None).await;
        (s, v)
    }
}

#[tokio::test]
async fn create_answers_201_and_never_deduplicates() {
    let api = Api::new();
    let body = json!({"long_url": "https://Example.com:443/a?b=1#c"});
    let (s1, a) = api.post("/v1/links", &api.alice, body.clone()).await;
    let (s2, b) = api.post("/v1/links", &api.alice, body).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_ne!(a["code"], b["code"], "same URL twice gives two codes");
    let code = a["code"].as_str().unwrap();
    assert_eq!(code.len(), 7);
    assert_eq!(a["short_url"], format!("https://lh.test/{code}"));
    assert_eq!(a["long_url"], "https://example.com/a?b=1#c");
    assert!(a["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(a["expires_at"], Value::Null);
}

#[tokio::test]
async fn get_tells_active_expired_deleted_and_never_existed_apart() {
    let api = Api::new();
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(300);
    let (s, exp) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://example.com/e", "expires_at": soon.to_rfc3339()}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{exp}");
    let code = exp["code"].as_str().unwrap().to_string();
    let (s, v) = api.get(&format!("/v1/links/{code}"), &api.alice).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("active")));
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, v) = api.get(&format!("/v1/links/{code}"), &api.alice).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("expired")));
    assert_eq!(v["long_url"], "https://example.com/e");

    let (_, del) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://example.com/d", "alias": "to-be-deleted"}),
        )
        .await;
    assert_eq!(del["code"], "to-be-deleted");
    let (s, _, _) = api
        .send(
            "DELETE",
            "/v1/links/to-be-deleted",
            Some(&api.alice),
            &[],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = api.get("/v1/links/to-be-deleted", &api.alice).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("deleted")));
    assert_eq!(v["long_url"], Value::Null, "the URL is erased");
    // The alias stays claimed forever.
    let (s, v) = api
        .post(
            "/v1/links",
            &api.bob,
            json!({"long_url": "https://example.com/x", "alias": "to-be-deleted"}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("alias_taken"))
    );
    // Deleting twice is fine.
    let (s, _, _) = api
        .send(
            "DELETE",
            "/v1/links/to-be-deleted",
            Some(&api.alice),
            &[],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    for missing in ["zzzzzzz", "never-existed", "x"] {
        let (s, v) = api.get(&format!("/v1/links/{missing}"), &api.alice).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{missing}"
        );
    }
    let (s, v) = api
        .post(
            "/v1/resolve",
            &api.bob,
            json!({"codes": [code, "to-be-deleted", "zzzzzzz"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let statuses: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["expired", "deleted", "not_found"]);
}

#[tokio::test]
async fn the_region_mints_at_most_its_max_mint_rate() {
    let api = Api::with(ApiConfig {
        max_mint_rate: 3,
        ..ApiConfig::default()
    });
    let body = json!({"long_url": "https://example.com/"});
    for key in [&api.alice, &api.bob, &api.alice] {
        assert_eq!(
            api.post("/v1/links", key, body.clone()).await.0,
            StatusCode::CREATED
        );
    }
    // A second's worth is spent, by every owner together: the next create waits, whoever asks.
    let (status, v, headers) = api
        .send(
            "POST",
            "/v1/links",
            Some(&api.bob),
            &[],
            Some(body.to_string().into_bytes()),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");
    assert!(headers.get("retry-after").is_some());
}

#[tokio::test]
async fn idempotency_key_replays_or_conflicts() {
    let api = Api::new();
    let body = json!({"long_url": "https://example.com/idem"}).to_string();
    let send = |key: &'static str, body: String| {
        let api = &api;
        async move {
            api.send(
                "POST",
                "/v1/links",
                Some(&api.alice),
                &[("idempotency-key", key)],
                Some(body.into_bytes()),
            )
            .await
        }
    };
    let (s1, a, _) = send("order-42", body.clone()).await;
    let spaced = "{ \"long_url\" : \"https://example.com/idem\" }".to_string();
    let (s2, b, h2) = send("order-42", spaced).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(a, b, "replay gives the first answer");
    assert_eq!(h2.get("idempotent-replayed").unwrap(), "true");
    let (s3, c, _) = send(
        "order-42",
        json!({"long_url": "https://example.com/other"}).to_string(),
    )
    .await;
    assert_eq!(
        (s3, c["error"]["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    let (s4, d, _) = send("order-43", body).await;
    assert_eq!(s4, StatusCode::CREATED);
    assert_ne!(d["code"], a["code"]);
    // Keys are per owner: bob's "order-42" is his own.
    let (s5, e, _) = api
        .send(
            "POST",
            "/v1/links",
            Some(&api.bob),
            &[("idempotency-key", "order-42")],
            Some(
                json!({"long_url": "https://example.com/idem"})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
    assert_eq!(s5, StatusCode::CREATED);
    assert_ne!(e["code"], a["code"]);
}

#[tokio::test]
async fn malformed_input_is_400_with_a_machine_code() {
    let api = Api::new();
    let big = format!(
        r#"{{"long_url":"https://example.com/{}"}}"#,
        "a".repeat(17 * 1024)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "invalid_json"),
        (b"".to_vec(), "invalid_json"),
        (vec![0xff, 0xfe, 0x00], "invalid_json"),
        (br#"[1,2,3]"#.to_vec(), "invalid_field"),
        (br#"{"long_url": 5}"#.to_vec(), "invalid_field"),
        (
            br#"{"long_url": "https://example.com/", "alias": 7}"#.to_vec(),
            "invalid_field",
        ),
        (
            br#"{"long_url": "https://example.com/", "surprise": 1}"#.to_vec(),
            "invalid_field",
        ),
        (br#"{}"#.to_vec(), "invalid_field"),
        (big.into_bytes(), "body_too_large"),
        (
            br#"{"long_url": "ftp://example.com/"}"#.to_vec(),
            "url_scheme",
        ),
        (
            br#"{"long_url": "javascript:alert(1)"}"#.to_vec(),
            "url_scheme",
        ),
        (
            br#"{"long_url": "https://example.com/\r\nX: y"}"#.to_vec(),
            "url_forbidden_char",
        ),
        (
            br#"{"long_url": "https://u:p@example.com/"}"#.to_vec(),
            "url_credentials",
        ),
        (
            br#"{"long_url": "http://127.0.0.1/admin"}"#.to_vec(),
            "url_forbidden_host",
        ),
        (br#"{"long_url": "https://"}"#.to_vec(), "url_invalid"),
        (
            br#"{"long_url": "https://example.com/", "alias": "short"}"#.to_vec(),
            "alias_too_short",
        ),
        (
            br#"{"long_url": "https://example.com/", "alias": "bad alias!"}"#.to_vec(),
            "alias_invalid_char",
        ),
        (
            br#"{"long_url": "https://example.com/", "alias": "123456789"}"#.to_vec(),
            "alias_all_digits",
        ),
        (
            br#"{"long_url": "https://example.com/", "alias": "admin-login"}"#.to_vec(),
            "alias_reserved",
        ),
        (
            br#"{"long_url": "https://example.com/", "expires_at": "next tuesday"}"#.to_vec(),
            "invalid_expires_at",
        ),
        (
            br#"{"long_url": "https://example.com/", "expires_at": "2001-01-01T00:00:00Z"}"#
                .to_vec(),
            "expires_in_past",
        ),
    ];
    for (body, code) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        let (s, v, _) = api
            .send("POST", "/v1/links", Some(&api.alice), &[], Some(body))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{shown}: {v}");
        assert_eq!(v["error"]["code"], code, "{shown}: {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let (s, v, _) = api
        .send(
            "POST",
            "/v1/links",
            Some(&api.alice),
            &[("idempotency-key", "")],
            Some(br#"{"long_url":"https://example.com/"}"#.to_vec()),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_idempotency_key"))
    );
    let codes: Vec<String> = (0..101).map(|i| format!("code{i:03}")).collect();
    let (s, v) = api
        .post("/v1/resolve", &api.alice, json!({"codes": codes}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("too_many_codes"))
    );
    for q in ["limit=0", "limit=abc", "limit=100000", "cursor=notanumber"] {
        let (s, v) = api.get(&format!("/v1/links?{q}"), &api.alice).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
    }
}

#[tokio::test]
async fn keys_are_required() {
    let api = Api::new();
    let body = Some(br#"{"long_url":"https://example.com/"}"#.to_vec());
    let (s, v, _) = api.send("POST", "/v1/links", None, &[], body.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    let (s, _, _) = api
        .send("POST", "/v1/links", Some("lh_wrong"), &[], body.clone())
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = api
        .send(
            "GET",
            "/v1/links",
            None,
            &[("authorization", "Basic Zm9vOmJhcg==")],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn owners_see_only_their_links_newest_first_in_pages() {
    let api = Api::new();
    let mut codes = Vec::new();
    for i in 0..7 {
        let (_, v) = api
            .post(
                "/v1/links",
                &api.alice,
                json!({"long_url": format!("https://example.com/{i}")}),
            )
            .await;
        codes.push(v["code"].as_str().unwrap().to_string());
    }
    api.post(
        "/v1/links",
        &api.bob,
        json!({"long_url": "https://example.com/bob"}),
    )
    .await;
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (s, v) = api
            .get(&format!("/v1/links?limit=3&cursor={cursor}"), &api.alice)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        for l in v["links"].as_array().unwrap() {
            assert_eq!(l["owner"], "alice");
            seen.push(l["code"].as_str().unwrap().to_string());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    codes.reverse();
    assert_eq!(seen, codes, "newest first, each once");

    let (s, v) = api.get(&format!("/v1/links/{}", codes[0]), &api.bob).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (s, _, _) = api
        .send(
            "DELETE",
            &format!("/v1/links/{}", codes[0]),
            Some(&api.bob),
            &[],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = api
        .get(&format!("/v1/links/{}", codes[0]), &api.admin)
        .await;
    assert_eq!(s, StatusCode::OK, "admins see every link");
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let api = Api::new();
    api.post(
        "/v1/links",
        &api.alice,
        json!({"long_url": "https://example.com/m"}),
    )
    .await;
    api.get("/v1/links/nothere", &api.alice).await;
    let (s, v, _) = api.send("GET", "/metrics", None, &[], None).await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().unwrap();
    assert!(
        text.contains(r#"lasthop_api_requests_total{route="/v1/links",status="201"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"lasthop_api_requests_total{route="/v1/links/{code}",status="404"} 1"#),
        "{text}"
    );
    assert!(text.contains("lasthop_create_seconds_count 1"), "{text}");
    // The embedded store's page cache holds the pages the create and the read touched.
    let cache: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("lasthop_store_cache_bytes ")?.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(cache > 0, "{text}");
}

async fn send_json(
    api: &Api,
    method: &str,
    path: &str,
    key: &str,
    body: &str,
) -> (StatusCode, Value) {
    let (s, v, _) = api
        .send(method, path, Some(key), &[], Some(body.as_bytes().to_vec()))
        .await;
    (s, v)
}

#[tokio::test]
async fn takedown_and_restore_are_for_admins() {
    let api = Api::new();
    let (_, v) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://example.com/t"}),
        )
        .await;
    let code = v["code"].as_str().unwrap().to_string();
    let takedown = format!("/v1/links/{code}/takedown");
    let restore = format!("/v1/links/{code}/restore");
    let reason = r#"{"reason":"phishing"}"#;

    for (path, body) in [(&takedown, reason), (&restore, "")] {
        let (s, v) = send_json(&api, "POST", path, &api.alice, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden")),
            "{path}"
        );
    }
    let (s, v) = send_json(
        &api,
        "POST",
        "/v1/links/zzzzzzz/takedown",
        &api.admin,
        reason,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (s, _) = send_json(
        &api,
        "POST",
        "/v1/links/no-such-alias/restore",
        &api.admin,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let long = format!(r#"{{"reason":"{}"}}"#, "x".repeat(201));
    for body in [
        r#"{"reason":""}"#,
        r#"{"reason":"   "}"#,
        r#"{"reason":"a\nb"}"#,
        long.as_str(),
    ] {
        let (s, v) = send_json(&api, "POST", &takedown, &api.admin, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_reason")),
            "{body:.40}"
        );
    }
    let (s, v) = send_json(
        &api,
        "POST",
        &takedown,
        &api.admin,
        r#"{"reason":"x","why":1}"#,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_field"))
    );
    let max = format!(r#"{{"reason":"{}"}}"#, "é".repeat(200));
    assert_eq!(
        send_json(&api, "POST", &takedown, &api.admin, &max).await.0,
        StatusCode::OK,
        "200 characters is fine"
    );

    let (s, v) = send_json(&api, "POST", &takedown, &api.admin, reason).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["takedown_reason"].as_str()),
        (Some("taken_down"), Some("phishing"))
    );
    assert_eq!(v["long_url"], "https://example.com/t");
    // The owner sees the takedown too.
    let (_, v) = api.get(&format!("/v1/links/{code}"), &api.alice).await;
    assert_eq!(v["status"], "taken_down");

    let (s, v) = send_json(
        &api,
        "POST",
        &takedown,
        &api.admin,
        r#"{"reason":"suspicious","warn":true}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["status"].as_str(), v["flagged"].as_bool()),
        (Some("active"), Some(true))
    );
    assert_eq!(v["takedown_reason"], Value::Null);

    let (s, v) = send_json(&api, "POST", &restore, &api.admin, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["status"].as_str(), v["flagged"].as_bool()),
        (Some("active"), Some(false))
    );

    let (s, _, _) = api
        .send(
            "DELETE",
            &format!("/v1/links/{code}"),
            Some(&api.alice),
            &[],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = send_json(&api, "POST", &takedown, &api.admin, reason).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("link_deleted"))
    );
}

#[tokio::test]
async fn owners_patch_expiry_and_disablement() {
    let api = Api::new();
    let (_, v) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://example.com/p"}),
        )
        .await;
    let code = v["code"].as_str().unwrap().to_string();
    let path = format!("/v1/links/{code}");

    let (s, v) = send_json(&api, "PATCH", &path, &api.bob, r#"{"disabled":true}"#).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (s, _) = send_json(&api, "PATCH", "/v1/links/zzzzzzz", &api.alice, "{}").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for (body, code) in [
        (r#"{"disabled":true,"owner":"mallory"}"#, "invalid_field"),
        (r#"{"expires_at":"tomorrow"}"#, "invalid_expires_at"),
        (
            r#"{"expires_at":"2001-01-01T00:00:00Z"}"#,
            "expires_in_past",
        ),
        (r#"{"disabled":"yes"}"#, "invalid_field"),
        ("{", "invalid_json"),
    ] {
        let (s, v) = send_json(&api, "PATCH", &path, &api.alice, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{body}"
        );
    }

    let (s, v) = send_json(
        &api,
        "PATCH",
        &path,
        &api.alice,
        r#"{"expires_at":"2100-01-01T00:00:00Z"}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["expires_at"], "2100-01-01T00:00:00.000Z");
    assert_eq!(v["status"], "active");
    let (s, v) = send_json(&api, "PATCH", &path, &api.alice, r#"{"disabled":true}"#).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "disabled");
    assert_eq!(
        v["expires_at"], "2100-01-01T00:00:00.000Z",
        "absent fields are left alone"
    );
    let (s, v) = send_json(
        &api,
        "PATCH",
        &path,
        &api.admin,
        r#"{"expires_at":null,"disabled":false}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "admins may patch any link");
    assert_eq!(
        (v["status"].as_str(), &v["expires_at"]),
        (Some("active"), &Value::Null)
    );
    let (s, v) = send_json(&api, "PATCH", &path, &api.alice, "{}").await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("active")));
}

#[tokio::test]
async fn edges_and_the_lag_alarm() {
    let api = Api::new();
    let (s, _) = api.get("/v1/edges", &api.alice).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = api.get("/v1/edges", &api.admin).await;
    assert_eq!(
        (s, v.clone()),
        (StatusCode::OK, json!({"last_seq": 0, "edges": []}))
    );
    let (s, v) = api.post("/v1/admin/snapshots", &api.admin, json!({})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("snapshots_unavailable")
        )
    );

    // An engine last heard from a minute ago, caught up then: 60 s of lag, over the 30 s alarm.
    let report = lasthop_core::feed::StatusReport {
        engine: "e1".into(),
        pop: "ams".into(),
        applied_seq: 0,
        snapshot_id: None,
        snapshot_seq: 0,
        feed_connected: false,
        safe_mode: true,
        certificates_generation: 0,
        time_ms: 0,
    };
    api.fleet
        .record(report, 0, lasthop_control::clock::now_ms() - 60_000)
        .unwrap();
    let (_, v) = api.get("/v1/edges", &api.admin).await;
    let lag = v["edges"][0]["lag_seconds"].as_f64().unwrap();
    assert!((60.0..70.0).contains(&lag), "{v}");
    assert_eq!(v["edges"][0]["safe_mode"], true);
    assert_eq!(v["edges"][0]["state"], "missing", "silent for a minute");
    let alarm = |text: &str, line: &str| text.lines().any(|l| l == line);
    let (_, text, _) = api.send("GET", "/metrics", None, &[], None).await;
    let text = text.as_str().unwrap();
    for line in [
        "lasthop_edge_engines 1",
        "lasthop_edge_lag_alarm 1",
        "lasthop_edge_worst_lag_sequences 0",
    ] {
        assert!(alarm(text, line), "{line} in\n{text}");
    }

    // Only an admin takes it off the fleet, and the alarm goes with it.
    let path = "/v1/edges/e1";
    let (s, _, _) = api.send("DELETE", path, Some(&api.alice), &[], None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = api.send("DELETE", path, Some(&api.admin), &[], None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v, _) = api.send("DELETE", path, Some(&api.admin), &[], None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_engine"))
    );
    let (_, v) = api.get("/v1/edges", &api.admin).await;
    assert_eq!(v["edges"], json!([]));
    let (_, text, _) = api.send("GET", "/metrics", None, &[], None).await;
    assert!(alarm(text.as_str().unwrap(), "lasthop_edge_lag_alarm 0"));
}

/// The QR endpoints: exactly the size asked (PNG), an SVG that says it, for the owner or an
/// admin only, sizes checked; the PNG decodes (zbarimg, where installed) to the short URL.
#[tokio::test]
async fn qr_codes_of_the_short_url() {
    let api = Api::new();
    let (s, created) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://example.com/poster"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    let code = created["code"].as_str().unwrap().to_string();
    let raw = |path: String, key: String| {
        let app = api.app.clone();
        async move {
            let req = Request::builder()
                .uri(path)
                .header("authorization", format!("Bearer {key}"))
                .body(Body::empty())
                .unwrap();
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let ctype = resp
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, ctype, bytes.to_vec())
        }
    };
    let (status, ctype, png) = raw(
        format!("/v1/links/{code}/qr.png?size=300"),
        api.alice.clone(),
    )
    .await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "image/png"));
    let reader = png::Decoder::new(std::io::Cursor::new(png.clone()))
        .read_info()
        .unwrap();
    assert_eq!((reader.info().width, reader.info().height), (300, 300));
    let (status, _, default) = raw(format!("/v1/links/{code}/qr.png"), api.admin.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let reader = png::Decoder::new(std::io::Cursor::new(default))
        .read_info()
        .unwrap();
    assert_eq!(reader.info().width, 512, "the default size");
    let (status, ctype, svg) = raw(
        format!("/v1/links/{code}/qr.svg?size=1024"),
        api.alice.clone(),
    )
    .await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "image/svg+xml"));
    assert!(String::from_utf8(svg).unwrap().contains("width=\"1024\""));
    for bad in ["63", "2049", "big"] {
        let (s, v) = api
            .get(&format!("/v1/links/{code}/qr.png?size={bad}"), &api.alice)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["code"], "invalid_size");
    }
    let (s, _) = api.get(&format!("/v1/links/{code}/qr.svg"), &api.bob).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = api.get("/v1/links/AAAAAAA/qr.png", &api.alice).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // A real decoder reads it back.
    if std::process::Command::new("zbarimg")
        .arg("--version")
        .output()
        .is_err()
    {
        lasthop_testkit::skip(
            "router::qr_codes_of_the_short_url decoding",
            "zbarimg (zbar-tools) is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("qr.png");
    std::fs::write(&file, &png).unwrap();
    let out = std::process::Command::new("zbarimg")
        .args(["--raw", "-q"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("https://lh.test/{code}")
    );
}

#[tokio::test]
async fn branded_domains_are_added_listed_patched_suspended_and_deleted() {
    let api = Api::new();
    // The default domain is listed first and cannot be claimed.
    let (s, v) = api.get("/v1/domains", &api.alice).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v["domains"],
        json!([{"domain": "lh.test", "owner": null, "default": true, "status": "active",
                "certificate": null}])
    );
    let (s, v) = api
        .post("/v1/domains", &api.alice, json!({"domain": "LH.test."}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("domain_taken"))
    );

    // A claim: canonical name, the caller's, pending until it has a certificate.
    let (s, d) = api
        .post(
            "/v1/domains",
            &api.alice,
            json!({"domain": "Go.Example.COM"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    assert_eq!(d["domain"], "go.example.com");
    assert_eq!(d["owner"], "alice");
    assert_eq!(d["status"], "pending");
    assert_eq!(d["certificate"], Value::Null);
    assert_eq!(d["default"], false);
    assert!(d["created_at"].as_str().unwrap().ends_with('Z'));
    // Taken for everyone else, and for alice again.
    for key in [&api.bob, &api.alice] {
        let (s, v) = api
            .post("/v1/domains", key, json!({"domain": "go.example.com"}))
            .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("domain_taken"))
        );
    }
    // Names that are not branded domains, with their reasons.
    for (raw, status, code, reason) in [
        ("127.0.0.1", 400, "invalid_domain", "ip_address"),
        ("co.uk", 400, "invalid_domain", "public_suffix"),
        ("go_example.com", 400, "invalid_domain", "not_a_hostname"),
        (
            "paypal-login.example",
            400,
            "domain_reserved",
            "brand:paypal",
        ),
    ] {
        let (s, v) = api
            .post("/v1/domains", &api.bob, json!({"domain": raw}))
            .await;
        assert_eq!(s.as_u16(), status, "{raw}: {v}");
        assert_eq!(v["error"]["code"], code, "{raw}");
        assert_eq!(v["error"]["reason"], reason, "{raw}");
    }
    let (s, v) = api
        .post(
            "/v1/domains",
            &api.bob,
            json!({"domain": "b.example", "owner": "alice"}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    // A name under the fleet's own domain (lh.test) is the operators' to give.
    let (s, v) = api
        .post("/v1/domains", &api.bob, json!({"domain": "www.lh.test"}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        (v["error"]["code"].as_str(), v["error"]["reason"].as_str()),
        (Some("domain_reserved"), Some("fleet_domain"))
    );
    // An admin may add a brand's name, for any owner.
    let (s, v) = api
        .post(
            "/v1/domains",
            &api.admin,
            json!({"domain": "paypal-login.example", "owner": "bob"}),
        )
        .await;
    assert_eq!(
        (s, v["owner"].as_str()),
        (StatusCode::CREATED, Some("bob")),
        "{v}"
    );

    // Each owner sees its own; an admin sees all, or one owner's.
    let names = |v: &Value| -> Vec<String> {
        v["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["domain"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, v) = api.get("/v1/domains", &api.alice).await;
    assert_eq!(names(&v), ["lh.test", "go.example.com"]);
    let (_, v) = api.get("/v1/domains", &api.bob).await;
    assert_eq!(names(&v), ["lh.test", "paypal-login.example"]);
    let (_, v) = api.get("/v1/domains", &api.admin).await;
    assert_eq!(
        names(&v),
        ["lh.test", "go.example.com", "paypal-login.example"]
    );
    let (_, v) = api.get("/v1/domains?owner=bob", &api.admin).await;
    assert_eq!(names(&v), ["lh.test", "paypal-login.example"]);
    let (s, _) = api.get("/v1/domains?owner=bob", &api.alice).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = api.get("/v1/domains/go.example.com", &api.bob).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "another owner's domain is not found"
    );
    let (s, v) = api.get("/v1/domains/GO.example.com", &api.alice).await;
    assert_eq!(
        (s, v["domain"].as_str()),
        (StatusCode::OK, Some("go.example.com"))
    );

    // Settings: absent fields stay, null clears, destinations are checked like links'.
    let patch = |key: &str, body: Value| {
        let body = body.to_string();
        let key = key.to_string();
        let api = &api;
        async move { send_json(api, "PATCH", "/v1/domains/go.example.com", &key, &body).await }
    };
    let (s, v) = patch(
        &api.alice,
        json!({"root_redirect": "https://Example.com/home",
               "hsts": {"max_age": 31536000, "include_subdomains": true, "preload": true}}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["settings"]["root_redirect"], "https://example.com/home");
    assert_eq!(v["settings"]["hsts"]["preload"], true);
    let (s, v) = patch(
        &api.alice,
        json!({"not_found_redirect": "https://example.com/404"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v["settings"]["root_redirect"], "https://example.com/home",
        "kept"
    );
    assert_eq!(
        v["settings"]["not_found_redirect"],
        "https://example.com/404"
    );
    let (s, v) = patch(&api.alice, json!({"root_redirect": null, "hsts": null})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["settings"]["root_redirect"], Value::Null);
    assert_eq!(v["settings"]["hsts"], Value::Null);
    let (s, v) = patch(
        &api.alice,
        json!({"hsts": {"max_age": 300, "preload": true}}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_hsts"))
    );
    let (s, v) = patch(&api.alice, json!({"root_redirect": "ftp://example.com/"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = patch(&api.alice, json!({"colour": "red"})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_field"))
    );
    let (s, _) = patch(&api.bob, json!({"root_redirect": null})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // A suspension: admins only; the owner can then neither change nor delete it.
    let (s, _) = api
        .post(
            "/v1/admin/domains/go.example.com/suspend",
            &api.alice,
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = api
        .post(
            "/v1/admin/domains/go.example.com/suspend",
            &api.admin,
            json!({"reason": "phishing reports"}),
        )
        .await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("suspended")),
        "{v}"
    );
    assert_eq!(v["suspension"]["reason"], "phishing reports");
    let (s, v) = patch(&api.alice, json!({"root_redirect": null})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("domain_suspended"))
    );
    let (s, v) = send_json(&api, "DELETE", "/v1/domains/go.example.com", &api.alice, "").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("domain_suspended"))
    );
    let (s, v) = api
        .post(
            "/v1/admin/domains/go.example.com/unsuspend",
            &api.admin,
            json!({}),
        )
        .await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("pending")),
        "{v}"
    );
    let (s, _) = api
        .post(
            "/v1/admin/domains/none.example/suspend",
            &api.admin,
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Deleted by its owner (not by another), then free to claim again.
    let (s, _) = send_json(&api, "DELETE", "/v1/domains/go.example.com", &api.bob, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = send_json(&api, "DELETE", "/v1/domains/go.example.com", &api.alice, "").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = api.get("/v1/domains/go.example.com", &api.alice).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api
        .post("/v1/domains", &api.bob, json!({"domain": "go.example.com"}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
}

#[tokio::test]
async fn a_domains_certificate_is_checked_then_stored_and_makes_it_active() {
    let api = Api::new();
    let pki = tempfile::tempdir().unwrap();
    let d = pki.path();
    lasthop_testkit::ca_and_server(
        d,
        "Upload CA",
        "DNS:go.example.com",
        "go.example.com",
        "srv.key",
        "srv.pem",
    );
    let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    let chain = format!("{}{}", read("srv.pem"), read("ca.pem"));
    let (s, _) = api
        .post(
            "/v1/domains",
            &api.alice,
            json!({"domain": "go.example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api
        .post("/v1/domains", &api.bob, json!({"domain": "b.example.com"}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let put = |key: &str, domain: &str, body: Value| {
        let (key, path, body) = (
            key.to_string(),
            format!("/v1/domains/{domain}/certificate"),
            body.to_string(),
        );
        let api = &api;
        async move { send_json(api, "PUT", &path, &key, &body).await }
    };
    // Refusals, each with its reason; nothing stored.
    for (domain, body, reason) in [
        (
            "go.example.com",
            json!({"certificate": "junk", "key": read("srv.key")}),
            "no_certificate",
        ),
        (
            "go.example.com",
            json!({"certificate": chain, "key": read("ca.key")}),
            "key_mismatch",
        ),
    ] {
        let (s, v) = put(&api.alice, domain, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["code"], "invalid_certificate");
        assert_eq!(v["error"]["reason"], reason);
    }
    // bob's domain is another name: the certificate does not cover it.
    let (s, v) = put(
        &api.bob,
        "b.example.com",
        json!({"certificate": chain, "key": read("srv.key")}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("wrong_name"))
    );
    // Not bob's to set on alice's domain.
    let (s, _) = put(
        &api.bob,
        "go.example.com",
        json!({"certificate": chain, "key": read("srv.key")}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, v) = api.get("/v1/domains/go.example.com", &api.alice).await;
    assert_eq!(
        (v["status"].as_str(), &v["certificate"]),
        (Some("pending"), &Value::Null)
    );

    let (s, v) = put(
        &api.alice,
        "go.example.com",
        json!({"certificate": chain, "key": read("srv.key")}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "active");
    assert_eq!(v["certificate"]["issuer"], "CN=Upload CA");
    assert_eq!(v["certificate"]["source"], "upload");
    assert!(v["certificate"]["not_after"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let text = v.to_string();
    assert!(
        !text.contains("PRIVATE KEY"),
        "the key is never shown: {text}"
    );
    let (_, v) = api.get("/v1/domains", &api.alice).await;
    let listed = v["domains"][1].clone();
    assert_eq!(
        (listed["domain"].as_str(), listed["status"].as_str()),
        (Some("go.example.com"), Some("active"))
    );
    assert!(!v.to_string().contains("PRIVATE KEY"));
}

/// Links on a branded domain: `domain` at creation (the owner's own domains only, never a
/// suspended one), aliases unique per domain, `?domain=` on every code route, `domain` and a
/// domain's `short_url` in answers, keys limited to domains, and a domain with live links not
/// deletable.
#[tokio::test]
async fn links_belong_to_a_domain() {
    let api = Api::new();
    let (s, _) = api
        .post(
            "/v1/domains",
            &api.alice,
            json!({"domain": "go.example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api
        .post("/v1/domains", &api.bob, json!({"domain": "b.example"}))
        .await;
    assert_eq!(s, StatusCode::CREATED);

    // The same alias on the default domain and on go.example.com: two links.
    let (s, plain) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://a.example/", "alias": "spring-sale"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{plain}");
    assert_eq!(plain["domain"], "lh.test");
    assert_eq!(plain["short_url"], "https://lh.test/spring-sale");
    let (s, branded) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://b.example/", "alias": "spring-sale", "domain": "Go.Example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{branded}");
    assert_eq!(
        (&branded["code"], &branded["domain"], &branded["short_url"]),
        (
            &json!("spring-sale"),
            &json!("go.example.com"),
            &json!("https://go.example.com/spring-sale")
        )
    );
    let (s, v) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://c.example/", "alias": "spring-sale", "domain": "go.example.com"}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("alias_taken"))
    );
    // Naming the default domain is the default domain.
    let (s, v) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://c.example/", "alias": "spring-sale", "domain": "lh.test"}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("alias_taken"))
    );
    // Another owner's domain, and one that does not exist: 404.
    for domain in ["b.example", "none.example"] {
        let (s, _) = api
            .post(
                "/v1/links",
                &api.alice,
                json!({"long_url": "https://c.example/", "domain": domain}),
            )
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{domain}");
    }
    // A generated code on the domain.
    let (s, generated) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://d.example/", "domain": "go.example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let code = generated["code"].as_str().unwrap().to_string();
    assert_eq!(code.len(), 7);

    // Code routes take ?domain=.
    let (s, v) = api.get("/v1/links/spring-sale", &api.alice).await;
    assert_eq!(
        (s, v["long_url"].as_str()),
        (StatusCode::OK, Some("https://a.example/"))
    );
    let (s, v) = api
        .get("/v1/links/spring-sale?domain=go.example.com", &api.alice)
        .await;
    assert_eq!(
        (s, v["long_url"].as_str()),
        (StatusCode::OK, Some("https://b.example/"))
    );
    assert_eq!(v["domain"], "go.example.com");
    let (s, _) = api.get(&format!("/v1/links/{code}"), &api.alice).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "a branded code is not the default domain's"
    );
    let (s, _) = api
        .get(
            &format!("/v1/links/{code}?domain=go.example.com"),
            &api.alice,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = api
        .get(
            "/v1/links/spring-sale/history?domain=go.example.com",
            &api.alice,
        )
        .await;
    assert_eq!(
        (s, &v["domain"]),
        (StatusCode::OK, &json!("go.example.com"))
    );
    let (s, v) = api
        .post(
            "/v1/links/spring-sale/takedown?domain=go.example.com",
            &api.admin,
            json!({"reason": "phishing"}),
        )
        .await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("taken_down")),
        "{v}"
    );
    let (_, v) = api.get("/v1/links/spring-sale", &api.alice).await;
    assert_eq!(
        v["status"], "active",
        "the default domain's link is another link"
    );
    // The owner's list shows both, each with its domain.
    let (_, v) = api.get("/v1/links", &api.alice).await;
    let domains: Vec<&str> = v["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["domain"].as_str().unwrap())
        .collect();
    assert_eq!(domains, ["go.example.com", "go.example.com", "lh.test"]);

    // A domain with live links is not deleted.
    let (s, v) = send_json(&api, "DELETE", "/v1/domains/go.example.com", &api.alice, "").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("domain_in_use")),
        "{v}"
    );
    for path in [
        format!("/v1/links/{code}?domain=go.example.com"),
        "/v1/links/spring-sale?domain=go.example.com".to_string(),
    ] {
        let (s, _) = send_json(&api, "DELETE", &path, &api.alice, "").await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{path}");
    }
    let (s, _) = send_json(&api, "DELETE", "/v1/domains/go.example.com", &api.alice, "").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
}

/// A key limited to domains (`apikey create --domain D`) acts on those alone: 403
/// `domain_not_allowed` elsewhere, on creates, code routes and the domains API.
#[tokio::test]
async fn keys_limited_to_domains() {
    let api = Api::new();
    for d in ["go.example.com", "other.example"] {
        let (s, _) = api
            .post("/v1/domains", &api.alice, json!({"domain": d}))
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let limited = lasthop_control::auth::create_key_for(
        api._dir.path(),
        "alice",
        false,
        &["go.example.com".to_string()],
    )
    .unwrap()
    .key;
    let (s, v) = api
        .post(
            "/v1/links",
            &limited,
            json!({"long_url": "https://a.example/", "domain": "go.example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    for domain in [json!(null), json!("other.example")] {
        let (s, v) = api
            .post(
                "/v1/links",
                &limited,
                json!({"long_url": "https://a.example/", "domain": domain}),
            )
            .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("domain_not_allowed")),
            "{domain}"
        );
    }
    let (_, plain) = api
        .post(
            "/v1/links",
            &api.alice,
            json!({"long_url": "https://a.example/"}),
        )
        .await;
    let (s, v) = api
        .get(
            &format!("/v1/links/{}", plain["code"].as_str().unwrap()),
            &limited,
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("domain_not_allowed"))
    );
    let (s, v) = api.get("/v1/domains/other.example", &limited).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("domain_not_allowed"))
    );
    // Its list holds its domains' links alone; the owner's full key sees both.
    let (_, v) = api.get("/v1/links", &limited).await;
    let domains: Vec<&str> = v["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["domain"].as_str().unwrap())
        .collect();
    assert_eq!(domains, ["go.example.com"]);
    let (_, v) = api.get("/v1/links", &api.alice).await;
    assert_eq!(v["links"].as_array().unwrap().len(), 2);
    // An admin key is fleet-wide: it cannot be limited.
    assert!(matches!(
        lasthop_control::auth::create_key_for(
            api._dir.path(),
            "ops",
            true,
            &["go.example.com".to_string()]
        ),
        Err(lasthop_control::auth::KeysError::AdminWithDomains)
    ));
    let (_, v) = api.get("/v1/domains", &limited).await;
    let listed: Vec<&str> = v["domains"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["default"] != true)
        .map(|d| d["domain"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["go.example.com"]);
}
