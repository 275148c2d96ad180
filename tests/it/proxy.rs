//! The OpenAI-compatible proxy: an agent that sends its whole conversation with every call
//! (raw HTTP here, and the official `openai` Python SDK) talks to a mock upstream through
//! compactd, long enough to compact several times.

use crate::common::mock_model::{MockModel, Reply};
use crate::common::{TestDaemon, have};
use compactd_api::client::Client;
use hyper::Method;
use serde_json::{Value, json};

pub(crate) const KEY: &str = "sk-proxy-test-0123456789abcdef";

fn config(mock: &MockModel) -> String {
    format!(
        "[compaction]\nmax_messages = 12\ndefault_context_limit = 32000\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    )
}

/// A chat completion calling `bash` (call `call_{i}`), as the upstream's exact bytes.
pub(crate) fn tool_call_answer(i: usize) -> String {
    json!({
        "id": format!("chatcmpl-{i}"), "object": "chat.completion", "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": format!("Step {i}: reading."),
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                "function": {"name": "bash", "arguments": format!("{{\"command\": \"cat src/mod_{i}.py\"}}")}}]}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
    })
    .to_string()
}

/// The same answer streamed: content and the call in deltas, then usage and `[DONE]`.
fn streamed_answer(i: usize) -> String {
    let chunks = [
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": format!("Step {i}: ")}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "reading."}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": format!("call_{i}"), "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\": "}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": format!("\"cat src/mod_{i}.py\"}}")}}]}}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 20}}),
    ];
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

pub(crate) fn raw(body: String, streamed: bool) -> Reply {
    let kind = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    Reply::Raw {
        status: 200,
        body,
        headers: vec![("content-type", kind.into())],
    }
}

/// The assistant message the client keeps from answer `i` (what an SDK hands back).
pub(crate) fn assistant(i: usize) -> Value {
    json!({"role": "assistant", "content": format!("Step {i}: reading."),
           "tool_calls": [{"id": format!("call_{i}"), "type": "function",
               "function": {"name": "bash", "arguments": format!("{{\"command\": \"cat src/mod_{i}.py\"}}")}}]})
}

/// POSTs a chat completion as an agent does; returns status, headers and the body's bytes.
pub(crate) async fn call(
    client: &Client,
    key: &str,
    session: Option<&str>,
    body: &Value,
) -> (u16, hyper::HeaderMap, Vec<u8>) {
    let auth = format!("Bearer {key}");
    let mut headers = vec![("authorization", auth.as_str())];
    if let Some(id) = session {
        headers.push(("x-compactd-session", id));
    }
    post(client, "/v1/chat/completions", &headers, body).await
}

/// POSTs an Anthropic Messages call as Claude Code does; returns status, headers and body.
pub(crate) async fn anthropic_call(
    client: &Client,
    body: &Value,
) -> (u16, hyper::HeaderMap, String) {
    anthropic_call_as(client, KEY, body).await
}

/// [`anthropic_call`] with another API key.
pub(crate) async fn anthropic_call_as(
    client: &Client,
    key: &str,
    body: &Value,
) -> (u16, hyper::HeaderMap, String) {
    let headers = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    let (status, head, bytes) = post(client, "/v1/messages", &headers, body).await;
    (status, head, String::from_utf8_lossy(&bytes).into_owned())
}

/// POSTs `body` to `path` with `headers` on a connection of its own; returns status, headers
/// and the body's bytes.
async fn post(
    client: &Client,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, hyper::HeaderMap, Vec<u8>) {
    let mut conn = client.keep_alive().await.unwrap();
    let response = conn
        .send_with(Method::POST, path, headers, body.to_string().into())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let head = response.headers().clone();
    use http_body_util::BodyExt;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, head, bytes.to_vec())
}

/// Whether python3 can import `module` (an SDK the CI installs).
fn python_has(module: &str) -> bool {
    let found = have("python3")
        && std::process::Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .status()
            .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIP: the {module} Python package is not installed (pip install {module})");
    }
    found
}

