//! Section 5, Problem Solving (the assistant's notes along the way, and what background tasks
//! reported when they ended), and section 8, Current Work (the last action, its outcome, and
//! what the assistant last said).

use super::errors::Outcome;
use super::text::{
    assistant_texts, bullet_blocks, call_line, first_line, keep_last, shorten, squash,
};
use super::{Detail, Sources};
use crate::compaction::notification::{TaskNotification, notifications};
use crate::compaction::truncate::truncate_chars;
use crate::message::{Part, Role};
use std::fmt::Write;

/// Assistant texts shorter than this are acknowledgements, not notes.
const NOTE_MIN_CHARS: usize = 40;
/// How an entry for a background task's end begins.
const NOTIFIED: &str = "- Background task ";

pub(super) fn problem_solving(sources: &Sources, detail: Detail) -> String {
    // A report says more than a note: it is all the conversation keeps of a sub-agent's work.
    let (kept, note_chars, report_chars, prose_chars) = match detail {
        Detail::Full => (10, 300, 1_000, usize::MAX),
        Detail::Reduced => (5, 200, 400, 2_000),
        Detail::Floor => (2, 120, 200, 600),
    };
    let mut entries: Vec<String> = bullet_blocks(sources.prior[4].as_deref())
        .into_iter()
        .map(|e| match e.starts_with(NOTIFIED) {
            true => shorten(&e, report_chars + 300),
            false => shorten(&e, note_chars + 2),
        })
        .collect();
    if let Some(text) = sources.unstructured_prior {
        let text = squash(text);
        entries.insert(
            0,
            format!("- Earlier summary: {}", truncate_chars(&text, prose_chars)),
        );
    }
    for message in &sources.request.messages {
        match message.role {
            Role::Assistant => {
                let text = message.joined_text();
                let text = text.trim();
                if text.chars().count() >= NOTE_MIN_CHARS {
                    entries.push(format!("- {}", shorten(&squash(text), note_chars)));
                }
            }
            // A background task's end, told in a system message or a user message's reminder:
            // its report is the delegated work's only outcome in the conversation.
            Role::System | Role::User => {
                for told in notifications(&message.joined_text()) {
                    entries.push(notified(&told, report_chars));
                }
            }
            Role::Tool => {}
        }
    }
    keep_last(&entries, kept)
}

/// `- Background task a67… completed (Agent "Run the tests" finished): <its report>`.
fn notified(told: &TaskNotification, report_chars: usize) -> String {
    let mut line = format!(
        "{NOTIFIED}{} {}",
        told.task_id.as_deref().unwrap_or("(no id)"),
        told.status.as_deref().unwrap_or("ended")
    );
    if let Some(summary) = &told.summary {
        let _ = write!(line, " ({})", shorten(&squash(summary), 200));
    }
    if let Some(result) = &told.result {
        let _ = write!(line, ": {}", shorten(&squash(result), report_chars));
    }
    line
}

pub(super) fn current_work(sources: &Sources, detail: Detail) -> String {
    let messages = &sources.request.messages;
    let (text_chars, recent_calls) = match detail {
        Detail::Full => (600, 3),
        Detail::Reduced => (300, 1),
        Detail::Floor => (150, 0),
    };
    let mut out = String::new();
    if let Some(line) = last_action(sources) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(text) = assistant_texts(messages).next_back() {
        let _ = writeln!(
            out,
            "Latest assistant message: {}",
            shorten(&squash(&text), text_chars)
        );
    }
    let calls: Vec<String> = messages
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter().rev())
        .filter_map(|p| match p {
            Part::ToolCall { name, args, .. } => Some(format!("- {}", call_line(name, args, 150))),
            _ => None,
        })
        .skip(1)
        .take(recent_calls)
        .collect();
    if !calls.is_empty() {
        let _ = writeln!(out, "Calls before it (newest first):");
        for call in calls {
            let _ = writeln!(out, "{call}");
        }
    }
    if out.is_empty() {
        // Nothing new happened in these messages: what was current still is.
        return sources.prior[7].clone().unwrap_or_default();
    }
    out
}

/// `Last action: bash(cargo test) → failed: error: ...`, from the newest tool call and the
/// result that answered it.
fn last_action(sources: &Sources) -> Option<String> {
    let messages = &sources.request.messages;
    let (index, id, line) = messages.iter().enumerate().rev().find_map(|(i, m)| {
        m.parts.iter().rev().find_map(|p| match p {
            Part::ToolCall { id, name, args } => Some((i, id.as_str(), call_line(name, args, 200))),
            _ => None,
        })
    })?;
    let result = messages[index + 1..]
        .iter()
        .flat_map(|m| &m.parts)
        .find_map(|p| match p {
            Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } if call_id == id => Some((output.as_str(), *is_error)),
            _ => None,
        });
    let outcome = match result {
        None => "no result yet".to_string(),
        Some((output, is_error)) => {
            let outcome = Outcome::of(output, is_error);
            let verdict = match (outcome.failed, outcome.exit) {
                (true, Some(code)) => format!("failed (exit {code})"),
                (true, None) => "failed".to_string(),
                (false, _) => "done".to_string(),
            };
            let shown = first_line(outcome.body);
            if shown.is_empty() {
                verdict
            } else {
                format!("{verdict}: {}", shorten(shown, 200))
            }
        }
    };
    Some(format!("Last action: {line} → {outcome}"))
}
