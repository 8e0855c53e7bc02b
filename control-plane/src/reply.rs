//! What every HTTP listener of the control plane answers when a request fails, and how its
//! handlers run blocking work.
//!
//! One envelope for the public API and the edge listener (engines and peer regions read it):
//! a status, `{"error":{"code","message"}}` with a machine-readable `code`, a `reason` for
//! refusals with several causes, and `Retry-After` where waiting helps. Messages say what
//! happened in the caller's words, never internals.
//!
//! Store calls, key lookups and file work block: handlers hand them to the blocking pool through
//! [`offload`] (and [`blocking`], its form for handlers that answer [`ApiError`]), the one place
//! a task's panic is logged and turned into an answer.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::StoreError;

/// The one error answer of the API and the edge listener.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) retry_after: Option<u64>,
    /// Why, in machine words, for refusals that have several causes (`destination_blocked`,
    /// `alias_reserved`).
    pub(crate) reason: Option<String>,
}

impl std::fmt::Display for ApiError {
    /// `code: message`, as a tool outside the API reports it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            reason: None,
        }
    }

    pub(crate) fn with_reason(self, reason: impl Into<String>) -> Self {
        ApiError {
            reason: Some(reason.into()),
            ..self
        }
    }

    /// The same answer, telling the caller to retry after `secs`.
    pub(crate) fn retry_after(self, secs: u64) -> Self {
        ApiError {
            retry_after: Some(secs),
            ..self
        }
    }

    pub(crate) fn forbidden(message: &str) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn not_found() -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no link has this code")
    }

    /// 503 `storage_unavailable`: the store (or the keys behind it) cannot answer now.
    pub(crate) fn unavailable() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "storage is unavailable, retry later",
        )
        .retry_after(1)
    }

    /// 503 `home_region_unavailable`: region `home` holds the answer and cannot be reached (only
    /// the home region may say a code does not exist, so this stands in for its answer).
    pub(crate) fn home_unavailable(home: u32) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "home_region_unavailable",
            format!(
                "this link's home region {home} holds the answer and cannot be reached; retry later"
            ),
        )
    }

    /// 500 `internal`: a failure the caller can do nothing about (logged where it happened).
    pub(crate) fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::BadCursor => ApiError::bad("invalid_cursor", "cursor is not valid"),
            StoreError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "shutting down, retry",
            )
            .retry_after(1),
            other => {
                tracing::error!(error = %other, "store failure");
                // A lost database connection is retried by the store itself: clients retry.
                ApiError::unavailable()
            }
        }
    }
}

impl From<TaskFailed> for ApiError {
    fn from(_: TaskFailed) -> Self {
        ApiError::internal()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match &self.reason {
            Some(reason) => Json(
                json!({"error": {"code": self.code, "reason": reason, "message": self.message}}),
            ),
            None => Json(json!({"error": {"code": self.code, "message": self.message}})),
        };
        let mut resp = (self.status, body).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A blocking task that panicked (or was cancelled at shutdown); logged by [`offload`].
#[derive(Debug, thiserror::Error)]
#[error("{what}: the blocking task failed: {source}")]
pub struct TaskFailed {
    pub what: &'static str,
    #[source]
    pub source: tokio::task::JoinError,
}

/// Runs `f` on the blocking pool and waits for it. A task that panicked is logged as `what`
/// and comes back as [`TaskFailed`]; what `f` returns comes back as it is.
pub async fn offload<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TaskFailed> {
    tokio::task::spawn_blocking(f).await.map_err(|source| {
        tracing::error!(error = %source, "{what}: task failed");
        TaskFailed { what, source }
    })
}

/// [`offload`] for a handler answering [`ApiError`]: `f`'s error becomes the answer its `From`
/// says (a store failure 503 `storage_unavailable`, a bad cursor 400, ...), a failed task 500
/// `internal`.
pub(crate) async fn blocking<T: Send + 'static, E: Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError>
where
    ApiError: From<E>,
{
    Ok(offload("store task", f).await??)
}