/// Runs a Python program with `args`; it must succeed. Returns its output.
fn run_python(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every tool message answers a call of an earlier assistant message of the same request.
pub(crate) fn no_orphans(messages: &[Value]) {
    let mut calls = std::collections::HashSet::new();
    for m in messages {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            calls.insert(c["id"].as_str().unwrap().to_string());
        }
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap();
            assert!(calls.contains(id), "orphaned result {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_conversation_reaches_upstream_compacted_and_comes_back_byte_for_byte() {
    const STEPS: usize = 30;
    let script: Vec<Reply> = (0..STEPS)
        .map(|i| {
            if i % 3 == 2 {
                raw(streamed_answer(i), true)
            } else {
                raw(tool_call_answer(i), false)
            }
        })
        .collect();
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&config(&mock));
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let mut history = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "Read every module and fix the failing test."}),
    ];
    let mut session = String::new();
    for i in 0..STEPS {
        let streamed = i % 3 == 2;
        let body = json!({"model": "gpt-test", "messages": history, "stream": streamed,
                          "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
                          "temperature": 0.2});
        let (status, headers, bytes) = call(&client, KEY, None, &body).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let expected = if streamed {
            streamed_answer(i)
        } else {
            tool_call_answer(i)
        };
        assert_eq!(String::from_utf8(bytes).unwrap(), expected, "step {i}");
        let id = headers["x-compactd-session"].to_str().unwrap().to_string();
        if i > 0 {
            assert_eq!(id, session, "step {i} continued the same session");
        }
        session = id;
        history.push(assistant(i));
        history.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
                            "content": format!("# mod_{i}.py\n{}", "x = 1\n".repeat(300))}));
    }

    let requests = mock.requests();
    assert_eq!(requests.len(), STEPS);
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.header("authorization").unwrap(), format!("Bearer {KEY}"));
        assert_eq!(r.body["model"], "gpt-test");
        assert_eq!(r.body["temperature"], 0.2, "parameters pass through");
        assert_eq!(r.body["tools"][0]["function"]["name"], "bash");
        let sent = r.body["messages"].as_array().unwrap();
        no_orphans(sent);
        assert_eq!(
            sent[0]["content"], "You are a careful coding agent.",
            "call {i}"
        );
    }
    let last = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap();
    assert!(
        last.len() < history.len() - 2,
        "{} messages sent for a history of {}",
        last.len(),
        history.len()
    );
    assert!(
        last.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|t| t.contains("## 1. Primary Request"))),
        "the last call carries a summary"
    );
    let view = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(view["compaction_count"].as_u64().unwrap() >= 2, "{view}");
    // Every answer was recorded, once: the client's history is the session's.
    let messages = crate::common::all_messages(&client, &session).await;
    assert_eq!(
        messages.len(),
        history.len() - 1,
        "all but the last tool result"
    );

    // Another key can neither continue nor read it.
    let body = json!({"model": "gpt-test", "messages": history});
    let (status, _, bytes) = call(&client, "sk-someone-else", Some(&session), &body).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&bytes));

    // A rewound history (an edited earlier message) is a branch of the same conversation:
    // upstream gets that branch's messages and nothing of the other one.
    let mut rewound = history[..4].to_vec();
    rewound[1] = json!({"role": "user", "content": "Only read the first module."});
    let body = json!({"model": "gpt-test", "messages": rewound});
    let (status, headers, _) = call(&client, KEY, Some(&session), &body).await;
    assert_eq!(
        status, 500,
        "the mock's script is spent; its error passes through"
    );
    assert_eq!(headers["x-compactd-session"], session.as_str());
    let sent = mock.requests().last().unwrap().body["messages"].to_string();
    assert!(sent.contains("Only read the first module."), "{sent}");
    assert!(
        !sent.contains("mod_5.py") && !sent.contains("## 1. Primary Request"),
        "{sent}"
    );

    // The key is in no event, no stored byte and no log line.
    let mut seen = 0;
    while let Ok(Some(event)) =
        tokio::time::timeout(std::time::Duration::from_millis(300), events.next()).await
    {
        let (_, data) = event.unwrap();
        assert!(!data.to_string().contains(KEY), "the key is in an event");
        seen += 1;
    }
    assert!(seen >= 4, "compactions were announced ({seen} events)");
    drop(client);
    let mut daemon = daemon;
    daemon.terminate();
    let db = std::fs::read(daemon.db()).unwrap();
    let needle = KEY.as_bytes();
    assert!(
        !db.windows(needle.len()).any(|w| w == needle),
        "the key is in the database"
    );
    assert!(!daemon.log().contains(KEY), "the key is in the log");
}

