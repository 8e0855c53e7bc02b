//! The internal edge listener (docs/ARCHITECTURE.md, "The control plane"; core/FEED.md is
//! the wire contract): what engines, and only engines, call. It runs on its own socket
//! (`--edge-listen`) beside the public API so that operators can keep it on a private network and
//! so that engine traffic never shares a router, a rate limit or an access log with the public API.
//!
//! Endpoints:
//!
//! - `GET /edge/v1/links/{code}`: the origin read-through of an engine that missed a code in its
//!   snapshot and overlay. Any link that ever existed answers 200 (deleted ones too: the engine
//!   must answer 410 for them, never 404); a code that never existed answers 404 with the error
//!   code `not_found`, which is the one answer an engine may turn into a 404 (and cache briefly).
//!   Every other failure has another error code, so an engine pointed at the wrong server never
//!   mistakes its 404s for "no such link".
//! - `GET /edge/v1/feed?after=SEQ&engine=ID&pop=NAME`: the feed ([`crate::feed`]).
//! - `GET /edge/v1/snapshots/latest` and `GET /edge/v1/snapshots/{id}`: the newest snapshot's
//!   frame, and any kept snapshot's bytes ([`crate::publish`]); `{id}.zst` is its zstd copy.
//!   Both answer single `Range` requests (206, 416), so an engine resumes a broken download.
//! - `POST /edge/v1/status`: an engine's status report ([`crate::fleet`]).
//! - `GET /edge/v1/certificates[?generation=G]`: every branded domain's certificate and private
//!   key (suspended domains and expired certificates left out) at the store's domains
//!   generation, which the feed's `certificates` frames announce; 304 when the engine already
//!   holds `G`. Keys leave only over TLS, or over plain HTTP to a loopback peer, unless
//!   `--allow-plain-certificate-distribution`: otherwise 403 `plain_certificate_distribution`.
//! - `/peer/v1/...`: what other regions call ([`crate::peers`], docs/ARCHITECTURE.md,
//!   "Regions"), with the peer token only: `changes` (own changes with their audit records),
//!   `links/{code}` (read-through), `links/{code}/state` (a forwarded change), `aliases` (a
//!   forwarded alias create), `keys`, `owners` (suspensions) and `stats/{code}` (rollups).
//! - `/healthz`.
//!
//! AUTHENTICATION: every request but `/healthz` must carry `Authorization: Bearer <edge token>`
//! ([`crate::edge_token`], `DATA_DIR/edge.token`), checked in constant time by a middleware on
//! the whole router (unknown paths included, so the listener reveals nothing to a caller without
//! it); a missing or wrong token answers 401 `edge_unauthorized`. The token guards a listener
//! that reveals any link's destination and state by code, which the public API only shows to
//! owners: keep `--edge-listen` on a private network as well. Over plain HTTP the token and every
//! answer travel in clear; `--edge-tls-cert`/`--edge-tls-key` serve the listener over TLS
//! ([`crate::edge_tls`]), and `--edge-client-ca` makes a client certificate signed by that CA
//! required and sufficient (the token is then optional).

use std::io::Read as _;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lasthop_core::feed::{valid_name, EdgeLink, FrameError, StatusReport};
use serde::Deserialize;
use serde_json::json;

use crate::clock::now_ms;
use crate::edge_token::EdgeToken;
use crate::error_chain::ErrorChain;
use crate::feed::Feed;
use crate::fleet::{Fleet, FleetError};
use crate::publish::Publisher;
use crate::reply::{offload, ApiError};
use crate::store::{Store, StoredLink};

/// Largest status report body.
pub const MAX_STATUS_BODY: usize = 4 * 1024;
/// Bytes per chunk of a snapshot download, and chunks read ahead of the client.
const DOWNLOAD_CHUNK: usize = 256 * 1024;
const DOWNLOAD_AHEAD: usize = 4;

struct Inner {
    store: Arc<dyn Store>,
    token: EdgeToken,
    feed: Feed,
    fleet: Arc<Fleet>,
    snapshots: Option<Arc<Publisher>>,
    /// Every connection presented a client certificate our client CA signed
    /// (`--edge-client-ca`): it stands in for the token.
    client_certs: bool,
    /// This region and the token peer regions present (`--peer-token-file`), with
    /// `--peer`: the `/peer/` endpoints answer only to it, and it opens nothing else.
    peer: Option<(u32, EdgeToken)>,
    /// This region's `--max-mint-rate`, told to peer regions.
    mint_rate: Option<u64>,
    /// The API keys peer regions copy (`GET /peer/v1/keys`), where they are a file.
    keys: Option<Arc<crate::auth::ApiKeys>>,
    /// The other regions (`--peer`): a code of another region's range not found here is
    /// asked of that region before any 404.
    peers: Option<Arc<crate::peers::Peers>>,
    /// This region's click rollups, which peer regions read (`GET /peer/v1/stats/{code}`).
    rollups: Option<Arc<crate::clicks::RollupStore>>,
    certificates: CertificatePolicy,
    legacy: Option<Arc<crate::legacy::LegacyFallback>>,
}

