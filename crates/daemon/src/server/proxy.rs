//! The proxy's HTTP side: `POST /v1/chat/completions`, `/v1/messages`,
//! `/v1/messages/count_tokens` and `/v1/responses`, and `GET /v1/models`, as the model APIs
//! serve them, for agents that were never written for compactd.
//!
//! A call's conversation goes to the service ([`crate::service::proxy`]), which places it in
//! its session and returns the context of its branch; the request's wire format
//! ([`crate::provider::wire`]) puts that context in place of the conversation, and everything
//! else the client sent (model, tools, parameters, query string, headers) goes upstream as it
//! came. The answer comes back as the upstream sent it, streamed or not, status and body
//! unchanged, and what it says is recorded before the client sees its end
//! ([`super::answer_reading`]). This module only speaks HTTP.

use super::answer_reading::{Then, passed_on, recording};
use super::error::ApiError;
use super::extract::Utf8Body;
use super::offload::SLOTS;
use super::proxy_body::ProxyBody;
use crate::protocol::{ErrorCode, SessionId};
use crate::provider::overflow::{MAX_ERROR_BYTES, overflow};
use crate::provider::wire::{Outgoing, Wire, WireRequest};
use crate::service::proxy::{Caller, Identity, Preview, ProxyTurn};
use crate::service::unrecorded::Refused;
use crate::service::{Service, ServiceError};
use crate::store::StoreError;
use crate::summarize::http::{MARK, VIA_HEADER};
use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use compactd_core::Overflow;
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Request headers never forwarded: the connection's own, our own, `content-type` (set for
/// the new body) and `accept-encoding` (the answer is read to record it, so it must come
/// uncompressed).
const NOT_FORWARDED: [&str; 10] = [
    "host",
    VIA_HEADER,
    "content-length",
    "content-type",
    "connection",
    "transfer-encoding",
    "accept-encoding",
    "x-compactd-session",
    "x-compactd-context-limit",
    "keep-alive",
];

/// Headers that name a conversation, as the agents send them (Claude Code's, Codex's and
/// opencode's), each with the header that names a sub-agent beside it in each of the
/// sub-agent's calls: Claude Code's (a fork's too; none in the main conversation's calls),
/// Codex's thread (the conversation header's own value in the main thread's). One id for all
/// of a sub-agent's calls, another for each (`agents::each_sub_agent_names_itself` holds the
/// real agents to it). A sub-agent is a conversation of its own by it: a Claude Code fork's
/// history and instructions are its parent's, told apart otherwise by one flag in its system
/// prompt, and a Codex sub-agent's instructions and preamble are its parent's.
const CONVERSATION_HEADERS: [(&str, Option<&str>); 3] = [
    ("x-claude-code-session-id", Some("x-claude-code-agent-id")),
    ("session-id", Some("thread-id")),
    ("x-session-id", None),
];

/// Marks a call that came over the loopback TCP listener, which any local user can reach.
#[derive(Debug, Clone, Copy)]
pub(super) struct Network;

pub(super) async fn chat_completions(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Utf8Body(bytes): Utf8Body,
) -> Result<Response, ApiError> {
    let body = ProxyBody::read(Wire::Chat, bytes).await?;
    let call = Call::new(Wire::Chat, network, query, headers, &body)?;
    logged(&call, proxied(&call, &service, body).await)
}

pub(super) async fn messages(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Utf8Body(bytes): Utf8Body,
) -> Result<Response, ApiError> {
    let body = ProxyBody::read(Wire::Anthropic, bytes).await?;
    let call = Call::new(Wire::Anthropic, network, query, headers, &body)?;
    logged(&call, proxied(&call, &service, body).await)
}

pub(super) async fn responses(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Utf8Body(bytes): Utf8Body,
) -> Result<Response, ApiError> {
    let body = ProxyBody::read(Wire::Responses, bytes).await?;
    let call = Call::new(Wire::Responses, network, query, headers, &body)?;
    // The history of a call that continues a stored response is upstream's: pass it on.
    let result = match body.fields["previous_response_id"].is_string() {
        true => {
            let bytes = body.sent();
            forward(&call, &service, Method::POST, "/responses", Some(bytes)).await
        }
        false => proxied(&call, &service, body).await,
    };
    logged(&call, result)
}