#[tokio::test]
async fn a_call_without_a_key_is_refused() {
    let mock = MockModel::start(vec![], Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&config(&mock));
    let mut conn = daemon.client().keep_alive().await.unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let answer = conn
        .raw(Method::POST, "/v1/chat/completions", body.to_string())
        .await
        .unwrap();
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["error"]["code"], "unauthorized");
    // Every refusal is in the log: a listing of models without a key, and a path the proxy
    // does not serve (Gemini's), neither of which was.
    let models = conn
        .raw(Method::GET, "/v1/models", String::new())
        .await
        .unwrap();
    assert_eq!(models.status, 401);
    let unknown = conn
        .raw(
            Method::POST,
            "/v1beta/models/gemini-2.5-pro:generateContent?key=sk-secret",
            "{}",
        )
        .await
        .unwrap();
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "not_found");
    assert!(mock.requests().is_empty());
    let log = daemon.log();
    assert_eq!(log.matches("status=401").count(), 2, "{log}");
    assert!(
        log.contains("refused a request")
            && log.contains("/v1beta/models/gemini-2.5-pro:generateContent")
            && log.contains("status=404"),
        "{log}"
    );
    assert!(
        !log.contains("sk-secret"),
        "no query (a key) in the log: {log}"
    );
}

/// A proxied conversation deleted by its person (`compactd session delete`): the same opening
/// (system prompt and first message) afterwards starts a new conversation, with and without
/// tools, and so does its next step. Each such call was a 404 for that key forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_conversations_opening_starts_a_new_one() {
    let mock = crate::proxy_overflow::model(16_000, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let opening = vec![
        json!({"role": "system", "content": "You are a careful agent."}),
        json!({"role": "user", "content": "Refactor the parser."}),
    ];
    let mut deleted = Vec::new();
    for round in 0..3 {
        let mut messages = opening.clone();
        for step in 0..2 {
            let body = json!({"model": "m", "messages": messages});
            let (status, head, answer) = call(&client, KEY, None, &body).await;
            assert_eq!(
                status,
                200,
                "round {round} step {step}: {}",
                String::from_utf8_lossy(&answer)
            );
            let session = head["x-compactd-session"].to_str().unwrap().to_string();
            assert!(!deleted.contains(&session), "a new conversation");
            messages.push(assistant(step));
            messages.push(
                json!({"role": "tool", "tool_call_id": format!("call_{step}"),
                                 "content": "fn parse() {}"}),
            );
            if step == 1 {
                let deleting = client.delete(&format!("/session/{session}")).await;
                assert!(deleting.is_ok(), "{deleting:?}");
                deleted.push(session);
            }
        }
    }
}

/// An upstream set to the daemon's own loopback listener: the call that comes back is
/// refused at once (508 `proxy_loop`, saying what to fix) instead of going round until the
/// connections run out; only the agent's own call stored its conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_the_proxy_itself_is_a_loop_refused_at_once() {
    let port = crate::common::free_port();
    let daemon = TestDaemon::start(&format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"http://127.0.0.1:{port}/v1\"\n"
    ));
    let client = daemon.client();
    let mut conn = client.keep_alive().await.unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let started = std::time::Instant::now();
    let answer = conn
        .raw_with(
            Method::POST,
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {KEY}"))],
            body.to_string(),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 508, "{:?}", answer.json());
    assert_eq!(answer.json()["error"]["code"], "proxy_loop");
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("openai_upstream"),
        "{:?}",
        answer.json()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let sessions = client.get("/session").await.unwrap();
    assert_eq!(sessions["total"], 1, "{sessions}");
}

