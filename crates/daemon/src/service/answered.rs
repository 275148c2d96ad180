//! No tool result without its call in the default context: a result whose call is not
//! before it in the context (a late result for a call compacted away, or one a concurrent
//! writer appended after a compaction took its call) is shown as text naming the call, as
//! the provider formats show it. A plugin that maps the context onto a model API one message
//! for one then never sends a result the API would refuse.

use crate::message::{Part, Role};
use crate::protocol::ContextMessage;
use compactd_core::StoredMessage;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::collections::HashSet;

/// Tokens the note around an orphaned result adds (counted in the context's size).
pub(super) const NOTE_TOKENS: usize = 16;

/// Just what is needed of a part to pair calls with results, read without copying outputs.
#[derive(Deserialize)]
struct PartIds<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    id: Option<&'a str>,
    #[serde(borrow)]
    call_id: Option<&'a str>,
    #[serde(flatten)]
    _rest: IgnoredAny,
}

/// Rewrites the orphaned results of `messages` as text; returns how many it rewrote.
pub(super) fn answer_orphans(messages: &mut [ContextMessage]) -> usize {
    let mut calls: HashSet<String> = HashSet::new();
    let mut rewritten = 0;
    for message in messages.iter_mut() {
        let ContextMessage::Stored(stored) = message else {
            continue;
        };
        let raw = stored.parts.get();
        // Most messages hold neither calls nor results: not even read.
        if !raw.contains("\"tool_") {
            continue;
        }
        let Ok(ids) = serde_json::from_str::<Vec<PartIds>>(raw) else {
            continue;
        };
        let orphaned = ids
            .iter()
            .any(|p| p.kind == "tool_result" && p.call_id.is_some_and(|c| !calls.contains(c)));
        calls.extend(
            ids.iter()
                .filter(|p| p.kind == "tool_call")
                .filter_map(|p| p.id.map(str::to_string)),
        );
        if orphaned {
            rewritten += rewrite(stored, &calls);
        }
    }
    rewritten
}

/// Turns the results of `stored` whose call is not in `calls` into text; a tool message left
/// with no result becomes a user message.
fn rewrite(stored: &mut StoredMessage, calls: &HashSet<String>) -> usize {
    let Ok(mut message) = stored.to_message() else {
        return 0;
    };
    let mut rewritten = 0;
    for part in &mut message.parts {
        if let Part::ToolResult {
            call_id,
            name,
            output,
            is_error,
        } = part
            && !calls.contains(call_id.as_str())
        {
            let tool = name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let error = if *is_error { ", an error" } else { "" };
            let text = format!(
                "[result of tool call {call_id}{tool}{error}; the call itself is not in this context (compacted)]\n{output}"
            );
            *part = Part::Text { text };
            rewritten += 1;
        }
    }
    let results_left = message
        .parts
        .iter()
        .any(|p| matches!(p, Part::ToolResult { .. }));
    if stored.role == Role::Tool && !results_left {
        stored.role = Role::User;
    }
    if let Ok(parts) = serde_json::value::to_raw_value(&message.parts) {
        stored.parts = parts;
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(seq: u64, role: Role, parts: serde_json::Value) -> ContextMessage {
        ContextMessage::Stored(StoredMessage {
            seq,
            role,
            parts: serde_json::value::to_raw_value(&parts).unwrap(),
            tokens: 10,
            created_at: String::new(),
            pinned: false,
            masked: false,
            shortened: false,
            branches_from: None,
        })
    }

    #[test]
    fn a_result_without_its_call_becomes_text_naming_the_call() {
        let mut messages = vec![
            // The call of `late` was compacted away; `ok` has its call.
            stored(
                5,
                Role::Tool,
                json!([{"type": "tool_result", "call_id": "late", "name": "bash", "output": "done"}]),
            ),
            stored(
                6,
                Role::Assistant,
                json!([{"type": "tool_call", "id": "ok", "name": "bash", "args": {}}]),
            ),
            stored(
                7,
                Role::Tool,
                json!([{"type": "tool_result", "call_id": "ok", "output": "fine"}]),
            ),
        ];
        assert_eq!(answer_orphans(&mut messages), 1);
        let ContextMessage::Stored(first) = &messages[0] else {
            panic!()
        };
        assert_eq!(first.role, Role::User);
        let parts: serde_json::Value = serde_json::from_str(first.parts.get()).unwrap();
        let text = parts[0]["text"].as_str().unwrap();
        assert!(
            text.contains("late (bash)") && text.ends_with("\ndone"),
            "{text}"
        );
        let ContextMessage::Stored(last) = &messages[2] else {
            panic!()
        };
        assert_eq!(
            last.role,
            Role::Tool,
            "a result with its call is left alone"
        );
        assert!(last.parts.get().contains("tool_result"));
    }
}
