//! Moving in (issue 44): `POST /v1/imports/links` takes a batch of another shortener's links,
//! each with its old code, for one owner on one domain (admin), and
//! `GET /v1/exports/links` streams the caller's links in the generic import format.
//!
//! An import row goes through every create-time check (the destination's lists, scheme,
//! shortener chains, tags) and is then stored with its old code ([`Imported`]): a code of an
//! alias's shape as an alias, anything else of `[A-Za-z0-9_-]{1,64}` as a legacy code, a
//! 7-character base62 code as a claim on its counter value. A row whose code holds the same
//! owner's link to the same destination already is `existing` (so a re-run imports nothing);
//! one held by another link is refused (a collision), as is a 7-character code whose counter the
//! generator may have issued.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    blocking, branded_domain, checked_destination, checked_tags, domain_name, parse_json,
    read_body_up_to, require_admin, ApiError, AppState, Auth,
};
use crate::auth::Principal;
use crate::clock::{now_ms, rfc3339};
use crate::store::{Actor, CreateOutcome, CreateRequest, Imported, StoreError, StoredLink};

/// Most rows a batch takes.
pub const IMPORT_BATCH_MAX: usize = 1_000;
/// Largest batch body.
const IMPORT_BODY_MAX: usize = 8 << 20;

/// One row, as the importer read it from the old shortener's file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImportLink {
    /// The row's place in its file, echoed in refusals.
    #[serde(default)]
    pub line: u64,
    pub code: String,
    pub long_url: String,
    #[serde(default)]
    pub created_at_ms: Option<i64>,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Its clicks at the old shortener (kept with `with_clicks`).
    #[serde(default)]
    pub clicks: Option<u64>,
}

/// A refused row: where, which code, why (`reason`: the error code a create would have got,
/// or `collision`; `detail`: the refusal's own reason where it has one, e.g. `list:NAME`;
/// `message` for people).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RefusedRow {
    pub line: u64,
    pub code: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub message: String,
}

/// One batch of an import: whose links they become, on which domain, and the rows.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImportBatch {
    pub owner: String,
    #[serde(default)]
    pub domain: Option<String>,
    /// Check every row and answer what would happen; write nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Keep each row's `clicks` as the link's `imported_clicks`.
    #[serde(default)]
    pub with_clicks: bool,
    pub links: Vec<ImportLink>,
}