/// An upstream whose usage says a long conversation is 1 token (a constant, a zero, the
/// uncached part only): its report is not believed against an estimate many times larger, so
/// the conversation still compacts and nothing sent upstream passes the session's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_reporting_implausible_usage_does_not_switch_compaction_off() {
    let mock = MockModel::start(vec![], Reply::OpenAi("noted".into()));
    let daemon = TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = 16000\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    ));
    let client = daemon.client();
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    let mut session = String::new();
    for i in 0..30 {
        messages.push(json!({"role": "user", "content": format!("step {i}: {}", "the log says ".repeat(250))}));
        let (status, head, body) = call(
            &client,
            KEY,
            None,
            &json!({"model": "m", "messages": messages}),
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        messages.push(answer["choices"][0]["message"].clone());
    }
    // Every request the upstream saw fits the limit (four characters a token, as estimated).
    for sent in mock.requests() {
        let chars = sent.body["messages"].to_string().chars().count();
        assert!(chars / 4 < 16_000, "{chars} characters sent upstream");
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
    assert_eq!(state["token_source"], "estimated", "{state}");
    // The log says so, once (a server cutting prompts to a window of its own looks the same).
    let log = daemon.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("counted far fewer tokens"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains(&session) && said[0].contains("num_ctx"),
        "{}",
        said[0]
    );
}

/// An upstream whose usage figures are absurd (past any window, or summing past what a
/// number holds): the daemon neither fails nor believes them; the conversation goes on,
/// counted by its estimate. (The daemon panicked on the first answer before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_reporting_absurd_usage_is_not_believed() {
    let huge = [u64::MAX, 1 << 62, 1_000_000_001];
    let answers = (0..24)
        .map(|i| {
            let mut answer: Value = serde_json::from_str(&tool_call_answer(i)).unwrap();
            answer["usage"]["prompt_tokens"] = json!(huge[i % 3]);
            answer["usage"]["completion_tokens"] = json!(huge[(i + 1) % 3]);
            raw(answer.to_string(), false)
        })
        .collect();
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let session = read_modules(&client, &mut task(), 0..24).await;
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["token_source"], "estimated", "{state}");
    assert!(state["tokens"].as_u64().unwrap() < 16_000, "{state}");
    // Every answer was recorded, and the client's next call matched it: the task, 24 answers
    // and the 23 outputs sent after them, on one branch.
    assert_eq!(state["message_count"], 2 + 24 + 23, "{state}");
    assert_eq!(state["branches"], 1, "{state}");
    assert!(
        !daemon.log().contains("could not record"),
        "{}",
        daemon.log()
    );
}

/// Answer `i` (calling `bash`), its usage counting `prompt_tokens`.
pub(crate) fn counted_answer(i: usize, prompt_tokens: usize) -> Reply {
    let mut answer: Value = serde_json::from_str(&tool_call_answer(i)).unwrap();
    answer["usage"]["prompt_tokens"] = json!(prompt_tokens);
    raw(answer.to_string(), false)
}

/// A daemon proxying both APIs to `mock`, sessions of 16,000 tokens.
pub(crate) fn proxy_to(mock: &MockModel) -> TestDaemon {
    TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = 16000\n[proxy]\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n",
        base = mock.base
    ))
}

