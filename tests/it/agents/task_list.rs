//! Claude Code 2.1 keeps the model's task list one task at a time (TaskCreate, TaskUpdate,
//! TaskList), as it does interactively. The model's context must still say which tasks are
//! pending after compactd has summarized the calls that made them.

use super::harness::Agent;
use super::{Model, direct_with, through_with};
use crate::common::model_api::{Seen, Task};

/// The model makes two tasks before its first step, marks the first done after step 10, and
/// once its 20 steps are done finishes the tasks its context says are pending. Through
/// compactd at a window that compacts the conversation after the second task was made, the
/// summary's section 7 keeps it pending (before, it was in no summary: the model ended with
/// the task never finished).
#[test]
fn claude_code_finishes_the_tasks_it_made_one_at_a_time_through_compactd() {
    let seen = through_with(
        Agent::ClaudeCode,
        Model::new("claude-opus-5-5", 48_000, 2),
        |task| task.task_list = true,
    );
    assert_both_finished(&seen);
}

/// The same with Claude Code straight at the model API.
#[test]
fn claude_code_finishes_the_tasks_it_made_one_at_a_time_directly() {
    let task = Task {
        task_list: true,
        ..Task::default()
    };
    assert_both_finished(&direct_with(Agent::ClaudeCode, "claude-opus-5-5", task));
}

/// The model marked both tasks done: Claude Code answered an update of each (as the model
/// API saw it in some request: the first's may since have been summarized).
fn assert_both_finished(seen: &[Seen]) {
    if seen.is_empty() {
        return; // Claude Code is not installed.
    }
    for n in [1, 2] {
        let updated = format!("Updated task #{n} status");
        assert!(
            seen.iter()
                .any(|s| s.body["messages"].to_string().contains(&updated)),
            "task #{n} was never finished"
        );
    }
}
