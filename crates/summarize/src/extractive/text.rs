//! Small text helpers the sections share.

use crate::compaction::prompt::render_args;
use crate::message::{Message, Part, Role};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

/// The first non-blank line, trimmed.
pub(super) fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// Text on one line: newlines and runs of spaces become single spaces.
pub(super) fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The entries of a prior section: each a `- ` line with the indented lines under it.
pub(super) fn bullet_blocks(section: Option<&str>) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in section.unwrap_or_default().lines() {
        if line.starts_with("- ") {
            blocks.push(line.to_string());
        } else if let Some(block) = blocks.last_mut().filter(|_| line.starts_with("  ")) {
            block.push('\n');
            block.push_str(line);
        }
    }
    blocks
}

/// The last `n` entries, one per line.
pub(super) fn keep_last(entries: &[String], n: usize) -> String {
    let mut out = String::new();
    for entry in &entries[entries.len().saturating_sub(n)..] {
        let _ = writeln!(out, "{entry}");
    }
    out
}

/// The assistant's text parts (reasoning excluded), newest message last.
pub(super) fn assistant_texts(
    messages: &[Message],
) -> impl DoubleEndedIterator<Item = String> + '_ {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(Message::joined_text)
        .filter(|t| !t.trim().is_empty())
}

/// `text` cut to `max_chars` with a plain `…`: for the summary's own lines, where what was
/// cut stays in the stored messages (quotes of user messages say how much was cut instead).
pub(super) fn shorten(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// A tool call as one line: `name(args)`, args squashed and cut to `max_chars`. A shell
/// call shows its command line, not the JSON around it.
pub(super) fn call_line(name: &str, args: &Value, max_chars: usize) -> String {
    let args = match args.get("command").and_then(Value::as_str) {
        Some(command) => squash(command),
        None => squash(&render_args(args)),
    };
    format!("{name}({})", shorten(&args, max_chars))
}

/// Tool calls by id, so a result can be shown with the call it answers.
pub(super) fn calls_by_id(messages: &[Message]) -> HashMap<&str, (&str, &Value)> {
    messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::ToolCall { id, name, args } => Some((id.as_str(), (name.as_str(), args))),
            _ => None,
        })
        .collect()
}
