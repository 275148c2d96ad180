//! The current step is never compacted away: after every append, the context an agent is
//! handed holds the newest results with their calls (each output whole, or its head and its
//! tail), and stays within the session's limit, whatever the outputs' sizes (single outputs
//! larger than the whole limit included) and whatever the limit. Checked on the context's
//! own text, re-estimated, not on compactd's counters.

use compactd_api::SessionId;
use compactd_core::compaction::LazyEstimator;
use compactd_core::compaction::{Message, Part, Role};
use compactd_core::message::MessageBatch;
use compactd_daemon::Config;
use compactd_daemon::{CreateSession, Service};
use compactd_store::Store;
use compactd_store::Synchronous;
use proptest::prelude::*;
use serde_json::json;

/// One step of the random session: an assistant turn calling tools, and their outputs.
#[derive(Debug, Clone)]
struct Step {
    /// Output sizes, in multiples of a thousandth of the limit's characters (so up to about
    /// twice the whole limit for one output).
    outputs: Vec<usize>,
    /// Results in one user message (Anthropic style) rather than one tool message each.
    anthropic: bool,
    /// User messages after the results, about an eighth of the limit each (more than one:
    /// the person moved on, and the step is their newest message).
    users_after: usize,
    /// The step's results but its first (its only one, if it has one) come late: after the
    /// next step's results (a client appending out of order), answering calls of a turn that
    /// is no longer the newest.
    late: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec(prop_oneof![2 => 1usize..100, 1 => 100usize..2_000], 1..4),
        any::<bool>(),
        prop_oneof![8 => Just(0usize), 2 => Just(1), 1 => 2usize..10],
        prop::bool::weighted(0.3),
    )
        .prop_map(|(outputs, anthropic, users_after, late)| Step {
            outputs,
            anthropic,
            users_after,
            late,
        })
}

/// An output of `chars` characters whose first and last lines say which it is.
fn output(id: &str, chars: usize) -> String {
    let (head, tail) = (format!("BEGIN {id}\n"), format!("\nEND {id}"));
    let body = "x".repeat(chars.saturating_sub(head.len() + tail.len()));
    format!("{head}{body}{tail}")
}

/// Whether `context` shows `call_id`'s call, then its result: whole, or its head and tail.
fn visible(context: &[Message], call_id: &str, original: &str) -> bool {
    let (head, tail) = (
        original.lines().next().unwrap_or(""),
        original.lines().last().unwrap_or(""),
    );
    let mut called = false;
    for part in context.iter().flat_map(|m| &m.parts) {
        match part {
            Part::ToolCall { id, .. } if id == call_id => called = true,
            Part::ToolResult {
                call_id: id,
                output,
                ..
            } if id == call_id => {
                return called
                    && (output == original
                        || (output.starts_with(head) && output.ends_with(tail)));
            }
            _ => {}
        }
    }
    false
}

/// How many of `step`'s results come late.
fn held_back(step: &Step) -> usize {
    match (step.late, step.outputs.len()) {
        (false, _) => 0,
        (true, 1) => 1,
        (true, n) => n - 1,
    }
}

/// An in-process service with one session, `s`, at `limit` (and the directory of its
/// database, kept while it runs; its store is closed at the end of the test).
struct InProcess {
    _dir: tempfile::TempDir,
    store: Store,
    service: std::sync::Arc<Service>,
    id: SessionId,
}

async fn service_with_session(limit: usize) -> InProcess {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
    let service = Service::new(store.clone(), Config::default()).unwrap();
    let id = SessionId::parse("s").unwrap();
    service
        .create_session(CreateSession {
            id: Some(id.clone()),
            context_limit: Some(limit),
            ..Default::default()
        })
        .await
        .unwrap();
    InProcess {
        _dir: dir,
        store,
        service,
        id,
    }
}

/// A daemon and its client, with one session, `id`, at `limit`.
async fn daemon_with_session(
    id: &str,
    limit: usize,
) -> (crate::common::TestDaemon, compactd_api::client::Client) {
    let daemon = crate::common::TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": id, "context_limit": limit}))
        .await
        .unwrap();
    (daemon, client)
}

