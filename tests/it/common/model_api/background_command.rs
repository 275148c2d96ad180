//! A command the model runs in the background, as Claude Code offers it (`Bash` with
//! `run_in_background`): the call is answered at once with the task's id and the file its
//! output goes to; when the command ends, a `<task-notification>` says so (its id, its
//! status, that file): to Claude Opus 5.5 in a system message of its own between two calls,
//! to Claude Sonnet 4.5 inside the result of whatever step the model runs next (Claude Code
//! 2.1.332, seen with both). The output itself is read from the file.
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
/// What the build prints.
pub const OUTPUT: &str = "BUILD-CODE-42";
/// What the model says when its steps are done and its context holds the build's start but
/// not its end.
pub const WAITING: &str = "Waiting for the build to finish.";
/// What the model says when its steps are done and its context holds no trace of the build.
pub const LOST: &str = "The build I started is not in my context any more.";

/// A turn of a conversation that started the build.
pub enum Turn {
    /// Start the build in the background.
    Start,
    /// Read the build's output from this file.
    Read(String),
    /// What the task does next otherwise.
    Act(Action),
}

/// The model's turn, given the newest tool output, what the task would do next (`then`) and
/// the whole request as text (`context`).
pub fn next_turn(task: &Task, newest: Option<&str>, then: Action, context: &str) -> Turn {
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
    let ended = context.contains("completed (exit code 0)");
    match output_file(context) {
        Some(file) if ended => Turn::Read(file),
        Some(_) => Turn::Act(Action::Text(WAITING.into())),
        None => Turn::Act(Action::Finish(LOST.into())),
    }
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
