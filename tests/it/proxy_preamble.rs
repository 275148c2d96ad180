//! What a proxied conversation keeps verbatim in every call: its system prompt, then the
//! user's request (while pinned messages leave room for the smallest summary and tail), then
//! as much of the rest of its preamble as a quarter of the usable context holds. The preamble here is SWE-agent's as its real transcript has it: its system
//! prompt, a demonstration of a whole solved issue (about 4,800 tokens), then the issue to
//! solve.

use crate::common::TestDaemon;
use crate::common::mock_model::{MockModel, Reply};
use crate::proxy::{KEY, call, no_orphans};
use serde_json::{Value, json};

/// SWE-agent's first call in the shared GPT-4 run: system prompt, demonstration, issue.
fn swe_agent_first_call() -> Option<Vec<Value>> {
    let files = crate::common::shared_transcripts()?;
    let file = files
        .iter()
        .find(|f| f.ends_with("swe-agent/test_data_gpt4__pydicom__pydicom-1458.traj"))?;
    let run: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let first: Vec<Value> = run["history"].as_array().unwrap()[..3]
        .iter()
        .map(|m| json!({"role": m["role"], "content": m["content"]}))
        .collect();
    assert_eq!(
        first.iter().map(|m| m["role"].as_str()).collect::<Vec<_>>(),
        [Some("system"), Some("user"), Some("user")]
    );
    Some(first)
}

/// A model of `window` tokens (four characters each) that refuses longer requests as OpenAI
/// does, and compactd before it giving sessions `limit` tokens.
fn through_a_window(window: usize, limit: usize) -> (MockModel, TestDaemon) {
    let mock = MockModel::start(
        vec![],
        Reply::Tokenized {
            window,
            chars_per_token: 4,
        },
    );
    let daemon = TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = {limit}\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    ));
    (mock, daemon)
}