/// An agent reading modules `steps` through the proxy, each call answered by a `bash` call
/// whose ~700-token output the next call sends; returns its session.
pub(crate) async fn read_modules(
    client: &Client,
    messages: &mut Vec<Value>,
    steps: std::ops::Range<usize>,
) -> String {
    let mut session = String::new();
    for i in steps {
        let body = json!({"model": "m", "messages": messages});
        let (status, head, answer) = call(client, KEY, None, &body).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        messages.push(assistant(i));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("module {i}: {}", "def f(): pass\n".repeat(200))}));
    }
    session
}

pub(crate) fn task() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "read every module"}),
    ]
}

/// An upstream whose usage stays over the trigger however compactd compacts (it counts what
/// compactd cannot see: images, a server-side prompt; or answers nonsense): each compaction is
/// judged by the next count, so the agent's turn sees three attempts and then none, not a
/// summary rewritten (and with a model summarizer, a model call) on every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_whose_count_stays_over_the_trigger_is_not_compacted_on_every_call() {
    // Ten calls counted as compactd would count them, then twenty counted over the trigger.
    let answers = (0..30)
        .map(|i| counted_answer(i, if i < 10 { 1000 + 700 * i } else { 15_000 }))
        .collect();
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let session = read_modules(&client, &mut task(), 0..30).await;
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    // Three attempts in all (before: 19 compactions in 20 calls). Which of them compacts and
    // which finds nothing new to compact depends on when the agent's next message lands.
    let compactions = state["compaction_count"].as_u64().unwrap();
    assert!((1..=3).contains(&compactions), "{state}");
    assert_eq!(state["breaker"]["open"], true, "{state}");
    assert_eq!(state["breaker"]["attempts"], 3, "{state}");
    for sent in mock.requests() {
        no_orphans(sent.body["messages"].as_array().unwrap());
    }
}

/// A call's usage measures the context it was sent with. When a compaction lands while the
/// call is with the model (in the background, or asked for meanwhile), the answer's usage
/// counts the context before it: kept, it would make the session look as full as before its
/// compaction (and start another at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_of_a_call_sent_before_a_compaction_landed_does_not_count_after_it() {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let mut answers: Vec<Reply> = (0..8).map(|i| counted_answer(i, 1000 + 700 * i)).collect();
    answers.push(Reply::Gated(
        gate.clone(),
        Box::new(counted_answer(8, 7000)),
    ));
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = task();
    let session = read_modules(&client, &mut messages, 0..8).await;
    let in_flight = {
        let (client, body) = (client.clone(), json!({"model": "m", "messages": messages}));
        tokio::spawn(async move { call(&client, KEY, None, &body).await })
    };
    mock.wait_for_requests(9);
    let compacted = client
        .post(&format!("/session/{session}/summarize"), &json!({}))
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true, "{compacted}");
    gate.add_permits(1);
    assert_eq!(in_flight.await.unwrap().0, 200);
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["token_source"], "estimated", "{state}");
    assert!(state["tokens"].as_u64().unwrap() < 7000, "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_runs_a_long_agent_loop_through_the_proxy() {
    if !python_has("openai") {
        return;
    }
    const STEPS: usize = 24;
    let mut script = vec![Reply::OpenAi("plain answer".into())];
    script.extend((1..STEPS).map(|i| {
        if i % 3 == 2 {
            raw(streamed_answer(i), true)
        } else {
            raw(tool_call_answer(i), false)
        }
    }));
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&config(&mock));
    // An agent loop as people write it: the SDK's own message objects go back into the
    // history, streamed answers are rebuilt from their deltas.
    let program = r#"
import sys, json, openai
try:
    import httpx2 as httpx  # what openai 3.x is built on
except ImportError:
    import httpx
client = openai.OpenAI(api_key="sk-sdk-key", base_url="http://compactd/v1",
                       http_client=httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1])))
history = [{"role": "system", "content": "You are a careful coding agent."},
           {"role": "user", "content": "hello"}]