/// Shared state of the edge handlers.
#[derive(Clone)]
pub struct EdgeState(Arc<Inner>);

impl std::fmt::Debug for EdgeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeState").finish_non_exhaustive()
    }
}

/// Every part of the edge listener's state, each built once by the server's composition root
/// and handed over here whole.
pub struct EdgeParts {
    /// The same store the public API reads.
    pub store: Arc<dyn Store>,
    /// The token engines present.
    pub token: EdgeToken,
    pub feed: Feed,
    /// Where status reports are recorded.
    pub fleet: Arc<Fleet>,
    /// What snapshots were published (without one, the snapshot endpoints answer 404
    /// `no_snapshot`/`unknown_snapshot`).
    pub snapshots: Option<Arc<Publisher>>,
    /// Every connection presented a client certificate the client CA signed
    /// (`--edge-client-ca`): requests without a token are admitted (a token presented is still
    /// checked).
    pub client_certs: bool,
    /// With peer regions: the `/peer/` endpoints of this region, what they answer to and read.
    pub peering: Option<Peering>,
    /// Where certificates and their keys may be sent.
    pub certificates: CertificatePolicy,
    /// The lazy fallback to old shorteners (issue 44): a read-through miss on a domain with
    /// `legacy_fallback` asks the old provider.
    pub legacy: Option<Arc<crate::legacy::LegacyFallback>>,
}

/// Whether `GET /edge/v1/certificates` may answer a caller: always over TLS; over plain HTTP
/// to a loopback peer, or to any peer with `allow_plain`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CertificatePolicy {
    pub over_tls: bool,
    pub allow_plain: bool,
}

/// What the `/peer/` endpoints need (`--peer-token-file` with `--peer`).
pub struct Peering {
    /// This region.
    pub region: u32,
    /// The token peer regions present; it opens nothing but `/peer/`.
    pub token: EdgeToken,
    /// The other regions: a code of another region's range not found here is asked of that
    /// region before any 404.
    pub peers: Option<Arc<crate::peers::Peers>>,
    /// This region's `--max-mint-rate`, told to peer regions.
    pub mint_rate: u64,
    /// The API keys peer regions copy (`GET /peer/v1/keys`).
    pub keys: Arc<crate::auth::ApiKeys>,
    /// This region's click rollups (`GET /peer/v1/stats/{code}`), where it runs a processor.
    pub rollups: Option<Arc<crate::clicks::RollupStore>>,
}

impl std::fmt::Debug for EdgeParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeParts")
            .field("client_certs", &self.client_certs)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Peering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peering")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl EdgeState {
    /// The edge handlers read the same store as the public API, accept `token`, stream `feed`,
    /// record reports into `fleet` and serve what `snapshots` published (without one, the
    /// snapshot endpoints answer 404 `no_snapshot`/`unknown_snapshot`); no peer regions, the
    /// token required.
    pub fn new(
        store: Arc<dyn Store>,
        token: EdgeToken,
        feed: Feed,
        fleet: Arc<Fleet>,
        snapshots: Option<Arc<Publisher>>,
    ) -> Self {
        EdgeState::from_parts(EdgeParts {
            store,
            token,
            feed,
            fleet,
            snapshots,
            client_certs: false,
            peering: None,
            certificates: CertificatePolicy::default(),
            legacy: None,
        })
    }

    /// Every part given: the full server.
    pub fn from_parts(parts: EdgeParts) -> Self {
        let EdgeParts {
            store,
            token,
            feed,
            fleet,
            snapshots,
            client_certs,
            peering,
            certificates,
            legacy,
        } = parts;
        let (peer, peers, mint_rate, keys, rollups) = match peering {
            Some(p) => (
                Some((p.region, p.token)),
                p.peers,
                Some(p.mint_rate).filter(|&r| r > 0),
                Some(p.keys),
                p.rollups,
            ),
            None => (None, None, None, None, None),
        };
        EdgeState(Arc::new(Inner {
            store,
            token,
            feed,
            fleet,
            snapshots,
            client_certs,
            peer,
            mint_rate,
            keys,
            peers,
            rollups,
            certificates,
            legacy,
        }))
    }
}

/// Runs a store (or keys file) call on the blocking pool: a failure, or the task's, is logged
/// as `what` and answers 503 `storage_unavailable`.
async fn on_store<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    offload(what, f)
        .await
        .map_err(|_| ApiError::unavailable())?
        .map_err(|e| {
            tracing::error!(error = %e, "{what}: store failure");
            ApiError::unavailable()
        })
}