/// SWE-agent's first call, then `steps` steps, through compactd to a model of `window`
/// tokens (four characters each) that refuses longer requests as OpenAI does and reports
/// its count. Checks what every call the model got must hold: the system prompt first, the
/// issue whole as a message of its own, no result without its call; returns the calls and
/// which of SWE-agent's three first messages are pinned in the file.
async fn swe_agent_through(model: &str, window: usize, steps: usize) -> Option<(usize, [bool; 3])> {
    let first = swe_agent_first_call()?;
    let (system, issue) = (&first[0], &first[2]);
    let (mock, daemon) = through_a_window(window, 32_000);
    let client = daemon.client();
    let mut messages = first.clone();
    let mut session = String::new();
    for i in 0..steps {
        let body = json!({"model": model, "messages": messages});
        let (status, head, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(
            status,
            200,
            "{model}, step {i}: {}",
            String::from_utf8_lossy(&answer)
        );
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        // As this SWE-agent run does: the model's answer, then the command's output as a
        // user message.
        messages.push(json!({"role": "assistant", "content": "noted"}));
        messages.push(json!({"role": "user",
            "content": format!("module {i}: {}", "def f(): pass\n".repeat(200))}));
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(
        state["compaction_count"].as_u64().unwrap() >= 1,
        "{model}: the conversation compacted: {state}"
    );
    let sent = mock.requests();
    for (n, request) in sent.iter().enumerate() {
        let got = request.body["messages"].as_array().unwrap();
        no_orphans(got);
        assert_eq!(
            &got[0], system,
            "{model}, call {n}: the system prompt first"
        );
        assert!(
            got.contains(issue),
            "{model}, call {n}: the issue, whole, a message of its own"
        );
    }
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let pinned: Vec<bool> = conn
        .prepare("SELECT pinned FROM messages WHERE session_id = ?1 AND seq <= 3 ORDER BY seq")
        .unwrap()
        .query_map([&session], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    Some((sent.len(), pinned.try_into().unwrap()))
}

/// At a 32,000-token window (a model the daemon has no window for: the configured default)
/// a quarter of the usable context (6,400 tokens) holds the system prompt and the
/// demonstration (about 6,000 together) or the system prompt and the issue, not all three.
/// The issue is the user's request: it stays a message of its own in every call the model
/// gets, after compactions as before them, and the demonstration is what goes to the summary
/// (before, the demonstration took the room and the issue was summarized at the first
/// compaction, call 25 of 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_request_is_pinned_before_a_long_demonstration() {
    let Some((calls, pinned)) = swe_agent_through("local-model", 32_000, 40).await else {
        return;
    };
    assert_eq!(calls, 40, "none refused");
    assert_eq!(pinned, [true, false, true], "the demonstration not pinned");
}

/// GPT-4's own 8,192 tokens, the window of the run the transcript comes from: SWE-agent's
/// first call (about 7,200 tokens) is over compactd's trigger from the start, and a quarter
/// of the usable context (1,600 tokens) holds the system prompt alone. The issue is pinned
/// all the same (the system prompt and it take 2,400 tokens, under the 2,550 that leave room
/// for the smallest summary and tail), so every call the model gets still has it whole;
/// before, it went to the summary with the demonstration at the first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_request_is_pinned_even_where_a_quarter_of_the_window_cannot_hold_it() {
    let Some((calls, pinned)) = swe_agent_through("gpt-4", 8_192, 12).await else {
        return;
    };
    assert_eq!(calls, 12, "none refused");
    assert_eq!(pinned, [true, false, true]);
}

/// POSTs a proxied call, which must be answered; returns the session it landed in.
async fn landed(
    client: &compactd_api::client::Client,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> String {
    let (status, head, answer) =
        crate::proxy_wire::send(client, hyper::Method::POST, path, headers, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    head["x-compactd-session"].to_str().unwrap().to_string()
}

/// A Claude Code fork whose instructions are its parent's, byte for byte: the fork's calls
/// carry the parent's whole history, then the `Agent` call that made it and one user message
/// holding that call's result and the fork's directive; only `x-claude-code-agent-id` tells
/// it from its parent. It is a session of its own with its call and directive pinned: its
/// every call, through several compactions, holds the directive whole after its call.
/// (Keyed by instructions alone, it was a branch of its parent's session whose compaction
/// summarized the directive away: the agent went on with its parent's steps.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_named_by_its_agent_id_keeps_its_directive_though_its_instructions_are_its_parents()
{
    let mock = crate::proxy_overflow::model(16_000, 2);
    let daemon = crate::proxy::proxy_to(&mock);
    let client = daemon.client();
    let output = |step: &str| format!("output of {step}: {}", "x = 1\n".repeat(300));
    let step = |messages: &mut Vec<Value>, id: &str, command: &str| {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Running {command}.")},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output(command)}]}));
    };
    let send = |messages: Vec<Value>, agent: Option<&'static str>| {
        let client = daemon.client();
        async move {
            let mut headers = vec![
                ("x-api-key", KEY),
                ("anthropic-version", "2023-06-01"),
                ("x-claude-code-session-id", "5f0c1a2e-session"),
            ];
            headers.extend(agent.map(|a| ("x-claude-code-agent-id", a)));
            let body = json!({"model": "claude-test", "max_tokens": 1024,
                "system": "You are Claude Code.",
                "tools": [{"name": "Bash", "description": "Runs a command.", "input_schema": {"type": "object"}},
                          {"name": "Agent", "description": "Starts an agent.", "input_schema": {"type": "object"}}],
                "messages": messages});
            landed(&client, "/v1/messages", &headers, &body).await
        }
    };
    let mut parent = vec![json!({"role": "user", "content": "Run the twelve steps."})];
    let mut parent_session = String::new();
    for i in 0..4 {
        parent_session = send(parent.clone(), None).await;
        step(&mut parent, &format!("toolu_p{i}"), &format!("step {i}"));
    }
    // The parent forks: its `Agent` call, answered in the fork's first message.
    let directive = "<fork-boilerplate>You are a fork.</fork-boilerplate> Your directive: run sub-steps A1 to A24, nothing else.";
    let mut fork = parent.clone();
    fork.push(json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_fork", "name": "Agent",
         "input": {"description": "Run sub-steps A", "prompt": "run sub-steps A1 to A24", "subagent_type": "fork"}}]}));
    fork.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_fork", "content": "Fork started — that fork is you."},
        {"type": "text", "text": directive}]}));
    let fork_from = mock.requests().len();
    let mut fork_session = String::new();
    for i in 1..=24 {
        fork_session = send(fork.clone(), Some("a1b2c3d4e5f6")).await;
        step(&mut fork, &format!("toolu_a{i}"), &format!("sub-step A{i}"));
    }
    assert_ne!(
        fork_session, parent_session,
        "the fork is a session of its own"
    );
    let state = client
        .get(&format!("/session/{fork_session}"))
        .await
        .unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 2, "{state}");
    for request in &mock.requests()[fork_from..] {
        let messages = request.body["messages"].as_array().unwrap();
        crate::proxy_overflow::results_follow_their_calls(messages);
        let text = request.body["messages"].to_string();
        assert!(
            text.contains("Your directive: run sub-steps A1 to A24"),
            "{text}"
        );
        assert!(text.contains("toolu_fork"), "{text}");
    }
    // The parent goes on in its own session, nothing of the fork's in its calls.
    step(&mut parent, "toolu_p4", "step 4");
    let before = mock.requests().len();
    assert_eq!(send(parent.clone(), None).await, parent_session);
    let text = mock.requests()[before].body["messages"].to_string();
    assert!(
        !text.contains("sub-step A") && !text.contains("toolu_fork"),
        "{text}"
    );
}

