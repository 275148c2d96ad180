//! The proxy's wire, against the model API that refuses what the providers refuse
//! ([`crate::common::model_api`]): the query string and headers reach the upstream, token
//! counts are of the compacted request, `GET /v1/models` and calls that continue a stored
//! response pass through, resends and parallel calls store one copy, side calls get their own
//! session, and every refusal is logged without the key.

use crate::common::TestDaemon;
use crate::common::mock_model::{MockModel, Reply};
use crate::common::model_api::{ModelApi, Task};
use compactd_api::client::Client;
use hyper::Method;
use serde_json::{Value, json};

const KEY: &str = "sk-wire-test-0123456789abcdef";

fn daemon_for(base: &str, extra: &str) -> TestDaemon {
    TestDaemon::start(&format!(
        "[proxy]\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n{extra}"
    ))
}

/// Sends `body` to `path` over the socket with `headers`; returns status, headers and body.
pub(crate) async fn send(
    client: &Client,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, hyper::HeaderMap, Value) {
    let mut conn = client.keep_alive().await.unwrap();
    let response = conn
        .send_with(
            method,
            path,
            headers,
            body.map(|b| b.to_string()).unwrap_or_default().into(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let head = response.headers().clone();
    use http_body_util::BodyExt;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        head,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn anthropic_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("x-api-key", KEY),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "some-beta-2026-01-01"),
    ]
}