/// The edge's view of a stored link at `now_ms` (the wire type is core's, shared with engines).
fn edge_link(s: &StoredLink, now_ms: i64) -> EdgeLink {
    EdgeLink::new(&s.link.code, s.state.url(&s.link), &s.state, now_ms)
}

async fn get_link(
    State(state): State<EdgeState>,
    Path(code): Path<String>,
) -> Result<Json<EdgeLink>, ApiError> {
    // A code no namespace can hold never existed: answered without touching the store.
    if !lasthop_core::plausible_key(code.as_bytes()) {
        return Err(ApiError::not_found());
    }
    let store = Arc::clone(&state.0.store);
    let asked = code.clone();
    let found = on_store("edge lookup", move || store.get(&asked)).await?;
    if let Some(s) = found {
        return Ok(Json(edge_link(&s, now_ms())));
    }
    if let Some(s) = read_through(&state, code.clone()).await? {
        return Ok(Json(edge_link(&s, now_ms())));
    }
    // Not ours: its domain's old shortener may have it (the lazy fallback).
    if let Some(legacy) = &state.0.legacy {
        if let Some(s) = legacy.resolve(&code).await? {
            return Ok(Json(edge_link(&s, now_ms())));
        }
    }
    Err(ApiError::not_found())
}

/// A code not found here whose home is another region: that region is asked (only the home
/// may say a code does not exist), and 503 `home_region_unavailable` stands in for its answer
/// while it cannot give one, never a 404.
async fn read_through(state: &EdgeState, code: String) -> Result<Option<StoredLink>, ApiError> {
    let Some(peers) = state.0.peers.clone() else {
        return Ok(None);
    };
    let Some(home) = peers.home_elsewhere(&code) else {
        return Ok(None);
    };
    let asked = offload("read-through", move || peers.fetch_link(home, &code))
        .await
        .map_err(|_| ApiError::unavailable())?;
    asked.map_err(|e| {
        tracing::warn!(error = %e, "read-through to the home region failed");
        ApiError::home_unavailable(home)
    })
}

/// `GET /peer/v1/links/{code}`: the link as this region has it (its record and state), for a
/// peer region's read-through; 404 `not_found` when this region has no such code.
async fn peer_link(
    State(state): State<EdgeState>,
    Path(code): Path<String>,
) -> Result<Json<StoredLink>, ApiError> {
    if !lasthop_core::plausible_key(code.as_bytes()) {
        return Err(ApiError::not_found());
    }
    let store = Arc::clone(&state.0.store);
    on_store("peer lookup", move || store.get(&code))
        .await?
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

/// `POST /peer/v1/aliases`: another region forwards an alias create to this one, the alias
/// home (`--alias-home-region`): created here (the one place aliases are claimed), it
/// replicates to every region. `{"outcome", "link"}`.
async fn peer_alias(
    State(state): State<EdgeState>,
    body: Body,
) -> Result<Json<crate::peers::CreateAnswer>, ApiError> {
    use crate::store::CreateOutcome;
    let forwarded: crate::peers::ForwardedCreate = peer_body(body, "a forwarded create").await?;
    let req = forwarded
        .request()
        .map_err(|e| ApiError::bad("invalid_body", e))?;
    let store = Arc::clone(&state.0.store);
    let outcome = on_store("forwarded alias create", move || store.create(req)).await?;
    let (outcome, link, why) = match outcome {
        CreateOutcome::Created(s) => ("created", Some(s), None),
        CreateOutcome::Replayed(s) => ("replayed", Some(s), None),
        CreateOutcome::AliasTaken => ("alias_taken", None, None),
        CreateOutcome::IdempotencyMismatch => ("idempotency_mismatch", None, None),
        CreateOutcome::Collision(why) => ("collision", None, Some(why)),
    };
    Ok(Json(crate::peers::CreateAnswer {
        outcome: outcome.into(),
        link,
        why,
    }))
}

/// `GET /peer/v1/keys`: every API key this region knows (hashes, never secrets), revocations
/// included, for a peer region to copy: a key works in every region, and a revocation anywhere
/// reaches every region. 404 `no_keys` where keys are not served.
async fn peer_keys(
    State(state): State<EdgeState>,
) -> Result<Json<Vec<crate::store::transfer::KeyLine>>, ApiError> {
    let keys = state.0.keys.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_keys",
            "this region serves no keys",
        )
    })?;
    let records = on_store("peer keys", move || keys.records()).await?;
    Ok(Json(
        records
            .iter()
            .map(crate::store::transfer::KeyLine::from_record)
            .collect(),
    ))
}

