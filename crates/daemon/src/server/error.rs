//! API errors: `{"error": {"code": "...", "message": "..."}}` with the right status.

use crate::protocol::ErrorCode;
use crate::service::ServiceError;
use crate::service::StoreError;
use crate::summarize::SummarizeError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub(super) struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    /// Seconds after which a retry may succeed (`Retry-After`), for "busy" answers.
    pub retry_after: Option<u64>,
    /// Already in the log with more than the request shows (a proxied call's model).
    pub logged: bool,
}

/// Marks a response as a refusal of compactd's own (not an upstream's answer passed on), so
/// that [`log_refusals`] says it in the log unless its handler did.
#[derive(Debug, Clone)]
struct Refusal {
    code: ErrorCode,
    message: String,
    logged: bool,
}

/// Logs every refusal of a request that its handler did not (status, code, method, path
/// without its query: never a body, a header or a key), whatever refused it: a route, an
/// extractor, a body limit, the fallback for an unknown path.
pub(super) async fn log_refusals(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if let Some(refusal) = response.extensions().get::<Refusal>()
        && !refusal.logged
    {
        tracing::info!(
            %method,
            path = path.chars().take(256).collect::<String>(),
            status = response.status().as_u16(),
            code = refusal.code.as_str(),
            reason = %refusal.message,
            "refused a request"
        );
    }
    response
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            logged: false,
        }
    }

    /// The same error, said in the log already by its handler.
    pub(super) fn logged(mut self) -> ApiError {
        self.logged = true;
        self
    }

    /// The same error, telling the client when to retry.
    pub(super) fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        response.extensions_mut().insert(Refusal {
            code: self.code,
            message: self.message,
            logged: self.logged,
        });
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let message = e.to_string();
        let (status, code) = match &e {
            ServiceError::Store(StoreError::NotFound(_) | StoreError::Deleted(_)) => {
                (StatusCode::NOT_FOUND, ErrorCode::NotFound)
            }
            ServiceError::Store(StoreError::Exists(_) | StoreError::Conflict(_)) => {
                (StatusCode::CONFLICT, ErrorCode::Conflict)
            }
            ServiceError::Store(StoreError::UnknownCall(_)) => {
                (StatusCode::BAD_REQUEST, ErrorCode::UnknownCall)
            }
            ServiceError::Store(StoreError::BadQuery(_)) => {
                (StatusCode::BAD_REQUEST, ErrorCode::BadRequest)
            }
            ServiceError::Store(StoreError::PinnedTooLarge { .. }) => {
                (StatusCode::BAD_REQUEST, ErrorCode::PinnedTooLarge)
            }
            ServiceError::PinnedOverflow(_) => (StatusCode::CONFLICT, ErrorCode::PinnedTooLarge),
            ServiceError::Store(StoreError::IdempotencyMismatch(_)) => {
                (StatusCode::CONFLICT, ErrorCode::IdempotencyMismatch)
            }
            ServiceError::Store(StoreError::Closed) | ServiceError::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::ShuttingDown)
            }
            ServiceError::Store(StoreError::TooManySessions(wait)) => {
                return ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::RateLimited,
                    message,
                )
                .retry_after(*wait);
            }
            ServiceError::Store(StoreError::Busy) => {
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Busy, message)
                    .retry_after(1);
            }
            // The store says a full disk, and a file gone, once (not once per refused write).
            ServiceError::Store(StoreError::Full) => {
                tracing::debug!(%message, "store error");
                return ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    ErrorCode::StorageFull,
                    message,
                )
                .retry_after(60);
            }
            ServiceError::Store(
                StoreError::Gone(_)
                | StoreError::SideFileGone { .. }
                | StoreError::Overwritten { .. },
            ) => {
                tracing::debug!(%message, "store error");
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::StorageGone)
            }
            ServiceError::Store(
                StoreError::Io { .. }
                | StoreError::Corrupt(_)
                | StoreError::Sqlite(_)
                | StoreError::Internal(_),
            ) => {
                tracing::error!(%message, "store error");
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal)
            }
            ServiceError::InvalidMessage { .. } => {
                (StatusCode::BAD_REQUEST, ErrorCode::InvalidMessage)
            }
            ServiceError::BadRequest(_) | ServiceError::Overrides(_) => {
                (StatusCode::BAD_REQUEST, ErrorCode::BadRequest)
            }
            ServiceError::Summarizer(SummarizeError::Cancelled) => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::ShuttingDown)
            }
            ServiceError::Summarizer(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::SummarizerFailed)
            }
        };
        ApiError::new(status, code, message)
    }
}
