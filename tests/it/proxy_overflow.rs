//! An upstream that refuses a proxied call as longer than the model's window. compactd counts
//! four characters a token; the models' tokenizers count more on code (1.2 to 2.0 times as
//! many on the shared transcripts), so a long conversation's first call can reach the model
//! over its window while compactd's estimate is under the trigger. The mock here counts as
//! such a tokenizer would and refuses as the providers document; the agent must never see the
//! refusal while compacting can make the call fit.

use crate::common::TestDaemon;
use crate::common::mock_model::{MockModel, Reply};
use crate::proxy::{
    KEY, anthropic_call, assistant, call, counted_answer, no_orphans, proxy_to, read_modules, task,
};
use serde_json::{Value, json};

/// A mock upstream whose tokenizer counts a token every `chars_per_token` characters, its
/// window `window` tokens.
pub(crate) fn model(window: usize, chars_per_token: usize) -> MockModel {
    MockModel::start(
        vec![],
        Reply::Tokenized {
            window,
            chars_per_token,
        },
    )
}

/// The tokens the mock counted for a request it recorded (as [`Reply::Tokenized`] counts).
pub(crate) fn counted(request: &Value, chars_per_token: usize) -> usize {
    ["messages", "system", "tools"]
        .iter()
        .filter(|key| !request[**key].is_null())
        .map(|key| request[*key].to_string().len())
        .sum::<usize>()
        / chars_per_token
}

/// What `compactd session show` prints of `session`.
fn session_shown(daemon: &TestDaemon, session: &str) -> String {
    let shown = std::process::Command::new(crate::common::BIN)
        .arg("--socket")
        .arg(daemon.socket())
        .args(["session", "show", session])
        .output()
        .unwrap();
    String::from_utf8_lossy(&shown.stdout).into_owned()
}

/// A resumed Claude Code conversation: the task, then `rounds` tool calls each answered by
/// an output of `chars` characters of code.
fn resumed(rounds: usize, chars: usize) -> Vec<Value> {
    let mut messages =
        vec![json!({"role": "user", "content": "Read every module and fix the failing test."})];
    for i in 0..rounds {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Reading module {i}.")},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read",
             "input": {"file_path": format!("/src/mod_{i}.py")}}]}));
        let code = format!("def f_{i}(x):\n    return x + {i}\n").repeat(chars / 20 + 1);
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": code[..chars].to_string()}]}));
    }
    messages
}

/// The Messages API's rule compactd must keep in what it resends: every tool_result answers
/// a tool_use of the assistant message right before it.
pub(crate) fn results_follow_their_calls(messages: &[Value]) {
    assert_eq!(messages[0]["role"], "user");
    let mut calls = std::collections::HashSet::new();
    for m in messages {
        for block in m["content"].as_array().into_iter().flatten() {
            match block["type"].as_str() {
                Some("tool_use") => {
                    calls.insert(block["id"].as_str().unwrap().to_string());
                }
                Some("tool_result") => {
                    let id = block["tool_use_id"].as_str().unwrap();
                    assert!(calls.contains(id), "a result without its call: {id}");
                }
                _ => {}
            }
        }
    }
}

/// Claude Code resumes a long session through compactd: by compactd's estimate the context is
/// well under the trigger, by the model's tokenizer (two characters a token) it is over the
/// window, and Anthropic refuses it. compactd takes the count the refusal gives, compacts to
/// it and sends the call once more: the agent gets its answer, not "prompt is too long".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_upstream_refuses_as_too_long_is_compacted_and_sent_once_more() {
    let mock = model(16_000, 2);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let body = json!({"model": "claude-test", "max_tokens": 1024,
                      "system": "You are careful.", "messages": resumed(5, 7_000)});
    let (status, head, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("noted"), "{answer}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "one refusal, one answer");
    let (refused, sent) = (&requests[0].body, &requests[1].body);
    assert!(counted(refused, 2) > 16_000);
    assert!(counted(sent, 2) <= 16_000);
    results_follow_their_calls(sent["messages"].as_array().unwrap());
    // The task and the newest output reach the model; the rest is in the summary.
    let text = sent["messages"].to_string();
    assert!(text.contains("fix the failing test"), "{text}");
    assert!(text.contains("toolu_4"), "{text}");
    let session = head["x-compactd-session"].to_str().unwrap();
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["compaction_count"], 1, "{state}");
    // The answer's usage (the model's own count of what it was sent) is the session's count.
    assert_eq!(state["token_source"], "reported", "{state}");
    // (and the estimate of the answer after it, "noted").
    let tokens = state["tokens"].as_u64().unwrap() as usize;
    assert!(
        (counted(sent, 2)..counted(sent, 2) + 8).contains(&tokens),
        "{state}"
    );
    // Nothing the client sent was lost: every message is stored.
    let history = crate::common::all_messages(&client, session).await;
    assert_eq!(
        history.len(),
        1 + 5 * 2 + 1,
        "the task, five rounds and the answer"
    );
}

