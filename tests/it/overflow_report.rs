//! An agent on the socket API whose model refuses the context compactd gave it as longer than
//! its window (compactd counts four characters a token; the model's tokenizer more, and the
//! agent may not know its model's window). It passes the refusal on (`POST
//! /session/{id}/overflow`) and the next context is one the model takes, with nothing lost.
//! The mock model counts and refuses as the providers document.

use crate::common::mock_model::{MockModel, Reply};
use crate::common::{TestDaemon, all_messages, api_error, user};
use crate::proxy::{anthropic_call, proxy_to};
use crate::proxy_overflow::results_follow_their_calls;
use compactd_api::client::Client;
use serde_json::{Value, json};

/// The model's window, and how many characters its tokenizer counts a token.
const WINDOW: usize = 12_000;
const CHARS_PER_TOKEN: usize = 2;

/// The agent's task, then `rounds` tool calls each answered by `chars` characters of code.
async fn long_session(client: &Client, id: &str, rounds: usize, chars: usize) {
    client
        .post(
            "/session",
            &json!({"id": id, "context_limit": 100_000, "model": "claude-test"}),
        )
        .await
        .unwrap();
    let mut messages = vec![user("Read every module and fix the failing test.")];
    for i in 0..rounds {
        let code = format!("def f_{i}(x):\n    return x + {i}\n").repeat(chars / 20 + 1);
        messages.extend(crate::common::bash_round(
            &format!("call_{i}"),
            &format!("cat mod_{i}.py"),
            &code[..chars],
        ));
    }
    client
        .post(&format!("/session/{id}/message"), &json!(messages))
        .await
        .unwrap();
}

/// A session of a 100,000-token window holding only the agent's task.
async fn task_session(client: &Client, id: &str) {
    client
        .post("/session", &json!({"id": id, "context_limit": 100_000}))
        .await
        .unwrap();
    client
        .post(
            &format!("/session/{id}/message"),
            &json!([user("Refactor the parser.")]),
        )
        .await
        .unwrap();
}

/// The agent's model call: the session's context in the Messages API's form, sent to the
/// model as the agent would; the model's status and answer, and the context's
/// `compaction_num`.
async fn model_call(client: &Client, mock: &MockModel, id: &str) -> (u16, Value, Value) {
    let context = client
        .get(&format!("/session/{id}/context?format=anthropic"))
        .await
        .unwrap();
    let mut request = json!({"model": "claude-test", "max_tokens": 1024,
                             "messages": context["messages"]});
    if let Some(system) = context.get("system") {
        request["system"] = system.clone();
    }
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/messages", mock.base))
        .header("anthropic-version", "2023-06-01")
        .json(&request)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap(), context)
}

/// What a session's view says of what is stored (not whether a compaction runs now).
fn stored(session: &Value) -> Value {
    let mut session = session.clone();
    for live in ["compacting", "breaker"] {
        session.as_object_mut().unwrap().remove(live);
    }
    session
}

/// The agent created its session with a window of 100,000 tokens; its model's is 12,000 and
/// counts two characters a token. By compactd's estimate (about 9,000 tokens) nothing is due;
/// the model counts about 18,000 and refuses. The agent passes the refusal on, and its next
/// context fits the window the refusal named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_context_passed_on_is_compacted_to_the_window_the_model_named() {
    let mock = MockModel::start(
        vec![],
        Reply::Tokenized {
            window: WINDOW,
            chars_per_token: CHARS_PER_TOKEN,
        },
    );
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    long_session(&client, "a", 6, 6_000).await;
    let stored = all_messages(&client, "a").await.len();

    let (status, refusal, sent) = model_call(&client, &mock, "a").await;
    assert_eq!(status, 400, "{refusal}");
    let counted = mock.requests()[0].body.to_string().len() / CHARS_PER_TOKEN;
    let report = json!({"error": refusal, "compaction_num": sent["compaction_num"]});
    let outcome = client.post("/session/a/overflow", &report).await.unwrap();
    assert_eq!(outcome["noted"], true, "{outcome}");
    assert_eq!(outcome["context_limit"], WINDOW, "{outcome}");
    assert!(outcome["compaction"]["status"].is_string(), "{outcome}");
    let session = &outcome["session"];
    assert_eq!(session["context_limit"], WINDOW, "{session}");
    assert_eq!(session["limit_source"], "upstream refusal", "{session}");
    // What the refusal counted, within the request's few characters beyond the messages.
    let tokens = outcome["tokens"].as_u64().unwrap() as usize;
    assert!(tokens.abs_diff(counted) < 50, "{tokens} against {counted}");

    let (status, answer, context) = model_call(&client, &mock, "a").await;
    assert_eq!(status, 200, "the model takes the next context: {answer}");
    assert!(
        context["compaction_num"].as_u64().unwrap() >= 1,
        "{context}"
    );
    let messages = context["messages"].as_array().unwrap();
    results_follow_their_calls(messages);
    let text = context["messages"].to_string();
    assert!(text.contains("fix the failing test"), "the task: {text}");
    assert!(text.contains("call_5"), "the newest call: {text}");
    // Nothing was lost: every message is stored as it came.
    assert_eq!(all_messages(&client, "a").await.len(), stored);

    // The same refusal passed on again (a retry) names a context compacted since: it changes
    // nothing.
    let before = client.get("/session/a").await.unwrap();
    let again = client.post("/session/a/overflow", &report).await.unwrap();
    assert_eq!(again["noted"], false, "{again}");
    let after = client.get("/session/a").await.unwrap();
    for key in [
        "context_limit",
        "tokens",
        "compaction_count",
        "token_source",
    ] {
        assert_eq!(before[key], after[key], "{key}: {before} {after}");
    }
}