async fn run_session(limit: usize, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let InProcess {
        _dir,
        store,
        service,
        id,
    } = service_with_session(limit).await;
    let append = |messages: Vec<Message>| {
        let service = service.clone();
        let id = id.clone();
        async move {
            let request = MessageBatch {
                messages,
                input_tokens: None,
                compaction_num: None,
                wait: true,
            };
            service.append(&id, request, None).await.unwrap();
        }
    };
    append(vec![Message::text(Role::User, "Fix the build.")]).await;
    let estimator = LazyEstimator::default();
    // The results held back for after the next step's, with the steps they came from.
    let mut held: Vec<Part> = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let ids: Vec<String> = (0..step.outputs.len())
            .map(|i| format!("c{n}-{i}"))
            .collect();
        append(vec![Message {
            role: Role::Assistant,
            parts: ids
                .iter()
                .map(|id| Part::ToolCall {
                    id: id.clone(),
                    name: "bash".into(),
                    args: json!({"command": format!("run {id}")}),
                })
                .collect(),
        }])
        .await;
        let outputs: Vec<String> = ids
            .iter()
            .zip(&step.outputs)
            .map(|(id, size)| output(id, size * limit * 4 / 1000))
            .collect();
        let result = |(id, output): (&String, &String)| Part::ToolResult {
            call_id: id.clone(),
            name: None,
            output: output.clone(),
            is_error: false,
        };
        let mut parts: Vec<Part> = ids.iter().zip(&outputs).map(result).collect();
        let late = held_back(step);
        let holding = parts.split_off(parts.len() - late);
        if step.anthropic && !parts.is_empty() {
            append(vec![Message {
                role: Role::User,
                parts,
            }])
            .await;
        } else {
            for part in parts {
                append(vec![Message {
                    role: Role::Tool,
                    parts: vec![part],
                }])
                .await;
            }
        }
        for part in std::mem::replace(&mut held, holding) {
            append(vec![Message {
                role: Role::Tool,
                parts: vec![part],
            }])
            .await;
        }
        for u in 0..step.users_after {
            append(vec![Message::text(
                Role::User,
                format!(
                    "Now step {n} again, part {u}. {}",
                    "Say more. ".repeat(limit / 20)
                ),
            )])
            .await;
        }
        let view = service.context(&id, true).await.unwrap();
        let context = view.to_messages();
        let tokens = estimator.messages(&context);
        prop_assert!(
            tokens <= limit,
            "step {}: the context takes {} tokens of {}",
            n,
            tokens,
            limit
        );
        prop_assert!(
            view.tokens <= limit,
            "step {}: counted {} of {}",
            n,
            view.tokens,
            limit
        );
        // The step's outputs are in it, unless the person wrote more than once since.
        let answered = ids.len() - late;
        for (id, original) in ids
            .iter()
            .zip(&outputs)
            .take(answered)
            .filter(|_| step.users_after < 2)
        {
            prop_assert!(
                visible(&context, id, original),
                "step {}: {} is not visible",
                n,
                id
            );
        }
        if let Some(newest) = step.users_after.checked_sub(1) {
            let asked = format!("Now step {n} again, part {newest}.");
            prop_assert!(context.iter().any(|m| m.joined_text().contains(&asked)));
        }
    }
    service.shutdown().await;
    store.close();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_context_holds_the_current_step_and_stays_within_its_limit(
        limit in 6_000usize..60_000,
        steps in prop::collection::vec(step(), 1..24),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run_session(limit, steps))?;
    }
}

