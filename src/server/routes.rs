//! The handlers: parse, call the service, shape the answer. No decisions live here.

use super::error::ApiError;
use super::extract::{ApiQuery, JsonBody, SessionPath, Utf8Body};
use crate::message::{BatchError, parse_message_batch};
use crate::service::views::{ContextFormat, ProviderContext};
use crate::service::{AppendRequest, CreateSession, HistoryRequest, Service};
use crate::store::SessionUpdate;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

type Svc = State<Arc<Service>>;
type ApiResult = Result<axum::response::Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(value).into_response())
}

pub async fn health(State(service): Svc) -> ApiResult {
    let settings = service.settings();
    let status = service.config_status();
    ok(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": service.uptime_s(),
        "pid": std::process::id(),
        "summarizer": settings.summarizer.name(),
        "config": status,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    id: Option<String>,
    model: Option<String>,
    context_limit: Option<usize>,
    config: Option<Value>,
}

pub async fn create_session(
    State(service): Svc,
    JsonBody(body): JsonBody<CreateBody>,
) -> ApiResult {
    let view = service
        .create_session(CreateSession {
            id: body.id,
            model: body.model,
            context_limit: body.context_limit,
            config: body.config,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

pub async fn list_sessions(State(service): Svc) -> ApiResult {
    ok(json!({"sessions": service.sessions().await?}))
}

pub async fn get_session(State(service): Svc, SessionPath(id): SessionPath) -> ApiResult {
    ok(service.session(&id).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateBody {
    model: Option<String>,
    context_limit: Option<usize>,
    config: Option<Value>,
}

pub async fn update_session(
    State(service): Svc,
    SessionPath(id): SessionPath,
    JsonBody(body): JsonBody<UpdateBody>,
) -> ApiResult {
    let update = SessionUpdate {
        model: body.model,
        context_limit: body.context_limit,
        overrides: body.config,
    };
    ok(service.update_session(&id, update).await?)
}

pub async fn delete_session(State(service): Svc, SessionPath(id): SessionPath) -> ApiResult {
    service.delete_session(&id).await?;
    ok(json!({"deleted": true, "id": id}))
}

/// `POST /session/{id}/message` takes one message, an array of messages, or
/// `{"messages": [...], "usage": {"input_tokens": N}, "wait": bool}`; an `Idempotency-Key`
/// header makes a retry append nothing twice.
pub async fn append(
    State(service): Svc,
    SessionPath(id): SessionPath,
    headers: HeaderMap,
    Utf8Body(body): Utf8Body,
) -> ApiResult {
    let batch = parse_message_batch(&body.bytes).map_err(|e| match e {
        BatchError::Message { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_message", e.to_string())
        }
        other => ApiError::bad_request(other.to_string()),
    })?;
    // The body's bytes are not needed once parsed.
    drop(body);
    let input_tokens = match batch.input_tokens {
        Some(n) if n > MAX_REPORTED_TOKENS => {
            return Err(ApiError::bad_request(format!(
                "usage.input_tokens must be at most {MAX_REPORTED_TOKENS}"
            )));
        }
        n => n.map(|n| n as usize),
    };
    let idempotency_key = match headers.get("idempotency-key") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be printable ASCII"))?
                .to_string(),
        ),
        None => None,
    };
    let request = AppendRequest {
        messages: batch.messages,
        input_tokens,
        wait: batch.wait,
        idempotency_key,
    };
    ok(service.append(&id, request).await?)
}

/// No model reads more tokens than this in one call; larger reports are mistakes.
const MAX_REPORTED_TOKENS: u64 = 1_000_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
}

/// Most messages one history page returns.
const MAX_PAGE: usize = 1_000;

pub async fn history(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult {
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_PAGE}"
        )));
    }
    ok(service.history(&id, query.after, limit).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextQuery {
    wait: Option<bool>,
    #[serde(default)]
    format: ContextFormat,
}

pub async fn context(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<ContextQuery>,
) -> ApiResult {
    let view = service.context(&id, query.wait.unwrap_or(true)).await?;
    match query.format {
        ContextFormat::Compactd => ok(view),
        format => ok(ProviderContext::new(&view, format)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummarizeBody {
    focus: Option<String>,
}

pub async fn summarize(
    State(service): Svc,
    SessionPath(id): SessionPath,
    JsonBody(body): JsonBody<SummarizeBody>,
) -> ApiResult {
    ok(service.summarize(&id, body.focus).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionQuery {
    #[serde(default)]
    after: u32,
    #[serde(default)]
    failures_after: u64,
    #[serde(default)]
    maskings_after: u64,
    limit: Option<usize>,
}

/// Most compactions (and failures) one page returns.
const MAX_COMPACTION_PAGE: usize = 100;

pub async fn compactions(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<CompactionQuery>,
) -> ApiResult {
    let limit = query.limit.unwrap_or(MAX_COMPACTION_PAGE);
    if limit == 0 || limit > MAX_COMPACTION_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_COMPACTION_PAGE}"
        )));
    }
    let page = HistoryRequest {
        after: query.after,
        failures_after: query.failures_after,
        maskings_after: query.maskings_after,
        limit,
    };
    ok(service.compaction_history(&id, page).await?)
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this endpoint",
    )
}