/// `POST /v1/messages/count_tokens`, answered for the compacted request: what the agent
/// counts is what really goes out.
pub(super) async fn count_tokens(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Utf8Body(bytes): Utf8Body,
) -> Result<Response, ApiError> {
    let body = ProxyBody::read(Wire::Anthropic, bytes).await?;
    let call = Call::new(Wire::Anthropic, network, query, headers, &body)?;
    let result = async {
        let caller = call.caller()?;
        let (request, body) = parsed(&call, body, "messages").await?;
        let preview = service
            .proxy_preview(&caller, call.identity()?, &request)
            .await?;
        let bytes = SLOTS
            .run(call.bytes, move || {
                let outgoing = previewed(Wire::Anthropic, preview.as_ref(), &request);
                Wire::Anthropic.render(&body, &outgoing)
            })
            .await?
            .map_err(internal)?;
        forward(
            &call,
            &service,
            Method::POST,
            "/messages/count_tokens",
            Some(bytes),
        )
        .await
    }
    .await;
    logged(&call, result)
}

/// `GET /v1/models`, passed on to the upstream the client's headers point to.
pub(super) async fn models(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let wire = if headers.contains_key("anthropic-version") || headers.contains_key("x-api-key") {
        Wire::Anthropic
    } else {
        Wire::Chat
    };
    let call = Call::new(wire, network, query, headers, &ProxyBody::none(wire))?;
    let result = match call.caller() {
        Ok(_) => forward(&call, &service, Method::GET, "/models", None).await,
        Err(e) => Err(e),
    };
    logged(&call, result)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Internal,
        e.to_string(),
    )
}

/// One proxied call's HTTP facts.
struct Call {
    wire: Wire,
    local: bool,
    query: Option<String>,
    headers: HeaderMap,
    /// The model the body names (for the log).
    model: String,
    /// The body asks for a streamed answer.
    streamed: bool,
    /// The body's size: its work runs off the workers if it is large ([`SLOTS`]).
    bytes: usize,
}

impl Call {
    /// `network` is set when the call came over the loopback listener. A call this daemon
    /// made itself is refused ([`VIA_HEADER`]).
    fn new(
        wire: Wire,
        network: Option<Extension<Network>>,
        query: Option<String>,
        headers: HeaderMap,
        body: &ProxyBody,
    ) -> Result<Call, ApiError> {
        if headers
            .get(VIA_HEADER)
            .is_some_and(|v| v.as_bytes() == MARK.as_bytes())
        {
            tracing::warn!(
                api = wire.name(),
                "a call this daemon made came back to its proxy: an upstream or the summarizer's base_url points at it"
            );
            return Err(ApiError::new(
                StatusCode::LOOP_DETECTED,
                ErrorCode::ProxyLoop,
                "this call came from this daemon itself: [proxy] openai_upstream, anthropic_upstream or [summarizer] base_url points at its own proxy; set it to the model API",
            ));
        }
        let fields = &body.fields;
        Ok(Call {
            wire,
            bytes: body.size(),
            local: network.is_none(),
            query,
            headers,
            model: fields["model"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(128)
                .collect(),
            streamed: fields["stream"] == true,
        })
    }

    fn caller(&self) -> Result<Caller, ApiError> {
        Ok(Caller::new(credential(&self.headers)?, self.local))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }

    fn identity(&self) -> Result<Identity, ApiError> {
        let named = self
            .header("x-compactd-session")
            .map(|v| {
                SessionId::parse(v)
                    .map_err(|_| ApiError::bad_request("x-compactd-session is not a session id"))
            })
            .transpose()?;
        let context_limit = self
            .header("x-compactd-context-limit")
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    ApiError::bad_request("x-compactd-context-limit is not a number of tokens")
                })
            })
            .transpose()?;
        let named_by = |header: &str| -> Option<String> {
            self.header(header).map(|v| v.chars().take(256).collect())
        };
        let (conversation, agent) = CONVERSATION_HEADERS
            .iter()
            .find_map(|(header, agent)| {
                let conversation = named_by(header)?;
                // Codex's main thread is named by the conversation header's own value.
                let agent = agent
                    .and_then(named_by)
                    .filter(|agent| *agent != conversation);
                Some((conversation, agent))
            })
            .unzip();
        let agent = agent.flatten();
        Ok(Identity {
            named,
            conversation,
            agent,
            context_limit,
        })
    }

    /// The upstream URL of this call's path.
    fn url(&self, service: &Service, path: &str) -> String {
        let proxy = &service.settings().config.proxy;
        let base = match self.wire {
            Wire::Anthropic => format!("{}/v1", proxy.anthropic_upstream.trim_end_matches('/')),
            Wire::Chat | Wire::Responses => proxy.openai_upstream.trim_end_matches('/').to_string(),
        };
        match &self.query {
            Some(query) => format!("{base}{path}?{query}"),
            None => format!("{base}{path}"),
        }
    }
}