/// A local model server with a smaller window than compactd assumed (an unknown model gets
/// `default_context_limit`): its refusal names the window, which becomes the session's limit,
/// so the conversation goes on compacted under it, refused once and never again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_the_upstream_names_becomes_the_sessions_limit() {
    // OpenAI's form; vLLM's older one (the error object at the answer's root); Gemini's list;
    // Mistral's sentence.
    for model_name in [
        "local-model",
        "vllm-local",
        "gemini-2.5-flash",
        "mistral-local",
    ] {
        named_window_learned(model_name).await;
    }
}

async fn named_window_learned(model_name: &str) {
    let mock = model(8_000, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = vec![json!({"role": "user", "content": "read every module"})];
    let mut session = String::new();
    for i in 0..24 {
        let body = json!({"model": model_name, "messages": messages});
        let (status, head, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(
            status,
            200,
            "{model_name}, step {i}: {}",
            String::from_utf8_lossy(&answer)
        );
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        messages.push(assistant(i));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("module {i}: {}", "def f(): pass\n".repeat(500))}));
    }
    let requests = mock.requests();
    let refused: Vec<usize> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| counted(&r.body, 4) > 8_000)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(refused.len(), 1, "{model_name}: refused once: {refused:?}");
    assert_eq!(requests.len(), 25, "{model_name}");
    for sent in &requests {
        no_orphans(sent.body["messages"].as_array().unwrap());
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["context_limit"], 8_000, "{model_name}: {state}");
    assert_eq!(
        state["limit_source"], "upstream refusal",
        "{model_name}: {state}"
    );
    // When, as the file has it.
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let taught: String = conn
        .query_row(
            "SELECT limit_taught_at FROM sessions WHERE id = ?1",
            [&session],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(state["limit_taught_at"], taught.as_str(), "{state}");
    let shown = session_shown(&daemon, &session);
    assert!(
        shown.contains(&format!("limit from upstream refusal at {taught}")),
        "{shown}"
    );
}

/// Claude Code asks for a long completion (`max_tokens`); the Messages API refuses a prompt
/// that leaves it no room, though the prompt alone is under the window. compactd keeps the
/// completion free beside the prompt, but counts four characters a token where this model
/// counts two: refused once, it takes the model's count, compacts to leave the completion
/// free and sends the call once more: the agent gets its answer, not "input length and
/// `max_tokens` exceed context limit".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_leaving_the_completion_no_room_is_compacted_beside_it() {
    let mock = model(16_000, 2);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let body = json!({"model": "claude-test", "max_tokens": 8_000,
                      "system": "You are careful.", "messages": resumed(3, 7_000)});
    let (status, head, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "one refusal, one answer");
    let (refused, sent) = (&requests[0].body, &requests[1].body);
    assert!(
        (8_000..=16_000).contains(&counted(refused, 2)),
        "{}",
        counted(refused, 2)
    );
    assert!(counted(sent, 2) <= 8_000, "{}", counted(sent, 2));
    results_follow_their_calls(sent["messages"].as_array().unwrap());
    let text = sent["messages"].to_string();
    assert!(text.contains("fix the failing test"), "{text}");
    assert!(text.contains("toolu_2"), "the newest call: {text}");
    let session = head["x-compactd-session"].to_str().unwrap();
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(
        state["context_limit"], 16_000,
        "the window is the model's: {state}"
    );
    assert_eq!(state["completion_tokens"], 8_000, "{state}");
    assert_eq!(state["token_threshold"], 8_000, "{state}");
    // Nothing the client sent was lost.
    let history = crate::common::all_messages(&client, session).await;
    assert_eq!(
        history.len(),
        1 + 3 * 2 + 1,
        "the task, three rounds and the answer"
    );
}

