//! A command the model runs in the background, as Claude Code offers it (`Bash` with
//! `run_in_background`): the call is answered at once with the task's id and the file its
//! output goes to; when the command ends, a `<task-notification>` says so (its id, its
//! status, that file): to Claude Opus 5.5 in a system message of its own between two calls,
//! to Claude Sonnet 4.5 inside the result of whatever step the model runs next (Claude Code
//! 2.1.332, seen with both). The output itself is read from the file.
//!
//! Codex leaves a command that outlives its call's yield time running, answers with the
//! process's session, and the model polls it (`write_stdin`) for more output and its end.
//!
//! The mock model plays a build started that way before its first step
//! ([`Task::background_command`]): it runs its steps meanwhile and, once they are done, reads
//! the build's output from the file a notification named, and ends quoting it. A model does
//! not read a file it was not told is finished: with the build's end nowhere in its context
//! (the notification summarized away), it says it waits for it ([`WAITING`]), or, with no
//! trace of the build at all, that it lost it ([`LOST`]).

use super::{Action, Task};

/// The build: its output is known only to whoever reads it.
pub const COMMAND: &str = "echo BUILD-CODE-$((6*7))";
/// The build as Codex runs it: long enough to outlive the call's yield time
/// ([`CODEX_YIELD_MS`]), so Codex leaves it running and answers with its session.
pub const CODEX_COMMAND: &str = "sleep 3; echo BUILD-CODE-$((6*7))";
pub const CODEX_YIELD_MS: u64 = 250;
/// What the build prints.
pub const OUTPUT: &str = "BUILD-CODE-42";
/// What the model says when its steps are done and its context holds the build's start but
/// not its end.
pub const WAITING: &str = "Waiting for the build to finish.";
/// What the model says when its steps are done and its context holds no trace of the build.
pub const LOST: &str = "The build I started is not in my context any more.";

/// The build the model stops ([`Task::stopped_command`]): it would not end by itself within
/// a run.
pub const LONG_COMMAND: &str = "sleep 300; echo BUILD-CODE-$((6*7))";

/// A turn of a conversation that started the build.
pub enum Turn {
    /// Start the build in the background.
    Start,
    /// Read the build's output from this handle (Claude Code: the file; Codex: the session).
    Read(String),
    /// What the task does next otherwise.
    Act(Action),
}

/// What the context tells of the build: where to read its output, and whether it ended.
pub struct Told {
    pub handle: Option<String>,
    pub ended: bool,
}

/// What Claude Code's context tells: the file named by the call's answer or a notification,
/// and the notification's `completed`.
pub fn told_by_claude_code(context: &str) -> Told {
    Told {
        handle: output_file(context),
        ended: context.contains("completed (exit code 0)"),
    }
}

/// What Codex's context tells: the session of the process left running (`exec_command`
/// answers `Process running with session ID N` when the command outlives its yield time), which
/// `write_stdin` polls, waiting for its end.
pub fn told_by_codex(context: &str) -> Told {
    const RUNNING: &str = "Process running with session ID ";
    let handle = context.find(RUNNING).map(|at| {
        context[at + RUNNING.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
    });
    Told {
        handle: handle.filter(|id| !id.is_empty()),
        ended: true,
    }
}

/// The model's turn, given the newest tool output, what the task would do next (`then`) and
/// what the context tells of the build.
pub fn next_turn(task: &Task, newest: Option<&str>, then: Action, told: Told) -> Turn {
    let Some(newest) = newest else {
        return Turn::Start;
    };
    if newest.contains(OUTPUT) {
        return Turn::Act(Action::Finish(format!(
            "All {n} steps done; the last output ended with STEP-{n}-END. The build printed {OUTPUT}.",
            n = task.steps
        )));
    }
    let Action::Finish(_) = then else {
        return Turn::Act(then);
    };
    match told.handle {
        Some(handle) if told.ended => Turn::Read(handle),
        Some(_) => Turn::Act(Action::Text(WAITING.into())),
        None => Turn::Act(Action::Finish(LOST.into())),
    }
}

/// The model's turn when it stops the build it started ([`Task::stopped_command`]): it starts
/// the build, stops it as soon as the answer names its id (`TaskStop`, which Claude Code 2.1.332
/// answers "Successfully stopped task: <id> (<command>)", no notification after it), runs its
/// steps, and ends, unless its context (`context`) names the build's id as started and not
/// as stopped: a model told a build runs does not end without it ([`WAITING`]).
pub fn stopping_turn(newest: Option<&str>, then: Action, context: &str) -> Stopping {
    let Some(newest) = newest else {
        return Stopping::Start;
    };
    if let Some(id) = started_id(newest) {
        return Stopping::Stop(id);
    }
    let Action::Finish(_) = then else {
        return Stopping::Act(then);
    };
    match started_id(context) {
        Some(id) if !context.contains(&format!("stopped task: {id}")) => {
            Stopping::Act(Action::Text(WAITING.into()))
        }
        _ => Stopping::Act(then),
    }
}

/// A turn of a conversation that stops the build it started.
pub enum Stopping {
    /// Start the build in the background.
    Start,
    /// Stop the task of this id (Claude Code's `TaskStop`).
    Stop(String),
    /// What the task does next otherwise.
    Act(Action),
}

/// The id of a task Claude Code says it runs in the background ("Command running in
/// background with ID: <id>."), where `text` says so.
fn started_id(text: &str) -> Option<String> {
    const STARTED: &str = "running in background with ID: ";
    let at = text.find(STARTED)? + STARTED.len();
    let id: String = text[at..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    Some(id).filter(|id| !id.is_empty())
}

/// The file the build's output goes to, as the context names it anywhere (the call's
/// answer, a notification, a summary).
fn output_file(context: &str) -> Option<String> {
    context.match_indices(".output").find_map(|(at, found)| {
        let end = at + found.len();
        let start = context[..end]
            .rfind(|c: char| c.is_whitespace() || matches!(c, '"' | '<' | '>' | '\\'))
            .map_or(0, |before| before + 1);
        let file = &context[start..end];
        (file.starts_with('/') && file.contains("/tasks/")).then(|| file.to_string())
    })
}
