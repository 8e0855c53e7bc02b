//! The internal edge listener (DESIGN.md, "The control plane"): what engines, and only engines,
//! call. It runs on its own socket (`--edge-listen`) beside the public API so that operators can
//! keep it on a private network and so that engine traffic never shares a router, a rate limit or
//! an access log with the public API.
//!
//! Endpoints so far:
//!
//! - `GET /edge/v1/links/{code}`: the origin read-through of an engine that missed a code in its
//!   snapshot and overlay. Any link that ever existed answers 200 (deleted ones too: the engine
//!   must answer 410 for them, never 404); a code that never existed answers 404 with the error
//!   code `not_found`, which is the one answer an engine may turn into a 404 (and cache briefly).
//!   Every other failure has another error code, so an engine pointed at the wrong server never
//!   mistakes its 404s for "no such link".
//! - `/healthz`.
//!
//! The feed, snapshot downloads and edge status reports join this router in later issues.
//!
//! AUTHENTICATION: none yet. The listener defaults to loopback and must only be reachable by
//! engines; an edge token (`Authorization: Bearer <edge token>`, checked by a middleware on this
//! router) comes with the feed issue. Until then, do not expose `--edge-listen` publicly: it
//! reveals any link's destination and state by code, which the public API only shows to owners.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lasthop_core::LinkStatus;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::clock::now_ms;
use crate::store::{Store, StoredLink};

/// Longest code of any namespace (aliases are 8–64 characters, generated codes 7).
const MAX_CODE_LEN: usize = 64;

/// Shared state of the edge handlers.
#[derive(Clone)]
pub struct EdgeState {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for EdgeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeState").finish_non_exhaustive()
    }
}

impl EdgeState {
    /// The edge handlers read the same store as the public API.
    pub fn new(store: Arc<dyn Store>) -> Self {
        EdgeState { store }
    }
}

/// The answer of `GET /edge/v1/links/{code}`: everything an engine needs to answer for the code.
///
/// `status` is evaluated at the control plane's clock when answering; `expires_at_ms` travels too
/// so the engine can expire a cached answer on its own clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeLink {
    pub code: String,
    /// The destination; empty for a deleted link.
    pub long_url: String,
    pub expires_at_ms: Option<i64>,
    pub status: LinkStatus,
    /// Served through the warning interstitial.
    pub warn: bool,
}

impl EdgeLink {
    /// The edge's view of a stored link at `now_ms`.
    pub fn from_stored(s: &StoredLink, now_ms: i64) -> Self {
        let status = s.state.status(now_ms);
        EdgeLink {
            code: s.link.code.clone(),
            long_url: if status == LinkStatus::Deleted {
                String::new()
            } else {
                s.link.long_url.clone()
            },
            expires_at_ms: s.state.expires_at_ms,
            status,
            warn: s.state.warn,
        }
    }
}

/// The edge router's one error shape: a status and `{"error":{"code","message"}}`, like the API.
#[derive(Debug)]
struct EdgeError {
    status: StatusCode,
    code: &'static str,
    message: &'static str,
}

impl EdgeError {
    const NOT_FOUND: EdgeError = EdgeError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: "no link has this code",
    };
    const NO_ROUTE: EdgeError = EdgeError {
        status: StatusCode::NOT_FOUND,
        code: "no_route",
        message: "no such endpoint",
    };
    const UNAVAILABLE: EdgeError = EdgeError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "storage_unavailable",
        message: "storage is unavailable, retry later",
    };
}

impl IntoResponse for EdgeError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        (self.status, body).into_response()
    }
}

/// A code no namespace can hold never existed: answered without touching the store.
fn plausible_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= MAX_CODE_LEN
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

async fn get_link(
    State(state): State<EdgeState>,
    Path(code): Path<String>,
) -> Result<Json<EdgeLink>, EdgeError> {
    if !plausible_code(&code) {
        return Err(EdgeError::NOT_FOUND);
    }
    let store = Arc::clone(&state.store);
    let found = match tokio::task::spawn_blocking(move || store.get(&code)).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "edge lookup: store failure");
            return Err(EdgeError::UNAVAILABLE);
        }
        Err(e) => {
            tracing::error!(error = %e, "edge lookup: task failed");
            return Err(EdgeError::UNAVAILABLE);
        }
    };
    match found {
        Some(s) => Ok(Json(EdgeLink::from_stored(&s, now_ms()))),
        None => Err(EdgeError::NOT_FOUND),
    }
}

async fn fallback() -> EdgeError {
    EdgeError::NO_ROUTE
}

/// The edge router. Serve it on its own listener, never merged into the public API's.
pub fn router(state: EdgeState) -> Router {
    // An edge-token middleware goes here with the feed issue (see the module docs).
    Router::new()
        .route("/edge/v1/links/{code}", get(get_link))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(fallback)
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::{Link, LinkState};

    fn stored(state: LinkState) -> StoredLink {
        StoredLink {
            link: Link {
                code: "abcDEF1".into(),
                long_url: "https://example.com/x".into(),
                owner: "alice".into(),
                created_at_ms: 1,
            },
            state,
            seq: 1,
        }
    }

    #[test]
    fn edge_view_of_each_state() {
        let now = 1_000;
        let active = EdgeLink::from_stored(&stored(LinkState::default()), now);
        assert_eq!(active.status, LinkStatus::Active);
        assert_eq!(active.long_url, "https://example.com/x");
        assert!(!active.warn);

        let warned = EdgeLink::from_stored(
            &stored(LinkState {
                warn: true,
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(warned.status, LinkStatus::Active);
        assert!(warned.warn);

        let expired = EdgeLink::from_stored(
            &stored(LinkState {
                expires_at_ms: Some(now),
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(expired.status, LinkStatus::Expired);
        assert_eq!(expired.expires_at_ms, Some(now));

        let disabled = EdgeLink::from_stored(
            &stored(LinkState {
                disabled: true,
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(disabled.status, LinkStatus::Disabled);

        let taken = EdgeLink::from_stored(
            &stored(LinkState {
                takedown_reason: Some("phishing".into()),
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(taken.status, LinkStatus::TakenDown);
        // The reason is the public API's business, not the edge's.
        let json = serde_json::to_value(&taken).unwrap();
        assert_eq!(json["status"], "taken_down");
        assert!(json.get("takedown_reason").is_none());

        let mut gone = stored(LinkState {
            deleted: true,
            ..LinkState::default()
        });
        gone.link.long_url = String::new();
        let deleted = EdgeLink::from_stored(&gone, now);
        assert_eq!(deleted.status, LinkStatus::Deleted);
        assert_eq!(deleted.long_url, "");
    }

    #[test]
    fn plausible_codes() {
        assert!(plausible_code("abcDEF1"));
        assert!(plausible_code("my-alias_2"));
        assert!(!plausible_code(""));
        assert!(!plausible_code("has space"));
        assert!(!plausible_code("dot.dot"));
        assert!(!plausible_code(&"a".repeat(65)));
        assert!(plausible_code(&"a".repeat(64)));
    }
}
