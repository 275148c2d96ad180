//! The agents people use, unmodified, through compactd's proxy: Claude Code (its default
//! model, with thinking on), Codex CLI, opencode, mini-swe-agent and aider, each driven
//! through a task of many tool steps by a local model API that refuses what the providers
//! refuse ([`crate::common::model_api`]), first directly, then through compactd.

mod harness;

use crate::common::free_port;
use crate::common::model_api::{ModelApi, Task};
use harness::{Agent, Setup, installed, run};
use std::time::Duration;

const PROMPT: &str = "Run the numbered steps the model gives you with your shell tool, one per step, until it says they are done.";

fn direct(agent: Agent, model: &str) {
    if installed(agent).is_none() {
        return;
    }
    let api = ModelApi::start(Task::default());
    let dir = tempfile::TempDir::new().unwrap();
    let setup = Setup {
        agent,
        base: &api.base,
        model,
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-direct",
    };
    let result = run(&setup, Duration::from_secs(300));
    let refused = api.refused();
    eprintln!(
        "{} direct: {} requests, refused {:?}\nanswer: {}",
        agent.name(),
        api.seen().len(),
        refused,
        result.answer
    );
    assert!(result.ok(), "{}", result.log());
    assert!(refused.is_empty(), "{refused:?}");
    assert!(
        result
            .answer
            .contains("All 20 steps done; the last output ended with STEP-20-END"),
        "{}",
        result.log()
    );
}

#[test]
fn claude_code_runs_the_task_directly() {
    direct(Agent::ClaudeCode, "claude-opus-5-5");
}

#[test]
fn codex_runs_the_task_directly() {
    direct(Agent::Codex, "gpt-5-codex");
}

#[test]
fn opencode_runs_the_task_directly() {
    direct(Agent::Opencode, "mock-model");
}

#[test]
fn mini_swe_agent_runs_the_task_directly() {
    direct(Agent::MiniSwe, "mock-model");
}

