//! Background compaction (issue 25): a compaction starts before the trigger and the agent goes
//! on; only a context over the trigger waits, and at most `max_wait_s`.

use crate::common::*;
use serde_json::{Value, json};
use std::time::Duration;

/// A message of about 400 tokens, distinct by `i`.
fn filler(i: usize) -> Value {
    let role = if i.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    json!({"role": role, "content": format!("step {i}: {}", "words of the session ".repeat(80))})
}

async fn session(client: &compactd_api::client::Client, id: &str) -> Value {
    client.get(&format!("/session/{id}")).await.unwrap()
}

/// Texts of the context's messages after the summary (the tail), in order.
fn tail_texts(context: &Value) -> Vec<String> {
    context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["parts"][0]["text"].as_str().map(str::to_string))
        .collect()
}

/// Appends bash rounds (a call, then its `output`) numbered `rounds` to session `id`, one
/// message per request.
async fn append_rounds(
    client: &compactd_api::client::Client,
    id: &str,
    rounds: std::ops::Range<usize>,
    output: &str,
) {
    for i in rounds {
        for message in bash_round(&format!("c{i}"), "cargo test", output) {
            client
                .post(&format!("/session/{id}/message"), &message)
                .await
                .unwrap();
        }
    }
}

/// Appends fillers one by one until an append starts a compaction; returns how many.
async fn fill_until_started(client: &compactd_api::client::Client, id: &str) -> usize {
    for i in 0..200 {
        let answer = client
            .post(&format!("/session/{id}/message"), &filler(i))
            .await
            .unwrap();
        if !answer["compaction"].is_null() {
            assert_eq!(answer["compaction"]["status"], "started", "{answer}");
            return i + 1;
        }
    }
    panic!("no compaction started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_starts_before_the_trigger_and_contexts_are_served_meanwhile() {
    let dir = tempfile::TempDir::new().unwrap();
    let (started, gate, command) = gated_summarizer(dir.path(), "model-written");
    let config = format!(
        "[compaction]\nmax_messages = 1000\nmicrocompact = false\n[summarizer]\nkind = \"command\"\ncommand = \"{command}\"\n"
    );
    let daemon = TestDaemon::start(&config);
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    client
        .post("/session", &json!({"id": "bg", "context_limit": 16000}))
        .await
        .unwrap();
    let sent = fill_until_started(&client, "bg").await;
    let at_start = session(&client, "bg").await;
    let tokens = at_start["tokens"].as_u64().unwrap();
    let threshold = at_start["token_threshold"].as_u64().unwrap();
    assert!(
        tokens < threshold && tokens * 10 >= threshold * 7,
        "started at {tokens} of a {threshold}-token trigger"
    );
    assert_eq!(at_start["compacting"], true);
    let (name, event) = next_event(&mut events).await;
    assert_eq!(name, "compaction_started");
    assert_eq!(event["background"], true, "{event}");
    tokio::task::spawn_blocking(move || std::fs::read_to_string(&started).unwrap())
        .await
        .unwrap();

    // The summarizer is blocked: contexts are served as they are, appends go on.
    let before = client.get("/session/bg/context").await.unwrap();
    assert_eq!(before["compaction_num"], 0);
    assert_eq!(tail_texts(&before).len(), sent);
    let mut during = Vec::new();
    for i in 0..2 {
        let message = json!({"role": "user", "content": format!("appended while compacting {i}")});
        client.post("/session/bg/message", &message).await.unwrap();
        during.push(format!("appended while compacting {i}"));
        let context = client.get("/session/bg/context").await.unwrap();
        assert_eq!(context["compaction_num"], 0, "served without waiting");
        assert_eq!(
            tail_texts(&context)[..sent],
            tail_texts(&before)[..],
            "the prefix stays byte-stable while the compaction runs"
        );
    }

    tokio::task::spawn_blocking(move || std::fs::write(&gate, "go\n").unwrap())
        .await
        .unwrap();
    let (name, event) = next_event(&mut events).await;
    assert_eq!(name, "compaction_finished", "{event}");
    assert_eq!(event["background"], true);
    let after = client.get("/session/bg/context").await.unwrap();
    assert_eq!(after["compaction_num"], 1);
    let texts = tail_texts(&after);
    assert!(
        texts.iter().any(|t| t.contains("model-written")),
        "the summary"
    );
    for line in &during {
        assert_eq!(
            texts.iter().filter(|t| t.contains(line.as_str())).count(),
            1,
            "{line} is in the context once, verbatim: {texts:?}"
        );
    }
    assert!(session(&client, "bg").await["tokens"].as_u64().unwrap() < tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_over_the_trigger_waits_at_most_max_wait_s_then_gets_an_extractive_summary() {
    // A summarizer that never answers in time; the context may wait one second for it.
    let config = "[compaction]\nmax_messages = 1000\nmicrocompact = false\nmax_wait_s = 1\nbackground_at = 1.0\n[summarizer]\nkind = \"command\"\ncommand = \"cat > /dev/null; sleep 600\"\ntimeout_s = 600\n";
    let daemon = TestDaemon::start(config);
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "late", "context_limit": 16000}))
        .await
        .unwrap();
    let sent = fill_until_started(&client, "late").await;
    let over = session(&client, "late").await;
    assert!(over["tokens"].as_u64() >= over["token_threshold"].as_u64());

    let started = std::time::Instant::now();
    let context =
        tokio::time::timeout(Duration::from_secs(60), client.get("/session/late/context"))
            .await
            .expect("the wait is bounded")
            .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "it waited for the model first: {waited:?}"
    );
    assert_eq!(context["compaction_num"], 1);
    let now = session(&client, "late").await;
    assert!(
        now["tokens"].as_u64() < now["token_threshold"].as_u64(),
        "{now}"
    );
    let history = client.get("/session/late/compaction").await.unwrap();
    let compaction = &history["compactions"][0];
    assert_eq!(compaction["summarizer"], "extractive", "{compaction}");
    assert!(
        compaction["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("max_wait_s (1 s)"),
        "{compaction}"
    );
    // Nothing was lost: every message is in the history.
    assert_eq!(all_messages(&client, "late").await.len(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_a_compaction_lands_with_is_served_until_the_next_append() {
    // A compaction masks its tail's old outputs as it lands. The context an agent reads the
    // moment the compaction is announced must be the one it keeps getting: a masking landing
    // after it (as a write of its own) changed the tail under a context already served, and
    // the prompt cache's prefix with it (a CI run saw the session's tokens move under it).
    let dir = tempfile::TempDir::new().unwrap();
    let (started, gate, command) = gated_summarizer(dir.path(), "model-written");
    let config = format!("[summarizer]\nkind = \"command\"\ncommand = \"{command}\"\n");
    let daemon = TestDaemon::start(&config);
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    client
        .post("/session", &json!({"id": "lands", "context_limit": 32000}))
        .await
        .unwrap();
    // A task, then bash rounds: the 81st message starts a compaction by count, far below the
    // point where appends mask anything, and keeps a tail of ten messages.
    client
        .post("/session/lands/message", &user("please fix the tests"))
        .await
        .unwrap();
    append_rounds(&client, "lands", 0..40, &"ok\n".repeat(100)).await;
    let (name, _) = next_event(&mut events).await;
    assert_eq!(name, "compaction_started");
    tokio::task::spawn_blocking(move || std::fs::read_to_string(&started).unwrap())
        .await
        .unwrap();
    // The agent goes on while the model summarizes: these land in the tail, whose outputs
    // beyond the newest five are then masked with the compaction.
    append_rounds(&client, "lands", 40..45, &"ok\n".repeat(100)).await;
    tokio::task::spawn_blocking(move || std::fs::write(&gate, "go\n").unwrap())
        .await
        .unwrap();
    let (name, event) = next_event(&mut events).await;
    assert_eq!(name, "compaction_finished", "{event}");
    let first = client.get("/session/lands/context").await.unwrap();
    assert_eq!(first["compaction_num"], 1);
    // The tail's old outputs were masked with the compaction.
    let (name, masked) = next_event(&mut events).await;
    assert_eq!(name, "outputs_masked", "{masked}");
    assert_eq!(masked["post_tokens"], first["tokens"], "{masked}");
    let placeholders = first["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.to_string().contains("masked"))
        .count();
    assert!(placeholders > 0, "{first}");
    // Nothing appended since: the same context, byte for byte, and the session says so.
    let again = client.get("/session/lands/context").await.unwrap();
    assert_eq!(first, again);
    assert_eq!(session(&client, "lands").await["tokens"], first["tokens"]);
}

#[tokio::test]
async fn a_masking_a_config_edit_makes_due_is_in_the_context_that_starts_it() {
    // Microcompaction off: twenty-four bash rounds of 2,000-character outputs stay whole.
    let daemon = TestDaemon::start("[compaction]\nmicrocompact = false\n");
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    client
        .post("/session", &json!({"id": "edit", "context_limit": 128000}))
        .await
        .unwrap();
    client
        .post("/session/edit/message", &user("please fix the tests"))
        .await
        .unwrap();
    append_rounds(&client, "edit", 0..24, &"x".repeat(2000)).await;
    let unmasked = session(&client, "edit").await["tokens"].as_u64().unwrap();
    // Turned on by an edit: the session is past the point where masking starts, and nothing
    // is appended. The next context masks, and is served masked.
    edit_config(&daemon, "[compaction]\nmicrocompact = true\n");
    wait_for_event(&mut events, "config_reloaded").await;
    let first = client.get("/session/edit/context").await.unwrap();
    let tokens = first["tokens"].as_u64().unwrap();
    assert!(tokens < unmasked / 2, "{tokens} of {unmasked}");
    assert_eq!(session(&client, "edit").await["tokens"], first["tokens"]);
    assert_eq!(client.get("/session/edit/context").await.unwrap(), first);
}

#[tokio::test]
async fn the_background_settings_are_checked_like_every_other() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    for (config, key) in [
        (json!({"background_at": 0.5}), "background_at"),
        (json!({"max_wait_s": 0}), "max_wait_s"),
    ] {
        let error = client
            .post("/session", &json!({"id": "bad", "config": config}))
            .await
            .unwrap_err();
        let (status, message) = api_error(error);
        assert_eq!(status, 400);
        assert!(message.contains(key), "{message}");
    }
    assert!(
        client.get("/session/bad").await.is_err(),
        "nothing was made"
    );
}