/// A lower limit shortens the current step again: the context still fits the new limit and
/// still shows the output's head and tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_limit_shortens_the_current_step_again() {
    let InProcess {
        _dir,
        store,
        service,
        id,
    } = service_with_session(128_000).await;
    let big = output("c1", 160_000);
    let messages = vec![
        Message::text(Role::User, "Read the log."),
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "c1".into(),
                name: "bash".into(),
                args: json!({"command": "cat big.log"}),
            }],
        },
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "c1".into(),
                name: None,
                output: big.clone(),
                is_error: false,
            }],
        },
    ];
    let request = MessageBatch {
        messages,
        input_tokens: None,
        compaction_num: None,
        wait: true,
    };
    service.append(&id, request, None).await.unwrap();
    let before = service.context(&id, true).await.unwrap();
    assert!(visible(&before.to_messages(), "c1", &big));
    assert!(before.tokens > 16_000, "shown at 128k: {}", before.tokens);
    let update = compactd_api::UpdateSessionRequest {
        context_limit: Some(16_000),
        ..Default::default()
    };
    service.update_session(&id, update).await.unwrap();
    let after = service.context(&id, true).await.unwrap();
    let context = after.to_messages();
    let tokens = LazyEstimator::default().messages(&context);
    assert!(
        tokens <= 16_000 && after.tokens <= 16_000,
        "{tokens} / {}",
        after.tokens
    );
    assert!(visible(&context, "c1", &big));
    // The stored message stays whole.
    let history = service.history(&id, 2, 1).await.unwrap();
    assert!(
        history.messages[0]
            .parts
            .get()
            .contains(&"x".repeat(100_000))
    );
    service.shutdown().await;
    store.close();
}

/// Masking old outputs never reaches into the current step, however many results it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masking_spares_every_result_of_the_current_step() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
    let service = Service::new(store.clone(), Config::default()).unwrap();
    let id = SessionId::parse("s").unwrap();
    let mut messages = vec![Message::text(Role::User, "Survey the logs.")];
    let round = |ids: Vec<String>, chars: usize| {
        let call = Message {
            role: Role::Assistant,
            parts: ids
                .iter()
                .map(|id| Part::ToolCall {
                    id: id.clone(),
                    name: "bash".into(),
                    args: json!({"command": format!("cat {id}.log")}),
                })
                .collect(),
        };
        let results: Vec<Message> = ids
            .iter()
            .map(|id| Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: id.clone(),
                    name: None,
                    output: output(id, chars),
                    is_error: false,
                }],
            })
            .collect();
        std::iter::once(call).chain(results).collect::<Vec<_>>()
    };
    for i in 0..12 {
        messages.extend(round(vec![format!("old{i}")], 4_000));
    }
    let parallel: Vec<String> = (0..8).map(|i| format!("now{i}")).collect();
    messages.extend(round(parallel.clone(), 8_000));
    for message in messages {
        let request = MessageBatch {
            messages: vec![message],
            input_tokens: None,
            compaction_num: None,
            wait: true,
        };
        service.append(&id, request, None).await.unwrap();
    }
    let view = service.context(&id, true).await.unwrap();
    let context = view.to_messages();
    for id in &parallel {
        assert!(visible(&context, id, &output(id, 8_000)), "{id} was masked");
    }
    let history = service
        .compaction_history(
            &id,
            compactd_daemon::HistoryRequest {
                after: 0,
                failures_after: 0,
                maskings_after: 0,
                limit: 100,
            },
        )
        .await
        .unwrap();
    assert!(!history.maskings.is_empty(), "old outputs were masked");
    service.shutdown().await;
    store.close();
}

/// A person who goes on writing after the agent's last turn (here 60 messages of about 900
/// tokens at a 16,000-token window: changes pasted one by one for release notes) has moved
/// on: the step is their newest message, and the older ones are compacted like any message.
/// Through a real daemon, each context stays within the limit by its own text (it held all
/// 60, 55,000 tokens, when every message after the agent's turn was a floor), holds the
/// newest message whole, and nothing stored is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_writing_on_after_the_agents_turn_does_not_overflow_the_context() {
    let (_daemon, client) = daemon_with_session("notes", 16_000).await;
    let say = |role: &str, text: String| json!({"role": role, "content": text});
    for message in [
        say(
            "user",
            "Write the release notes from the changes I send.".into(),
        ),
        say("assistant", "Send me the changes, one message each.".into()),
    ] {
        client
            .post("/session/notes/message", &message)
            .await
            .unwrap();
    }
    for i in 0..60 {
        let change = format!(
            "Change {i}: {}",
            "the parser now reads nested tables and reports each error with its line. ".repeat(48)
        );
        client
            .post("/session/notes/message", &say("user", change.clone()))
            .await
            .unwrap();
        let messages = context_within(&client, "notes", 16_000, &format!("change {i}")).await;
        let newest = messages.last().unwrap().joined_text();
        assert_eq!(
            newest, change,
            "change {i}: the newest message is whole and last"
        );
    }
    let stored = client
        .get("/session/notes/message?limit=1000")
        .await
        .unwrap();
    assert_eq!(
        stored["messages"].as_array().unwrap().len(),
        62,
        "nothing is lost"
    );
}

