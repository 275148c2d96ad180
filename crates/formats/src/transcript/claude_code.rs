//! Claude Code session JSONL: one record per line; an API reply is split over consecutive
//! assistant records sharing `message.id`, which are merged back. Sub-agent (`isSidechain`)
//! records, CLI notes, titles and Claude Code's own compaction summaries are skipped (and
//! counted); `toolUseResult` is ignored in favour of the `tool_result` blocks the model saw.
//!
//! User records that are not instructions are skipped and counted too, so nothing downstream
//! mistakes them for requests: notes the CLI flags `isMeta` (the "Caveat: ..." around local
//! commands), slash-command echoes (`<command-name>`, `<local-command-stdout>`) and
//! "[Request interrupted by user]" markers.

use super::{Draft, content_text};
use crate::compaction::instruction::{UserText, classify_user_text};
use crate::message::{Message, Part, Role};
use serde_json::Value;

pub(super) fn convert(text: &str) -> Result<Draft, super::Malformed> {
    let mut draft = Draft::default();
    let mut reply_id: Option<String> = None;
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            return Err(format!("line {} is not JSON", number + 1).into());
        };
        if draft.session_hint.is_none() {
            draft.session_hint = record["sessionId"].as_str().map(str::to_string);
        }
        let kind = record["type"].as_str().unwrap_or_default();
        if record["isSidechain"] == true {
            draft.skip("sub-agent (isSidechain) records");
            continue;
        }
        match kind {
            "summary" => {
                draft.skip("session titles");
                continue;
            }
            "system" => {
                draft.skip("CLI notes (type system, not sent to the model)");
                continue;
            }
            "user" | "assistant" => {}
            _ => {
                draft.skip("records of unknown type");
                continue;
            }
        }
        if record["isCompactSummary"] == true {
            draft.skip("Claude Code's own compaction summaries (compactd compacts itself)");
            reply_id = None;
            continue;
        }
        let message = &record["message"];
        if kind == "assistant" {
            let id = message["id"].as_str().map(str::to_string);
            let parts = content_parts(&message["content"], &mut draft);
            let continues = id.is_some() && id == reply_id;
            match draft.messages.last_mut() {
                Some(last) if continues && last.role == Role::Assistant => last.parts.extend(parts),
                _ => draft.messages.push(Message {
                    role: Role::Assistant,
                    parts,
                }),
            }
            reply_id = id;
        } else {
            reply_id = None;
            if record["isMeta"] == true {
                draft.skip("CLI notes flagged isMeta");
                continue;
            }
            let parts = content_parts(&message["content"], &mut draft);
            if parts.is_empty() {
                draft.skip("empty user records");
                continue;
            }
            if is_cli_echo(&parts) {
                draft.skip("slash-command echoes and interruption markers");
                continue;
            }
            draft.messages.push(Message {
                role: Role::User,
                parts,
            });
        }
    }
    Ok(draft)
}

/// A user record made only of text the CLI wrote (command echoes, interruption markers).
fn is_cli_echo(parts: &[Part]) -> bool {
    parts.iter().all(|p| match p {
        Part::Text { text } => classify_user_text(text) == UserText::Meta,
        _ => false,
    })
}

/// The parts of a record's content: a string, or blocks. Blocks a role cannot carry (a
/// tool_result from the assistant) are caught by the shared validation and reported there.
pub(super) fn content_parts(content: &Value, draft: &mut Draft) -> Vec<Part> {
    let blocks = match content {
        Value::String(s) => return vec![Part::Text { text: s.clone() }],
        Value::Array(blocks) => blocks,
        _ => return vec![],
    };
    let text = |block: &Value, key: &str| block[key].as_str().unwrap_or_default().to_string();
    let mut parts = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => parts.push(Part::Text {
                text: text(block, "text"),
            }),
            Some("thinking") => parts.push(Part::Reasoning {
                text: text(block, "thinking"),
            }),
            Some("redacted_thinking") => draft.skip("redacted thinking blocks"),
            Some("tool_use") => parts.push(Part::ToolCall {
                id: text(block, "id"),
                name: text(block, "name"),
                args: block["input"].clone(),
            }),
            Some("tool_result") => parts.push(Part::ToolResult {
                call_id: text(block, "tool_use_id"),
                name: None,
                output: content_text(&block["content"], draft).unwrap_or_default(),
                is_error: block["is_error"] == true,
            }),
            Some("image") => {
                draft.skip("images (replaced by a placeholder)");
                parts.push(Part::Text {
                    text: "[image omitted]".into(),
                });
            }
            _ => draft.skip("unknown content blocks"),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reply_split_over_records_is_merged_and_sidechains_are_skipped() {
        let jsonl = [
            r#"{"type":"summary","summary":"title","leafUuid":"x"}"#,
            r#"{"type":"user","sessionId":"s1","message":{"role":"user","content":"fix it"}}"#,
            r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"ok"}]}}"#,
            r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/a"}}]}}"#,
            r#"{"type":"user","isSidechain":true,"message":{"role":"user","content":"sub"}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"data"}],"is_error":false}]},"toolUseResult":{"big":"ignored"}}"#,
            r#"{"type":"assistant","message":{"id":"m2","role":"assistant","content":[{"type":"text","text":"done"}]}}"#,
        ]
        .join("\n");
        let draft = convert(&jsonl).unwrap();
        assert_eq!(draft.session_hint.as_deref(), Some("s1"));
        assert_eq!(draft.messages.len(), 4);
        assert_eq!(draft.messages[1].parts.len(), 2, "merged reply");
        assert!(
            matches!(&draft.messages[2].parts[0], Part::ToolResult { output, .. } if output == "data")
        );
        assert_eq!(draft.skipped["sub-agent (isSidechain) records"], 1);
        assert_eq!(draft.skipped["session titles"], 1);
    }

    #[test]
    fn cli_notes_echoes_and_interruptions_are_not_imported_as_instructions() {
        let jsonl = [
            r#"{"type":"user","isMeta":true,"message":{"role":"user","content":"Caveat: The messages below were generated by the user while running local commands. DO NOT respond."}}"#,
            r#"{"type":"user","message":{"role":"user","content":"<command-name>/exit</command-name>\n<command-message>exit</command-message>"}}"#,
            r#"{"type":"user","message":{"role":"user","content":"<local-command-stdout>(no content)</local-command-stdout>"}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user for tool use]"}]}}"#,
            r#"{"type":"user","message":{"role":"user","content":"Now fix the <command-name> parser"}}"#,
        ]
        .join("\n");
        let draft = convert(&jsonl).unwrap();
        assert_eq!(draft.messages.len(), 1);
        assert_eq!(
            draft.messages[0].joined_text(),
            "Now fix the <command-name> parser"
        );
        assert_eq!(draft.skipped["CLI notes flagged isMeta"], 1);
        assert_eq!(
            draft.skipped["slash-command echoes and interruption markers"],
            3
        );
    }
}