/// A Codex sub-agent names its thread (`thread-id`) beside its parent's `session-id`; the
/// main thread's is the session's own. One whose history is its parent's whole conversation,
/// steps and all, then its own task (where no rule of where a sub-agent leaves its parent
/// would tell it) is a session of its own, named beside its parent's, its task pinned; the
/// main thread goes on in its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_named_by_its_thread_is_a_session_beside_its_parents() {
    let mock = crate::proxy_overflow::model(16_000, 2);
    let daemon = crate::proxy::proxy_to(&mock);
    let client = daemon.client();
    let send = |messages: Vec<Value>, thread: &'static str| {
        let client = daemon.client();
        async move {
            let headers = [
                ("authorization", "Bearer sk-proxy-test-0123456789abcdef"),
                ("session-id", "0199a1b2-main"),
                ("thread-id", thread),
            ];
            let body = json!({"model": "gpt-test", "messages": messages,
                "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]});
            landed(&client, "/v1/chat/completions", &headers, &body).await
        }
    };
    let step = |messages: &mut Vec<Value>, id: &str, command: &str| {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "shell", "arguments": json!({"command": command}).to_string()}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id,
            "content": format!("output of {command}: {}", "x = 1\n".repeat(300))}));
    };
    let mut main = vec![
        json!({"role": "system", "content": "You are Codex."}),
        json!({"role": "user", "content": "Run the twelve steps."}),
    ];
    let mut main_session = String::new();
    for i in 0..4 {
        main_session = send(main.clone(), "0199a1b2-main").await;
        step(&mut main, &format!("call_m{i}"), &format!("step {i}"));
    }
    let mut sub = main.clone();
    sub.push(json!({"role": "user", "content": "Run sub-steps A1 to A24, nothing else."}));
    let from = mock.requests().len();
    let mut sub_session = String::new();
    for i in 1..=24 {
        sub_session = send(sub.clone(), "0199a1b2-thread-a").await;
        step(&mut sub, &format!("call_a{i}"), &format!("sub-step A{i}"));
    }
    assert_ne!(
        sub_session, main_session,
        "the sub-agent is a session of its own"
    );
    assert!(
        sub_session.starts_with(&format!("{main_session}.")),
        "{sub_session} beside {main_session}"
    );
    let state = client
        .get(&format!("/session/{sub_session}"))
        .await
        .unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 2, "{state}");
    for request in &mock.requests()[from..] {
        let text = request.body["messages"].to_string();
        assert!(
            text.contains("Run sub-steps A1 to A24, nothing else."),
            "{text}"
        );
    }
    step(&mut main, "call_m4", "step 4");
    let before = mock.requests().len();
    assert_eq!(send(main.clone(), "0199a1b2-main").await, main_session);
    let text = mock.requests()[before].body["messages"].to_string();
    assert!(!text.contains("sub-step A"), "{text}");
}