/// However the agent's SDK holds the model's answer (the body, its text, the OpenAI SDKs'
/// `error` object alone, or just the message), the figures are read from it; figures the agent
/// gives itself stand over them. Anything that is not a refusal of a context as too long is a
/// clear 400 and changes nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_read_however_the_client_holds_it_and_anything_else_changes_nothing() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let sentence = "This model's maximum context length is 50000 tokens. However, your messages resulted in 61000 tokens. Please reduce the length of the messages.";
    let forms = [
        json!({"error": {"message": sentence, "type": "invalid_request_error",
                         "param": "messages", "code": "context_length_exceeded"}}),
        json!(
            json!({"error": {"message": sentence, "code": "context_length_exceeded"}}).to_string()
        ),
        json!({"message": sentence, "code": "context_length_exceeded"}),
        json!(sentence),
    ];
    for (i, error) in forms.iter().enumerate() {
        let id = format!("f{i}");
        task_session(&client, &id).await;
        let outcome = client
            .post(&format!("/session/{id}/overflow"), &json!({"error": error}))
            .await
            .unwrap();
        assert_eq!(
            (&outcome["tokens"], &outcome["context_limit"]),
            (&json!(61_000), &json!(50_000)),
            "form {i}: {outcome}"
        );
        assert_eq!(outcome["session"]["context_limit"], 50_000, "{outcome}");
        assert_eq!(outcome["session"]["tokens"], 61_000, "{outcome}");
        assert_eq!(outcome["session"]["token_source"], "reported", "{outcome}");
    }
    // A prompt that left the completion asked for no room: that completion is kept free from
    // then on (the reserve, 16,000 at 80,000 tokens, was less).
    let reserved = |asked: usize| {
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!(
            "input length and `max_tokens` exceed context limit: 61000 + {asked} > 80000, decrease input length or `max_tokens` and try again")}})
    };
    task_session(&client, "r").await;
    let outcome = client
        .post("/session/r/overflow", &json!({"error": reserved(30_000)}))
        .await
        .unwrap();
    let session = &outcome["session"];
    assert_eq!(session["context_limit"], 80_000, "{outcome}");
    assert_eq!(session["completion_tokens"], 30_000, "{outcome}");
    assert_eq!(session["token_threshold"], 50_000, "{outcome}");
    // One asking most of the window: no compaction makes room beside it.
    let (status, message) = api_error(
        client
            .post("/session/r/overflow", &json!({"error": reserved(70_000)}))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 400);
    assert!(message.contains("ask for less"), "{message}");
    // A refusal in a form compactd does not read: the agent gives the figures.
    task_session(&client, "g").await;
    let outcome = client
        .post(
            "/session/g/overflow",
            &json!({"tokens": 40_000, "context_limit": 32_000}),
        )
        .await
        .unwrap();
    assert_eq!(outcome["session"]["context_limit"], 32_000, "{outcome}");
    // A refusal that names only the count it refused at: the window is under that count.
    task_session(&client, "h").await;
    let outcome = client
        .post("/session/h/overflow", &json!({"tokens": 40_000}))
        .await
        .unwrap();
    assert_eq!(outcome["session"]["context_limit"], 40_000, "{outcome}");

    let before = client.get("/session/g").await.unwrap();
    let rate_limited = json!({"type": "error", "error": {"type": "rate_limit_error",
        "message": "Number of request tokens has exceeded your per-minute rate limit"}});
    let refused = [
        (json!({"error": rate_limited}), "`error` is not a refusal"),
        (json!({"tokens": 0}), "tokens must be 1 to"),
        (json!({"context_limit": 5}), "context_limit"),
        (json!({"tokens": 40_000, "window": 32_000}), "unknown field"),
    ];
    for (body, says) in refused {
        let (status, message) =
            api_error(client.post("/session/g/overflow", &body).await.unwrap_err());
        assert_eq!(status, 400, "{body}: {message}");
        assert!(message.contains(says), "{body}: {message}");
    }
    assert_eq!(
        stored(&client.get("/session/g").await.unwrap()),
        stored(&before)
    );
    let (status, _) = api_error(
        client
            .post("/session/nobody/overflow", &json!({}))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 404);
}

/// A conversation the proxy records belongs to the API key that made it, and the proxy reads
/// its model's refusals itself: the socket API does not take them for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_conversation_takes_no_refusal_through_the_socket_api() {
    let mock = MockModel::start(
        vec![],
        Reply::Tokenized {
            window: WINDOW,
            chars_per_token: CHARS_PER_TOKEN,
        },
    );
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let body = json!({"model": "claude-test", "max_tokens": 1024,
                      "messages": [{"role": "user", "content": "Fix the failing test."}]});
    let (status, head, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    let session = head["x-compactd-session"].to_str().unwrap();
    let before = client.get(&format!("/session/{session}")).await.unwrap();
    let (status, message) = api_error(
        client
            .post(
                &format!("/session/{session}/overflow"),
                &json!({"tokens": 20_000, "context_limit": 12_000}),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 409, "{message}");
    assert!(message.contains("proxy"), "{message}");
    assert_eq!(
        stored(&client.get(&format!("/session/{session}")).await.unwrap()),
        stored(&before)
    );
}
