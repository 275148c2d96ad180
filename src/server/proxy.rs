//! `POST /v1/chat/completions` and `POST /v1/messages`: compactd as an OpenAI- and
//! Anthropic-compatible endpoint for agents that were never written for it. The client sends its whole conversation; the service maps it to a
//! session ([`crate::service::proxy`]); upstream gets the session's context in its place, with
//! the client's model, tools, parameters and headers otherwise untouched; the answer comes back
//! as the upstream sent it (streamed or not), and is appended to the session before the client
//! sees its end.

use super::error::ApiError;
use super::extract::JsonBody;
use crate::message::Message;
use crate::protocol::{ErrorCode, SessionId};
use crate::service::Service;
use crate::service::proxy::{Caller, ProxyTurn};
use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The most of a streamed answer kept to record it; a longer one is recorded by the client's
/// next call, which carries it.
const MAX_RECORDED_STREAM: usize = 16 * 1024 * 1024;

/// Request headers never forwarded: the connection's own, our own, `content-type` (set for
/// the new body) and `accept-encoding` (the answer is read to record it, so it must come
/// uncompressed).
const NOT_FORWARDED: [&str; 7] = [
    "host",
    "content-length",
    "content-type",
    "connection",
    "transfer-encoding",
    "accept-encoding",
    "x-compactd-session",
];

/// Marks a call that came over the loopback TCP listener, which any local user can reach.
#[derive(Debug, Clone, Copy)]
pub struct Network;

/// Which model API a call speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// Chat Completions.
    OpenAi,
    /// Messages.
    Anthropic,
}

pub async fn chat_completions(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    proxied(Api::OpenAi, service, network.is_none(), headers, body).await
}

pub async fn messages(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    proxied(Api::Anthropic, service, network.is_none(), headers, body).await
}

async fn proxied(
    api: Api,
    service: Arc<Service>,
    local: bool,
    headers: HeaderMap,
    mut body: Value,
) -> Result<Response, ApiError> {
    let caller = Caller::new(credential(&headers)?, local);
    let wanted = match headers.get("x-compactd-session") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| SessionId::parse(v).ok())
                .ok_or_else(|| ApiError::bad_request("x-compactd-session is not a session id"))?,
        ),
        None => None,
    };
    let conversation = match api {
        Api::OpenAi => crate::transcript::openai_messages(&body["messages"]),
        Api::Anthropic => crate::transcript::anthropic_messages(&body),
    }
    .map_err(|e| ApiError::bad_request(format!("messages: {e}")))?;
    let turn = service.proxy_turn(&caller, wanted, conversation).await?;
    put_context(api, &mut body, &turn);
    let streaming = body["stream"] == true;
    let upstream = send_upstream(api, &service, &headers, &body).await?;
    let status = upstream.status();
    let mut response = Response::builder().status(status.as_u16());
    for (name, value) in upstream.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(name, value);
        }
    }
    let response = compactd_headers(response, &turn);
    let body = if !status.is_success() {
        Body::from(upstream.bytes().await.unwrap_or_default())
    } else if streaming {
        Body::from_stream(recorded_stream(
            api,
            service,
            turn.id,
            upstream.bytes_stream(),
        ))
    } else {
        let bytes = upstream.bytes().await.map_err(unreachable)?;
        record(&service, &turn.id, reply_of(api, &bytes)).await;
        Body::from(bytes)
    };
    response.body(body).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e.to_string(),
        )
    })
}

/// The client's body with its conversation replaced by the session's context.
fn put_context(api: Api, body: &mut Value, turn: &ProxyTurn) {
    let messages = turn.context.to_messages();
    match api {
        Api::OpenAi => {
            body["messages"] = Value::Array(crate::provider::openai::messages(&messages));
        }
        Api::Anthropic => {
            // A client that marks cache breakpoints (Claude Code does) pays for uncached input
            // otherwise: the context is byte-stable between compactions, so mark it the same.
            let wants_cache = has_key(body, "cache_control");
            let conversation = crate::provider::anthropic::conversation(&messages);
            body["messages"] = Value::Array(conversation.messages);
            match (conversation.system, body.as_object_mut()) {
                (Some(system), _) => body["system"] = Value::String(system),
                (None, Some(object)) => {
                    object.remove("system");
                }
                (None, None) => {}
            }
            if wants_cache {
                mark_cache_breakpoints(body);
            }
        }
    }
}

/// Whether `key` names a field anywhere in `value` (found without serializing the body).
fn has_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(map) => map.contains_key(key) || map.values().any(|v| has_key(v, key)),
        Value::Array(items) => items.iter().any(|v| has_key(v, key)),
        _ => false,
    }
}