/// `GET /peer/v1/owners`: every owner this region ever suspended or unsuspended (its
/// [`crate::store::OwnerRecord`], with when), for a peer region to copy: a suspension anywhere
/// reaches every region ([`crate::safety::enforce::copy_suspension`]).
async fn peer_owners(
    State(state): State<EdgeState>,
) -> Result<Json<Vec<crate::store::OwnerRecord>>, ApiError> {
    let store = Arc::clone(&state.0.store);
    let mut owners = on_store("peer owners", move || store.owners()).await?;
    owners.retain(|o| o.suspension_event_ms().is_some());
    Ok(Json(owners))
}

#[derive(Debug, Deserialize)]
struct StatsQuery {
    from: String,
    to: String,
}

/// `GET /peer/v1/stats/{code}?from=YYYY-MM-DD&to=YYYY-MM-DD`: this region's clicks of `code`
/// by day ([`crate::clicks::stats::WireDay`]), for a peer region's stats answer to merge;
/// 404 `no_stats` where this region runs no click processor.
async fn peer_stats(
    State(state): State<EdgeState>,
    Path(code): Path<String>,
    Query(q): Query<StatsQuery>,
) -> Result<Json<Vec<crate::clicks::stats::WireDay>>, ApiError> {
    let rollups = state.0.rollups.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_stats",
            "this region runs no click processor",
        )
    })?;
    let (from, to) =
        crate::clicks::stats::range(Some(&q.from), Some(&q.to), crate::clicks::Day::today())
            .map_err(|e| ApiError::bad(e.code(), e.to_string()))?;
    let days = offload("reading stats for a peer region", move || {
        rollups.range(&code, from, to)
    })
    .await?
    .map_err(|e| {
        tracing::error!(error = %e, "reading stats for a peer region");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "stats are unavailable, retry later",
        )
    })?;
    Ok(Json(crate::clicks::stats::to_wire(&days)))
}

/// Largest body a peer region posts (a forwarded create or change).
const PEER_BODY_MAX: usize = 16 * 1024;

