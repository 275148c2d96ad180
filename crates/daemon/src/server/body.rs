//! Reading request bodies within bounds, whatever the client does, and charging each for what
//! it costs once parsed.
//!
//! Every request with a body passes [`api_bodies`] or [`proxy_bodies`] before its handler: the
//! body is read into one buffer (at most `[server] max_body_bytes`, or `[proxy]
//! max_body_bytes` for the proxy's routes) within `[server] request_timeout_s`, after taking
//! its size from the request budget every listener shares ([`crate::service::memory`]). Once
//! read, it is scanned (not parsed) for how many JSON objects and arrays it holds and how deep
//! they nest ([`Shape`]): a parsed message costs far more than its bytes (220,000 tiny
//! messages are 7.5 MB of JSON and over 200 MB parsed), so the charge grows to what parsing
//! and handling it will hold ([`Costs`], one for the API's routes, one for the proxy's), and the charge is kept until the
//! handler has answered. A body that would cost more than its routes allow, or nests deeper
//! than [`MAX_DEPTH`], is refused before it is parsed. A client that trickles a body, or many
//! clients sending large ones at once to both, cannot grow the daemon's memory beyond
//! the budget.

use super::error::ApiError;
use crate::compaction::microcompact::thousands;
use crate::json_shape::Shape;
use crate::protocol::ErrorCode;
use crate::service::Service;
use crate::service::memory::{Budget, Charge, Costs};
use axum::body::{Body, HttpBody as _};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;

/// How long a request waits for room in the budget before it is told to retry.
const BUDGET_WAIT: Duration = Duration::from_secs(5);
/// What a body of unknown length is charged before any of it has come.
const UNDECLARED_FIRST_CHARGE: usize = 64 * 1024;
/// How deep JSON objects and arrays may nest in one request.
pub(super) const MAX_DEPTH: usize = 64;

/// The API's routes: bodies up to `[server] max_body_bytes`.
pub(super) async fn api_bodies(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    let limit = service.settings().config.server.max_body_bytes;
    let limits = BodyLimits {
        bytes: limit,
        setting: "[server] max_body_bytes",
        costs: Costs::API,
    };
    bounded(&service, limits, req, next).await
}

/// The proxy's routes: a whole conversation comes with every call, up to `[proxy]
/// max_body_bytes`, and up to what the request budget can hold of it once read (its messages
/// are held as text, [`crate::provider::wire::Native`], so this is several times the
/// messages the API takes in one request: an agent behind the proxy never compacts
/// its own history, and resends all of it with every call).
pub(super) async fn proxy_bodies(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    let limit = service.settings().config.proxy.max_body_bytes;
    let limits = BodyLimits {
        bytes: limit,
        setting: "[proxy] max_body_bytes",
        costs: Costs::PROXY,
    };
    bounded(&service, limits, req, next).await
}

/// A route group's body limit, the setting it comes from, and what its bodies cost once read.
#[derive(Debug, Clone, Copy)]
struct BodyLimits {
    bytes: usize,
    setting: &'static str,
    costs: Costs,
}

impl BodyLimits {
    /// Why a body of `bytes` and `shape`, costing `cost`, is refused before it is parsed, if
    /// it is: it nests too deep, or holds more than its routes take (a count of containers,
    /// or what the budget holds).
    fn refusal(self, shape: Shape, bytes: usize, cost: usize, budget: &Budget) -> Option<ApiError> {
        if shape.depth > MAX_DEPTH {
            return Some(ApiError::bad_request(format!(
                "the body nests JSON objects and arrays deeper than {MAX_DEPTH} levels"
            )));
        }
        let too_large = |message: String| {
            Some(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::TooLarge,
                message,
            ))
        };
        match self.costs.max_containers {
            Some(max) if shape.containers > max => too_large(format!(
                "the body holds {} JSON objects and arrays, more than the {} one request may hold (each message is one, each of its parts one): send the messages in several requests",
                thousands(shape.containers),
                thousands(max)
            )),
            None if cost > budget.bytes() => too_large(format!(
                "the conversation is too long for the proxy: its {} JSON objects and arrays ({} bytes) would hold {} MiB once read, more than the {} MiB all requests share. Start a new conversation or compact this one in the agent (Claude Code, Codex: /compact); compactd keeps its history",
                thousands(shape.containers),
                thousands(bytes),
                cost >> 20,
                budget.bytes() >> 20
            )),
            _ => None,
        }
    }

    fn exceeded(self) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooLarge,
            format!(
                "request body is larger than the limit of {} bytes ({})",
                self.bytes, self.setting
            ),
        )
    }
}

async fn bounded(service: &Arc<Service>, limits: BodyLimits, req: Request, next: Next) -> Response {
    if req.body().size_hint().exact() == Some(0) {
        return next.run(req).await;
    }
    match read_charged(service, limits, req).await {
        Ok((req, charge)) => {
            let response = next.run(req).await;
            // The parsed body and everything made of it are gone once the handler answered
            // (a streamed answer's recording is charged on its own as it grows).
            drop(charge);
            response
        }
        Err(e) => e.into_response(),
    }
}

/// Reads the body within its limit and deadline, charged first for its bytes, then for what
/// its parsed form will hold; gives the request back with the body in memory.
async fn read_charged(
    service: &Arc<Service>,
    limit: BodyLimits,
    req: Request,
) -> Result<(Request, Charge), ApiError> {
    let declared = req.body().size_hint().exact().map(|n| n as usize);
    if declared.is_some_and(|n| n > limit.bytes) {
        return Err(limit.exceeded());
    }
    let budget = &service.memory().requests;
    // A body of unknown length (chunked) is charged for what has come of it, growing as it
    // comes: charged its limit up front, five slow ones held every request's budget.
    let mut charge = budget
        .take(
            declared.unwrap_or(UNDECLARED_FIRST_CHARGE.min(limit.bytes)),
            Some(BUDGET_WAIT),
        )
        .await
        .ok_or_else(busy)?;
    let timeout = Duration::from_secs(service.settings().config.server.request_timeout_s);
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, declared, limit, timeout, (budget, &mut charge)).await?;
    let shape = Shape::of(&bytes);
    let cost = limit.costs.of(bytes.len(), shape.containers);
    if let Some(refusal) = limit.refusal(shape, bytes.len(), cost, budget) {
        return Err(refusal);
    }
    let more = cost.saturating_sub(charge.bytes());
    if !budget.extend(&mut charge, more, BUDGET_WAIT).await {
        return Err(busy());
    }
    Ok((Request::from_parts(parts, Body::from(bytes)), charge))
}

fn busy() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Busy,
        "too many large requests in flight; retry shortly",
    )
    .retry_after(1)
}

/// Reads `body`, declared `declared` bytes long (if known), refusing more than the limit;
/// `charge` grows from `budget` with what arrives, doubling, when it holds less.
async fn read_body(
    body: Body,
    declared: Option<usize>,
    limit: BodyLimits,
    timeout: Duration,
    (budget, charge): (&Budget, &mut Charge),
) -> Result<Vec<u8>, ApiError> {
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("cannot read request body: {e}")))?;
            if let Some(data) = frame.data_ref() {
                let read = bytes.len() + data.len();
                if read > limit.bytes {
                    return Err(limit.exceeded());
                }
                if read > charge.bytes() {
                    let more = read.max(charge.bytes() * 2).min(limit.bytes) - charge.bytes();
                    if !budget.extend(charge, more, BUDGET_WAIT).await {
                        return Err(busy());
                    }
                }
                bytes.extend_from_slice(data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::Timeout,
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs()
                ),
            ));
        }
    }
    Ok(bytes)
}