/// Results answering calls of an earlier turn (a client appending them after the agent's
/// next turn) share what the step's room has left: twelve outputs of 5,000 tokens, each
/// shown at the whole step budget before, held a 16,000-token context at 38,500 tokens. Each
/// is still stored whole, the newest turn's own result keeps its room, and a lower limit
/// shortens them all again within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_an_earlier_turn_share_what_the_step_has_left() {
    let (_daemon, client) = daemon_with_session("late", 16_000).await;
    let post = |message: serde_json::Value| {
        let client = client.clone();
        async move {
            client
                .post("/session/late/message", &message)
                .await
                .unwrap()
        }
    };
    let calls = |ids: &[String]| {
        let parts: Vec<_> = ids
            .iter()
            .map(|id| json!({"type": "tool_call", "id": id, "name": "bash", "args": {"command": format!("make test-{id}")}}))
            .collect();
        json!({"role": "assistant", "parts": parts})
    };
    let output = |id: &str| {
        format!(
            "BEGIN {id}\n{}END {id}",
            "a line of the test log\n".repeat(900)
        )
    };
    let result = |id: &str| json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": id, "output": output(id)}]});
    post(json!({"role": "user", "content": "Run every test suite."})).await;
    let early: Vec<String> = (0..12).map(|i| format!("suite{i}")).collect();
    post(calls(&early)).await;
    post(calls(&["lint".to_string()])).await;
    post(result("lint")).await;
    let shown_lint = |context: &serde_json::Value| {
        let messages: Vec<Message> = serde_json::from_value(context["messages"].clone()).unwrap();
        messages
            .iter()
            .flat_map(|m| &m.parts)
            .find_map(|p| match p {
                Part::ToolResult {
                    call_id, output, ..
                } if call_id == "lint" => Some(output.len()),
                _ => None,
            })
            .unwrap_or(0)
    };
    let first_lint_shown = shown_lint(&client.get("/session/late/context").await.unwrap());
    for id in &early {
        post(result(id)).await;
        let messages = context_within(&client, "late", 16_000, &format!("after {id}")).await;
        let lint = messages
            .iter()
            .flat_map(|m| &m.parts)
            .find_map(|p| match p {
                Part::ToolResult {
                    call_id, output, ..
                } if call_id == "lint" => Some(output),
                _ => None,
            })
            .expect("the newest turn's result is in the context");
        assert!(
            lint.starts_with("BEGIN lint\n") && lint.ends_with("END lint"),
            "and shown as its step shows it: whole, or its head and its tail"
        );
        assert_eq!(
            lint.len(),
            first_lint_shown,
            "the late results took none of its room"
        );
    }
    // A lower limit shortens the step again, in the same order: still within it.
    client
        .patch("/session/late", &json!({"context_limit": 12_000}))
        .await
        .unwrap();
    context_within(&client, "late", 12_000, "at 12,000").await;
    let stored = client.get("/session/late/message?limit=100").await.unwrap();
    let outputs: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["parts"][0]["output"].as_str())
        .collect();
    assert_eq!(outputs.len(), 13);
    for id in &early {
        assert!(
            outputs.contains(&output(id).as_str()),
            "{id} is stored whole"
        );
    }
}

/// The context of `session`, after checking that it is within `limit` both by its own text,
/// re-estimated, and by what compactd counts.
async fn context_within(
    client: &compactd_api::client::Client,
    session: &str,
    limit: usize,
    when: &str,
) -> Vec<Message> {
    let context = client
        .get(&format!("/session/{session}/context"))
        .await
        .unwrap();
    let messages: Vec<Message> = serde_json::from_value(context["messages"].clone()).unwrap();
    let tokens = LazyEstimator::default().messages(&messages);
    assert!(tokens <= limit, "{when}: the context takes {tokens} tokens");
    let counted = context["tokens"].as_u64().unwrap() as usize;
    assert!(counted <= limit, "{when}: counted {counted} tokens");
    messages
}

