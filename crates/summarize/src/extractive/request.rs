//! Section 1, Primary Request and Intent: the session's original request and the current one.
//!
//! The original request is the session's task (its first instruction), quoted by its opening:
//! it is whole elsewhere (pinned at the start of the context, or in section 6). The current
//! request is the latest substantive instruction, whole up to 2,000 characters, so a session
//! whose user has moved on says so at the top. The focus of a manual compaction comes last.

use super::Sources;
use crate::compaction::constants::MAX_TEXT_CHARS;
use crate::compaction::instruction::{instruction_text, is_substantive};
use crate::compaction::truncate::truncate_chars;
use std::fmt::Write;

/// Characters of the original request quoted here.
const ORIGINAL_CHARS: usize = 600;
const ORIGINAL: &str = "Original request: ";
const CURRENT: &str = "Current request: ";
const FOCUS: &str = "Focus requested for this compaction: ";

pub(super) fn section(sources: &Sources) -> String {
    let prior = sources.prior[0].as_deref().filter(|p| p.trim() != "(none)");
    let messages = &sources.request.messages;
    let instructions: Vec<String> = messages
        .iter()
        .filter_map(instruction_text)
        .map(|text| text.trim().to_string())
        .collect();
    let original = prior
        .and_then(|p| field(p, ORIGINAL))
        // A prior section 1 in another shape (an older summary) is the original request.
        .or_else(|| {
            prior
                .filter(|p| field(p, CURRENT).is_none())
                .map(|p| p.trim().to_string())
        })
        .or_else(|| {
            let task = sources
                .request
                .task
                .as_ref()
                .map(|t| t.text.trim().to_string());
            task.or_else(|| instructions.first().cloned())
                .map(|t| truncate_chars(&t, ORIGINAL_CHARS).into_owned())
        });
    let current = instructions
        .iter()
        .rev()
        .find(|t| is_substantive(t))
        .map(|t| truncate_chars(t, MAX_TEXT_CHARS).into_owned())
        .or_else(|| prior.and_then(|p| field(p, CURRENT)));
    let mut out = String::new();
    if let Some(original) = &original {
        let _ = writeln!(out, "{ORIGINAL}{original}");
    }
    match &current {
        Some(current) if Some(current) != original.as_ref() => {
            let _ = writeln!(out, "{CURRENT}{current}");
        }
        _ => {}
    }
    if let Some(focus) = sources
        .request
        .focus
        .as_deref()
        .map(str::trim)
        .filter(|f| !f.is_empty())
    {
        let _ = writeln!(out, "{FOCUS}{focus}");
    }
    out
}

/// The text after `label` up to the next label (fields may span lines).
fn field(section: &str, label: &str) -> Option<String> {
    let start = section.find(label)? + label.len();
    let rest = &section[start..];
    let end = [ORIGINAL, CURRENT, FOCUS]
        .iter()
        .filter_map(|l| rest.find(&format!("\n{l}")))
        .min()
        .unwrap_or(rest.len());
    Some(rest[..end].trim().to_string()).filter(|s| !s.is_empty())
}
