//! `POST /v1/chat/completions`: compactd as an OpenAI-compatible endpoint for agents that were
//! never written for it. The client sends its whole conversation; the service maps it to a
//! session ([`crate::service::proxy`]); upstream gets the session's context in its place, with
//! the client's model, tools, parameters and headers otherwise untouched; the answer comes back
//! as the upstream sent it (streamed or not), and is appended to the session before the client
//! sees its end.

use super::error::ApiError;
use super::extract::JsonBody;
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

/// Request headers never forwarded: the connection's own, our own, and `accept-encoding`
/// (the answer is read to record it, so it must come uncompressed).
const NOT_FORWARDED: [&str; 6] = [
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "accept-encoding",
    "x-compactd-session",
];

/// Marks a call that came over the loopback TCP listener, which any local user can reach.
#[derive(Debug, Clone, Copy)]
pub struct Network;

pub async fn chat_completions(
    State(service): State<Arc<Service>>,
    network: Option<Extension<Network>>,
    headers: HeaderMap,
    JsonBody(mut body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let caller = Caller::new(credential(&headers)?, network.is_none());
    let wanted = match headers.get("x-compactd-session") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| SessionId::parse(v).ok())
                .ok_or_else(|| ApiError::bad_request("x-compactd-session is not a session id"))?,
        ),
        None => None,
    };
    let conversation = crate::transcript::openai_messages(&body["messages"])
        .map_err(|e| ApiError::bad_request(format!("messages: {e}")))?;
    let turn = service.proxy_turn(&caller, wanted, conversation).await?;
    body["messages"] = Value::Array(crate::provider::openai::messages(
        &turn.context.to_messages(),
    ));
    let streaming = body["stream"] == true;
    let upstream = send_upstream(&service, &headers, &body).await?;
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
        Body::from_stream(recorded_stream(service, turn.id, upstream.bytes_stream()))
    } else {
        let bytes = upstream.bytes().await.map_err(unreachable)?;
        record(&service, &turn.id, reply_of(&bytes)).await;
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
    service: &Service,
    headers: &HeaderMap,
    body: &Value,
) -> Result<reqwest::Response, ApiError> {
    let proxy = service.settings().config.proxy.clone();
    let url = format!(
        "{}/chat/completions",
        proxy.openai_upstream.trim_end_matches('/')
    );
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
        format!("the upstream model API {what} ([proxy] openai_upstream)"),
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
    service: Arc<Service>,
    id: SessionId,
    upstream: impl Stream<Item = reqwest::Result<Bytes>> + Send + Unpin + 'static,
) -> impl Stream<Item = Result<Bytes, reqwest::Error>> + Send {
    let state = (upstream, Vec::new(), Some((service, id)));
    futures_util::stream::unfold(state, |(mut upstream, mut seen, mut after)| async move {
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
                    record(&service, &id, reply_of_stream(&seen)).await;
                }
                None
            }
        }
    })
}

/// Appends a recorded answer; a failure only loses the record (the client's next call
/// carries the answer anyway), so it is logged, not returned.
async fn record(service: &Arc<Service>, id: &SessionId, reply: Option<(Value, Option<usize>)>) {
    let Some((message, tokens)) = reply else {
        return;
    };
    let Some(message) = crate::transcript::openai_message(&message) else {
        return;
    };
    if let Err(e) = service.proxy_reply(id, message, tokens).await {
        tracing::warn!(session = %id, error = %e, "could not record a proxied answer");
    }
}

/// The assistant message of a Chat Completions answer, and the tokens of the context after
/// it (prompt plus completion), when the upstream reported them.
fn reply_of(bytes: &[u8]) -> Option<(Value, Option<usize>)> {
    let answer: Value = serde_json::from_slice(bytes).ok()?;
    let message = answer["choices"][0]["message"].clone();
    message.is_object().then(|| (message, usage_of(&answer)))
}

fn usage_of(answer: &Value) -> Option<usize> {
    let usage = &answer["usage"];
    Some(
        (usage["prompt_tokens"].as_u64()? + usage["completion_tokens"].as_u64().unwrap_or(0))
            as usize,
    )
}

/// The assistant message a streamed answer built up from its deltas: content, and tool
/// calls assembled by index.
fn reply_of_stream(bytes: &[u8]) -> Option<(Value, Option<usize>)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut tokens = None;
    for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        tokens = usage_of(&chunk).or(tokens);
        let delta = &chunk["choices"][0]["delta"];
        if let Some(piece) = delta["content"].as_str() {
            content.push_str(piece);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if index >= 128 {
                continue;
            }
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
        let (message, tokens) = reply_of_stream(stream.as_bytes()).unwrap();
        assert_eq!(message["content"], "Let me look.");
        assert_eq!(message["tool_calls"][0]["id"], "call_1");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "bash");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"command\": \"ls\"}"
        );
        assert_eq!(tokens, Some(107));
    }
}