/// A peer region's JSON body: `what` it should be, or 400 `invalid_body` saying why not.
async fn peer_body<T: serde::de::DeserializeOwned>(body: Body, what: &str) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, PEER_BODY_MAX)
        .await
        .map_err(|_| ApiError::bad("invalid_body", "the body is unreadable or too large"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_body", format!("not {what}: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForwardedUpdate {
    /// The change, or none with `delete`.
    #[serde(default)]
    update: Option<crate::store::StateUpdate>,
    /// A deletion (of a link the forwarding region has not replicated yet).
    #[serde(default)]
    delete: bool,
    /// Who issued it in the forwarding region (for the audit trail).
    actor: String,
}

/// `POST /peer/v1/links/{code}/state` `{"update", "actor"}` or `{"delete": true, "actor"}`:
/// another region forwards a change of a link whose home is this region (a restore, an enable,
/// an expiry: what only the home applies; or any change or a deletion of a link it has not
/// replicated yet). Applied here as the forwarding region's actor; the link as it now is,
/// which then replicates back.
async fn peer_update(
    State(state): State<EdgeState>,
    Path(code): Path<String>,
    body: Body,
) -> Result<Json<StoredLink>, ApiError> {
    let Some(region) = state.0.peer.as_ref().map(|(r, _)| *r) else {
        return Err(ApiError::not_found());
    };
    let forwarded: ForwardedUpdate = peer_body(body, "a forwarded update").await?;
    if forwarded.actor.len() > 200 || forwarded.actor.chars().any(char::is_control) {
        return Err(ApiError::bad(
            "invalid_body",
            "actor: at most 200 printable characters",
        ));
    }
    let store = Arc::clone(&state.0.store);
    let actor = crate::store::Actor::Forwarded(forwarded.actor);
    let applied = match (forwarded.update, forwarded.delete) {
        (Some(update), false) => {
            on_store("forwarded update", move || {
                store.update_state(&code, update, &actor)
            })
            .await?
        }
        (None, true) => {
            on_store("forwarded delete", move || {
                store.delete(&code, &actor)?;
                store.get(&code)
            })
            .await?
        }
        _ => {
            return Err(ApiError::bad(
                "invalid_body",
                "one of update and delete: true",
            ))
        }
    }
    .ok_or_else(ApiError::not_found)?;
    tracing::info!(code = %applied.link.code, region, "applied a change forwarded by a peer region");
    Ok(Json(applied))
}

#[derive(Debug, Deserialize)]
struct FeedQuery {
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    engine: Option<String>,
    #[serde(default)]
    pop: Option<String>,
}

async fn feed(
    State(state): State<EdgeState>,
    Query(q): Query<FeedQuery>,
) -> Result<Response, ApiError> {
    let name = |v: Option<String>, what: &str| {
        v.filter(|v| valid_name(v)).ok_or_else(|| {
            ApiError::bad(
                "invalid_engine",
                format!("{what} must be 1-64 characters of A-Z a-z 0-9 . _ : -"),
            )
        })
    };
    let engine = name(q.engine, "engine")?;
    let pop = name(q.pop, "pop")?;
    let after = match q.after.as_deref() {
        None | Some("") => 0,
        Some(a) => a.parse::<u64>().map_err(|_| {
            ApiError::bad(
                "invalid_after",
                "after must be a change sequence (an unsigned integer)",
            )
        })?,
    };
    let body = state.0.feed.subscribe(after, engine, pop);
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct CertificatesQuery {
    generation: Option<u64>,
    /// `keys=0`: the domains alone, no certificate or key (an engine that serves no TLS).
    #[serde(default)]
    keys: Option<u8>,
}

/// `GET /edge/v1/certificates[?generation=G]`: see the module docs.
async fn certificates(
    State(state): State<EdgeState>,
    Query(q): Query<CertificatesQuery>,
    req: Request,
) -> Result<Response, ApiError> {
    let policy = state.0.certificates;
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let plain_ok = policy.allow_plain || peer.is_some_and(|p| p.ip().is_loopback());
    let with_keys = q.keys != Some(0);
    if with_keys && !policy.over_tls && !plain_ok {
        tracing::warn!(peer = ?peer, "refused to send certificates over plain HTTP");
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "plain_certificate_distribution",
            "certificates and their keys are sent only over TLS or to loopback \
             (--edge-tls-cert, or --allow-plain-certificate-distribution)",
        ));
    }
    let store = Arc::clone(&state.0.store);
    let (generation, domains) = on_store("reading the domains", move || {
        let generation = store.domains_generation()?;
        Ok::<_, crate::store::StoreError>((generation, store.domains()?))
    })
    .await?;
    if q.generation == Some(generation) {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let now = now_ms();
    // Every domain with what the edge applies (its namespace, settings, suspension); the
    // certificates of those that have a valid one, unless the engine asked for none.
    let edge_domains: Vec<_> = domains
        .iter()
        .map(|d| {
            json!({
                "domain": d.domain,
                "suspended": d.suspended.is_some(),
                "root_redirect": d.settings.root_redirect,
                "not_found_redirect": d.settings.not_found_redirect,
                "hsts": d.settings.hsts,
                "legacy_fallback": d.settings.legacy_fallback.is_some(),
            })
        })
        .collect();
    let certificates: Vec<_> = domains
        .iter()
        .filter(|_| with_keys)
        .filter(|d| d.suspended.is_none())
        .filter_map(|d| d.certificate.as_ref().map(|c| (d, c)))
        .filter(|(_, c)| c.not_after_ms >= now)
        .map(|(d, c)| {
            json!({
                "domain": d.domain,
                "revision": d.revision,
                "not_after_ms": c.not_after_ms,
                "chain": c.chain_pem,
                "key": c.key_pem,
            })
        })
        .collect();
    // ACME challenge answers while orders validate: HTTP-01's to every engine (its plain
    // listener answers them, TLS or not), TLS-ALPN-01's with the certificates.
    let challenges: Vec<_> = domains
        .iter()
        .filter(|d| d.suspended.is_none())
        .filter_map(|d| d.acme.as_ref()?.challenge.as_ref().map(|c| (d, c)))
        .filter(|(_, c)| with_keys || c.kind == "http-01")
        .map(|(d, c)| {
            json!({
                "domain": d.domain,
                "type": c.kind,
                "token": c.token,
                "key_authorization": c.key_authorization,
                "certificate": c.certificate_pem,
                "key": c.key_pem,
            })
        })
        .collect();
    Ok((
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Json(json!({
            "generation": generation,
            "domains": edge_domains,
            "certificates": certificates,
            "challenges": challenges,
            // The default domain's lazy fallback (`--legacy-fallback`): engines read its
            // unknown legacy-shaped codes through instead of answering 404.
            "default_legacy_fallback": state.0.legacy.as_ref().is_some_and(|l| l.default_domain()),
        })),
    )
        .into_response())
}

async fn status_report(State(state): State<EdgeState>, body: Body) -> Result<StatusCode, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_STATUS_BODY)
        .await
        .map_err(|_| {
            ApiError::bad(
                "body_too_large",
                format!("a status report is at most {MAX_STATUS_BODY} bytes"),
            )
        })?;
    let report: StatusReport = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_report", format!("not a status report: {e}")))?;
    report.validate().map_err(|e| {
        let code = match e {
            FrameError::Field("engine" | "pop") => "invalid_engine",
            _ => "invalid_report",
        };
        ApiError::bad(code, e.to_string())
    })?;
    let last_seq = *state.0.store.commits().borrow();
    let engine = report.engine.clone();
    let now = now_ms();
    match state.0.fleet.record(report, last_seq, now) {
        Ok(recorded) => {
            if state.0.fleet.save_due(recorded, now) {
                let fleet = Arc::clone(&state.0.fleet);
                if let Ok(Err(e)) = offload("saving the fleet", move || fleet.save(now)).await {
                    tracing::warn!(error = %e, "saving the fleet");
                }
            }
            if state.0.fleet.is_shared() {
                // Every control plane on the store lists this engine.
                let fleet = Arc::clone(&state.0.fleet);
                let shared = offload("sharing an engine report", move || fleet.persist(&engine));
                if let Ok(Err(e)) = shared.await {
                    tracing::warn!(error = %e, "sharing an engine report");
                }
            }
            Ok(StatusCode::NO_CONTENT)
        }
        Err(e @ FleetError::Full) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_engines",
            e.to_string(),
        )),
    }
}

