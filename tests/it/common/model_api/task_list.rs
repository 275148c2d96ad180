//! A task list kept one task at a time, as Claude Code 2.1 offers it (`TaskCreate`,
//! `TaskUpdate`, `TaskList`; deferred tools, loaded with `ToolSearch`, with
//! `CLAUDE_CODE_ENABLE_TODO_TOOLS=1` in print mode). `TaskCreate` is answered `Task #N created
//! successfully: <subject>`, `TaskUpdate` names the task by that number, `TaskList` answers
//! `#N [status] <subject>` a line.
//!
//! The mock model plays ([`Task::task_list`]): it loads the tools, makes two tasks, runs its
//! steps, marks the first task done after step [`FIRST_DONE_AFTER`], and once its steps are
//! done finishes every task it knows to be pending, then ends. What it knows is what its
//! context says (the answers and calls, a `TaskList`, a summary that lists them): a task
//! forgotten is left pending, and its final answer says which it finished.

use super::{Action, Task};
use serde_json::{Value, json};

/// The tasks the model makes, in order.
pub const SUBJECTS: [&str; 2] = ["Write the parser", "Test the parser"];
/// The step after which the model marks the first task done.
pub const FIRST_DONE_AFTER: usize = 10;
/// How the final answer names the tasks the model finished.
pub const FINISHED: &str = "Tasks finished:";

/// The model's next call: a tool and its input, or the task's own action.
pub enum Turn {
    Call(&'static str, Value),
    Act(Action),
}

/// The turn, given the newest tool output, what the task does next (`then`), and the
/// request's messages.
pub fn next_turn(task: &Task, newest: Option<&str>, then: Action, messages: &[Value]) -> Turn {
    let created = |n: usize| format!("Task #{n} created successfully");
    let updated = |n: usize| format!("Updated task #{n}");
    match newest {
        None => {
            return Turn::Call(
                "ToolSearch",
                json!({"query": "select:TaskCreate,TaskUpdate,TaskList"}),
            );
        }
        // The search's answer is a list of tool references, no text.
        Some("") => return create(0),
        Some(o) if o.starts_with(&created(1)) => return create(1),
        Some(o) if o.starts_with(&created(2)) => {
            return Turn::Act(super::decide(task, None, true));
        }
        Some(o) if o.starts_with(&updated(1)) => {
            let done = format!("STEP-{FIRST_DONE_AFTER}-END");
            return Turn::Act(super::decide(task, Some(&done), true));
        }
        Some(o) if o.starts_with(&updated(2)) => return finish(task, messages),
        _ => {}
    }
    if let Action::Run { step, .. } = &then
        && *step == FIRST_DONE_AFTER + 1
        && status_of(messages, "1").as_deref() != Some("completed")
    {
        return update("1");
    }
    let Action::Finish(_) = then else {
        return Turn::Act(then);
    };
    if let Some(pending) = ["1", "2"].into_iter().find(|n| {
        matches!(
            status_of(messages, n).as_deref(),
            Some("pending" | "in_progress")
        )
    }) {
        return update(pending);
    }
    finish(task, messages)
}

/// The final answer, naming the tasks the context says are done.
fn finish(task: &Task, messages: &[Value]) -> Turn {
    let finished: Vec<String> = ["1", "2"]
        .into_iter()
        .filter(|n| status_of(messages, n).as_deref() == Some("completed"))
        .map(|n| format!("#{n}"))
        .collect();
    Turn::Act(Action::Finish(format!(
        "All {n} steps done; the last output ended with STEP-{n}-END. {FINISHED} {}.",
        finished.join(", "),
        n = task.steps
    )))
}

fn create(index: usize) -> Turn {
    Turn::Call(
        "TaskCreate",
        json!({"subject": SUBJECTS[index], "description": format!("{} for the config file", SUBJECTS[index])}),
    )
}

fn update(n: &str) -> Turn {
    Turn::Call("TaskUpdate", json!({"taskId": n, "status": "completed"}))
}

/// Task `n`'s status as the request tells it, last word first: its creation's answer
/// (pending), `TaskUpdate` calls, and any text listing it as `#n [status]` (TaskList) or
/// `[status] #n` (a summary).
fn status_of(messages: &[Value], n: &str) -> Option<String> {
    let mut status = None;
    for block in messages.iter().flat_map(|m| match &m["content"] {
        Value::Array(blocks) => blocks.clone(),
        text => vec![json!({"type": "text", "text": text})],
    }) {
        if block["type"] == "tool_use" && block["name"] == "TaskUpdate" {
            if block["input"]["taskId"] == n
                && let Some(s) = block["input"]["status"].as_str()
            {
                status = Some(s.to_string());
            }
            continue;
        }
        let text = match block["type"].as_str() {
            Some("tool_result") => super::text_of(&block["content"]),
            _ => block["text"].as_str().unwrap_or_default().to_string(),
        };
        if text.contains(&format!("Task #{n} created successfully")) {
            status = Some("pending".into());
        }
        for line in text.lines() {
            let listed = line.trim().strip_prefix(&format!("#{n} ["));
            let summed = line
                .trim()
                .strip_prefix("- [")
                .and_then(|rest| rest.split_once("] "))
                .filter(|(_, rest)| rest.starts_with(&format!("#{n} ")))
                .map(|(s, _)| s);
            if let Some(s) = listed.and_then(|rest| rest.split_once(']')).map(|(s, _)| s) {
                status = Some(s.to_string());
            } else if let Some(s) = summed {
                status = Some(s.to_string());
            }
        }
    }
    status
}
