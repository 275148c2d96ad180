//! A window the model taught compactd by refusing a call is the model's, not one
//! conversation's: the caller's next conversations of the model start from it, until the
//! configuration reloads (an operator correcting `[proxy.models]`).

use super::harness::{Agent, Setup, installed, run};
use super::{PROMPT, too_long};
use crate::common::model_api::{ModelApi, Task};
use crate::common::{TestDaemon, edit_config, free_port, wait_for_event};
use std::time::Duration;

/// mini-swe-agent sends no conversation header: each task it is given is a conversation of
/// its own. compactd is told twice the model's window: the first task's first call over the
/// window is refused (compactd compacts it and sends it again; the agent never sees the
/// refusal) and teaches the window; the second task starts from it and is refused nothing;
/// after the configuration reloads (the operator changed the window told, to one still too
/// large), the third task's long call is refused once again.
#[test]
fn mini_swe_agent_tasks_start_from_the_window_compactd_learned_until_the_config_reloads() {
    let agent = Agent::MiniSwe;
    if installed(agent).is_none() {
        return;
    }
    let (model, window, told) = ("mock-model", 16_000, 32000);
    let mut task = Task {
        lines: 1_500,
        chars_per_token: 2,
        ..Task::default()
    };
    task.windows.insert(model.to_string(), window);
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\n\n[proxy.models]\n\"{model}\" = {told}\n",
        base = api.base,
    );
    let daemon = TestDaemon::start(&config);
    let base = format!("http://127.0.0.1:{port}");
    let run_task = |n: usize| {
        let dir = tempfile::TempDir::new().unwrap();
        let prompt = format!("{PROMPT} This is task {n} of the day.");
        let setup = Setup {
            agent,
            base: &base,
            model,
            dir: dir.path(),
            prompt: &prompt,
            key: "sk-test-taught",
            max_output: None,
            thinking: true,
            task_tools: false,
        };
        run(&setup, Duration::from_secs(400))
            .assert_done(&format!("daemon log:\n{}", daemon.log()));
    };
    let refusals = || {
        let refused = api.refused();
        assert!(refused.iter().all(|(_, why)| too_long(why)), "{refused:?}");
        refused.len()
    };

    run_task(1);
    assert_eq!(refusals(), 1, "the first task's long call, once");
    run_task(2);
    assert_eq!(refusals(), 1, "the second task started from the window");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut events = daemon.client().events().await.unwrap();
        edit_config(&daemon, &config.replace(&told.to_string(), "24000"));
        wait_for_event(&mut events, "config_reloaded").await;
    });
    run_task(3);
    assert_eq!(
        refusals(),
        2,
        "after the reload, the window told (24,000) once more"
    );

    for seen in api.seen().iter().filter(|s| s.refused.is_none()) {
        assert!(
            seen.tokens <= window,
            "{} tokens reached the model",
            seen.tokens
        );
    }
    // The file shows it: three conversations, each at the window the model named, the
    // second from the first's teaching (its time), the third from a teaching of its own.
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let conversations: Vec<(u64, String, String)> = conn
        .prepare(
            "SELECT context_limit, limit_source, limit_taught_at FROM sessions
             WHERE kind = 'proxy' ORDER BY created_at",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(conversations.len(), 3, "{conversations:?}");
    assert!(
        conversations
            .iter()
            .all(|(limit, source, _)| *limit == window as u64 && source == "upstream refusal"),
        "{conversations:?}"
    );
    let taught: Vec<&str> = conversations.iter().map(|c| c.2.as_str()).collect();
    assert!(
        taught[0] == taught[1] && taught[2] > taught[1],
        "{conversations:?}"
    );
}

/// opencode's sub-agents are sessions of their own headers (`x-session-id`: each sub-agent's
/// conversation its own), so only the model ties them to their parent: with compactd told
/// twice the window, the run has one call refused, not one for each of its three
/// conversations.
#[test]
fn opencode_sub_agents_start_from_the_window_compactd_learned_when_told_too_large_a_one() {
    let model = super::Model {
        told: 64_000,
        ..super::Model::new("mock-model", 32_000, 2)
    };
    super::through_with(Agent::Opencode, model, |task| {
        task.delegate_after = Some(10);
        task.sub_agents = 2;
    });
}
