//! API errors: `{"error": {"code": "...", "message": "..."}}` with the right status.

use crate::service::ServiceError;
use crate::store::StoreError;
use crate::summarize::SummarizeError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "request body is larger than the limit of {limit} bytes ([server] max_body_bytes)"
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let message = e.to_string();
        let (status, code) = match &e {
            ServiceError::Store(StoreError::NotFound(_) | StoreError::Deleted(_)) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            ServiceError::Store(StoreError::Exists(_) | StoreError::Conflict(_)) => {
                (StatusCode::CONFLICT, "conflict")
            }
            ServiceError::Store(StoreError::UnknownCall(_)) => {
                (StatusCode::BAD_REQUEST, "unknown_call")
            }
            ServiceError::Store(StoreError::PinnedTooLarge { .. }) => {
                (StatusCode::BAD_REQUEST, "pinned_too_large")
            }
            ServiceError::PinnedOverflow(_) => (StatusCode::CONFLICT, "pinned_too_large"),
            ServiceError::Store(StoreError::Closed) | ServiceError::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
            ServiceError::Store(StoreError::Sqlite(_)) => {
                tracing::error!(%message, "store error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            ServiceError::InvalidMessage { .. } => (StatusCode::BAD_REQUEST, "invalid_message"),
            ServiceError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ServiceError::Summarizer(SummarizeError::Cancelled) => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
            ServiceError::Summarizer(_) => (StatusCode::SERVICE_UNAVAILABLE, "summarizer_failed"),
        };
        ApiError::new(status, code, message)
    }
}
