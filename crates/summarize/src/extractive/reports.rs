//! Reports of delegated work, for section 5: what a sub-agent reported when it ended (the
//! result of Claude Code's `Agent` call, opencode's `task`, Codex's `wait_agent`), what a
//! background task's notification said ([`crate::compaction::notification`]), and, until
//! that notification comes (or a poll sees the process end), that the task was started and
//! where its output goes (Claude Code: a file; Codex: the session to poll). A task the model
//! stopped (Claude Code's `TaskStop`) is told ended by the stop's answer: no notification
//! comes after it.
//!
//! A report is all the conversation keeps of a sub-agent's work (its own steps are in its own
//! session), so it is kept where the assistant's notes are, longer than a note and carried
//! from summary to summary. Before, a report that was not the last action at compaction time
//! was summarized away without a trace: the real Claude Code and opencode, handing steps to a
//! sub-agent through compactd, went on to their last step without the report they had been
//! given (`tests/it/agents`). A shell command run in the background is told ended without
//! its output, which is in a file: the file is kept, or the model cannot read it (Claude Code
//! ended saying it lost its build); Codex's running process is read through its session,
//! kept likewise.

use super::text::{calls_by_id, shorten, squash};
use crate::compaction::notification::{
    TaskNotification, appended_to_result, notifications, waited_for,
};
use crate::compaction::tags;
use crate::message::{Message, Part, Role};
use serde_json::Value;
use std::fmt::Write;

/// How the entries of reports begin: a prior summary's are told from notes by it.
const PREFIXES: [&str; 2] = ["- Background task ", "- Sub-agent report"];
/// How the entry of a background task that was started begins (its end has its id there).
const STARTED: &str = "- Background task started";

/// Tools whose result is a sub-agent's report (matched on the name's last segment, case
/// aside: Codex namespaces its tools).
const DELEGATION_TOOLS: &[&str] = &["agent", "task", "wait_agent"];

/// How Claude Code answers an `Agent` call run in the background (whether the call asked for
/// it or not: its agents run in the background by default): not a report (that comes in a
/// notification).
const LAUNCHED: &str = "Async agent launched";
/// How Codex answers a command that outlived its call's wait (`exec_command`): the process
/// goes on, and the model reads more of it and its end with `write_stdin` on that session.
const RUNNING: &str = "Process running with session ID ";
/// How Codex tells, in a later `write_stdin`, that such a process ended.
const EXITED: &str = "Process exited with code ";
/// Tools that stop a background task (Claude Code's `TaskStop`; `KillShell` and `KillBash`
/// before it), matched as [`DELEGATION_TOOLS`] are.
const STOP_TOOLS: &[&str] = &["taskstop", "killshell", "killbash"];

/// Whether a prior summary's entry is a report.
pub(super) fn is_report(entry: &str) -> bool {
    PREFIXES.iter().any(|p| entry.starts_with(p))
}

/// The reports in `messages`, in order, each at most about `max_chars` of its text.
pub(super) fn reports(messages: &[Message], max_chars: usize) -> Vec<(usize, String)> {
    let calls = calls_by_id(messages);
    let mut found = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if matches!(message.role, Role::System | Role::User) {
            for told in notifications(&message.joined_text()) {
                found.push((index, notified(&told, max_chars)));
            }
        }
        for part in &message.parts {
            let Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } = part
            else {
                continue;
            };
            // A notification that came inside the result of an unrelated call.
            for told in appended_to_result(output) {
                found.push((index, notified(&told, max_chars)));
            }
            let Some((name, args)) = calls.get(call_id.as_str()) else {
                continue;
            };
            if let Some(ended) = process_ended(args, output) {
                found.push((index, ended));
            } else if is_one_of(name, STOP_TOOLS) {
                found.extend(
                    (!is_error)
                        .then(|| stopped(args, output))
                        .flatten()
                        .map(|e| (index, e)),
                );
            } else if left_running(args, output) {
                found.push((index, started(args, output)));
            } else if let Some(waited) = waited_for(output).filter(|_| is_delegation(name)) {
                // Codex's `wait_agent`: each sub-agent's end as its notification tells it.
                for told in waited {
                    found.push((index, notified(&told, max_chars)));
                }
            } else if is_delegation(name) {
                found.push((index, reported(args, output, max_chars)));
            }
        }
    }
    found
}

/// `entries` with each report once, where it was first told: Codex tells a sub-agent's end
/// twice in the same words (its `wait_agent` answer and its notification), and the two may
/// be compacted apart (one in the prior summary). Notes stay as they are.
pub(super) fn once_each(mut entries: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    entries.retain(|e| !is_report(e) || seen.insert(e.clone()));
    entries
}

