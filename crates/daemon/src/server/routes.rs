//! The handlers: parse, call the service, shape the answer. No decisions live here. Each
//! carries its OpenAPI description (`openapi` collects them).

use super::error::ApiError;
use super::extract::{ApiQuery, JsonBody, SessionPath, Utf8Body};
use crate::message::{BatchError, parse_message_batch};
use crate::protocol::{
    AppendBody, AppendResponse, CompactionHistory, CompactionQuery, ContextFormat, ContextQuery,
    ContextView, CreateSessionRequest, Deleted, ErrorBody, ErrorCode, Health, HistoryPage,
    HistoryQuery, OverflowOutcome, OverflowReport, ProviderContext, SearchQuery, SearchResults,
    SessionList, SessionListQuery, SessionView, SummarizeOutcome, SummarizeRequest,
    UpdateSessionRequest,
};
use crate::service::{CreateSession, HistoryRequest, Service};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use std::sync::Arc;

type Svc = State<Arc<Service>>;
type ApiResult = Result<axum::response::Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(value).into_response())
}

#[utoipa::path(get, path = "/v1/health", tag = "daemon",
    responses((status = 200, description = "The daemon is up", body = Health)))]
pub(super) async fn health(State(service): Svc) -> ApiResult {
    let settings = service.settings();
    let mut config = service.config_status();
    config.exists = config
        .path
        .as_deref()
        .is_some_and(|p| std::path::Path::new(p).exists());
    let refused = service.store().writes_refused();
    ok(Health {
        status: match &refused {
            Some(r) if r.until_restart => "refusing_writes".into(),
            Some(_) => "storage_full".into(),
            None => "ok".into(),
        },
        writes_refused: refused.map(|r| r.why),
        write_lock_held_elsewhere: service.store().write_lock_held_elsewhere(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: service.uptime_s(),
        pid: std::process::id(),
        summarizer: settings.summarizer.name(),
        database: service.store().path().display().to_string(),
        config,
        proxy: crate::protocol::ProxyStatus {
            openai_upstream: settings.config.proxy.openai_upstream.clone(),
            anthropic_upstream: settings.config.proxy.anthropic_upstream.clone(),
            listen: settings.config.proxy.listen.clone(),
            unpinned_system_prompts: service.unpinned_system_prompts(),
        },
        memory: service.memory().status(),
        disk: {
            let (database_bytes, free_bytes) = service.store().disk_usage();
            crate::protocol::DiskStatus {
                database_bytes,
                free_bytes,
            }
        },
        summarizer_calls: settings.summarizer_slots.status(),
    })
}

#[utoipa::path(post, path = "/v1/session", tag = "sessions", request_body = CreateSessionRequest,
    responses(
        (status = 201, description = "Created", body = SessionView),
        (status = 400, description = "`bad_request`: a bad id, config key or context_limit", body = ErrorBody),
        (status = 409, description = "`conflict`: the session exists", body = ErrorBody)))]
pub(super) async fn create_session(
    State(service): Svc,
    JsonBody(body): JsonBody<CreateSessionRequest>,
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

/// Most sessions one page of the list returns.
const MAX_SESSION_PAGE: usize = 1_000;

#[utoipa::path(get, path = "/v1/session", tag = "sessions", params(SessionListQuery),
    responses(
        (status = 200, description = "A page of the sessions in id order (follow `next_after`)", body = SessionList),
        (status = 400, description = "`bad_request`", body = ErrorBody)))]
pub(super) async fn list_sessions(
    State(service): Svc,
    ApiQuery(query): ApiQuery<SessionListQuery>,
) -> ApiResult {
    let limit = page_limit(query.limit, MAX_SESSION_PAGE, MAX_SESSION_PAGE)?;
    ok(service.sessions_page(query.after, limit).await?)
}

#[utoipa::path(get, path = "/v1/session/{id}", tag = "sessions", params(("id" = String, Path)),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn get_session(State(service): Svc, SessionPath(id): SessionPath) -> ApiResult {
    ok(service.session(&id).await?)
}