/// Runs the model's shell task through `/v1/messages` for `steps` steps, as an agent would;
/// returns the final conversation.
async fn anthropic_steps(client: &Client, steps: usize, model: &str) -> Vec<Value> {
    let tools = json!([{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object",
        "properties": {"command": {"type": "string"}}}}]);
    let mut messages = vec![json!({"role": "user", "content": "Run the steps."})];
    for _ in 0..steps {
        let body = json!({"model": model, "max_tokens": 1000, "system": "You run commands.", "tools": tools,
                          "messages": messages, "thinking": {"type": "enabled", "budget_tokens": 1024}});
        let (status, _, answer) = send(
            client,
            Method::POST,
            "/v1/messages?beta=true",
            &anthropic_headers(),
            Some(&body),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let content = answer["content"].clone();
        let call = content
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .cloned()
            .unwrap();
        messages.push(json!({"role": "assistant", "content": content}));
        let command = call["input"]["command"].as_str().unwrap();
        let step: usize = command
            .split("STEP-")
            .nth(1)
            .unwrap()
            .split('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let output = format!(
            "STEP-{step}-BEGIN\n{}\nSTEP-{step}-END",
            "1\n".repeat(1_500)
        );
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": output}]}));
    }
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_query_string_headers_and_token_counts_reach_the_upstream_compacted() {
    let mut task = Task::default();
    task.windows.insert("claude-test".into(), 8_000);
    let api = ModelApi::start(task);
    let daemon = daemon_for(
        &api.base,
        "[proxy.models]\n\"claude-test\" = 8000\n[compaction]\nmax_messages = 12\n",
    );
    let client = daemon.client();
    let messages = anthropic_steps(&client, 12, "claude-test").await;
    assert!(api.refused().is_empty(), "{:?}", api.refused());
    let seen = api.seen();
    for s in &seen {
        assert_eq!(
            s.query.as_deref(),
            Some("beta=true"),
            "the query string reaches the upstream"
        );
        assert_eq!(s.header("anthropic-beta"), Some("some-beta-2026-01-01"));
        assert!(s.tokens <= 8_000, "{} tokens", s.tokens);
    }
    // The agent counts tokens of its whole history: it is told what really goes out.
    let body = json!({"model": "claude-test", "system": "You run commands.", "messages": messages});
    let (status, _, counted) = send(
        &client,
        Method::POST,
        "/v1/messages/count_tokens",
        &anthropic_headers(),
        Some(&body),
    )
    .await;
    assert_eq!(status, 200, "{counted}");
    let forwarded = api.seen().pop().unwrap();
    assert!(forwarded.path.ends_with("/messages/count_tokens"));
    assert_eq!(counted["input_tokens"], forwarded.tokens);
    let sent = forwarded.body["messages"].as_array().unwrap().len();
    assert!(
        sent < messages.len(),
        "{sent} of {} messages counted",
        messages.len()
    );
    assert!(
        forwarded.body.to_string().contains("## 1. Primary Request"),
        "the summary stands for the rest"
    );
    let compactions = client.get("/session").await.unwrap()["sessions"][0]["compaction_count"]
        .as_u64()
        .unwrap();
    assert!(compactions >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_calls_that_continue_a_stored_response_pass_through() {
    let api = ModelApi::start(Task::default());
    let daemon = daemon_for(&api.base, "");
    let client = daemon.client();
    let (status, _, models) = send(
        &client,
        Method::GET,
        "/v1/models",
        &[("authorization", "Bearer k")],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "mock-model");
    let body = json!({"model": "gpt-test", "previous_response_id": "resp_1", "input": [
        {"type": "message", "role": "user", "content": "and then?"}]});
    let (status, _, _) = send(
        &client,
        Method::POST,
        "/v1/responses",
        &[("authorization", "Bearer k")],
        Some(&body),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(api.seen().pop().unwrap().body, body, "passed on as sent");
    assert_eq!(
        client.get("/session").await.unwrap()["sessions"],
        json!([]),
        "no session: the history is upstream's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_and_parallel_calls_store_one_copy() {
    let mock = MockModel::start(vec![], Reply::OpenAi("the same answer".into()));
    let daemon = daemon_for(&mock.base, "");
    let client = daemon.client();
    let body = json!({"model": "gpt-test", "messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Say something."}]});
    let auth = [("authorization", "Bearer k")];
    let (_, headers, _) = send(
        &client,
        Method::POST,
        "/v1/chat/completions",
        &auth,
        Some(&body),
    )
    .await;
    let id = headers["x-compactd-session"].to_str().unwrap().to_string();
    for _ in 0..100 {
        let (status, headers, _) = send(
            &client,
            Method::POST,
            "/v1/chat/completions",
            &auth,
            Some(&body),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-compactd-session"].to_str().unwrap(), id);
    }
    let stored = crate::common::all_messages(&client, &id).await;
    assert_eq!(stored.len(), 3, "the two messages and the one answer, once");
    // Two calls at once with one new message: it is stored once.
    let mut next = body.clone();
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "the same answer"}),
        json!({"role": "user", "content": "Again."}),
    ]);
    let (a, b) = tokio::join!(
        send(
            &client,
            Method::POST,
            "/v1/chat/completions",
            &auth,
            Some(&next)
        ),
        send(
            &client,
            Method::POST,
            "/v1/chat/completions",
            &auth,
            Some(&next)
        )
    );
    assert_eq!((a.0, b.0), (200, 200));
    let stored = crate::common::all_messages(&client, &id).await;
    let again = stored
        .iter()
        .filter(|m| m["parts"].to_string().contains("Again."))
        .count();
    assert_eq!(again, 1, "{stored:?}");
    assert_eq!(
        stored.len(),
        5,
        "one more message and one answer (the same from both calls)"
    );
    assert_eq!(
        client.get("/session").await.unwrap()["sessions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_calls_get_their_own_session_and_refusals_are_logged_without_the_key() {
    let api = ModelApi::start(Task::default());
    let daemon = daemon_for(&api.base, "");
    let client = daemon.client();
    let headers = [
        ("authorization", "Bearer sk-side-0123456789"),
        ("x-session-id", "ses_42"),
    ];
    let title = json!({"model": "m", "messages": [
        {"role": "system", "content": "Write a title for the conversation."},
        {"role": "user", "content": "Run the steps."}]});
    let main = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Run the steps."}]});
    let (_, h1, _) = send(
        &client,
        Method::POST,
        "/v1/chat/completions",
        &headers,
        Some(&title),
    )
    .await;
    let (_, h2, _) = send(
        &client,
        Method::POST,
        "/v1/chat/completions",
        &headers,
        Some(&main),
    )
    .await;
    assert_eq!(h1["x-compactd-session-kind"], "side");
    assert_eq!(h2["x-compactd-session-kind"], "proxy");
    assert_ne!(h1["x-compactd-session"], h2["x-compactd-session"]);
    // A refused call: a message of an unknown role.
    let bad = json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]});
    let (status, _, error) = send(
        &client,
        Method::POST,
        "/v1/chat/completions",
        &headers,
        Some(&bad),
    )
    .await;
    assert_eq!(status, 400, "{error}");
    let log = daemon.log();
    assert!(
        log.contains("proxy refused a call") && log.contains("status=400"),
        "{log}"
    );
    assert!(!log.contains("sk-side-0123456789"), "the key is in the log");
}