fn no_snapshot() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_snapshot",
        "no snapshot has been published yet",
    )
}

fn unknown_snapshot() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_snapshot",
        "no such snapshot (never published, or garbage-collected)",
    )
}

async fn latest_snapshot(State(state): State<EdgeState>) -> Result<Response, ApiError> {
    let latest = state.0.snapshots.as_ref().and_then(|p| p.latest());
    latest
        .map(|f| Json(f).into_response())
        .ok_or_else(no_snapshot)
}

/// Streams a snapshot file: its length from the open file, its bytes read on the blocking pool a
/// few chunks ahead of the client, never the whole file in memory.
async fn download_snapshot(
    State(state): State<EdgeState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let publisher = state.0.snapshots.clone().ok_or_else(unknown_snapshot)?;
    // `<id>.zst`: the zstd copy (made on first demand if publishing did not make it). On a
    // shared store a snapshot another control plane published may not be copied here yet: it
    // is fetched from the store first.
    let (wanted, compressed) = match id.strip_suffix(".zst") {
        Some(base) => (base.to_string(), true),
        None => (id.clone(), false),
    };
    let found = offload("preparing a snapshot download", move || {
        if compressed {
            publisher.compressed_copy(&wanted)
        } else {
            publisher.local_copy(&wanted)
        }
    })
    .await
    .map_err(|_| ApiError::unavailable())?;
    let path = match found {
        Ok(Some(path)) => path,
        Ok(None) => return Err(unknown_snapshot()),
        Err(e) => {
            tracing::error!(%id, error = %ErrorChain(&e), "preparing a snapshot download");
            return Err(ApiError::unavailable());
        }
    };
    let opened = offload("opening a snapshot", move || {
        let file = std::fs::File::open(&path)?;
        let len = file.metadata()?.len();
        Ok::<_, std::io::Error>((file, len))
    })
    .await
    .map_err(|_| ApiError::unavailable())?;
    let (mut file, len) = match opened {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(unknown_snapshot()),
        Err(e) => {
            tracing::error!(%id, error = %e, "opening a snapshot");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "cannot read the snapshot",
            ));
        }
    };
    // Both files are immutable under their name, so the id is a strong validator.
    let etag = HeaderValue::from_str(&format!("\"{id}\"")).map_err(|_| unknown_snapshot())?;
    let content_type = HeaderValue::from_static(if compressed {
        "application/zstd"
    } else {
        "application/octet-stream"
    });
    let (status, start, count) = match byte_range(headers.get(header::RANGE), len) {
        RangeAnswer::Whole => (StatusCode::OK, 0, len),
        RangeAnswer::Part { start, end } => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        RangeAnswer::Unsatisfiable => {
            let mut resp = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the snapshot has {len} bytes"),
            )
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
    };
    let (tx, body) = crate::body_stream::channel(DOWNLOAD_AHEAD);
    tokio::task::spawn_blocking(move || {
        use std::io::Seek as _;
        if let Err(e) = file.seek(std::io::SeekFrom::Start(start)) {
            let _ = tx.blocking_send(Err(e));
            return;
        }
        let mut file = file.take(count);
        loop {
            let mut buf = vec![0u8; DOWNLOAD_CHUNK];
            let chunk = match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            // A send error means the client went away.
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    });
    let mut resp = (
        status,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_LENGTH, HeaderValue::from(count)),
            (header::ACCEPT_RANGES, HeaderValue::from_static("bytes")),
            (header::ETAG, etag),
        ],
        body,
    )
        .into_response();
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{len}", start + count - 1))
        {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(resp)
}

/// What a `Range` header asks of a `len`-byte representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No range, or one this server ignores (several ranges, another unit, bad syntax): 200.
    Whole,
    /// Bytes `start..=end`: 206.
    Part { start: u64, end: u64 },
    /// A well-formed range that starts past the end: 416.
    Unsatisfiable,
}

