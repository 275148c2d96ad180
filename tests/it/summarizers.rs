//! Model-backed summarizers against local mock servers: request shapes, faults, chunking,
//! fallback, the command summarizer, the circuit breaker, and compactions that run while
//! appends keep arriving.

use crate::common::mock_model::{self, MockModel, Reply, nine_sections};
use crate::common::{TestDaemon, api_error, bash_round, eventually, gated_summarizer, user};
use compactd_api::client::Client;
use serde_json::{Value, json};
use std::time::Duration;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

fn openai_config(mock: &MockModel, extra: &str) -> String {
    format!(
        "[summarizer]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"sum-model\"\napi_key_env = \"COMPACTD_TEST_KEY\"\nmax_output_tokens = 1234\ntimeout_s = 20\nmax_retries = 2\n{extra}",
        mock.base
    )
}

fn start(config: &str) -> TestDaemon {
    TestDaemon::start_with_env(config, &[("COMPACTD_TEST_KEY", KEY)])
}

/// A session with `rounds` bash rounds, appended in one batch.
async fn fill(client: &Client, id: &str, rounds: usize) {
    let mut messages = vec![user(&format!("{id}: fix every module"))];
    for i in 0..rounds {
        messages.extend(bash_round(
            &format!("{id}-{i}"),
            &format!("sed -i 's/x/y/' src/module_{i}.py"),
            &"output line\n".repeat(40),
        ));
    }
    client
        .post(
            &format!("/session/{id}/message"),
            &json!({"messages": messages}),
        )
        .await
        .unwrap();
}

/// A session of 75 rounds in a small context, with no automatic compaction (none in the
/// background either) nor masking: a manual compaction does all the work.
async fn fill_for_manual(client: &Client, id: &str) {
    client
        .post(
            "/session",
            &json!({"id": id, "context_limit": 16000,
                    "config": {"max_messages": 1000, "microcompact": false, "background_at": 1.0}}),
        )
        .await
        .unwrap();
    fill(client, id, 75).await;
}

/// Fills session `id` (30 rounds) and compacts it by hand; the compaction must succeed.
async fn fill_and_compact(client: &Client, id: &str) -> Value {
    fill(client, id, 30).await;
    let answer = client
        .post(&format!("/session/{id}/summarize"), &json!({}))
        .await
        .unwrap();
    assert_eq!(answer["compacted"], true, "{answer}");
    answer
}

/// Fills session `id` (30 rounds) and compacts it by hand; the compaction must fail.
async fn fill_and_fail(client: &Client, id: &str) -> (u16, String) {
    fill(client, id, 30).await;
    api_error(
        client
            .post(&format!("/session/{id}/summarize"), &json!({}))
            .await
            .unwrap_err(),
    )
}

/// A model that writes a fine summary but leaves the user's instructions out of section 6
/// (or drops the earlier ones the prior summary carried): compactd quotes them there, so no
/// later context loses them; what the model wrote stays as it wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instructions_a_model_summary_leaves_out_are_quoted_in_section_6() {
    let mock = MockModel::start(
        vec![],
        Reply::OpenAi(nine_sections("model-written summary")),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    let rules = [
        "Never push to main; open a pull request for every change.",
        "Keep the public API of the billing module unchanged.",
    ];
    client
        .post(
            "/session/rules/message",
            &user("Migrate the services to the new queue."),
        )
        .await
        .unwrap();
    for rule in rules {
        let mut messages = vec![user(rule)];
        for i in 0..15 {
            messages.extend(bash_round(
                &format!("{rule:.5}-{i}"),
                &format!("sed -i 's/x/y/' src/module_{i}.py"),
                &"output line\n".repeat(40),
            ));
        }
        client
            .post("/session/rules/message", &json!({"messages": messages}))
            .await
            .unwrap();
        let answer = client
            .post("/session/rules/summarize", &json!({}))
            .await
            .unwrap();
        assert_eq!(answer["compacted"], true, "{answer}");
    }
    // The second model summary dropped the first rule too: both are in its section 6.
    let context = client.get("/session/rules/context").await.unwrap();
    let summary = context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["summary"] == true)
        .unwrap()["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(summary.contains("model-written summary"), "{summary}");
    let six = summary
        .split("## 6. All user messages")
        .nth(1)
        .unwrap()
        .split("## 7.")
        .next()
        .unwrap();
    for rule in rules {
        assert!(six.contains(rule), "{rule} not in section 6: {six}");
    }
    assert!(six.contains("quoted by compactd"), "{six}");
}