#[utoipa::path(patch, path = "/v1/session/{id}", tag = "sessions", params(("id" = String, Path)),
    request_body = UpdateSessionRequest,
    responses(
        (status = 200, description = "The session after the change (a compaction may have started)", body = SessionView),
        (status = 400, description = "`bad_request`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn update_session(
    State(service): Svc,
    SessionPath(id): SessionPath,
    JsonBody(body): JsonBody<UpdateSessionRequest>,
) -> ApiResult {
    ok(service.update_session(&id, body).await?)
}

#[utoipa::path(delete, path = "/v1/session/{id}", tag = "sessions", params(("id" = String, Path)),
    responses(
        (status = 200, description = "Hidden from the API; its rows stay in the database", body = Deleted),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn delete_session(State(service): Svc, SessionPath(id): SessionPath) -> ApiResult {
    service.delete_session(&id).await?;
    ok(Deleted { deleted: true, id })
}

/// `POST /session/{id}/message` takes one message, an array of messages, or
/// `{"messages": [...], "usage": {"input_tokens": N}, "wait": bool}`; an `Idempotency-Key`
/// header makes a retry append nothing twice.
#[utoipa::path(post, path = "/v1/session/{id}/message", tag = "messages",
    params(("id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 128 printable ASCII characters: a retry with the same key appends nothing again")),
    request_body = AppendBody,
    responses(
        (status = 200, description = "Stored (the session is created if new)", body = AppendResponse),
        (status = 400, description = "`bad_request`, `invalid_message`, `unknown_call`, `pinned_too_large`", body = ErrorBody),
        (status = 409, description = "`conflict` (a second result for a call; a conversation the proxy records), `idempotency_mismatch`", body = ErrorBody),
        (status = 413, description = "`too_large`", body = ErrorBody),
        (status = 503, description = "`busy` (Retry-After), `shutting_down`, `storage_gone`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody)))]
pub(super) async fn append(
    State(service): Svc,
    SessionPath(id): SessionPath,
    headers: HeaderMap,
    Utf8Body(body): Utf8Body,
) -> ApiResult {
    // The body's bytes are not needed once parsed (they are freed where it was parsed).
    let batch = super::offload::SLOTS
        .run(body.len(), move || parse_message_batch(&body))
        .await?
        .map_err(|e| match e {
            BatchError::Message { .. } => ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidMessage,
                e.to_string(),
            ),
            other => ApiError::bad_request(other.to_string()),
        })?;
    let idempotency_key = match headers.get("idempotency-key") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be printable ASCII"))?
                .to_string(),
        ),
        None => None,
    };
    // The service refuses a count past MAX_REPORTED_TOKENS.
    ok(service.append(&id, batch, idempotency_key).await?)
}

/// Most messages one history page returns.
const MAX_PAGE: usize = 1_000;

#[utoipa::path(get, path = "/v1/session/{id}/message", tag = "messages",
    params(("id" = String, Path), HistoryQuery),
    responses(
        (status = 200, description = "A page of the history, every message whole", body = HistoryPage),
        (status = 400, description = "`bad_request`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn history(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult {
    let limit = page_limit(query.limit, 100, MAX_PAGE)?;
    ok(service.history(&id, query.after, limit).await?)
}

/// Most results one search returns.
const MAX_SEARCH_RESULTS: usize = 100;

#[utoipa::path(get, path = "/v1/session/{id}/search", tag = "messages",
    params(("id" = String, Path), SearchQuery),
    responses(
        (status = 200, description = "The session's messages that best match the words, over its whole history (compacted and masked ones included); read one whole with `GET /v1/session/{id}/message?after=SEQ-1&limit=1`", body = SearchResults),
        (status = 400, description = "`bad_request` (no word to search for, a query over 2,000 bytes, a bad limit)", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn search(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<SearchQuery>,
) -> ApiResult {
    let limit = page_limit(query.limit, 10, MAX_SEARCH_RESULTS)?;
    ok(service.search(&id, &query.q, limit).await?)
}

#[utoipa::path(get, path = "/v1/session/{id}/context", tag = "messages",
    params(("id" = String, Path), ContextQuery),
    responses(
        (status = 200, description = "What to send to the model now: `ContextView` by default, `ProviderContext` with `format=openai` or `format=anthropic`",
            body = inline(ContextAnswer)),
        (status = 400, description = "`bad_request`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn context(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<ContextQuery>,
) -> ApiResult {
    let view = service.context(&id, query.wait.unwrap_or(true)).await?;
    match query.format {
        ContextFormat::Compactd => ok(view),
        format => ok(crate::service::views::provider_context(&view, format)),
    }
}

/// The two shapes of a context answer (for the OpenAPI document).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum ContextAnswer {
    Compactd(ContextView),
    Provider(ProviderContext),
}

#[utoipa::path(post, path = "/v1/session/{id}/summarize", tag = "compaction",
    params(("id" = String, Path)), request_body = SummarizeRequest,
    responses(
        (status = 200, description = "Compacted, or why not (`compacted: false`)", body = SummarizeOutcome),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict`, `pinned_too_large`", body = ErrorBody),
        (status = 503, description = "`summarizer_failed` (recorded), `shutting_down`", body = ErrorBody)))]
pub(super) async fn summarize(
    State(service): Svc,
    SessionPath(id): SessionPath,
    JsonBody(body): JsonBody<SummarizeRequest>,
) -> ApiResult {
    ok(service.summarize(&id, body.focus).await?)
}

#[utoipa::path(post, path = "/v1/session/{id}/overflow", tag = "compaction",
    params(("id" = String, Path)), request_body = OverflowReport,
    responses(
        (status = 200, description = "Recorded (or not: `noted: false`, a compaction landed since the call was sent), the compaction that makes the context fit started", body = OverflowOutcome),
        (status = 400, description = "`bad_request` (`error` is not a refusal of a prompt as too long, figures out of range)", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict` (a conversation the proxy records)", body = ErrorBody)))]
pub(super) async fn overflow(
    State(service): Svc,
    SessionPath(id): SessionPath,
    JsonBody(report): JsonBody<OverflowReport>,
) -> ApiResult {
    ok(service.report_overflow(&id, report).await?)
}

/// A page size the client asked for (or `default`), refused outside 1 to `max`.
fn page_limit(asked: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match asked.unwrap_or(default) {
        limit @ 1.. if limit <= max => Ok(limit),
        _ => Err(ApiError::bad_request(format!("limit must be 1 to {max}"))),
    }
}

/// Most compactions (and failures) one page returns.
const MAX_COMPACTION_PAGE: usize = 100;

#[utoipa::path(get, path = "/v1/session/{id}/compaction", tag = "compaction",
    params(("id" = String, Path), CompactionQuery),
    responses(
        (status = 200, description = "Compactions, failed attempts and maskings, oldest first, paged", body = CompactionHistory),
        (status = 400, description = "`bad_request`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody)))]
pub(super) async fn compactions(
    State(service): Svc,
    SessionPath(id): SessionPath,
    ApiQuery(query): ApiQuery<CompactionQuery>,
) -> ApiResult {
    let limit = page_limit(query.limit, MAX_COMPACTION_PAGE, MAX_COMPACTION_PAGE)?;
    let page = HistoryRequest {
        after: query.after,
        failures_after: query.failures_after,
        maskings_after: query.maskings_after,
        limit,
    };
    ok(service.compaction_history(&id, page).await?)
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "daemon",
    responses((status = 200, description = "This API's OpenAPI 3.1 document")))]
pub(super) async fn openapi() -> ApiResult {
    ok(crate::server::openapi::document())
}

pub(super) async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such endpoint",
    )
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        "method not allowed on this endpoint",
    )
}