/// Reads a `Range` header (RFC 9110 §14.2) for a `len`-byte representation: one `bytes=`
/// range, `first-`, `first-last` or `-suffix`; anything else is ignored (the whole
/// representation), as the RFC allows. Bytes from the network: never panics.
pub fn byte_range(value: Option<&HeaderValue>, len: u64) -> RangeAnswer {
    let Some(spec) = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return RangeAnswer::Whole;
    };
    if spec.contains(',') {
        return RangeAnswer::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAnswer::Whole;
    };
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first.trim(), last.trim()) {
        ("", suffix) => match number(suffix) {
            Some(0) => RangeAnswer::Unsatisfiable,
            Some(_) if len == 0 => RangeAnswer::Unsatisfiable,
            Some(n) => RangeAnswer::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
            None => RangeAnswer::Whole,
        },
        (first, last) => {
            let Some(start) = number(first) else {
                return RangeAnswer::Whole;
            };
            let end = match last {
                "" => None,
                l => match number(l) {
                    Some(e) if e >= start => Some(e),
                    _ => return RangeAnswer::Whole,
                },
            };
            if start >= len {
                return RangeAnswer::Unsatisfiable;
            }
            RangeAnswer::Part {
                start,
                end: end.map_or(len - 1, |e| e.min(len - 1)),
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct ChangesQuery {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// Most changes one `/peer/v1/changes` answer carries, and the longest it waits for one.
const PEER_PAGE_MAX: usize = 5_000;
const PEER_WAIT_MAX_MS: u64 = 25_000;

/// The change log keeps no edited destination ([`lasthop_core::LinkState::logged`] leaves an
/// empty mark): a change that has one leaves for a peer with the link's destinations as they
/// are now, as the feed's frames do.
fn with_destinations(
    store: &dyn crate::store::Store,
    changes: &mut [crate::store::OwnChange],
) -> Result<(), crate::store::StoreError> {
    for c in changes.iter_mut() {
        let state = c.change.state_mut();
        if state.destination.is_none() && state.pending_destination.is_none() {
            continue;
        }
        let now = store.get(c.change.code())?.map(|s| s.state);
        let state = c.change.state_mut();
        state.destination = now.as_ref().and_then(|n| n.destination.clone());
        state.pending_destination = now.and_then(|n| n.pending_destination);
    }
    Ok(())
}

/// `GET /peer/v1/changes?after=SEQ&limit=N&wait_ms=MS`: this region's own changes after `SEQ`
/// (none it replicated from another region), for a peer region's replication
/// ([`crate::peers`]). Waits up to `wait_ms` for one when there is none (a long poll).
/// `{"region", "head", "high_water", "upto", "changes": [{"seq", "change", "audit"?}]}` (`audit`:
/// the audit records written with the change, [`crate::store::OwnChange`]): `upto` is the
/// sequence the page is complete up to (the next `after`).
async fn peer_changes(
    State(state): State<EdgeState>,
    Query(q): Query<ChangesQuery>,
) -> Result<Response, ApiError> {
    let Some(region) = state.0.peer.as_ref().map(|(r, _)| *r) else {
        return Err(ApiError::not_found());
    };
    let limit = q.limit.unwrap_or(1_000).clamp(1, PEER_PAGE_MAX);
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(PEER_WAIT_MAX_MS));
    let mut commits = state.0.store.commits();
    loop {
        let store = Arc::clone(&state.0.store);
        let (head, changes, upto, marks) = on_store("peer changes", move || {
            let head = store.last_seq()?;
            let (mut changes, upto) = store.own_changes_since(q.after, limit)?;
            with_destinations(&*store, &mut changes)?;
            Ok::<_, crate::store::StoreError>((head, changes, upto, store.high_water_marks()?))
        })
        .await?;
        let waited_out = tokio::time::Instant::now() >= deadline;
        if !changes.is_empty() || upto > q.after || waited_out {
            let high_water = marks
                .iter()
                .find(|(r, _)| *r == region)
                .map_or(0, |(_, m)| *m);
            let body = json!({
                "region": region,
                "head": head,
                "high_water": high_water,
                "upto": upto.max(q.after),
                "mint_rate": state.0.mint_rate,
                "changes": changes,
            });
            return Ok((
                [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
                Json(body),
            )
                .into_response());
        }
        // Nothing of ours yet: wait for the next commit (or the deadline), then read again.
        let _ = tokio::time::timeout_at(deadline, commits.changed()).await;
    }
}

async fn fallback() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such endpoint")
}

/// Everything but `/healthz` needs the edge token; `/peer/` needs the peer token instead.
async fn require_token(State(state): State<EdgeState>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if req.uri().path().starts_with("/peer/") {
        return match (&state.0.peer, presented) {
            (Some((_, token)), Some(t)) if token.matches(t) => next.run(req).await,
            (None, _) => ApiError::new(
                StatusCode::NOT_FOUND,
                "no_peers",
                "this control plane replicates with no region (--peer, --peer-token-file)",
            )
            .into_response(),
            _ => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "peer_unauthorized",
                "missing or wrong Authorization: Bearer <peer token> (--peer-token-file)",
            )
            .into_response(),
        };
    }
    match presented {
        Some(t) if state.0.token.matches(t) => next.run(req).await,
        // Mutual TLS: the handshake already proved the client's certificate.
        None if state.0.client_certs => next.run(req).await,
        Some(_) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "edge_unauthorized",
            "wrong edge token",
        )
        .into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "edge_unauthorized",
            "missing Authorization: Bearer <edge token> (DATA_DIR/edge.token)",
        )
        .into_response(),
    }
}