raw = client.chat.completions.with_raw_response.create(model="gpt-test", messages=history)
print("session", raw.headers["x-compactd-session"])
answer = raw.parse()
print("text", answer.choices[0].message.content)
history.append(answer.choices[0].message.model_dump(exclude_none=True))
history.append({"role": "user", "content": "now read every module"})
for i in range(1, int(sys.argv[2])):
    if i % 3 == 2:
        text, calls = "", {}
        for chunk in client.chat.completions.create(model="gpt-test", messages=history, stream=True,
                                                    stream_options={"include_usage": True}):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.id or slot["id"]
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
        message = {"role": "assistant", "content": text, "tool_calls": list(calls.values())}
        print("streamed", text, "|", message["tool_calls"][0]["function"]["arguments"])
    else:
        message = client.chat.completions.create(model="gpt-test", messages=history).choices[0].message
        message = message.model_dump(exclude_none=True)
    history.append(message)
    call = message["tool_calls"][0]
    history.append({"role": "tool", "tool_call_id": call["id"], "content": "x = 1\n" * 300})
print("done", len(history))
"#;
    let socket = daemon.socket();
    let stdout = run_python(program, &[socket.to_str().unwrap(), &STEPS.to_string()]);
    assert!(stdout.contains("text plain answer"), "{stdout}");
    assert!(
        stdout.contains("streamed Step 2: reading. | {\"command\": \"cat src/mod_2.py\"}"),
        "{stdout}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), STEPS);
    assert_eq!(requests[2].body["stream_options"]["include_usage"], true);
    for r in &requests {
        no_orphans(r.body["messages"].as_array().unwrap());
    }
    let session = stdout
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap();
    let client = daemon.client();
    let view = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(view["compaction_count"].as_u64().unwrap() >= 2, "{view}");
    // One session all along: the SDK's re-serialized messages matched what was stored.
    let sessions = client.get("/session").await.unwrap();
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        1,
        "{sessions}"
    );
    let last = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap();
    assert!(
        last.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|t| t.contains("## 1. Primary Request"))),
        "the last call carries a summary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loopback_listener_serves_the_proxy_and_only_to_the_key_that_owns_a_session() {
    let port = crate::common::free_port();
    let mock = MockModel::start(vec![], Reply::OpenAi("over tcp".into()));
    let daemon = TestDaemon::start(&format!("{}listen = \"127.0.0.1:{port}\"\n", config(&mock)));
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let answer = http
        .post(&url)
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let session = answer.headers()["x-compactd-session"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(answer.text().await.unwrap().contains("over tcp"));
    // Another key, naming the session: over TCP a name lives in the key's own namespace,
    // so it gets a session of its own and the owner's is untouched.
    let client = daemon.client();
    let before = crate::common::all_messages(&client, &session).await.len();
    let other = http
        .post(&url)
        .bearer_auth("sk-another-user")
        .header("x-compactd-session", &session)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    assert_ne!(
        other.headers()["x-compactd-session"].to_str().unwrap(),
        session
    );
    assert_eq!(
        crate::common::all_messages(&client, &session).await.len(),
        before
    );
    // A session made through the socket API is not reachable over TCP, whatever the key.
    client
        .post(
            "/session/mine/message",
            &json!({"role": "user", "content": "hi"}),
        )
        .await
        .unwrap();
    let theirs = http
        .post(&url)
        .bearer_auth(KEY)
        .header("x-compactd-session", "mine")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 200);
    assert_ne!(
        theirs.headers()["x-compactd-session"].to_str().unwrap(),
        "mine"
    );
    assert_eq!(crate::common::all_messages(&client, "mine").await.len(), 1);
    // Only the proxy is served there.
    let listing = http
        .get(format!("http://127.0.0.1:{port}/v1/session"))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 404);
    assert_eq!(mock.requests().len(), 3);
}

#[test]
fn a_listen_address_beyond_loopback_is_refused() {
    let out = TestDaemon::builder()
        .config("[proxy]\nlisten = \"0.0.0.0:8484\"\n")
        .build()
        .command()
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}