/// What a batch did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportReport {
    /// Rows written (or, in a dry run, that would be).
    pub imported: u64,
    /// Rows whose code already holds the same owner's link to the same destination.
    pub existing: u64,
    /// Rows refused, in file order.
    pub refused: Vec<RefusedRow>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/imports/links` (admin): an [`ImportBatch`] (`{"owner", "domain"?, "dry_run"?,
/// "with_clicks"?, "links": [{"line", "code", "long_url", "created_at_ms"?, "expires_at_ms"?,
/// "tags"?, "clicks"?}]}`, at most [`IMPORT_BATCH_MAX`] rows) → an [`ImportReport`]
/// (`{"imported", "existing", "refused": [{"line", "code", "reason", "detail"?, "message"}],
/// "dry_run"}`).
pub(super) async fn import_links(
    State(state): State<AppState>,
    Auth(who): Auth,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let bytes = read_body_up_to(body, IMPORT_BODY_MAX).await?;
    let batch: ImportBatch = parse_json(&bytes)?;
    let actor = who.actor();
    let report = import_batch(&state, &who, actor, batch).await?;
    Ok((StatusCode::OK, Json(report)).into_response())
}

/// Imports one batch as `who` (an admin), recording `actor`: every row is checked as a create
/// is, and the rows that pass are written in one transaction (all or nothing). What
/// `POST /v1/imports/links` and `lasthop-control links import --data-dir` run.
pub async fn import_batch(
    state: &AppState,
    who: &Principal,
    actor: Actor,
    batch: ImportBatch,
) -> Result<ImportReport, ApiError> {
    require_admin(who)?;
    if batch.links.len() > IMPORT_BATCH_MAX {
        return Err(ApiError::bad(
            "batch_too_large",
            format!("at most {IMPORT_BATCH_MAX} links a batch"),
        ));
    }
    if batch.owner.is_empty() || batch.owner.len() > 128 {
        return Err(ApiError::bad("invalid_owner", "owner must be 1-128 bytes"));
    }
    let domain = branded_domain(state, batch.domain.as_deref().map(domain_name).as_deref());
    if let Some(d) = &domain {
        let record = super::domains::fetch_visible(state, who, d).await?;
        if record.suspended.is_some() {
            return Err(super::domains::suspended());
        }
    }
    let now = now_ms();
    let mut refused = Vec::new();
    let mut ready = Vec::new();
    for row in batch.links {
        match checked_row(state, &row) {
            Ok(checked) => ready.push((row, checked)),
            Err(e) => refused.push(RefusedRow {
                line: row.line,
                code: row.code.clone(),
                reason: e.code.to_string(),
                detail: e.reason.clone(),
                message: e.message.clone(),
            }),
        }
    }
    let store = std::sync::Arc::clone(&state.0.store);
    let peers = state.0.peers.clone();
    let owner = batch.owner;
    let dry_run = batch.dry_run;
    let with_clicks = batch.with_clicks;
    let (imported, existing, more_refused) = blocking(move || -> Result<_, StoreError> {
        let (mut imported, mut existing, mut refused) = (0u64, 0u64, Vec::new());
        // Each code is claimed in its home region (a 7-character code's counter region, the
        // alias home for any other): rows homed elsewhere are forwarded there, one by one.
        let home_of = |key: &str| peers.as_ref().and_then(|p| p.home_elsewhere(key));
        let lookup = |key: &str| -> Result<Option<StoredLink>, StoreError> {
            match (home_of(key), &peers) {
                (Some(home), Some(p)) => p
                    .fetch_link(home, key)
                    .map_err(|e| StoreError::Refused(format!("region {home}: {e}"))),
                _ => store.get(key),
            }
        };
        let same = |key: &str, long_url: &str| -> Result<Option<bool>, StoreError> {
            Ok(lookup(key)?.map(|s| s.link.owner == owner && s.state.url(&s.link) == long_url))
        };
        if dry_run {
            for (row, (long_url, ..)) in &ready {
                let key = lasthop_core::link_key(domain.as_deref(), &row.code);
                match same(&key, long_url)? {
                    Some(true) => existing += 1,
                    Some(false) => refused.push(taken(row)),
                    None => imported += 1,
                }
            }
            return Ok((imported, existing, refused));
        }
        let request = |row: &ImportLink, (long_url, dest, tags): &Checked| CreateRequest {
            owner: owner.clone(),
            long_url: long_url.clone(),
            domain: domain.clone(),
            alias: Some(row.code.clone()),
            expires_at_ms: row.expires_at_ms,
            idempotency: None,
            now_ms: now,
            hold: None,
            options: lasthop_core::LinkOptions::default(),
            tags: tags.clone(),
            actor: actor.clone(),
            destination: Some(dest.clone()),
            imported: Some(Imported {
                created_at_ms: row.created_at_ms,
                clicks: row.clicks.filter(|_| with_clicks),
            }),
        };
        let key_of = |row: &ImportLink| lasthop_core::link_key(domain.as_deref(), &row.code);
        let (here, elsewhere): (Vec<_>, Vec<_>) = ready
            .iter()
            .partition(|(row, _)| home_of(&key_of(row)).is_none());
        // This region's rows in one transaction: written whole or not at all.
        let mut outcomes: Vec<(&ImportLink, &str, CreateOutcome)> = Vec::new();
        let made = store.create_many(here.iter().map(|(row, c)| request(row, c)).collect())?;
        for ((row, (long_url, ..)), outcome) in here.iter().zip(made) {
            outcomes.push((row, long_url, outcome));
        }
        for (row, checked) in &elsewhere {
            let key = key_of(row);
            let (Some(home), Some(p)) = (home_of(&key), &peers) else {
                continue;
            };
            let outcome = p
                .forward_create(home, &request(row, checked))
                .map_err(|e| StoreError::Refused(format!("region {home}: {e}")))?;
            outcomes.push((row, &checked.0, outcome));
        }
        for (row, long_url, outcome) in outcomes {
            match outcome {
                CreateOutcome::Created(_) => imported += 1,
                CreateOutcome::AliasTaken => match same(&key_of(row), long_url)? {
                    Some(true) => existing += 1,
                    _ => refused.push(taken(row)),
                },
                CreateOutcome::Collision(why) => refused.push(RefusedRow {
                    line: row.line,
                    code: row.code.clone(),
                    reason: "collision".into(),
                    detail: None,
                    message: why,
                }),
                CreateOutcome::Replayed(_) | CreateOutcome::IdempotencyMismatch => {}
            }
        }
        Ok((imported, existing, refused))
    })
    .await?;
    if imported > 0 && !dry_run {
        state.0.safety.wake_scanner();
    }
    refused.extend(more_refused);
    refused.sort_by_key(|r| r.line);
    Ok(ImportReport {
        imported,
        existing,
        refused,
        dry_run,
    })
}

fn taken(row: &ImportLink) -> RefusedRow {
    RefusedRow {
        line: row.line,
        code: row.code.clone(),
        reason: "collision".into(),
        detail: None,
        message: "the code is held by another link (another owner or destination)".into(),
    }
}

type Checked = (String, lasthop_trust::Destination, Vec<String>);

/// A row's code, destination (every create-time check) and tags (the old shortener's, lower
/// case; names that are no tag here are dropped, and past [`lasthop_core::TAGS_MAX`]).
fn checked_row(state: &AppState, row: &ImportLink) -> Result<Checked, ApiError> {
    if !lasthop_core::legacy_shape(row.code.as_bytes()) {
        return Err(ApiError::bad(
            "invalid_code",
            "a code is 1-64 characters of A-Z a-z 0-9 _ -",
        ));
    }
    let (long_url, dest) = checked_destination(state, &row.long_url)?;
    let mut tags: Vec<String> = row.tags.iter().map(|t| t.to_ascii_lowercase()).collect();
    tags.retain(|t| lasthop_core::tag_ok(t));
    tags.truncate(lasthop_core::TAGS_MAX);
    let tags = checked_tags(&tags)?;
    // An old link's expiry in the past imports as expired (410), as it answered before.
    Ok((long_url, dest, tags))
}

#[derive(Debug, Deserialize)]
pub(super) struct ExportQuery {
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    owner: Option<String>,
}

/// `GET /v1/exports/links?format=csv|ndjson` (admin: `&owner=`): the caller's links, newest
/// first, live and expired (deleted ones have no URL left), streamed page by page. The CSV is
/// the generic import format (`code,long_url,created_at,tags,expires_at`), so an export
/// re-imports elsewhere; a branded link's code is its link key (`domain/code`).
pub(super) async fn export_links(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let csv = match q.format.as_deref() {
        None | Some("csv") => true,
        Some("ndjson") => false,
        Some(_) => return Err(ApiError::bad("invalid_format", "format is csv or ndjson")),
    };
    let owner = match q.owner {
        Some(o) if o != who.owner => {
            require_admin(&who)?;
            o
        }
        _ => who.owner.clone(),
    };
    let store = std::sync::Arc::clone(&state.0.store);
    let (tx, body) = crate::body_stream::channel(4);
    tokio::task::spawn_blocking(move || {
        if csv {
            let header = format!("{}\n", crate::import::CSV_HEADER).into_bytes();
            if tx.blocking_send(Ok(header.into())).is_err() {
                return;
            }
        }
        let mut cursor: Option<String> = None;
        loop {
            let page = match store.list(&owner, cursor.as_deref(), 1_000) {
                Ok(p) => p,
                Err(e) => {
                    let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                    return;
                }
            };
            let mut out = Vec::new();
            for s in page.links.iter().filter(|s| !s.state.deleted) {
                let url = s.state.url(&s.link);
                if csv {
                    out.extend_from_slice(
                        crate::import::csv_record(
                            &s.link.code,
                            url,
                            Some(s.link.created_at_ms),
                            &s.state.tags,
                            s.state.expires_at_ms,
                        )
                        .as_bytes(),
                    );
                } else {
                    let line = json!({
                        "code": s.link.code,
                        "long_url": url,
                        "created_at": rfc3339(s.link.created_at_ms),
                        "expires_at": s.state.expires_at_ms.map(rfc3339),
                        "tags": s.state.tags,
                        "status": s.state.status(now_ms()).as_str(),
                    });
                    out.extend_from_slice(line.to_string().as_bytes());
                    out.push(b'\n');
                }
            }
            if !out.is_empty() && tx.blocking_send(Ok(out.into())).is_err() {
                return;
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return,
            }
        }
    });
    let content_type = if csv {
        "text/csv; charset=utf-8"
    } else {
        "application/x-ndjson"
    };
    let name = if csv { "links.csv" } else { "links.ndjson" };
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        body,
    )
        .into_response())
}
