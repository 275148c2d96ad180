//! Section 7, Pending Tasks: the unfinished items of the assistant's task list, carried
//! forward. Two kinds of tools keep one: a todo list written whole each time (Claude Code's
//! TodoWrite, Codex's update_plan, ...: the newest list is the list), and tasks created and
//! updated one at a time (Claude Code 2.1's TaskCreate, answered `Task #N created
//! successfully`, and TaskUpdate by that id, as Claude Code itself rebuilds its list from a
//! transcript; TaskList answers the whole list, which stands for it). Those are summed up
//! from the prior summary's items (which keep their ids) and the calls since; before, a list
//! kept that way was in no summary, and the real Claude Code through compactd never finished
//! a task it had made before a compaction (`tests/it/agents/task_list.rs`).

use super::{Detail, Sources};
use crate::compaction::truncate::truncate_chars;
use crate::message::{Message, Part};
use serde_json::Value;
use std::fmt::Write;

const TODO_TOOLS: &[&str] = &[
    "todowrite",
    "todo_write",
    "write_todos",
    "update_plan",
    "todo",
];
const TASK_CREATE: &str = "taskcreate";
const TASK_UPDATE: &str = "taskupdate";
/// Answered with the whole list, a task a line: `#1 [completed] Write the parser`.
const TASK_LIST: &str = "tasklist";
/// How TaskCreate's answer names the task it made.
const CREATED: (&str, &str) = ("Task #", " created successfully");

/// One unfinished item.
pub(super) struct Todo {
    pub status: String,
    pub task: String,
    /// Its id, for a task made by TaskCreate (later updates name it).
    pub id: Option<String>,
}

/// The unfinished items of the task list as of the end of `messages`, from the prior
/// summary's section 7 (`prior`) and the calls in `messages`; `None` when `messages` hold no
/// call that keeps one (the prior's items stand as they were).
pub(super) fn pending_tasks(prior: Option<&str>, messages: &[Message]) -> Option<Vec<Todo>> {
    let is_task_call = |p: &Part| match p {
        Part::ToolCall { name, .. } => {
            matches!(
                name.to_ascii_lowercase().as_str(),
                TASK_CREATE | TASK_UPDATE | TASK_LIST
            )
        }
        _ => false,
    };
    if messages.iter().flat_map(|m| &m.parts).any(is_task_call) {
        return Some(tasks_made_one_at_a_time(prior, messages));
    }
    latest_todos(messages)
}

/// The task list kept by TaskCreate, TaskUpdate and TaskList: the prior summary's items, then
/// each call in turn (a create counts once its answer names its id, or as it is while unanswered;
/// a failed one not at all).
fn tasks_made_one_at_a_time(prior: Option<&str>, messages: &[Message]) -> Vec<Todo> {
    let mut tasks: Vec<Todo> = prior
        .unwrap_or_default()
        .lines()
        .filter_map(carried)
        .collect();
    let mut creating: Vec<(&str, Todo)> = Vec::new();
    let mut listing: Vec<&str> = Vec::new();
    for part in messages.iter().flat_map(|m| &m.parts) {
        match part {
            Part::ToolCall { id, name, args } => match name.to_ascii_lowercase().as_str() {
                TASK_CREATE => {
                    if let Some(subject) = args.get("subject").and_then(Value::as_str) {
                        let task = todo("pending", subject, None);
                        creating.push((id.as_str(), task));
                    }
                }
                TASK_UPDATE => update(&mut tasks, args),
                TASK_LIST => listing.push(id),
                _ => {}
            },
            Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } => {
                if listing.contains(&call_id.as_str()) && !is_error {
                    tasks = output.lines().filter_map(listed).collect();
                    continue;
                }
                let Some(at) = creating.iter().position(|(id, _)| id == call_id) else {
                    continue;
                };
                let (_, mut task) = creating.remove(at);
                let made = output
                    .trim_start()
                    .strip_prefix(CREATED.0)
                    .and_then(|rest| {
                        let id = rest.split_whitespace().next()?;
                        rest[id.len()..].starts_with(CREATED.1).then_some(id)
                    });
                if let Some(id) = made.filter(|_| !is_error)
                    && !tasks.iter().any(|t| t.id.as_deref() == Some(id))
                {
                    task.id = Some(id.to_string());
                    tasks.push(task);
                }
            }
            _ => {}
        }
    }
    tasks.extend(creating.into_iter().map(|(_, task)| task));
    tasks.retain(|t| !is_done(&t.status));
    tasks
}