/// An Anthropic message calling `bash` (`toolu_{i}`), as the upstream's exact bytes.
fn anthropic_answer(i: usize) -> String {
    json!({
        "id": format!("msg_{i}"), "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "text", "text": format!("Step {i}: reading.")},
                    {"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash",
                     "input": {"command": format!("cat src/mod_{i}.py")}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 900, "cache_read_input_tokens": 100, "output_tokens": 20}
    })
    .to_string()
}

/// The same answer as Anthropic streams it.
fn anthropic_streamed(i: usize) -> String {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": format!("msg_{i}"), "type": "message",
            "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 900, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": format!("Step {i}: ")}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "reading."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"command\": "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": format!("\"cat src/mod_{i}.py\"}}")}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 20}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

fn anthropic_assistant(i: usize) -> Value {
    json!({"role": "assistant", "content": [
        {"type": "text", "text": format!("Step {i}: reading.")},
        {"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash",
         "input": {"command": format!("cat src/mod_{i}.py")}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_conversation_reaches_upstream_compacted_and_valid() {
    const STEPS: usize = 24;
    let script: Vec<Reply> = (0..STEPS)
        .map(|i| {
            if i % 3 == 2 {
                raw(anthropic_streamed(i), true)
            } else {
                raw(anthropic_answer(i), false)
            }
        })
        .collect();
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&format!(
        "[compaction]\nmax_messages = 12\n[proxy]\nanthropic_upstream = \"{}\"\n",
        mock.base
    ));
    let client = daemon.client();
    let mut history =
        vec![json!({"role": "user", "content": "Read every module and fix the failing test."})];
    let mut session = String::new();
    for i in 0..STEPS {
        let streamed = i % 3 == 2;
        let system = json!([{"type": "text", "text": "You are careful.",
                              "cache_control": {"type": "ephemeral"}}]);
        let body = json!({"model": "claude-test", "max_tokens": 1024, "system": system,
                          "messages": history, "stream": streamed});
        let (status, head, answer) = anthropic_call(&client, &body).await;
        assert_eq!(status, 200);
        let id = head["x-compactd-session"].to_str().unwrap().to_string();
        let expected = if streamed {
            anthropic_streamed(i)
        } else {
            anthropic_answer(i)
        };
        assert_eq!(answer, expected, "step {i}");
        if i > 0 {
            assert_eq!(id, session);
        }
        session = id;
        history.push(anthropic_assistant(i));
        history.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
                            "content": format!("# mod_{i}.py\n{}", "x = 1\n".repeat(300))}]}));
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), STEPS);
    for r in &requests {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.header("x-api-key").unwrap(), KEY);
        assert_eq!(r.header("anthropic-version").unwrap(), "2023-06-01");
        assert_eq!(r.body["max_tokens"], 1024);
        // The client's system, cache marks included, goes upstream as it sent it.
        let system = &r.body["system"][0];
        assert_eq!(system["text"], "You are careful.");
        assert_eq!(system["cache_control"]["type"], "ephemeral");
        // The Messages API's rules: user first, every tool_result answering a tool_use of the
        // assistant turn right before it (consecutive messages of one role are one turn).
        let sent = r.body["messages"].as_array().unwrap();
        assert_eq!(sent[0]["role"], "user");
        let mut turns: Vec<(String, Vec<Value>)> = Vec::new();
        for m in sent {
            let role = m["role"].as_str().unwrap().to_string();
            let blocks = m["content"].as_array().cloned().unwrap_or_default();
            match turns.last_mut() {
                Some((last, content)) if *last == role => content.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        }
        for pair in turns.windows(2) {
            let calls: Vec<&str> = pair[0]
                .1
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap())
                .collect();
            for block in &pair[1].1 {
                if block["type"] == "tool_result" {
                    assert!(
                        calls.contains(&block["tool_use_id"].as_str().unwrap()),
                        "orphaned result"
                    );
                }
            }
        }
    }
    let last = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap();
    assert!(
        last.len() < history.len() - 2,
        "{} of {}",
        last.len(),
        history.len()
    );
    let view = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(view["compaction_count"].as_u64().unwrap() >= 2, "{view}");
    let stored = crate::common::all_messages(&client, &session).await;
    assert_eq!(
        stored.len(),
        history.len() - 1,
        "all but the last result (the system prompt is the client's, sent with each call)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_sdk_works_through_the_proxy() {
    if !python_has("anthropic") {
        return;
    }
    let script = vec![
        Reply::Anthropic("plain answer".into()),
        raw(anthropic_streamed(3), true),
    ];
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&format!(
        "[proxy]\nanthropic_upstream = \"{}\"\n",
        mock.base
    ));
    let program = r#"
