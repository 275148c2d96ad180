//! Section 5, Problem Solving (the assistant's notes along the way), and section 8, Current
//! Work (the last action, its outcome, and what the assistant last said).

use super::errors::Outcome;
use super::text::{
    assistant_texts, bullet_blocks, call_line, first_line, keep_last, shorten, squash,
};
use super::{Detail, Sources};
use crate::compaction::truncate::truncate_chars;
use crate::message::Part;
use std::fmt::Write;

/// Assistant texts shorter than this are acknowledgements, not notes.
const NOTE_MIN_CHARS: usize = 40;

pub(super) fn problem_solving(sources: &Sources, detail: Detail) -> String {
    let (kept, note_chars, prose_chars) = match detail {
        Detail::Full => (10, 300, usize::MAX),
        Detail::Reduced => (5, 200, 2_000),
        Detail::Floor => (2, 120, 600),
    };
    let mut entries: Vec<String> = bullet_blocks(sources.prior[4].as_deref())
        .into_iter()
        .map(|e| shorten(&e, note_chars + 2))
        .collect();
    if let Some(text) = sources.unstructured_prior {
        let text = squash(text);
        entries.insert(
            0,
            format!("- Earlier summary: {}", truncate_chars(&text, prose_chars)),
        );
    }
    for text in assistant_texts(&sources.request.messages) {
        let text = text.trim();
        if text.chars().count() >= NOTE_MIN_CHARS {
            entries.push(format!("- {}", shorten(&squash(text), note_chars)));
        }
    }
    keep_last(&entries, kept)
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