/// An agent of GitHub Copilot CLI's shape in its bring-your-own-key mode, over Chat
/// Completions at a 20,000-token window: a 22,000-character system message and about 6,500
/// tokens of tools with every call, 44 steps of a command and its output. The system message
/// reaches the model whole in every call, the summary and the tail giving way to it; no call
/// is refused. (Pinned only while pinned messages took a quarter of the usable context, it
/// went with the first compaction: 18 of 21 calls had no system prompt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_system_prompt_stays_whole_in_every_call_at_a_small_window() {
    let (mock, daemon) = through_a_window(20_000, 20_000);
    let client = daemon.client();
    let system: String = (0..470)
        .map(|i| format!("Rule {i:03}: keep changes small and explain each. "))
        .collect();
    assert!(system.len() >= 22_000);
    let tools: Vec<Value> = (0..40)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": "Runs a step of the work; ".repeat(20),
            "parameters": {"type": "object", "properties": {"command": {"type": "string",
                "description": "What to run, exactly as a shell would take it."}}}}})
        })
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Build the project and fix what fails."}),
    ];
    let mut session = String::new();
    for i in 0..44 {
        let body =
            json!({"model": "gpt-byok", "messages": messages, "tools": tools, "max_tokens": 1_000});
        let (status, head, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(
            status,
            200,
            "step {i}: {}",
            String::from_utf8_lossy(&answer)
        );
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"),
            "type": "function", "function": {"name": "tool_1", "arguments": format!("{{\"command\": \"make step{i}\"}}")}}]}));
        let output: String = (0..150)
            .map(|l| format!("step {i} line {l}: compiled\n"))
            .collect();
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": output}));
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), 44, "no call was refused and sent again");
    for (i, request) in requests.iter().enumerate() {
        let sent = &request.body["messages"];
        assert_eq!(sent[0]["role"], "system", "call {i}");
        assert_eq!(
            sent[0]["content"].as_str(),
            Some(system.as_str()),
            "call {i}: the system prompt whole"
        );
        no_orphans(sent.as_array().unwrap());
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
    assert!(state.get("unpinned_system_tokens").is_none(), "{state}");
}

/// A system prompt that cannot fit beside the smallest summary and tail at its window (about
/// 11,000 tokens at 16,000) is not pinned, and compactd says so: once in the log, in the
/// session's view, in `/health`. It went silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_prompt_too_long_for_the_window_is_said_to_be_unpinned() {
    let (_mock, daemon) = through_a_window(1_000_000, 16_000);
    let client = daemon.client();
    let system: String = (0..1_200)
        .map(|i| format!("Rule {i:04}: check everything twice. "))
        .collect();
    let mut session = String::new();
    for step in 0..2 {
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": "Start."}),
        ];
        if step == 1 {
            messages.push(json!({"role": "assistant", "content": "noted"}));
            messages.push(json!({"role": "user", "content": "Go on."}));
        }
        let (status, head, answer) = call(
            &client,
            KEY,
            None,
            &json!({"model": "m", "messages": messages}),
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        session = head["x-compactd-session"].to_str().unwrap().to_string();
    }
    let view = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(
        view["unpinned_system_tokens"].as_u64().unwrap() > 8_000,
        "{view}"
    );
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["proxy"]["unpinned_system_prompts"], 1, "{health}");
    let log = daemon.log();
    assert_eq!(
        log.matches("system prompt does not fit").count(),
        1,
        "{log}"
    );
}

/// An agent of opencode's shape at a 20,000-token window: about 7,500 tokens of system
/// prompt and tools, then a file read of 11,300 characters. The output reaches the model
/// whole on its first appearance, the whole request far under the trigger; the current
/// step's fixed quarter of the usable context cut it to its head and tail (1,366 of 11,300
/// characters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newest_output_that_fits_reaches_the_model_whole_at_a_small_window() {
    let (mock, daemon) = through_a_window(20_000, 20_000);
    let client = daemon.client();
    let system: String = (0..300)
        .map(|i| format!("Guideline {i:03}: prefer small, tested changes. "))
        .collect();
    let tools: Vec<Value> = (0..30)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": "Reads, edits or runs things in the workspace; ".repeat(12),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
        })
        .collect();
    let file: String = (1..=200)
        .map(|i| format!("{i:>4}\tconst RECORD_{i}: Record = Record::new({i}, \"r{i}\");\n"))
        .collect();
    assert!((11_000..12_500).contains(&file.len()), "{}", file.len());
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Read src/records.rs and tell me what it holds."}),
    ];
    for step in 0..2 {
        if step == 1 {
            messages.push(
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "tool_0",
                "arguments": "{\"path\": \"src/records.rs\"}"}}]}),
            );
            messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": file}));
        }
        let body =
            json!({"model": "local", "messages": messages, "tools": tools, "max_tokens": 2_000});
        let (status, _, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    }
    let sent = &mock.requests()[1].body["messages"];
    let shown = sent.as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        shown == file,
        "the output whole, not its head and tail: {} of {} characters",
        shown.len(),
        file.len()
    );
}