import sys, anthropic
try:
    import httpx2 as httpx
except ImportError:
    import httpx
client = anthropic.Anthropic(api_key="sk-ant-sdk-key", base_url="http://compactd",
                             http_client=httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1])))
history = [{"role": "user", "content": "hello"}]
answer = client.messages.create(model="claude-test", max_tokens=100, system="be brief", messages=history)
print("text", answer.content[0].text)
history.append({"role": "assistant", "content": answer.content[0].text})
history.append({"role": "user", "content": "and now stream"})
with client.messages.stream(model="claude-test", max_tokens=100, system="be brief", messages=history) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
print("streamed", text, "|", final.content[1].input["command"])
"#;
    let socket = daemon.socket();
    let stdout = run_python(program, &[socket.to_str().unwrap()]);
    assert!(stdout.contains("text plain answer"), "{stdout}");
    assert!(
        stdout.contains("streamed Step 3: reading. | cat src/mod_3.py"),
        "{stdout}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let key = requests[1]
        .header("x-api-key")
        .or_else(|| requests[1].header("authorization"))
        .unwrap();
    assert!(
        key.ends_with("sk-ant-sdk-key"),
        "the SDK's key goes upstream: {key}"
    );
    assert_eq!(
        requests[1].headers.get_all("content-type").iter().count(),
        1,
        "one content-type"
    );
    assert_eq!(requests[1].body["system"], "be brief");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_npm_package_works_through_the_loopback_listener() {
    // Installed by .ci/run into target/npm (npm install --prefix target/npm openai@5).
    let package = format!(
        "{}/target/npm/node_modules/openai",
        env!("CARGO_MANIFEST_DIR")
    );
    if !have("node") || !std::path::Path::new(&package).exists() {
        eprintln!("SKIP: node or the openai npm package (target/npm) is missing");
        return;
    }
    let port = crate::common::free_port();
    let script = vec![
        Reply::OpenAi("plain answer".into()),
        raw(streamed_answer(5), true),
    ];
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let _daemon = TestDaemon::start(&format!("{}listen = \"127.0.0.1:{port}\"\n", config(&mock)));
    let program = r#"
const { OpenAI } = require(process.argv[1]);
const client = new OpenAI({ apiKey: "sk-node-key", baseURL: process.argv[2] });
(async () => {
  const history = [{ role: "user", content: "hello" }];
  const answer = await client.chat.completions.create({ model: "gpt-test", messages: history });
  console.log("text", answer.choices[0].message.content);
  history.push(answer.choices[0].message, { role: "user", content: "and now stream" });
  let text = "", args = "";
  const stream = await client.chat.completions.create({ model: "gpt-test", messages: history, stream: true });
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      text += choice.delta.content || "";
      for (const call of choice.delta.tool_calls || []) args += call.function.arguments || "";
    }
  }
  console.log("streamed", text, "|", args);
})().catch((e) => { console.error(e); process.exit(1); });
"#;
    let out = std::process::Command::new("node")
        .arg("-e")
        .arg(program)
        .arg(&package)
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("text plain answer"), "{stdout}");
    assert!(
        stdout.contains("streamed Step 5: reading. | {\"command\": \"cat src/mod_5.py\"}"),
        "{stdout}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let sent = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 3, "the whole short history: {sent:?}");
}
