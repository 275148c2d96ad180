//! Request extractors whose every rejection is a JSON [`ApiError`].

use super::error::ApiError;
use crate::service::Service;
use axum::body::to_bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::CONTENT_LENGTH;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// A JSON body, limited to `[server] max_body_bytes` (read per request, so a config reload
/// applies at once). An empty body reads as `{}`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<Service>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, service: &Arc<Service>) -> Result<Self, ApiError> {
        let limit = service.settings().config.server.max_body_bytes;
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::too_large(limit));
        }
        let bytes = to_bytes(req.into_body(), limit).await.map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit")
            {
                ApiError::too_large(limit)
            } else {
                ApiError::bad_request(format!("cannot read request body: {e}"))
            }
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "request body is not valid UTF-8 (byte {})",
                e.valid_up_to()
            ))
        })?;
        let text = if text.trim().is_empty() { "{}" } else { text };
        serde_json::from_str(text)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// Query parameters.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))
    }
}

/// The `{id}` of `/session/{id}/...` (validated by the service).
pub struct SessionPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| SessionPath(id))
            .map_err(|e| {
                ApiError::bad_request(format!("invalid session id in path: {}", e.body_text()))
            })
    }
}