/// Logs every refusal and every upstream failure (status, code, session, model; never a
/// body or a key), then answers.
fn logged(call: &Call, result: Result<Response, ApiError>) -> Result<Response, ApiError> {
    let model = call.model.as_str();
    match &result {
        Err(e) => {
            tracing::warn!(api = call.wire.name(), status = e.status.as_u16(), code = e.code.as_str(), model, reason = %e.message, "proxy refused a call");
            return result.map_err(ApiError::logged);
        }
        Ok(response) if !response.status().is_success() => {
            let session = response
                .headers()
                .get("x-compactd-session")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            tracing::warn!(
                api = call.wire.name(),
                status = response.status().as_u16(),
                session,
                model,
                "upstream answered with an error"
            );
        }
        Ok(_) => {}
    }
    result
}

async fn proxied(
    call: &Call,
    service: &Arc<Service>,
    body: ProxyBody,
) -> Result<Response, ApiError> {
    let caller = call.caller()?;
    let (mut request, mut body) = parsed(call, body, "the request's conversation").await?;
    let path = match call.wire {
        Wire::Chat => "/chat/completions",
        Wire::Anthropic => "/messages",
        Wire::Responses => "/responses",
    };
    // A context the upstream refuses as longer than the model's window (compactd's estimate
    // fell short of its tokenizer) is compacted to what it counted and sent once more. The
    // parsed request is kept for that until the answer's status: the body's charge holds it.
    let mut refused = None;
    loop {
        let identity = call.identity()?;
        let turn = match refused {
            None => service.proxy_turn(&caller, identity, &request).await,
            Some(refused) => {
                service
                    .proxy_retry(&caller, identity, &request, refused)
                    .await
            }
        };
        let turn = match turn {
            Ok(turn) => turn,
            Err(ServiceError::Store(why)) if why.leaves_a_call_unrecorded() => {
                return unrecorded(call, service, path, &caller, (request, body), &why).await;
            }
            Err(e) => return Err(e.into()),
        };
        let wire = call.wire;
        let (bytes, turn, kept) = SLOTS
            .run(call.bytes, move || {
                let bytes = wire.render(&body, &outgoing(wire, &turn, &request));
                (bytes, turn, (request, body))
            })
            .await?;
        (request, body) = kept;
        let bytes = bytes.map_err(internal)?;
        let watch = refused.is_none();
        match send(call, service, path, bytes, &turn, watch).await? {
            (response, Some(overflow)) if watch => {
                match service.proxy_overflow(&turn, overflow).await {
                    Ok(context) => refused = Some(context),
                    // Nothing can be compacted now: the refusal goes to the client as it came.
                    Err(ServiceError::Store(why)) if why.leaves_a_call_unrecorded() => {
                        return Ok(response);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            (response, _) => return Ok(response),
        }
    }
}

/// A call sent upstream while the store takes no writes (its disk full, a file removed or
/// overwritten under the daemon, its write lock held by another process past the bounded
/// wait): the context the session has stored (read, not written) and the call's messages
/// after it, compacted in memory once they would pass the session's trigger (see
/// `service::unrecorded`), or the client's own conversation when there is nothing to read;
/// the answer is not recorded. A refusal as longer than the model's window is compacted to
/// what it counted and sent once more, as a recorded call's is. An agent sends its whole
/// conversation with every call, so once writes go on, its next call stores what this one
/// could not: nothing is lost, and the agent does not stop for compactd's disk.
/// `x-compactd-unrecorded` names why.
async fn unrecorded(
    call: &Call,
    service: &Arc<Service>,
    path: &str,
    caller: &Caller,
    (mut conversation, mut body): (WireRequest, Value),
    why: &StoreError,
) -> Result<Response, ApiError> {
    let code = match why {
        StoreError::Full => ErrorCode::StorageFull,
        StoreError::Busy => ErrorCode::Busy,
        _ => ErrorCode::StorageGone,
    };
    let mut refused = None;
    loop {
        let preview = service
            .unrecorded_preview(caller, call.identity()?, &conversation, refused)
            .await
            .unwrap_or_default();
        let wire = call.wire;
        let (bytes, preview, kept) = SLOTS
            .run(call.bytes, move || {
                let sent = previewed(wire, preview.as_ref().map(|p| &p.preview), &conversation);
                let bytes = wire.render(&body, &sent);
                (bytes, preview, (conversation, body))
            })
            .await?;
        (conversation, body) = kept;
        let bytes = bytes.map_err(internal)?;
        let upstream = request(call, service, Method::POST, path, Some(bytes)).await?;
        let mut response = answer_head(&upstream).status(upstream.status().as_u16());
        if let Some(preview) = preview.as_ref().filter(|p| p.stored) {
            response = compactd_headers(response, &preview.preview.turn);
        }
        let response = response.header("x-compactd-unrecorded", code.as_str());
        let watch = refused.is_none() && preview.is_some();
        let then = (preview.as_ref())
            .filter(|p| !p.key.is_empty())
            .map(|p| Then::Learn {
                key: p.key.clone(),
                sent_tokens: p.tokens,
            });
        let (response, overflow) = answered(call, service, upstream, response, watch, then).await?;
        match (overflow, preview) {
            (Some(overflow), Some(preview)) => {
                refused = Some(Refused {
                    overflow,
                    sent_tokens: preview.tokens,
                })
            }
            _ => return Ok(response),
        }
    }
}

/// The call's conversation read from its body (off the workers if the body is large), and the
/// body with the conversation taken out.
/// `what` names the conversation in an error.
async fn parsed(
    call: &Call,
    body: ProxyBody,
    what: &str,
) -> Result<(WireRequest, Value), ApiError> {
    SLOTS
        .run(call.bytes, move || body.parse())
        .await?
        .map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// What goes upstream for a call nothing is stored of: its `preview` (the context it would
/// be sent with), then the call's messages after those the preview stands for; the call's
/// messages as they are without one.
fn previewed<'a>(
    wire: Wire,
    preview: Option<&'a Preview>,
    request: &'a WireRequest,
) -> Vec<Outgoing<'a>> {
    let (mut out, rest) = match preview {
        Some(preview) => (outgoing(wire, &preview.turn, request), preview.matched),
        None => (Vec::new(), 0),
    };
    out.extend(request.natives[rest..].iter().map(Outgoing::Native));
    out
}

/// What goes upstream for a call: the context's messages as the request has them (patched
/// where the context masks or shortens them), the summary in place of the rest. When a context
/// message is not on the call's branch (another call of the conversation moved it meanwhile),
/// the context is rendered from compactd's own messages instead.
fn outgoing<'a>(wire: Wire, turn: &'a ProxyTurn, request: &'a WireRequest) -> Vec<Outgoing<'a>> {
    use crate::protocol::ContextMessage;
    let mut out = Vec::with_capacity(turn.context.messages.len());
    for message in &turn.context.messages {
        match message {
            ContextMessage::Summary { parts, .. } => {
                if let Some(crate::message::Part::Text { text }) = parts.first() {
                    out.push(Outgoing::Summary(text));
                }
            }
            ContextMessage::Stored(stored) => {
                let Some(native) = turn
                    .branch
                    .position(stored.seq)
                    .and_then(|p| request.natives.get(p))
                else {
                    return fallback(wire, turn);
                };
                if stored.masked || stored.shortened {
                    match stored.to_message() {
                        Ok(shown) => out.push(Outgoing::Patched { native, shown }),
                        Err(_) => out.push(Outgoing::Native(native)),
                    }
                } else {
                    out.push(Outgoing::Native(native));
                }
            }
        }
    }
    out
}

fn fallback<'a>(wire: Wire, turn: &ProxyTurn) -> Vec<Outgoing<'a>> {
    wire.rendered(&turn.context.to_messages())
        .into_iter()
        .map(Outgoing::Rendered)
        .collect()
}

/// The client's API key, as it sent it (`Authorization` or `x-api-key`).
fn credential(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(header::AUTHORIZATION)
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "the proxy needs the client's API key (Authorization or x-api-key): its sessions belong to it",
            )
        })
}

