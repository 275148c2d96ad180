//! Section 9, Optional Next Step: what to do next, in this order of evidence:
//! a user request the assistant has not answered yet; the intent the assistant stated last
//! ("Now I need to ...", "Let me ...", "Next, I'll ..."); the first unfinished todo; else carry
//! on with the current request.

use super::Sources;
use super::text::squash;
use crate::compaction::instruction::{instruction_text, is_instruction};
use crate::compaction::truncate::truncate_chars;
use crate::message::{Message, Role};
use regex::Regex;
use std::sync::LazyLock;

/// A sentence that says what the assistant is about to do.
static INTENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^(?:(?:now|next|then|first|ok|okay|great|good|so|finally)[,!.]?\s+)*",
        r"(?:let me|let's|i'll|i will|i need to|i should|i'm going to|i am going to|",
        r"we need to|we should|the next step is|next step:|i must|i want to|time to)\b"
    ))
    .expect("valid regex")
});

pub(super) fn section(sources: &Sources) -> String {
    let messages = &sources.request.messages;
    let last_instruction = messages.iter().rposition(is_instruction);
    let last_assistant = messages.iter().rposition(|m| m.role == Role::Assistant);
    if let Some(u) = last_instruction.filter(|&u| last_assistant.is_none_or(|a| u > a)) {
        return format!(
            "Answer the latest user request: {}",
            truncate_chars(
                &squash(&instruction_text(&messages[u]).unwrap_or_default()),
                400
            )
        );
    }
    if let Some(intent) = stated_intent(&messages[last_instruction.map_or(0, |u| u + 1)..]) {
        return format!("Continue as stated last: {}", truncate_chars(&intent, 400));
    }
    if let Some(todo) = sources.pending_tasks.as_ref().and_then(|todos| {
        let first = todos
            .iter()
            .position(|t| t.status == "in_progress")
            .unwrap_or(0);
        todos.get(first)
    }) {
        return format!(
            "Work on the first unfinished task: {}",
            truncate_chars(&todo.task, 400)
        );
    }
    if let Some(text) = messages.iter().rev().find_map(instruction_text) {
        return format!(
            "Carry on with the current request: {}",
            truncate_chars(&squash(&text), 400)
        );
    }
    sources.prior[8]
        .clone()
        .filter(|p| !p.trim().is_empty() && p.trim() != "(none)")
        .unwrap_or_else(|| "Carry on with the request of section 1.".to_string())
}

/// The newest sentence of intent in the assistant's texts of `messages`.
fn stated_intent(messages: &[Message]) -> Option<String> {
    messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant)
        .map(Message::joined_text)
        .find_map(|text| {
            sentences(&text)
                .into_iter()
                .rev()
                .find(|s| INTENT.is_match(s))
        })
}

/// Sentences of `text`, squashed, without a leading `THOUGHT:` label.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim().trim_start_matches("THOUGHT:").trim();
        let mut start = 0;
        for (i, c) in line.char_indices() {
            if matches!(c, '.' | '!' | '?') && line[i + c.len_utf8()..].starts_with(' ') {
                out.push(line[start..=i].trim().to_string());
                start = i + 1;
            }
        }
        let rest = line[start..].trim();
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_sentence_of_intent_is_found() {
        let messages = vec![Message::text(
            Role::Assistant,
            "THOUGHT: The test fails because the parser drops CR. Now I need to fix parse_line in src/parse.rs. It is small.",
        )];
        assert_eq!(
            stated_intent(&messages).as_deref(),
            Some("Now I need to fix parse_line in src/parse.rs.")
        );
        assert_eq!(
            stated_intent(&[Message::text(Role::Assistant, "Done.")]),
            None
        );
    }
}
