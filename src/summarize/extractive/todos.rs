//! Section 7, Pending Tasks: the unfinished items of the latest todo list the assistant wrote
//! (Claude Code's TodoWrite, Codex's update_plan, ...), carried forward until a newer one.

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

/// One unfinished item.
pub(super) struct Todo {
    pub status: String,
    pub task: String,
}

/// The unfinished items of the newest todo list in `messages`; `None` when they hold none.
pub(super) fn latest_todos(messages: &[Message]) -> Option<Vec<Todo>> {
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
                (!matches!(status, "completed" | "done") && !task.trim().is_empty()).then(|| Todo {
                    status: status.to_string(),
                    task: task.trim().to_string(),
                })
            })
            .collect(),
    )
}

pub(super) fn section(sources: &Sources, detail: Detail) -> String {
    let Some(todos) = latest_todos(&sources.request.messages) else {
        return sources.prior[6].clone().unwrap_or_default();
    };
    let shown = match detail {
        Detail::Full => usize::MAX,
        Detail::Reduced => 10,
        Detail::Floor => 5,
    };
    let mut out = String::new();
    for todo in todos.iter().take(shown) {
        let _ = writeln!(
            out,
            "- [{}] {}",
            todo.status,
            truncate_chars(&todo.task, 300)
        );
    }
    if todos.len() > shown {
        let _ = writeln!(out, "- … and {} more", todos.len() - shown);
    }
    out
}