/// Sends the call upstream and answers with what came back.
async fn forward(
    call: &Call,
    service: &Arc<Service>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Response, ApiError> {
    let upstream = request(call, service, method, path, body).await?;
    let status = upstream.status();
    let response = answer_head(&upstream).status(status.as_u16());
    let body = Body::from_stream(upstream.bytes_stream());
    response.body(body).map_err(internal)
}

/// The upstream's answer, passed on with `response`'s head, a success read as it passes for
/// `then` (if anything); with `watch`, a refusal is read (within [`MAX_ERROR_BYTES`]) to tell whether the
/// upstream found the prompt longer than the model's window, and what it counted.
async fn answered(
    call: &Call,
    service: &Arc<Service>,
    mut upstream: reqwest::Response,
    response: axum::http::response::Builder,
    watch: bool,
    then: Option<Then>,
) -> Result<(Response, Option<Overflow>), ApiError> {
    let status = upstream.status().as_u16();
    if !watch || !matches!(status, 400 | 413) {
        let recording = (then)
            .filter(|_| upstream.status().is_success())
            .map(|then| recording(service, then, call.wire, call.streamed));
        let body = Body::from_stream(passed_on(upstream.bytes_stream(), recording));
        return Ok((response.body(body).map_err(internal)?, None));
    }
    let mut head = Vec::new();
    while head.len() <= MAX_ERROR_BYTES {
        match upstream.chunk().await.map_err(unreachable)? {
            Some(chunk) => head.extend_from_slice(&chunk),
            None => {
                let overflow = overflow(status, &head);
                return Ok((response.body(Body::from(head)).map_err(internal)?, overflow));
            }
        }
    }
    // Longer than any refusal: passed on as it comes.
    let read = futures_util::stream::iter([Ok(Bytes::from(head))]);
    let body = Body::from_stream(read.chain(upstream.bytes_stream()));
    Ok((response.body(body).map_err(internal)?, None))
}

/// Sends a turn's call upstream and answers with what came back, recording the answer. With
/// `watch`, a refusal is read (within [`MAX_ERROR_BYTES`]) to tell whether the upstream found
/// the prompt longer than the model's window, and what it counted.
async fn send(
    call: &Call,
    service: &Arc<Service>,
    path: &str,
    body: Vec<u8>,
    turn: &ProxyTurn,
    watch: bool,
) -> Result<(Response, Option<Overflow>), ApiError> {
    let upstream = request(call, service, Method::POST, path, Some(body)).await?;
    let response = compactd_headers(
        answer_head(&upstream).status(upstream.status().as_u16()),
        turn,
    );
    let then = Then::Record {
        id: turn.id.clone(),
        after_seq: turn.last_seq,
        sent: turn.sent,
    };
    answered(call, service, upstream, response, watch, Some(then)).await
}

/// The call, sent upstream with the client's headers (but [`NOT_FORWARDED`]) and ours.
async fn request(
    call: &Call,
    service: &Arc<Service>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<reqwest::Response, ApiError> {
    let timeout = Duration::from_secs(service.settings().config.proxy.timeout_s);
    let mut request = crate::summarize::http::HTTP
        .request(method, call.url(service, path))
        .timeout(timeout);
    for (name, value) in &call.headers {
        if !NOT_FORWARDED.contains(&name.as_str()) {
            request = request.header(name.as_str(), value.as_bytes());
        }
    }
    request = request.header(VIA_HEADER, MARK.as_str());
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    request.send().await.map_err(unreachable)
}

/// The answer's headers as the upstream sent them, but those of its own connection.
fn answer_head(upstream: &reqwest::Response) -> axum::http::response::Builder {
    let mut response = Response::builder();
    for (name, value) in upstream.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(name, value);
        }
    }
    response
}

fn unreachable(e: reqwest::Error) -> ApiError {
    let what = if e.is_timeout() {
        "timed out"
    } else {
        "could not be reached"
    };
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        ErrorCode::UpstreamUnreachable,
        format!("the upstream model API {what} ([proxy] openai_upstream or anthropic_upstream)"),
    )
}

/// `x-compactd-session`, `x-compactd-compaction` (the compaction the context sent upstream
/// starts from, `0` for none) and `x-compactd-session-kind` (`proxy` or `side`).
fn compactd_headers(
    mut response: axum::http::response::Builder,
    turn: &ProxyTurn,
) -> axum::http::response::Builder {
    let mut add = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response = std::mem::take(&mut response).header(HeaderName::from_static(name), value);
        }
    };
    add("x-compactd-session", turn.id.to_string());
    add(
        "x-compactd-compaction",
        turn.context.compaction_num.to_string(),
    );
    add("x-compactd-session-kind", turn.kind.as_str().to_string());
    response
}