/// A client asking room for a long completion (8,000 tokens of a 16,000-token window, where
/// compactd's own reserve is 3,200) has its conversation compacted before the prompt and that
/// completion would pass the window: the model, counting as compactd estimates, never
/// refuses. Its next call asking less gets the room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completion_a_call_asks_for_is_kept_free_before_the_model_refuses() {
    let mock = model(16_000, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = resumed(5, 7_000);
    let body = json!({"model": "claude-test", "max_tokens": 8_000,
                      "system": "You are careful.", "messages": messages});
    // Under compactd's own trigger, over what the completion leaves.
    assert!(
        (8_000..12_800).contains(&counted(&body, 4)),
        "{}",
        counted(&body, 4)
    );
    let (status, head, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 1, "sent once, not refused");
    assert!(counted(&requests[0].body, 4) <= 8_000);
    results_follow_their_calls(requests[0].body["messages"].as_array().unwrap());
    let session = head["x-compactd-session"].to_str().unwrap().to_string();
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["context_limit"], 16_000, "{state}");
    assert_eq!(state["completion_tokens"], 8_000, "{state}");
    assert_eq!(state["token_threshold"], 8_000, "{state}");
    assert_eq!(state["compaction_count"], 1, "{state}");
    // What a person sees of it.
    let shown = session_shown(&daemon, &session);
    assert!(
        shown.contains("compacts at 8000 (room kept for the client's 8000-token answers)"),
        "{shown}"
    );

    let reply: Value = serde_json::from_str(&answer).unwrap();
    messages.push(json!({"role": "assistant", "content": reply["content"]}));
    messages.push(json!({"role": "user", "content": "Go on."}));
    let body = json!({"model": "claude-test", "max_tokens": 1_000,
                      "system": "You are careful.", "messages": messages});
    let (status, _, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(mock.requests().len(), 2, "sent once, not refused");
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["completion_tokens"], 1_000, "{state}");
    assert_eq!(
        state["token_threshold"], 12_800,
        "compactd's own reserve: {state}"
    );
    assert_eq!(
        state["compaction_count"], 1,
        "nothing more to compact: {state}"
    );
}

/// A client that names no completion, refused by a server that reserves one for it anyway
/// (OpenRouter, "P of text input, C in the output"): that completion is kept free from then
/// on, for the calls after, which name none either, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_a_server_reserves_by_itself_is_kept_free_once_refused() {
    let mut answers: Vec<Reply> = (0..6).map(|i| counted_answer(i, 1500 + 1400 * i)).collect();
    answers.push(Reply::status(
        400,
        r#"{"error": {"code": 400, "metadata": {"provider_name": "Chutes"}, "message": "This endpoint's maximum context length is 16000 tokens. However, you requested about 17200 tokens (9200 of text input, 8000 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically."}}"#,
    ));
    answers.extend((6..10).map(|i| counted_answer(i, 2000 + 700 * (i - 6))));
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = task();
    let session = read_modules(&client, &mut messages, 0..10).await;
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["context_limit"], 16_000, "{state}");
    assert_eq!(state["completion_tokens"], 8_000, "{state}");
    assert_eq!(state["token_threshold"], 8_000, "{state}");
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 11, "ten calls and the one sent again");
    assert!(requests.iter().all(|r| r.body["max_tokens"].is_null()));
}