/// The edge router. Serve it on its own listener, never merged into the public API's.
pub fn router(state: EdgeState) -> Router {
    Router::new()
        .route("/edge/v1/links/{code}", get(get_link))
        .route("/edge/v1/feed", get(feed))
        .route("/edge/v1/snapshots/latest", get(latest_snapshot))
        .route("/edge/v1/snapshots/{id}", get(download_snapshot))
        .route("/edge/v1/status", post(status_report))
        .route(lasthop_core::feed::CERTIFICATES_PATH, get(certificates))
        .route("/peer/v1/changes", get(peer_changes))
        .route("/peer/v1/links/{code}", get(peer_link))
        .route("/peer/v1/aliases", post(peer_alias))
        .route("/peer/v1/keys", get(peer_keys))
        .route("/peer/v1/owners", get(peer_owners))
        .route("/peer/v1/stats/{code}", get(peer_stats))
        .route("/peer/v1/links/{code}/state", post(peer_update))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::LinkStatus;
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
        let active = edge_link(&stored(LinkState::default()), now);
        assert_eq!(active.status, LinkStatus::Active);
        assert_eq!(active.long_url, "https://example.com/x");
        assert!(!active.warn);

        let warned = edge_link(
            &stored(LinkState {
                warn: true,
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(warned.status, LinkStatus::Active);
        assert!(warned.warn);

        let expired = edge_link(
            &stored(LinkState {
                expires_at_ms: Some(now),
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(expired.status, LinkStatus::Expired);
        assert_eq!(expired.expires_at_ms, Some(now));

        let disabled = edge_link(
            &stored(LinkState {
                disabled: true,
                ..LinkState::default()
            }),
            now,
        );
        assert_eq!(disabled.status, LinkStatus::Disabled);

        let taken = edge_link(
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
        let deleted = edge_link(&gone, now);
        assert_eq!(deleted.status, LinkStatus::Deleted);
        assert_eq!(deleted.long_url, "");
    }

    /// What `get_link` asks before it touches the store.
    fn plausible_code(code: &str) -> bool {
        lasthop_core::plausible_key(code.as_bytes())
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

    fn range(v: &str, len: u64) -> RangeAnswer {
        byte_range(Some(&HeaderValue::from_str(v).unwrap()), len)
    }

    #[test]
    fn ranges() {
        use RangeAnswer::*;
        assert_eq!(byte_range(None, 10), Whole);
        assert_eq!(range("bytes=0-", 10), Part { start: 0, end: 9 });
        assert_eq!(range("bytes=4-", 10), Part { start: 4, end: 9 });
        assert_eq!(range("bytes=2-5", 10), Part { start: 2, end: 5 });
        assert_eq!(range("bytes=2-500", 10), Part { start: 2, end: 9 });
        assert_eq!(range("bytes=-3", 10), Part { start: 7, end: 9 });
        assert_eq!(range("bytes=-30", 10), Part { start: 0, end: 9 });
        assert_eq!(range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(range("bytes=0-", 0), Unsatisfiable);
        for ignored in [
            "bytes=5-2",
            "bytes=0-1,4-5",
            "items=0-1",
            "bytes=a-",
            "bytes=-",
            "bytes=1",
        ] {
            assert_eq!(range(ignored, 10), Whole, "{ignored}");
        }
    }

    proptest::proptest! {
        /// Whatever the header, the answer is whole, unsatisfiable, or a range inside the file.
        #[test]
        fn any_range_header_stays_inside_the_file(v in "[ -~]{0,40}", len in 0u64..1_000) {
            if let Ok(h) = HeaderValue::from_str(&v) {
                match byte_range(Some(&h), len) {
                    RangeAnswer::Part { start, end } => {
                        proptest::prop_assert!(start <= end && end < len);
                    }
                    RangeAnswer::Whole | RangeAnswer::Unsatisfiable => {}
                }
            }
        }
    }
}
