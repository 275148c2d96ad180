//! Request extractors whose every rejection is a JSON [`ApiError`].

use super::error::ApiError;
use crate::protocol::SessionId;
use crate::service::Service;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// A request body, valid UTF-8. It was read within bounds and charged to the memory budget
/// before the handler ran ([`super::body`]).
pub(super) struct Utf8Body(pub Bytes);

impl FromRequest<Arc<Service>> for Utf8Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &Arc<Service>) -> Result<Self, ApiError> {
        // The body is in memory already: this takes it, it does not read or copy it.
        let bytes = axum::body::to_bytes(req.into_body(), usize::MAX)
            .await
            .map_err(|e| ApiError::bad_request(format!("cannot read request body: {e}")))?;
        if let Err(e) = std::str::from_utf8(&bytes) {
            return Err(ApiError::bad_request(format!(
                "request body is not valid UTF-8 (byte {})",
                e.valid_up_to()
            )));
        }
        Ok(Utf8Body(bytes))
    }
}

/// A JSON body (see [`Utf8Body`]); an empty body reads as `{}`. A large body is parsed off
/// the runtime's workers ([`super::offload`]).
pub(super) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send + 'static> FromRequest<Arc<Service>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, service: &Arc<Service>) -> Result<Self, ApiError> {
        let Utf8Body(body) = Utf8Body::from_request(req, service).await?;
        let value = super::offload::SLOTS
            .run(body.len(), move || parse_json(&body))
            .await??;
        Ok(JsonBody(value))
    }
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(json_text(body))
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// A body's JSON: an empty body (or only whitespace) reads as `{}`.
pub(super) fn json_text(body: &[u8]) -> &[u8] {
    if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    }
}

/// Query parameters.
pub(super) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))
    }
}

/// The `{id}` of `/session/{id}/...`, checked here once.
pub(super) struct SessionPath(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::bad_request(format!("invalid session id in path: {}", e.body_text()))
            })?;
        SessionId::parse(id)
            .map(SessionPath)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }
}
