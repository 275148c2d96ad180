//! Section 5, Problem Solving (the assistant's notes along the way, and the reports of
//! delegated work: [`super::reports`]), and section 8, Current Work (the last action, its
//! outcome, and what the assistant last said).

use super::errors::Outcome;
use super::text::{assistant_texts, bullet_blocks, call_line, first_line, shorten, squash};
use super::{Detail, Sources};
use crate::compaction::truncate::truncate_chars;
use crate::message::{Part, Role};
use std::fmt::Write;

/// Assistant texts shorter than this are acknowledgements, not notes.
const NOTE_MIN_CHARS: usize = 40;

pub(super) fn problem_solving(sources: &Sources, detail: Detail) -> String {
    // A report says more than a note: it is all the conversation keeps of a sub-agent's work.
    let (kept, note_chars, report_chars, prose_chars) = match detail {
        Detail::Full => (10, 300, 1_000, usize::MAX),
        Detail::Reduced => (5, 200, 400, 2_000),
        Detail::Floor => (2, 120, 200, 600),
    };
    let mut entries: Vec<String> = bullet_blocks(sources.prior[4].as_deref())
        .into_iter()
        .map(|e| match super::reports::is_report(&e) {
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
    // Notes and reports in the order they came.
    let messages = &sources.request.messages;
    let mut reports = super::reports::reports(messages, report_chars)
        .into_iter()
        .peekable();
    for (index, message) in messages.iter().enumerate() {
        if message.role == Role::Assistant {
            let text = message.joined_text();
            let text = text.trim();
            if text.chars().count() >= NOTE_MIN_CHARS {
                entries.push(format!("- {}", shorten(&squash(text), note_chars)));
            }
        }
        while let Some((_, report)) = reports.next_if(|(at, _)| *at == index) {
            entries.push(report);
        }
    }
    let entries = super::reports::once_each(entries);
    newest_of_each(&super::reports::without_ended_starts(entries), kept)
}

/// The newest `kept` notes and, beside them, the newest `kept` reports, in their order: a day
/// of notes never pushes out what a sub-agent found.
fn newest_of_each(entries: &[String], kept: usize) -> String {
    let is_report: Vec<bool> = entries
        .iter()
        .map(|e| super::reports::is_report(e))
        .collect();
    let reports_total = is_report.iter().filter(|r| **r).count();
    let notes_total = entries.len() - reports_total;
    let (mut reports_seen, mut notes_seen) = (0, 0);
    let mut out = String::new();
    for (entry, report) in entries.iter().zip(is_report) {
        let (seen, total) = match report {
            true => (&mut reports_seen, reports_total),
            false => (&mut notes_seen, notes_total),
        };
        *seen += 1;
        if total - *seen < kept {
            let _ = writeln!(out, "{entry}");
        }
    }
    out
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