/// A long answer of the agent's (shown whole at 128,000: under its room there) is shortened
/// again when the limit is lowered, as an append at the lower limit would have shortened it:
/// it stayed whole, and the context at 32,000 took 38,631 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_limit_shortens_a_long_answer_again() {
    let (_daemon, client) = daemon_with_session("a", 128_000).await;
    let answer: String = (0..7_000).map(|i| format!("fn f{i}() {{}}\n")).collect();
    for message in [
        json!({"role": "user", "content": "Write the module."}),
        json!({"role": "assistant", "content": answer}),
    ] {
        client.post("/session/a/message", &message).await.unwrap();
    }
    let whole = context_within(&client, "a", 128_000, "at 128,000").await;
    assert!(whole[1].joined_text() == answer, "whole at 128,000");
    client
        .patch("/session/a", &json!({"context_limit": 32_000}))
        .await
        .unwrap();
    let messages = context_within(&client, "a", 32_000, "at 32,000").await;
    let shown = messages[1].joined_text();
    assert!(
        shown.starts_with("fn f0() {}\n") && shown.ends_with("fn f6999() {}\n"),
        "its head and its tail"
    );
    assert!(
        shown.contains("the whole message is seq 2"),
        "a marker says where it is"
    );
}

/// A model's refusal that teaches a smaller window shortens the current step again for it:
/// an output shortened to its room at 128,000 stayed so when the refusal said 16,000 (the
/// context took 24,467 tokens), and the agent's next call was refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_teaches_a_smaller_window_shortens_the_step_again() {
    let (_daemon, client) = daemon_with_session("r", 128_000).await;
    let log = output("c", 228_000);
    for message in [
        json!({"role": "user", "content": "Read the log."}),
        json!({"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "bash", "args": {"command": "cat log"}}]}),
        json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": "c", "output": log}]}),
    ] {
        client.post("/session/r/message", &message).await.unwrap();
    }
    let before = context_within(&client, "r", 128_000, "at 128,000").await;
    assert!(LazyEstimator::default().messages(&before) > 16_000);
    let noted = client
        .post(
            "/session/r/overflow",
            &json!({"error": {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 27170 tokens > 16000 maximum"}}}),
        )
        .await
        .unwrap();
    assert_eq!(noted["noted"], true);
    assert_eq!(noted["session"]["context_limit"], 16_000);
    let after = context_within(&client, "r", 16_000, "after the refusal").await;
    assert!(visible(&after, "c", &log), "the output's head and tail");
}

/// An agent whose system prompt takes 7,500 tokens of a 20,000-token window runs its first
/// command: the 7,800-character output is the newest thing in a context of about 10,600
/// tokens under a 16,000 trigger, and reaches the model whole. A fixed quarter of the usable
/// context (2,125 tokens) cut it to its head and tail on its very first appearance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_that_fits_is_whole_beside_a_long_system_prompt_at_a_small_window() {
    let (_daemon, client) = daemon_with_session("small", 20_000).await;
    let system: String = (0..1_500)
        .map(|i| format!("Rule {i}: be exact. "))
        .collect();
    let output: String = (0..600).map(|i| format!("line {i:04} ok\n")).collect();
    assert!(output.len() >= 7_800);
    let opening = json!({"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "List the build's output."}
    ]});
    let step = json!({"messages": [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "bash",
            "args": {"command": "make 2>&1"}}]},
        {"role": "tool", "parts": [{"type": "tool_result", "call_id": "c1", "output": output}]}
    ]});
    for batch in [opening, step] {
        client.post("/session/small/message", &batch).await.unwrap();
    }
    let context = context_within(&client, "small", 16_000, "after the first step").await;
    let whole = context.iter().flat_map(|m| &m.parts).any(|p| {
        matches!(p, Part::ToolResult { call_id, output: shown, .. } if call_id == "c1" && *shown == output)
    });
    assert!(whole, "the output is shown whole");
}