/// TaskUpdate: `deleted` takes the task off; otherwise its status and subject change (a task
/// not known, from before what the summaries kept, is taken as it is named).
fn update(tasks: &mut Vec<Todo>, args: &Value) {
    let Some(id) = args.get("taskId").and_then(Value::as_str) else {
        return;
    };
    let status = args.get("status").and_then(Value::as_str);
    let subject = args.get("subject").and_then(Value::as_str);
    if status == Some("deleted") {
        tasks.retain(|t| t.id.as_deref() != Some(id));
        return;
    }
    match tasks.iter_mut().find(|t| t.id.as_deref() == Some(id)) {
        Some(task) => {
            if let Some(status) = status {
                task.status = status.to_string();
            }
            if let Some(subject) = subject {
                task.task = subject.to_string();
            }
        }
        None => tasks.push(todo(
            status.unwrap_or("pending"),
            subject.unwrap_or(id),
            Some(id),
        )),
    }
}

/// A line of TaskList's answer: `#2 [pending] Test the parser`.
fn listed(line: &str) -> Option<Todo> {
    let (id, rest) = line.trim().strip_prefix('#')?.split_once(" [")?;
    let (status, subject) = rest.split_once("] ")?;
    Some(todo(status, subject, Some(id)))
}

/// An item of a prior summary's section 7: `- [status] #id subject` or `- [status] task`.
fn carried(line: &str) -> Option<Todo> {
    let rest = line.strip_prefix("- [")?;
    let (status, rest) = rest.split_once("] ")?;
    let (id, task) = match rest.strip_prefix('#').and_then(|r| r.split_once(' ')) {
        Some((id, task)) => (Some(id), task),
        None => (None, rest),
    };
    Some(todo(status, task, id))
}

fn todo(status: &str, task: &str, id: Option<&str>) -> Todo {
    Todo {
        status: status.to_string(),
        task: task.trim().to_string(),
        id: id.map(str::to_string),
    }
}

fn is_done(status: &str) -> bool {
    matches!(status, "completed" | "done")
}

/// The unfinished items of the newest todo list in `messages`; `None` when they hold none.
fn latest_todos(messages: &[Message]) -> Option<Vec<Todo>> {
    let args = messages
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter().rev())
        .find_map(|p| match p {
            Part::ToolCall { name, args, .. }
                if TODO_TOOLS.contains(&name.to_ascii_lowercase().as_str()) =>
            {
                Some(args)
            }
            _ => None,
        })?;
    let items = args
        .get("todos")
        .or_else(|| args.get("plan"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Some(
        items
            .iter()
            .filter_map(|item| {
                let status = item
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("pending");
                let task = ["content", "step", "task", "title"]
                    .iter()
                    .find_map(|k| item.get(k).and_then(Value::as_str))?;
                (!is_done(status) && !task.trim().is_empty()).then(|| todo(status, task, None))
            })
            .collect(),
    )
}

pub(super) fn section(sources: &Sources, detail: Detail) -> String {
    let Some(todos) = &sources.pending_tasks else {
        return sources.prior[6].clone().unwrap_or_default();
    };
    let shown = match detail {
        Detail::Full => usize::MAX,
        Detail::Reduced => 10,
        Detail::Floor => 5,
    };
    let mut out = String::new();
    for todo in todos.iter().take(shown) {
        let id = todo
            .id
            .as_ref()
            .map(|id| format!("#{id} "))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "- [{}] {id}{}",
            todo.status,
            truncate_chars(&todo.task, 300)
        );
    }
    if todos.len() > shown {
        let _ = writeln!(out, "- … and {} more", todos.len() - shown);
    }
    out
}