/// Many sessions due at once (a restart, a trigger lowered by a config edit) call the
/// summarizer at most `max_concurrent` at a time: the others wait their turn, as `/health`
/// says and as the command's own starts show, but for a compaction someone waits for, which
/// runs at once; all of them compact once slots free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactions_call_the_summarizer_at_most_max_concurrent_at_once() {
    let dir = tempfile::TempDir::new().unwrap();
    let (starts, gate) = (dir.path().join("starts"), dir.path().join("gate"));
    let command = format!(
        "cat > /dev/null; echo started >> '{}'; i=0; while [ ! -e '{}' ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done; printf '## 6. All user messages\\nok'",
        starts.display(),
        gate.display()
    );
    let daemon = TestDaemon::start(&format!(
        "[compaction]\nmax_messages = 6\n[summarizer]\nkind = \"command\"\ncommand = \"{command}\"\nmax_concurrent = 2\n"
    ));
    let client = daemon.client();
    for s in 0..5 {
        let messages: Vec<Value> = (0..8)
            .map(|i| user(&format!("session {s} step {i}")))
            .collect();
        client
            .post(
                &format!("/session/due{s}/message"),
                &json!({"messages": messages}),
            )
            .await
            .unwrap();
    }
    let calls = eventually(Duration::from_secs(30), || async {
        let calls = client.get("/health").await.unwrap()["summarizer_calls"].clone();
        (calls["running"] == 2 && calls["waiting"] == 3).then_some(calls)
    })
    .await;
    assert!(calls.is_some(), "{}", client.get("/health").await.unwrap());
    assert_eq!(calls.unwrap()["max_concurrent"], 2);
    // A slot is taken before its command starts: the command's own count catches up.
    let started = |n: usize| {
        let starts = starts.clone();
        async move {
            eventually(Duration::from_secs(30), || async {
                let lines = std::fs::read_to_string(&starts)
                    .unwrap_or_default()
                    .lines()
                    .count();
                (lines >= n).then_some(lines)
            })
            .await
        }
    };
    assert_eq!(started(2).await, Some(2));
    // A compaction someone waits for (here a manual one) runs at once, ahead of the queue.
    let messages: Vec<Value> = (0..4).map(|i| user(&format!("manual step {i}"))).collect();
    client
        .post("/session/asked/message", &json!({"messages": messages}))
        .await
        .unwrap();
    let manual = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/session/asked/summarize", &json!({})).await })
    };
    let calls = eventually(Duration::from_secs(30), || async {
        let calls = client.get("/health").await.unwrap()["summarizer_calls"].clone();
        (calls["running"] == 3).then_some(calls)
    })
    .await;
    assert_eq!(calls.unwrap()["waiting"], 3);
    assert_eq!(started(3).await, Some(3));
    let calls = client.get("/health").await.unwrap()["summarizer_calls"].clone();
    assert_eq!(
        (calls["running"].as_u64(), calls["waiting"].as_u64()),
        (Some(3), Some(3))
    );
    std::fs::write(&gate, "").unwrap();
    assert_eq!(manual.await.unwrap().unwrap()["compacted"], true);
    let done = eventually(Duration::from_secs(30), || async {
        let list = client.get("/session").await.unwrap();
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["id"] != "asked")
            .all(|s| s["compaction_count"] == 1)
            .then_some(())
    })
    .await;
    assert!(done.is_some(), "{}", client.get("/session").await.unwrap());
    assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), 6);
    let calls = client.get("/health").await.unwrap()["summarizer_calls"].clone();
    assert_eq!(
        (calls["running"].as_u64(), calls["waiting"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_request_shape_and_summary() {
    let mock = MockModel::start(
        vec![],
        Reply::OpenAi(nine_sections("model-written summary")),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    let answer = fill_and_compact(&client, "oa").await;
    assert_eq!(answer["summarizer"], "openai:sum-model");
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains("model-written summary")
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(
        r.header("authorization").as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(r.body["model"], "sum-model");
    assert_eq!(r.body["max_tokens"], 1234);
    assert_eq!(r.body["messages"][0]["role"], "system");
    assert_eq!(r.body["messages"][1]["role"], "user");
    let prompt = r.prompt();
    assert!(
        prompt.starts_with("<task>\n")
            && prompt.contains("<conversation>")
            && prompt.contains("<modified-files>\nsrc/module_0.py")
    );

    // The pinned task first, then the model's summary.
    let context = client.get("/session/oa/context").await.unwrap();
    assert_eq!(context["messages"][0]["pinned"], true);
    assert!(
        context["messages"][1]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("model-written summary")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_request_shape_and_summary() {
    let mock = MockModel::start(
        vec![],
        Reply::Anthropic(nine_sections("claude-written summary")),
    );
    let config = format!(
        "[summarizer]\nkind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude-test\"\napi_key_env = \"COMPACTD_TEST_KEY\"\nmax_output_tokens = 2048\n",
        mock.base
    );
    let daemon = start(&config);
    let client = daemon.client();
    let answer = fill_and_compact(&client, "an").await;
    assert_eq!(answer["summarizer"], "anthropic:claude-test");
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains("claude-written summary")
    );
    let r = &mock.requests()[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.header("x-api-key").as_deref(), Some(KEY));
    assert_eq!(r.header("anthropic-version").as_deref(), Some("2023-06-01"));
    assert!(r.header("authorization").is_none());
    assert_eq!(r.body["model"], "claude-test");
    assert_eq!(r.body["max_tokens"], 2048);
    assert!(
        r.body["system"]
            .as_str()
            .unwrap()
            .contains("nine numbered sections")
    );
    assert_eq!(r.body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["messages"][0]["role"], "user");
    assert!(r.prompt().starts_with("<task>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_server_needs_no_key() {
    let mock = MockModel::start(vec![], Reply::OpenAi(nine_sections("local")));
    let config = format!(
        "[summarizer]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"llama\"\n",
        mock.base
    );
    let daemon = TestDaemon::start(&config);
    let client = daemon.client();
    fill_and_compact(&client, "local").await;
    assert!(mock.requests()[0].header("authorization").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_is_retried_and_then_succeeds() {
    let mock = MockModel::start(
        vec![Reply::status(
            500,
            "{\"error\":{\"message\":\"overloaded\"}}",
        )],
        Reply::OpenAi(nine_sections("after retry")),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill_and_compact(&client, "r5").await;
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_when_retry_after_says() {
    // How long Retry-After makes it wait is tested on paused time in summarize::http; here
    // the header's path from a real answer, with no wait.
    let limited = Reply::Raw {
        status: 429,
        body: "{\"error\":{\"message\":\"slow down\"}}".into(),
        headers: vec![("retry-after", "0".into())],
    };
    let mock = MockModel::start(vec![limited], Reply::OpenAi(nine_sections("after 429")));
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill_and_compact(&client, "r429").await;
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_4xx_are_not_retried_and_are_recorded() {
    let mock = MockModel::start(
        vec![],
        Reply::status(400, "{\"error\":{\"message\":\"bad model name\"}}"),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    let (status, message) = fill_and_fail(&client, "r4").await;
    assert_eq!(status, 503);
    assert!(
        message.contains("HTTP 400") && message.contains("bad model name"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), 1);
    let history = client.get("/session/r4/compaction").await.unwrap();
    assert_eq!(history["compactions"].as_array().unwrap().len(), 0);
    assert!(
        history["failures"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("HTTP 400")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_model_times_out_while_the_daemon_keeps_answering() {
    let mock = MockModel::start(vec![], Reply::Hang);
    let config = openai_config(&mock, "")
        .replace("timeout_s = 20", "timeout_s = 5")
        .replace("max_retries = 2", "max_retries = 0");
    let daemon = start(&config);
    let client = daemon.client();
    fill(&client, "slow", 30).await;
    fill(&client, "other", 2).await;
    let before = client.get("/session/slow/context").await.unwrap();

    let pending = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/session/slow/summarize", &json!({})).await })
    };
    let requests = tokio::task::block_in_place(|| mock.wait_for_requests(1));
    assert_eq!(requests.len(), 1);
    // While the model hangs, everything else is served.
    assert_eq!(client.get("/health").await.unwrap()["status"], "ok");
    client
        .post("/session/other/message", &user("still here"))
        .await
        .unwrap();
    assert!(client.get("/session/other/context").await.is_ok());
    let slow = client.get("/session/slow").await.unwrap();
    assert_eq!(slow["compacting"], true);
    assert!(client.get("/session/slow/context?wait=false").await.is_ok());
    assert!(
        !pending.is_finished(),
        "the hanging call should still be pending"
    );

    let (status, message) = api_error(pending.await.unwrap().unwrap_err());
    assert_eq!(status, 503);
    assert!(message.contains("timed out"), "{message}");
    assert_eq!(
        client.get("/session/slow/context").await.unwrap(),
        before,
        "a timeout changed the session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_blank_answers_are_failures_that_change_nothing() {
    let mock = MockModel::start(
        vec![
            Reply::status(200, "this is not json"),
            Reply::OpenAi("   \n ".into()),
            // A wrong endpoint answering a download: cut off at 4 MiB, not held whole.
            Reply::status(200, &"x".repeat(5 << 20)),
        ],
        Reply::Hang,
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill(&client, "junk", 30).await;
    let before = client.get("/session/junk/context").await.unwrap();
    // The scripted answers in order: not JSON, blank, larger than the bound.
    for expected in ["could not be read", "blank", "larger than 4 MiB"] {
        let (_, message) = api_error(
            client
                .post("/session/junk/summarize", &json!({}))
                .await
                .unwrap_err(),
        );
        assert!(message.contains(expected), "{message}");
    }
    assert_eq!(mock.requests().len(), 3, "none is retried");
    assert_eq!(client.get("/session/junk/context").await.unwrap(), before);
    let history = client.get("/session/junk/compaction").await.unwrap();
    assert_eq!(history["failures"].as_array().unwrap().len(), 3);
    assert_eq!(
        client.get("/session/junk").await.unwrap()["compaction_count"],
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_window_compacts_in_chunks_each_refining_the_last() {
    let mock = MockModel::start(vec![], Reply::OpenAiNumbered);
    let config = openai_config(&mock, "context_window = 2500\n")
        .replace("max_output_tokens = 1234", "max_output_tokens = 300");
    let daemon = start(&config);
    let client = daemon.client();
    fill_for_manual(&client, "chunky").await;
    let answer = client
        .post("/session/chunky/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(answer["compacted"], true, "{answer}");
    let requests = mock.requests();
    let calls = requests.len();
    assert!(calls >= 3, "only {calls} calls: {answer}");
    assert_eq!(answer["chunks"], calls);
    for (i, r) in requests.iter().enumerate() {
        let tokens = (r.prompt().chars().count()
            + r.body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .chars()
                .count())
        .div_ceil(4);
        assert!(tokens <= 2500 - 300, "call {} sent {tokens} tokens", i + 1);
        if i > 0 {
            assert!(
                r.prompt().contains(&format!("<prior-summary>\n## 1. Primary Request and Intent\nsummary written by call {i}\n")),
                "call {} does not refine call {i}",
                i + 1
            );
        }
    }
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains(&format!("summary written by call {calls}"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_smaller_than_configured_is_answered_by_smaller_chunks() {
    // The config claims no window at all; the model really takes 3,000 tokens and says
    // `context_length_exceeded` to anything longer.
    let mock = MockModel::start(vec![], Reply::Window(3000));
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill_for_manual(&client, "small").await;
    let answer = client
        .post("/session/small/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(answer["compacted"], true, "{answer}");
    let requests = mock.requests();
    let (refused, accepted): (Vec<_>, Vec<_>) = requests
        .iter()
        .partition(|r| r.body["messages"].to_string().len() / 4 > 3000);
    assert!(!refused.is_empty(), "the first, whole prompt was refused");
    let chunks = answer["chunks"].as_u64().unwrap() as usize;
    assert!(chunks >= 2, "{answer}");
    assert_eq!(
        accepted.len(),
        chunks,
        "every chunk of the last try was taken"
    );
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains(&format!("summary written by call {}", requests.len())),
        "{answer}"
    );
    let history = client.get("/session/small/compaction").await.unwrap();
    assert_eq!(history["failures"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_refused_as_too_long_even_alone_fails_cleanly() {
    let mock = MockModel::start(vec![], Reply::Window(10));
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    let (status, message) = fill_and_fail(&client, "tiny").await;
    assert_eq!(status, 503, "{message}");
    assert!(message.contains("context window exceeded"), "{message}");
    assert!(mock.requests().len() <= 1 + 4 * 80, "bounded retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extractive_fallback_compacts_when_the_model_fails_and_says_so() {
    let mock = MockModel::start(
        vec![],
        Reply::status(500, "{\"error\":{\"message\":\"down\"}}"),
    );
    let config = openai_config(&mock, "fallback = \"extractive\"\n")
        .replace("max_retries = 2", "max_retries = 0");
    let daemon = start(&config);
    let client = daemon.client();
    let answer = fill_and_compact(&client, "fb").await;
    assert_eq!(answer["summarizer"], "extractive");
    let reason = answer["fallback_reason"].as_str().unwrap();
    assert!(
        reason.contains("openai:sum-model") && reason.contains("HTTP 500"),
        "{reason}"
    );
    let history = client.get("/session/fb/compaction").await.unwrap();
    assert_eq!(
        history["compactions"][0]["fallback_reason"],
        answer["fallback_reason"]
    );
}

/// A model that ignores `max_tokens` and answers a summary longer than the session's context
/// leaves one (stored, it would put the context over its limit): a failure that changes
/// nothing, and with the extractive fallback, an extractive compaction that says why. Every
/// context stays within its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_longer_than_the_context_allows_is_a_failure_never_a_context() {
    // About 25,000 tokens in a session of 16,000: the ceiling is half the usable context.
    let long = nine_sections(&"the model went on and on about module seven. ".repeat(2_500));
    let mock = MockModel::start(vec![], Reply::OpenAi(long));
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill_for_manual(&client, "long").await;
    let before = client.get("/session/long/context").await.unwrap();
    let (status, message) = api_error(
        client
            .post("/session/long/summarize", &json!({}))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 503);
    assert!(message.contains("tokens, over the"), "{message}");
    assert_eq!(client.get("/session/long/context").await.unwrap(), before);

    let with_fallback = start(&openai_config(&mock, "fallback = \"extractive\"\n"));
    let client = with_fallback.client();
    fill_for_manual(&client, "long").await;
    let answer = client
        .post("/session/long/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(answer["summarizer"], "extractive", "{answer}");
    assert!(
        answer["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("tokens, over the"),
        "{answer}"
    );
    let context = client.get("/session/long/context").await.unwrap();
    let tokens = context["tokens"].as_u64().unwrap();
    assert!(tokens <= 16_000, "{tokens} tokens in a context of 16,000");
}

/// A daemon whose model answers every call with a 500, and tries once.
fn model_down() -> (MockModel, TestDaemon) {
    let mock = MockModel::start(
        vec![],
        Reply::status(500, "{\"error\":{\"message\":\"down\"}}"),
    );
    let daemon = start(&openai_config(&mock, "").replace("max_retries = 2", "max_retries = 0"));
    (mock, daemon)
}

/// A model that is down, with no fallback configured: each compaction fails at once, the
/// breaker stops the attempts of a turn after three, and the agent goes on appending. No
/// context it is handed is over its trigger (let alone its limit): one that would be is
/// compacted with the extractive summarizer first, as one that waited for a slow model would
/// be, recorded as a fallback that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_failing_never_leaves_a_context_over_its_limit() {
    let (_mock, daemon) = model_down();
    let client = daemon.client();
    client
        .post(
            "/session",
            &json!({"id": "down", "context_limit": 16000, "config": {"microcompact": false}}),
        )
        .await
        .unwrap();
    let mut largest = 0;
    for i in 0..80 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let text = format!("step {i} {}", "word ".repeat(300));
        client
            .post(
                "/session/down/message",
                &json!({"role": role, "content": text}),
            )
            .await
            .unwrap();
        let context = client.get("/session/down/context").await.unwrap();
        largest = largest.max(context["tokens"].as_u64().unwrap());
    }
    let trigger = client.get("/session/down").await.unwrap()["token_threshold"]
        .as_u64()
        .unwrap();
    assert!(trigger < 16_000);
    assert!(
        largest <= trigger,
        "a context of {largest} tokens, trigger {trigger}"
    );
    let history = client.get("/session/down/compaction").await.unwrap();
    let compactions = history["compactions"].as_array().unwrap();
    assert!(!compactions.is_empty(), "{history}");
    for compaction in compactions {
        assert_eq!(compaction["summarizer"], "extractive");
        let why = compaction["fallback_reason"].as_str().unwrap();
        assert!(
            why.contains("openai:sum-model") && why.contains("over its trigger"),
            "{why}"
        );
    }
    assert!(!history["failures"].as_array().unwrap().is_empty());
}

/// The rescue above, when the model server's count stays over the trigger after it: one
/// extractive compaction for the open breaker, not one for every context the agent asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_over_its_trigger_by_the_servers_count_is_rescued_once_per_turn() {
    let (_mock, daemon) = model_down();
    let client = daemon.client();
    client
        .post(
            "/session",
            &json!({"id": "counted", "context_limit": 10000}),
        )
        .await
        .unwrap();
    client
        .post("/session/counted/message", &user("work on the parser"))
        .await
        .unwrap();
    for i in 0..5 {
        step(&client, "counted", i, 2000 + 1000 * i as u64).await;
    }
    for i in 5..17 {
        step(&client, "counted", i, 9000).await;
        client.get("/session/counted/context").await.unwrap();
    }
    let history = client.get("/session/counted/compaction").await.unwrap();
    let compactions = history["compactions"].as_array().unwrap();
    assert_eq!(compactions.len(), 1, "{history}");
    assert!(
        compactions[0]["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("over its trigger"),
        "{history}"
    );
    assert_eq!(
        history["failures"].as_array().unwrap().len(),
        3,
        "{history}"
    );
}

/// A summarizer `base_url` set to the daemon's own proxy: its call comes back to the daemon
/// and is refused at once (`proxy_loop`, saying what to fix), a failure like any other; the
/// compaction prompt is not stored as a proxied conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summarizer_pointed_at_the_daemons_own_proxy_fails_at_once() {
    let port = crate::common::free_port();
    let daemon = start(&format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\n[summarizer]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\napi_key_env = \"COMPACTD_TEST_KEY\"\nmax_retries = 0\n"
    ));
    let client = daemon.client();
    let (status, message) = fill_and_fail(&client, "looped").await;
    assert_eq!(status, 503);
    assert!(
        message.contains("508") && message.contains("[summarizer] base_url"),
        "{message}"
    );
    assert_eq!(client.get("/session").await.unwrap()["total"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_never_reaches_errors_events_logs_or_the_database() {
    // The key deep inside a long error body (past where messages are cut), base64-encoded,
    // and quoted in part; then a model answer that echoes it; then a config typo quoting it.
    let encoded = {
        use std::io::Write;
        let mut out = Vec::new();
        let mut child = std::process::Command::new("base64")
            .arg("-w0")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("user:{KEY}").as_bytes())
            .unwrap();
        use std::io::Read;
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        child.wait().unwrap();
        String::from_utf8(out).unwrap()
    };
    let echo = format!(
        "{{\"error\":{{\"message\":\"{} Incorrect API key provided: {KEY}. You passed sk-test-...CRET, Basic {encoded}\"}}}}",
        "padding ".repeat(40)
    );
    let mock = MockModel::start(
        vec![Reply::status(401, &echo)],
        Reply::OpenAi(mock_model::nine_sections(&format!(
            "I was called with {KEY}"
        ))),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let (_, message) = fill_and_fail(&client, "leak").await;
    assert!(message.contains("HTTP 401"), "{message}");
    let mut seen = String::new();
    while !seen.contains("compaction_failed") {
        let (name, data) = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&format!("{name} {data}\n"));
    }
    // The second call succeeds with a summary that echoes the key.
    let compacted = client
        .post("/session/leak/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true);
    // A config edit that puts the key in the wrong field is rejected without quoting it.
    std::fs::write(
        daemon.config_path(),
        format!("{}\napi_key = \"{KEY}\"\n", openai_config(&mock, "")),
    )
    .unwrap();
    let health = loop {
        let health = client.get("/health").await.unwrap();
        if !health["config"]["error"].is_null() {
            break health.to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let history = client
        .get("/session/leak/compaction")
        .await
        .unwrap()
        .to_string();
    let mut stored = Vec::new();
    for suffix in ["", "-wal"] {
        let path = format!("{}{suffix}", daemon.db().display());
        stored.extend(std::fs::read(path).unwrap_or_default());
    }
    let stored = String::from_utf8_lossy(&stored).to_string();
    for (what, text) in [
        ("error", &message),
        ("events", &seen),
        ("history", &history),
        ("health", &health),
        ("database", &stored),
        ("log", &daemon.log()),
    ] {
        assert!(!text.contains(KEY), "the key leaked into the {what}");
        assert!(
            !text.contains(&encoded[8..24]),
            "the encoded key leaked into the {what}"
        );
        assert!(
            !text.contains("sk-test-0123"),
            "a key fragment leaked into the {what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_summarizer_runs_a_program_and_reports_its_failures() {
    let works = TestDaemon::start(
        "[summarizer]\nkind = \"command\"\ncommand = [\"sh\", \"-c\", \"wc -c > /dev/null; printf '## 1. Primary Request and Intent\\\\nfrom a command'\"]\n",
    );
    let client = works.client();
    let answer = fill_and_compact(&client, "cmd").await;
    assert_eq!(answer["summarizer"], "command:sh");
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains("from a command")
    );

    let fails = TestDaemon::start(
        "[summarizer]\nkind = \"command\"\ncommand = \"echo boom >&2; exit 3\"\n",
    );
    let client = fails.client();
    let (_, message) = fill_and_fail(&client, "cmd").await;
    assert!(
        message.contains("exited") && message.contains("boom"),
        "{message}"
    );

    let hangs = TestDaemon::start(
        "[summarizer]\nkind = \"command\"\ncommand = \"sleep 30\"\ntimeout_s = 1\n",
    );
    let client = hangs.client();
    let (_, message) = fill_and_fail(&client, "cmd").await;
    assert!(message.contains("timed out"), "{message}");
    // A program that never stops writing fails at once (killed past 4 MiB), not at its
    // timeout with everything it wrote held; one that writes megabytes to stderr is drained
    // and its summary taken.
    let endless = TestDaemon::start(
        "[summarizer]\nkind = \"command\"\ncommand = \"yes '## 1. Primary Request and Intent'\"\ntimeout_s = 120\n",
    );
    let client = endless.client();
    let started = std::time::Instant::now();
    let (_, message) = fill_and_fail(&client, "cmd").await;
    assert!(message.contains("more than 4 MiB"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let chatty = TestDaemon::start(
        "[summarizer]\nkind = \"command\"\ncommand = \"cat > /dev/null; head -c 20000000 /dev/zero | tr '\\\\0' e >&2; printf '## 1. Primary Request and Intent\\\\nquiet on stdout'\"\n",
    );
    let client = chatty.client();
    let answer = fill_and_compact(&client, "cmd").await;
    assert!(
        answer["summary"]
            .as_str()
            .unwrap()
            .contains("quiet on stdout"),
        "{answer}"
    );
}

/// A command summarizer that fails while `flag` exists.
fn flaky_summarizer(flag: &std::path::Path) -> String {
    format!(
        "[compaction]\nmax_messages = 6\n[summarizer]\nkind = \"command\"\ncommand = \"cat > /dev/null; if [ -e '{}' ]; then echo down >&2; exit 1; fi; printf '## 6. All user messages\\\\nok'\"\n",
        flag.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_after_three_unproductive_attempts_in_a_turn_and_closes_on_the_next_user_message()
 {
    let flag_dir = tempfile::TempDir::new().unwrap();
    let flag = flag_dir.path().join("down");
    std::fs::write(&flag, "").unwrap();
    let daemon = TestDaemon::start(&flaky_summarizer(&flag));
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let append = |text: String| {
        let client = client.clone();
        async move {
            client
                .post(
                    "/session/brk/message",
                    &json!({"messages": [{"role": "assistant", "content": text}], "wait": true}),
                )
                .await
                .unwrap()
        }
    };
    client
        .post("/session/brk/message", &user("start the work"))
        .await
        .unwrap();
    for i in 0..5 {
        append(format!("step {i}")).await;
    }
    // Messages 7, 8, 9 each trigger a failing attempt; the fourth trigger finds the breaker open.
    let mut statuses = Vec::new();
    for i in 0..4 {
        statuses.push(
            append(format!("more {i}")).await["compaction"]["status"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(statuses, ["failed", "failed", "failed", "breaker_open"]);
    let session = client.get("/session/brk").await.unwrap();
    assert_eq!(session["breaker"]["open"], true);
    loop {
        let (name, data) = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if name == "breaker_open" {
            assert_eq!(data["attempts"], 3);
            break;
        }
    }
    assert_eq!(
        client.get("/session/brk/compaction").await.unwrap()["failures"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // Manual compaction still runs while the breaker is open.
    std::fs::remove_file(&flag).unwrap();
    let manual = client
        .post("/session/brk/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(manual["compacted"], true);

    // A new user message starts a new turn: automatic compaction resumes.
    std::fs::write(&flag, "").unwrap();
    for i in 0..5 {
        append(format!("after manual {i}")).await;
    }
    let answer = client
        .post(
            "/session/brk/message",
            &json!({"messages": [user("next request")], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "failed", "{answer}");
    assert_eq!(
        client.get("/session/brk").await.unwrap()["breaker"]["attempts"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autonomous_agent_is_compacted_as_often_as_it_needs_within_one_turn() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 10\n");
    let client = daemon.client();
    client
        .post("/session/auto/message", &user("work alone for a long time"))
        .await
        .unwrap();
    for i in 0..40 {
        let [call, result] = bash_round(&format!("a{i}"), &format!("cat f{i}.txt"), "content");
        client
            .post(
                "/session/auto/message",
                &json!({"messages": [call, result], "wait": true}),
            )
            .await
            .unwrap();
    }
    let session = client.get("/session/auto").await.unwrap();
    assert!(
        session["compaction_count"].as_u64().unwrap() > 3,
        "{session}"
    );
    assert!(session["active_messages"].as_u64().unwrap() <= 10);
    assert_eq!(session["breaker"]["open"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_during_a_compaction_are_accepted_and_land_after_the_boundary() {
    let dir = tempfile::TempDir::new().unwrap();
    let (started, gate, command) = gated_summarizer(dir.path(), "gated");
    let config = format!(
        "[compaction]\nmax_messages = 6\n[summarizer]\nkind = \"command\"\ncommand = \"{command}\"\n"
    );
    let daemon = TestDaemon::start(&config);
    let client = daemon.client();
    let seven: Vec<Value> = (0..7).map(|i| user(&format!("before {i}"))).collect();
    let answer = client
        .post("/session/gated/message", &json!({"messages": seven}))
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "started");
    assert_eq!(
        client.get("/session/gated").await.unwrap()["compacting"],
        true
    );
    tokio::task::spawn_blocking(move || std::fs::read_to_string(&started).unwrap())
        .await
        .unwrap();
    // The summarizer is blocked on the gate; these appends are acknowledged meanwhile.
    for i in 0..2 {
        let a = client
            .post("/session/gated/message", &user(&format!("during {i}")))
            .await
            .unwrap();
        assert_eq!(a["compaction"]["status"], "in_progress");
    }
    tokio::task::spawn_blocking(move || std::fs::write(&gate, "go\n").unwrap())
        .await
        .unwrap();
    // Under its trigger, the context is served without waiting; the compaction lands soon.
    let context = eventually(Duration::from_secs(30), || async {
        let context = client.get("/session/gated/context").await.unwrap();
        (context["compaction_num"] == 1).then_some(context)
    })
    .await
    .expect("the compaction landed");
    let texts: Vec<String> = context["messages"].as_array().unwrap()[1..]
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts.last().unwrap(), "during 1");
    assert!(texts.contains(&"during 0".to_string()));
    let history = client.get("/session/gated/compaction").await.unwrap();
    assert!(
        history["compactions"][0]["boundary_seq"].as_u64().unwrap() <= 7,
        "the boundary was planned before the late appends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_an_in_flight_model_call_cleanly() {
    let mock = MockModel::start(vec![], Reply::Hang);
    let mut daemon = start(&openai_config(&mock, "").replace("timeout_s = 20", "timeout_s = 300"));
    let client = daemon.client();
    fill(&client, "stop", 30).await;
    let pending = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/session/stop/summarize", &json!({})).await })
    };
    tokio::task::block_in_place(|| mock.wait_for_requests(1));
    let status = tokio::task::block_in_place(|| daemon.terminate());
    assert!(status.success(), "{status}");
    let (status, message) = api_error(pending.await.unwrap().unwrap_err());
    assert_eq!(status, 503, "{message}");
    daemon.spawn();
    let history = daemon
        .client()
        .get("/session/stop/compaction")
        .await
        .unwrap();
    assert!(
        history["failures"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{history}"
    );
}

/// A session whose tool calls and results carry credentials.
async fn fill_with_secrets(client: &Client, id: &str) {
    let mut messages = vec![user(&format!("{id}: deploy the service"))];
    for i in 0..30 {
        messages.extend(bash_round(
            &format!("{id}-{i}"),
            &format!("export DB_PASSWORD=hunter2hunter2 && ./deploy.sh --step {i}"),
            &format!("step {i} ok\nusing key sk-abcdefghijklmnopqrstuvwx{i}\n"),
        ));
    }
    client
        .post(
            &format!("/session/{id}/message"),
            &json!({"messages": messages}),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_neither_the_model_nor_a_summary_but_stay_in_the_history() {
    // A model that leaks credentials into its answer (it saw them elsewhere, or made them up).
    let mock = MockModel::start(
        vec![],
        Reply::OpenAi(nine_sections(
            "deployed with DB_PASSWORD=hunter2hunter2 and sk-abcdefghijklmnopqrstuvwx0",
        )),
    );
    let daemon = start(&openai_config(&mock, ""));
    let client = daemon.client();
    fill_with_secrets(&client, "sec").await;
    let answer = client
        .post("/session/sec/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(answer["compacted"], true, "{answer}");
    let prompt = mock.requests()[0].prompt();
    assert!(
        prompt.contains("DB_PASSWORD=[redacted]"),
        "the call is shown, redacted"
    );
    for secret in ["hunter2hunter2", "sk-abcdefghijklmnopqrstuvwx"] {
        assert!(!prompt.contains(secret), "{secret} sent to the model");
        assert!(!answer["summary"].as_str().unwrap().contains(secret));
        let context = client
            .get("/session/sec/context")
            .await
            .unwrap()
            .to_string();
        assert!(
            !context.contains(&format!("{secret}0")),
            "{secret} in the summary"
        );
    }
    // Nothing stored is changed: the history keeps every message verbatim.
    let history = crate::common::all_messages(&client, "sec").await;
    assert!(
        serde_json::to_string(&history)
            .unwrap()
            .contains("hunter2hunter2")
    );

    // The extractive summarizer redacts too, and `redact_secrets = false` turns it off.
    let plain = TestDaemon::start("");
    let client = plain.client();
    fill_with_secrets(&client, "ext").await;
    let summary = client
        .post("/session/ext/summarize", &json!({}))
        .await
        .unwrap()["summary"]
        .to_string();
    assert!(
        summary.contains("[redacted]") && !summary.contains("hunter2hunter2"),
        "{summary}"
    );
    let off = TestDaemon::start("[summarizer]\nredact_secrets = false\n");
    let client = off.client();
    fill_with_secrets(&client, "off").await;
    let summary = client
        .post("/session/off/summarize", &json!({}))
        .await
        .unwrap()["summary"]
        .to_string();
    assert!(summary.contains("hunter2hunter2"), "{summary}");
}

/// An agent step: a ~1,000-token answer with the usage its model call reported.
async fn step(client: &Client, id: &str, i: usize, input_tokens: u64) -> Value {
    client
        .post(
            &format!("/session/{id}/message"),
            &json!({
                "messages": [{"role": "assistant", "content": format!("{i:>4}{}", "x".repeat(3996))}],
                "usage": {"input_tokens": input_tokens},
                "wait": true,
            }),
        )
        .await
        .unwrap()
}

/// A model server whose count of the context stays over the trigger whatever compaction does
/// (it counts what compactd cannot see, or answers nonsense): compacting again on every call
/// would rewrite the summary (with a model summarizer, a model call) on every agent step. Each
/// compaction is judged by the first count after it, so three that did not bring the count
/// under the trigger open the breaker for the turn, as failed ones do; the next user message
/// starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_count_that_stays_over_the_trigger_after_compacting_opens_the_breaker() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "over", "context_limit": 10000}))
        .await
        .unwrap();
    client
        .post("/session/over/message", &user("work on the parser"))
        .await
        .unwrap();
    for i in 0..5 {
        let answer = step(&client, "over", i, 2000 + 1000 * i as u64).await;
        assert!(answer["compaction"].is_null(), "{answer}");
    }
    let mut statuses = Vec::new();
    for i in 5..17 {
        let answer = step(&client, "over", i, 9000).await;
        statuses.push(
            answer["compaction"]["status"]
                .as_str()
                .unwrap_or("none")
                .to_string(),
        );
    }
    let session = client.get("/session/over").await.unwrap();
    assert_eq!(session["compaction_count"], 3, "{statuses:?} {session}");
    assert_eq!(session["breaker"]["open"], true, "{session}");
    assert_eq!(
        statuses[..4],
        ["completed", "completed", "completed", "breaker_open"],
        "{statuses:?}"
    );
    // A new turn: compaction resumes, and a count under the trigger after it closes the breaker.
    let answer = client
        .post(
            "/session/over/message",
            &json!({"messages": [user("now the lexer")], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");
    let attempts =
        || async { client.get("/session/over").await.unwrap()["breaker"]["attempts"].clone() };
    assert_eq!(attempts().await, 1);
    step(&client, "over", 100, 3000).await;
    assert_eq!(attempts().await, 0);
}

/// The other side of the test above: a model server whose count drops after each compaction
/// (what it counts is what compactd sent) never opens the breaker, however long the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_count_that_drops_after_each_compaction_keeps_compaction_going() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "drops", "context_limit": 10000}))
        .await
        .unwrap();
    client
        .post(
            "/session/drops/message",
            &user("work alone for a long time"),
        )
        .await
        .unwrap();
    // The upstream's count: the system prompt and tools (2,000) and what was sent.
    let mut counted = 2000;
    for i in 0..40 {
        let answer = step(&client, "drops", i, counted).await;
        assert_ne!(
            answer["compaction"]["status"], "breaker_open",
            "step {i}: {answer}"
        );
        counted = 2000
            + client.get("/session/drops/context").await.unwrap()["tokens"]
                .as_u64()
                .unwrap();
    }
    let session = client.get("/session/drops").await.unwrap();
    assert!(
        session["compaction_count"].as_u64().unwrap() >= 5,
        "{session}"
    );
    assert_eq!(session["breaker"]["open"], false, "{session}");
}