/// Every session of the daemon: (id, kind, compactions, messages), read from its database
/// with the system's own view of it.
fn sessions(daemon: &crate::common::TestDaemon) -> Vec<(String, String, u64, u64)> {
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    conn.prepare(
        "SELECT id, kind, compaction_count, message_count FROM sessions ORDER BY created_at",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Runs `agent` through compactd's loopback proxy at a `limit`-token window for `model`,
/// whose tokenizer counts `chars_per_token` characters a token, and checks what every such
/// run must show.
fn through(agent: Agent, model: &str, limit: usize, chars_per_token: usize) {
    if installed(agent).is_none() {
        return;
    }
    let mut task = Task {
        lines: 1_500,
        chars_per_token,
        ..Task::default()
    };
    task.windows.insert(model.to_string(), limit);
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n\n[proxy.models]\n\"{model}\" = {limit}\n",
        base = api.base
    );
    let daemon = crate::common::TestDaemon::start(&config);
    let dir = tempfile::TempDir::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let setup = Setup {
        agent,
        base: &base,
        model,
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-through",
    };
    let result = run(&setup, Duration::from_secs(400));
    let refused = api.refused();
    let seen = api.seen();
    eprintln!(
        "{} through compactd: {} requests, refused {:?}\nanswer: {}",
        agent.name(),
        seen.len(),
        refused,
        result.answer
    );
    assert!(
        result.ok(),
        "{}\ndaemon log:\n{}",
        result.log(),
        daemon.log()
    );
    assert!(
        refused.is_empty(),
        "the model API refused: {refused:?}\ndaemon log:\n{}",
        daemon.log()
    );
    assert!(
        result
            .answer
            .contains("All 20 steps done; the last output ended with STEP-20-END"),
        "{}",
        result.log()
    );
    for s in &seen {
        assert!(
            s.tokens <= limit,
            "a request of {} tokens reached a {limit}-token model",
            s.tokens
        );
    }
    let sessions = sessions(&daemon);
    eprintln!(
        "sessions: {sessions:?}\nrequest tokens: {:?}",
        seen.iter().map(|s| s.tokens).collect::<Vec<_>>()
    );
    let main: Vec<&(String, String, u64, u64)> =
        sessions.iter().filter(|s| s.1 == "proxy").collect();
    assert_eq!(
        main.len(),
        1,
        "one session for the conversation: {sessions:?}"
    );
    assert!(
        main[0].2 >= 2,
        "the conversation compacted at least twice: {sessions:?}\n{}",
        daemon.log()
    );
    drop(api);
}

#[test]
fn claude_code_runs_the_task_through_compactd() {
    through(Agent::ClaudeCode, "claude-opus-5-5", 48_000, 2);
}

#[test]
fn codex_runs_the_task_through_compactd() {
    through(Agent::Codex, "gpt-5-codex", 40_000, 2);
}

#[test]
fn opencode_runs_the_task_through_compactd() {
    through(Agent::Opencode, "mock-model", 16_000, 4);
}

#[test]
fn mini_swe_agent_runs_the_task_through_compactd() {
    through(Agent::MiniSwe, "mock-model", 8_000, 4);
}

#[test]
fn claude_code_with_a_thinking_model_runs_the_task_through_compactd() {
    through(Agent::ClaudeCode, "claude-sonnet-4-5", 40_000, 4);
}

/// aider's rounds: `rounds` runs of `aider --message`, each restoring the chat history
/// aider keeps, each asking for one more function; returns the final `lib.py` and the runs.
fn aider_rounds(base: &str, dir: &std::path::Path, rounds: usize) -> (String, Vec<harness::Run>) {
    let mut runs = Vec::new();
    for k in 1..=rounds {
        let prompt = format!("Round {k}: add a function f{k}() to lib.py that returns {k}.");
        let setup = Setup {
            agent: Agent::Aider,
            base,
            model: "mock-aider",
            dir,
            prompt: &prompt,
            key: "sk-test-aider",
        };
        let run = run(&setup, Duration::from_secs(120));
        assert!(run.ok(), "round {k}: {}", run.log());
        runs.push(run);
    }
    let lib = std::fs::read_to_string(dir.join("work/lib.py")).unwrap_or_default();
    (lib, runs)
}

#[test]
fn aider_runs_its_rounds_directly() {
    if installed(Agent::Aider).is_none() {
        return;
    }
    let api = ModelApi::start(Task::default());
    let dir = tempfile::TempDir::new().unwrap();
    let (lib, _) = aider_rounds(&api.base, dir.path(), 3);
    let refused = api.refused();
    eprintln!(
        "aider direct: {} requests, refused {refused:?}\n{lib}",
        api.seen().len()
    );
    assert!(refused.is_empty());
    assert!(
        lib.contains("def f3():") && lib.contains("    return 3\n"),
        "{lib}"
    );
}

#[test]
fn aider_runs_its_rounds_through_compactd_as_one_conversation() {
    if installed(Agent::Aider).is_none() {
        return;
    }
    const ROUNDS: usize = 17;
    const LIMIT: usize = 8_000;
    let mut task = Task::default();
    task.windows.insert("mock-aider".into(), LIMIT);
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\n\n[proxy.models]\n\"mock-aider\" = {LIMIT}\n\"mock-aider-weak\" = {LIMIT}\n",
        base = api.base
    );
    let daemon = crate::common::TestDaemon::start(&config);
    let dir = tempfile::TempDir::new().unwrap();
    let (lib, _) = aider_rounds(&format!("http://127.0.0.1:{port}"), dir.path(), ROUNDS);
    let seen = api.seen();
    let refused = api.refused();
    let sessions = sessions(&daemon);
    eprintln!(
        "aider through compactd: {} requests, refused {refused:?}\nsessions {sessions:?}\ntokens {:?}",
        seen.len(),
        seen.iter().map(|s| s.tokens).collect::<Vec<_>>()
    );
    assert!(refused.is_empty(), "{refused:?}\n{}", daemon.log());
    for k in 1..=ROUNDS {
        assert!(
            lib.contains(&format!("    return {k}\n")) && lib.contains(&format!("def f{k}():")),
            "round {k} missing:\n{lib}"
        );
    }
    let main: Vec<_> = sessions.iter().filter(|s| s.1 == "proxy").collect();
    let side: Vec<_> = sessions.iter().filter(|s| s.1 == "side").collect();
    assert_eq!(main.len(), 1, "one conversation: {sessions:?}");
    assert!(
        side.len() <= 1,
        "at most one more session for side calls: {sessions:?}"
    );
    assert!(main[0].2 >= 1, "the conversation compacted: {sessions:?}");
    for s in &seen {
        assert!(s.tokens <= LIMIT, "a request of {} tokens", s.tokens);
    }
    // After the first compaction, every main call still carries the user's real request,
    // never aider's few-shot example as the task.
    let compacted: Vec<&crate::common::model_api::Seen> = seen
        .iter()
        .filter(|s| {
            s.model() == "mock-aider" && s.body.to_string().contains("## 1. Primary Request")
        })
        .collect();
    assert!(!compacted.is_empty());
    for s in compacted {
        let body = s.body.to_string();
        let asked = s.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str())
            .find_map(|t| {
                t.find("Round ")
                    .map(|at| t[at..].split(':').next().unwrap().to_string())
            });
        assert!(asked.is_some(), "the round's request is gone: {body}");
        assert!(
            !body.contains("Original request: Change the greeting"),
            "a few-shot example taken for the task"
        );
    }
}
