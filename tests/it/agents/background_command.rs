//! Work an agent leaves running in the background, whose output it reads later: Claude
//! Code's `Bash` with `run_in_background` (the output in a file a notification names), Codex's
//! command that outlives its call's wait (a session it polls). Through compactd the summary
//! must keep where the output is until the agent has read it.

use super::harness::Agent;
use super::{Model, direct_with, through_with};
use crate::common::model_api::{Seen, Task, background_command};

/// Claude Code runs a build in the background (`Bash` with `run_in_background`) before its
/// first step: the call is answered at once with the file the output goes to, and the end
/// is told later in a `<task-notification>`. The model goes on with its steps and, once they
/// are done, reads the build's output from the file it was told of (it ends quoting the
/// output only if it read it). Through compactd at a window that compacts the main
/// conversation many times after the notification came, the summary keeps the build's end
/// and its file (before, the model ended saying it lost the build). With Claude Opus 5.5,
/// Claude Code tells the end in a system message of its own.
#[test]
fn claude_code_reads_the_output_of_a_build_run_in_the_background_through_compactd() {
    through_build(Model::new("claude-opus-5-5", 48_000, 2), "system");
}

/// The same with Claude Sonnet 4.5, to which Claude Code tells the build's end inside the
/// result of the step that runs next (a larger window: Claude Code's preamble for it is).
#[test]
fn claude_code_reads_the_output_of_a_build_told_in_a_steps_result_through_compactd() {
    through_build(Model::new("claude-sonnet-4-5", 80_000, 2), "tool_result");
}

/// Both with Claude Code straight at the model API.
#[test]
fn claude_code_reads_the_output_of_a_build_run_in_the_background_directly() {
    for (model, told_in) in [
        ("claude-opus-5-5", "system"),
        ("claude-sonnet-4-5", "tool_result"),
    ] {
        let task = Task {
            background_command: true,
            ..Task::default()
        };
        let seen = direct_with(Agent::ClaudeCode, model, task);
        assert_build_told_and_read(&seen, told_in);
    }
}

fn through_build(model: Model, told_in: &str) {
    let seen = through_with(Agent::ClaudeCode, model, |task| {
        task.background_command = true
    });
    assert_build_told_and_read(&seen, told_in);
}

/// What the model API saw of the build: its end told in a message of role `system` or in a
/// `tool_result` block as `told_in` says (so the run tried what it means to), then its output
/// read.
fn assert_build_told_and_read(seen: &[Seen], told_in: &str) {
    if seen.is_empty() {
        return; // Claude Code is not installed.
    }
    let told = seen.iter().position(|s| {
        s.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| {
                let blocks = m["content"].as_array().cloned().unwrap_or_default();
                let told = |v: &serde_json::Value| v.to_string().contains("<task-notification>");
                match told_in {
                    "system" => m["role"] == "system" && told(&m["content"]),
                    _ => blocks.iter().any(|b| b["type"] == told_in && told(b)),
                }
            })
    });
    let Some(told) = told else {
        panic!("the build's end was never told in a {told_in}");
    };
    let read = seen.iter().rposition(|s| {
        s.body["messages"]
            .to_string()
            .contains(background_command::OUTPUT)
    });
    assert!(
        read.is_some_and(|r| r > told),
        "the build's output was read after its end was told (told in request {told}, read in {read:?})"
    );
}

/// Codex runs a build that outlives its call's yield time: Codex leaves it running and
/// answers with its session, which the model polls (`write_stdin`) once its 20 steps are
/// done, ending with the build's output. Through compactd at a window that compacts the
/// thread many times after the build started, the summary keeps the running process's
/// session.
#[test]
fn codex_polls_a_build_left_running_through_compactd() {
    let seen = through_with(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2), |task| {
        task.background_command = true
    });
    assert_build_polled(&seen);
}

/// The same with Codex straight at the model API.
#[test]
fn codex_polls_a_build_left_running_directly() {
    let task = Task {
        background_command: true,
        ..Task::default()
    };
    assert_build_polled(&direct_with(Agent::Codex, "gpt-5-codex", task));
}

/// What the model API saw: the build left running (its session in a call's output), then its
/// output read.
fn assert_build_polled(seen: &[Seen]) {
    if seen.is_empty() {
        return; // Codex is not installed.
    }
    let running = seen.iter().position(|s| {
        s.body["input"]
            .to_string()
            .contains("Process running with session ID")
    });
    let read = seen.iter().rposition(|s| {
        s.body["input"]
            .to_string()
            .contains(background_command::OUTPUT)
    });
    assert!(
        running.is_some_and(|r| read.is_some_and(|read| read > r)),
        "the build was left running (request {running:?}), then its output read (request {read:?})"
    );
}

/// Claude Code stops a build it started in the background (`TaskStop`, answered "Successfully
/// stopped task: <id>"; no notification comes after it) and goes on with its steps; a model
/// whose context still says the build runs waits for it rather than end. Through compactd at a
/// window that compacts the conversation many times after the stop, the summary says the
/// build was stopped (before, it kept saying the build was started, the stop summarized
/// away, and the model ended its run waiting for a build that no longer ran).
#[test]
fn claude_code_knows_a_build_it_stopped_is_over_through_compactd() {
    let seen = through_with(
        Agent::ClaudeCode,
        Model::new("claude-opus-5-5", 48_000, 2),
        |task| task.stopped_command = true,
    );
    assert_build_stopped(&seen);
}

/// The same with Claude Code straight at the model API.
#[test]
fn claude_code_knows_a_build_it_stopped_is_over_directly() {
    let task = Task {
        stopped_command: true,
        ..Task::default()
    };
    let seen = direct_with(Agent::ClaudeCode, "claude-opus-5-5", task);
    assert_build_stopped(&seen);
}

/// The model API saw the stop answered as Claude Code answers it (so the run tried what it
/// means to).
fn assert_build_stopped(seen: &[Seen]) {
    if seen.is_empty() {
        return; // Claude Code is not installed.
    }
    assert!(
        seen.iter().any(|s| s.body["messages"]
            .to_string()
            .contains("Successfully stopped task: ")),
        "the build was never stopped"
    );
}