/// Puts Anthropic `cache_control` breakpoints after the system text and after the last
/// message's last block, so the whole prefix is read from cache on the next call.
fn mark_cache_breakpoints(body: &mut Value) {
    let breakpoint = json!({"type": "ephemeral"});
    if let Some(system) = body["system"].as_str().map(str::to_string) {
        body["system"] = json!([{"type": "text", "text": system, "cache_control": breakpoint}]);
    }
    let Some(last) = body["messages"].as_array_mut().and_then(|m| m.last_mut()) else {
        return;
    };
    if let Some(text) = last["content"].as_str().map(str::to_string) {
        last["content"] = json!([{"type": "text", "text": text}]);
    }
    if let Some(block) = last["content"].as_array_mut().and_then(|b| b.last_mut()) {
        block["cache_control"] = breakpoint;
    }
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

async fn send_upstream(
    api: Api,
    service: &Service,
    headers: &HeaderMap,
    body: &Value,
) -> Result<reqwest::Response, ApiError> {
    let proxy = service.settings().config.proxy.clone();
    let url = match api {
        Api::OpenAi => format!(
            "{}/chat/completions",
            proxy.openai_upstream.trim_end_matches('/')
        ),
        Api::Anthropic => format!(
            "{}/v1/messages",
            proxy.anthropic_upstream.trim_end_matches('/')
        ),
    };
    let mut request = crate::summarize::http::HTTP
        .post(url)
        .timeout(Duration::from_secs(proxy.timeout_s));
    for (name, value) in headers {
        if !NOT_FORWARDED.contains(&name.as_str()) {
            request = request.header(name.as_str(), value.as_bytes());
        }
    }
    request
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(unreachable)
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
/// starts from, `0` for none) and, after a fork, `x-compactd-forked-from`.
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
    if let Some(from) = &turn.forked_from {
        add("x-compactd-forked-from", from.to_string());
    }
    response
}

/// The upstream's stream, passed through chunk by chunk; at its end the answer it carried is
/// appended to the session before the client sees the end.
fn recorded_stream(
    api: Api,
    service: Arc<Service>,
    id: SessionId,
    upstream: impl Stream<Item = reqwest::Result<Bytes>> + Send + Unpin + 'static,
) -> impl Stream<Item = Result<Bytes, reqwest::Error>> + Send {
    let state = (upstream, Vec::new(), Some((service, id)));
    futures_util::stream::unfold(
        state,
        move |(mut upstream, mut seen, mut after)| async move {
            match upstream.next().await {
                Some(Ok(chunk)) => {
                    if seen.len() + chunk.len() <= MAX_RECORDED_STREAM {
                        seen.extend_from_slice(&chunk);
                    }
                    Some((Ok(chunk), (upstream, seen, after)))
                }
                Some(Err(e)) => Some((Err(e), (upstream, seen, None))),
                None => {
                    if let Some((service, id)) = after.take() {
                        record(&service, &id, reply_of_stream(api, &seen)).await;
                    }
                    None
                }
            }
        },
    )
}

/// Appends a recorded answer; a failure only loses the record (the client's next call
/// carries the answer anyway), so it is logged, not returned.
async fn record(service: &Arc<Service>, id: &SessionId, reply: Option<(Message, Option<usize>)>) {
    let Some((message, tokens)) = reply else {
        return;
    };
    if message.parts.is_empty() {
        return;
    }
    if let Err(e) = service.proxy_reply(id, message, tokens).await {
        tracing::warn!(session = %id, error = %e, "could not record a proxied answer");
    }
}

/// The assistant message of an answer, and the tokens of the context after it (input plus
/// output), when the upstream reported them.
fn reply_of(api: Api, bytes: &[u8]) -> Option<(Message, Option<usize>)> {
    let answer: Value = serde_json::from_slice(bytes).ok()?;
    match api {
        Api::OpenAi => {
            let message = &answer["choices"][0]["message"];
            let message =
                crate::transcript::openai_message(message.is_object().then_some(message)?)?;
            Some((message, openai_usage(&answer["usage"])))
        }
        Api::Anthropic => Some((
            crate::transcript::anthropic_reply(&answer["content"]),
            anthropic_usage(&answer["usage"], None),
        )),
    }
}

fn openai_usage(usage: &Value) -> Option<usize> {
    Some(
        (usage["prompt_tokens"].as_u64()? + usage["completion_tokens"].as_u64().unwrap_or(0))
            as usize,
    )
}

/// Anthropic counts cached input apart: all of it is context.
fn anthropic_usage(usage: &Value, output: Option<u64>) -> Option<usize> {
    let input = usage["input_tokens"].as_u64()?;
    let cached = ["cache_read_input_tokens", "cache_creation_input_tokens"]
        .iter()
        .filter_map(|k| usage[k].as_u64())
        .sum::<u64>();
    let output = output.or(usage["output_tokens"].as_u64()).unwrap_or(0);
    Some((input + cached + output) as usize)
}

/// The `data:` payloads of a server-sent event stream that parse as JSON.
fn stream_events(bytes: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect()
}

fn reply_of_stream(api: Api, bytes: &[u8]) -> Option<(Message, Option<usize>)> {
    let events = stream_events(bytes);
    match api {
        Api::OpenAi => {
            let (message, tokens) = openai_stream_reply(&events)?;
            Some((crate::transcript::openai_message(&message)?, tokens))
        }
        Api::Anthropic => anthropic_stream_reply(&events),
    }
}

/// An Anthropic stream's answer: its content blocks assembled from their deltas (text
/// appended, tool input JSON joined then parsed), and its usage.
fn anthropic_stream_reply(events: &[Value]) -> Option<(Message, Option<usize>)> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let (mut start_usage, mut output) = (Value::Null, None);
    for event in events {
        let index = event["index"].as_u64().unwrap_or(0) as usize;
        match event["type"].as_str() {
            Some("message_start") => start_usage = event["message"]["usage"].clone(),
            Some("message_delta") => output = event["usage"]["output_tokens"].as_u64().or(output),
            Some("content_block_start") if index < 128 => {
                while blocks.len() <= index {
                    blocks.push(Value::Null);
                    partial.push(String::new());
                }
                // Only objects: an upstream answering nonsense must not make indexing panic.
                if event["content_block"].is_object() {
                    blocks[index] = event["content_block"].clone();
                }
            }
            Some("content_block_delta") if index < blocks.len() => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        let so_far = blocks[index]["text"].as_str().unwrap_or_default();
                        let text =
                            format!("{so_far}{}", delta["text"].as_str().unwrap_or_default());
                        blocks[index]["text"] = Value::String(text);
                    }
                    Some("input_json_delta") => {
                        partial[index].push_str(delta["partial_json"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    for (block, json) in blocks.iter_mut().zip(&partial) {
        if block["type"] == "tool_use" && !json.is_empty() {
            block["input"] = serde_json::from_str(json).unwrap_or(Value::Null);
        }
    }
    let blocks: Vec<Value> = blocks.into_iter().filter(|b| !b.is_null()).collect();
    if blocks.is_empty() {
        return None;
    }
    let message = crate::transcript::anthropic_reply(&Value::Array(blocks));
    Some((message, anthropic_usage(&start_usage, output)))
}

/// The assistant message a Chat Completions stream built up from its deltas: content, and
/// tool calls assembled by index.
fn openai_stream_reply(chunks: &[Value]) -> Option<(Value, Option<usize>)> {
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut tokens = None;
    for chunk in chunks {
        tokens = openai_usage(&chunk["usage"]).or(tokens);
        let delta = &chunk["choices"][0]["delta"];
        if let Some(piece) = delta["content"].as_str() {
            content.push_str(piece);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let Some(index) = call["index"]
                .as_u64()
                .map(|i| i as usize)
                .filter(|i| *i < 128)
            else {
                continue;
            };
            while calls.len() <= index {
                calls.push(json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}));
            }
            let slot = &mut calls[index];
            if let Some(id) = call["id"].as_str() {
                slot["id"] = json!(id);
            }
            for key in ["name", "arguments"] {
                if let Some(piece) = call["function"][key].as_str() {
                    let so_far = slot["function"][key].as_str().unwrap_or_default();
                    slot["function"][key] = json!(format!("{so_far}{piece}"));
                }
            }
        }
    }
    if content.is_empty() && calls.is_empty() {
        return None;
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Some((message, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_answer_is_assembled_from_its_deltas() {
        let stream = [
            r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"content":"look."}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"comm"}}]}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\": \"ls\"}"}}]}}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7}}"#,
            "data: [DONE]",
        ]
        .join("\n\n");
        let (message, tokens) = openai_stream_reply(&stream_events(stream.as_bytes())).unwrap();
        assert_eq!(message["content"], "Let me look.");
        assert_eq!(message["tool_calls"][0]["id"], "call_1");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "bash");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"command\": \"ls\"}"
        );
        assert_eq!(tokens, Some(107));
    }

    #[test]
    fn a_nonsense_stream_records_nothing_and_panics_nowhere() {
        let events = [
            json!({"type": "content_block_start", "index": 0, "content_block": "text"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}),
            json!({"type": "content_block_delta", "index": 5, "delta": {"type": "input_json_delta", "partial_json": "{"}}),
            json!({"type": "content_block_start", "index": 99999, "content_block": {"type": "text"}}),
        ];
        let reply = anthropic_stream_reply(&events);
        assert!(reply.is_none_or(|(m, _)| {
            m.parts
                .iter()
                .all(|p| matches!(p, crate::message::Part::Text { .. }))
        }));
        assert!(
            openai_stream_reply(&[
                json!({"choices": [{"delta": {"tool_calls": [{"index": 1e9}]}}]})
            ])
            .is_none()
        );
    }
}