/// A refusal compacting cannot help (the window is smaller than what the context keeps: the
/// task alone) reaches the agent as the upstream sent it, after one more try, not a loop; a
/// refusal for another reason is passed on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_compacting_cannot_help_is_passed_on_after_one_more_try() {
    let mock = model(50, 2);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let task = "Fix the failing test. ".repeat(20);
    let body = json!({"model": "claude-test", "max_tokens": 1024,
                      "messages": [{"role": "user", "content": task}]});
    let (status, _, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 400, "{answer}");
    let refusal: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(refusal["error"]["type"], "invalid_request_error");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long"),
        "{refusal}"
    );
    assert_eq!(mock.requests().len(), 2);

    let other = MockModel::start(
        vec![],
        Reply::status(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.0: unexpected role"}}"#,
        ),
    );
    let daemon = TestDaemon::start(&format!(
        "[proxy]\nanthropic_upstream = \"{}\"\n",
        other.base
    ));
    let (status, _, answer) = anthropic_call(&daemon.client(), &body).await;
    assert_eq!(status, 400);
    assert!(answer.contains("unexpected role"), "{answer}");
    assert_eq!(other.requests().len(), 1);
}

/// A refusal that names no window (the Responses API's, or a server's own words) after the
/// model has reported its counts: the window is under what was sent, and compactd's count of
/// it, by those reports, becomes the session's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_naming_no_window_teaches_the_count_that_was_refused() {
    let mut answers: Vec<Reply> = (0..6).map(|i| counted_answer(i, 1500 + 1400 * i)).collect();
    answers.push(Reply::status(
        400,
        r#"{"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.", "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}"#,
    ));
    answers.extend((6..10).map(|i| counted_answer(i, 2000)));
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = task();
    let session = read_modules(&client, &mut messages, 0..6).await;
    let before = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(before["token_source"], "reported", "{before}");
    read_modules(&client, &mut messages, 6..10).await;
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert_eq!(state["limit_source"], "upstream refusal", "{state}");
    let learned = state["context_limit"].as_u64().unwrap();
    // Past the last report (the count grew by one output since), under what compactd assumed.
    assert!(
        learned > before["tokens"].as_u64().unwrap() && learned < 16_000,
        "{state}"
    );
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
    assert_eq!(
        mock.requests().len(),
        11,
        "ten calls and the one sent again"
    );
}

/// Claude Code writes a file larger than the model's window and sends its next call: the
/// call with the whole file as its input is the current step, which no compaction may
/// summarize, so before, nothing could make the request fit and the model's refusal reached
/// the agent. The context now shows the call's longest argument head and tail (the file's
/// path, the call's id and name as they were): the refusal teaches the window, and the call
/// goes again under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_larger_than_the_window_goes_up_shortened_and_is_answered() {
    let mock = model(16_000, 2);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let file: String = (0..4_000)
        .map(|i| format!("line {i} of the new module\n"))
        .collect();
    let messages = json!([
        {"role": "user", "content": "Write the new module in full."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Writing it."},
            {"type": "tool_use", "id": "toolu_w", "name": "Write",
             "input": {"file_path": "/src/new_module.py", "content": file}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_w", "content": "File written."}]}
    ]);
    let body = json!({"model": "claude-test", "max_tokens": 1024, "messages": messages});
    let (status, _, answer) = anthropic_call(&client, &body).await;
    assert_eq!(status, 200, "{answer}");
    let requests = mock.requests();
    let sent = &requests.last().unwrap().body;
    assert!(counted(sent, 2) <= 16_000, "{}", counted(sent, 2));
    results_follow_their_calls(sent["messages"].as_array().unwrap());
    let call = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .find(|b| b["type"] == "tool_use")
        .expect("the call goes up");
    assert_eq!(call["id"], "toolu_w");
    assert_eq!(call["name"], "Write");
    assert_eq!(call["input"]["file_path"], "/src/new_module.py");
    let content = call["input"]["content"].as_str().unwrap();
    assert!(
        content.starts_with("line 0 of the new module\n"),
        "{content}"
    );
    assert!(content.ends_with("line 3999 of the new module\n"));
    assert!(content.contains("characters cut here"), "{content}");
    let text = sent["messages"].to_string();
    assert!(text.contains("File written."), "the result goes up whole");
}