/// `entries` without the start of a background task whose end is among them (the end names
/// the task's id, a word of the start's answer).
pub(super) fn without_ended_starts(mut entries: Vec<String>) -> Vec<String> {
    let ended: Vec<String> = entries
        .iter()
        .filter(|e| !e.starts_with(STARTED))
        .filter_map(|e| e.strip_prefix(PREFIXES[0])?.split_whitespace().next())
        .filter(|id| !id.starts_with('('))
        .map(str::to_string)
        .collect();
    let names_an_ended = |entry: &str| {
        entry
            .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .any(|word| ended.iter().any(|id| id == word))
    };
    entries.retain(|e| !(e.starts_with(STARTED) && names_an_ended(e)));
    entries
}

fn is_delegation(name: &str) -> bool {
    is_one_of(name, DELEGATION_TOOLS)
}

/// Whether a tool's name is one of `tools` (lowercase), by its last segment, case aside.
fn is_one_of(name: &str, tools: &[&str]) -> bool {
    let last = name.rsplit(['.', '/']).next().unwrap_or(name);
    tools.contains(&last.to_ascii_lowercase().as_str())
}

/// `- Background task b7x stopped: Successfully stopped task: b7x (make)`, for a stop of the
/// task of that id (the call's `task_id`, or `shell_id` as it was), in the answer's own words
/// (its `message` when it is JSON, as Claude Code 2.1 answers).
fn stopped(args: &Value, output: &str) -> Option<String> {
    let id = ["task_id", "shell_id"]
        .iter()
        .find_map(|key| args.get(key)?.as_str())
        .filter(|id| !id.trim().is_empty())?;
    let answer: Option<Value> = serde_json::from_str(output.trim()).ok();
    let said = answer
        .as_ref()
        .and_then(|a| a.get("message")?.as_str())
        .unwrap_or(output);
    Some(format!(
        "{}{} stopped: {}",
        PREFIXES[0],
        shorten(&squash(id), 100),
        shorten(&squash(said), 300)
    ))
}

/// `- Sub-agent report (Run the tests): <the report>`.
fn reported(args: &Value, output: &str, max_chars: usize) -> String {
    let mut line = PREFIXES[1].to_string();
    if let Some(description) = args.get("description").and_then(Value::as_str) {
        let _ = write!(line, " ({})", shorten(&squash(description), 200));
    }
    let _ = write!(line, ": {}", shorten(&squash(output), max_chars));
    line
}

/// Whether a call's answer says the task it started goes on in the background: asked so
/// (Claude Code's `run_in_background`), an agent launched (Claude Code runs them so by
/// default), or a process left running (Codex; a poll of it says so again, and is not a start).
fn left_running(args: &Value, output: &str) -> bool {
    args.get("run_in_background") == Some(&Value::Bool(true))
        || output.trim_start().starts_with(LAUNCHED)
        || (output.contains(RUNNING) && args.get("session_id").is_none())
}

/// `- Background task 10691 exited with code 0`, for a poll of a process left running
/// (Codex's `write_stdin` on its session) that saw it end.
fn process_ended(args: &Value, output: &str) -> Option<String> {
    let session = args.get("session_id")?;
    let code: String = output
        .split(EXITED)
        .nth(1)?
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    Some(format!("{}{session} exited with code {code}", PREFIXES[0]))
}

/// `- Background task started (Build): Command running in background with ID: b7…. Output
/// is being written to: /tmp/…/b7….output. …`: what the call was answered, which names the
/// task and its output file in the CLI's own words.
fn started(args: &Value, output: &str) -> String {
    let mut line = STARTED.to_string();
    let named = ["description", "cmd", "command"]
        .iter()
        .find_map(|key| args.get(key)?.as_str());
    if let Some(named) = named {
        let _ = write!(line, " ({})", shorten(&squash(named), 200));
    }
    let answer = tags::without(output, "system-reminder");
    let _ = write!(line, ": {}", shorten(&squash(&answer), 400));
    line
}

/// `- Background task a67… completed (Agent "Run the tests" finished), output in
/// /tmp/…/a67….output: <its report>`.
fn notified(told: &TaskNotification, max_chars: usize) -> String {
    let mut line = format!(
        "{}{} {}",
        PREFIXES[0],
        told.task_id.as_deref().unwrap_or("(no id)"),
        told.status.as_deref().unwrap_or("ended")
    );
    if let Some(summary) = &told.summary {
        let _ = write!(line, " ({})", shorten(&squash(summary), 200));
    }
    if let Some(file) = &told.output_file {
        let _ = write!(line, ", output in {}", shorten(&squash(file), 300));
    }
    if let Some(result) = &told.result {
        let _ = write!(line, ": {}", shorten(&squash(result), max_chars));
    }
    line
}
