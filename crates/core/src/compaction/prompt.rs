//! buildCompactionPrompt (SPEC.md 5.4): the prompt a summarizer receives, in the spec's layout.
//!
//! ```text
//! <task> 9-section template </task>
//! <focus> optional instructions of a manual compaction </focus>
//! <conversation>
//! <prior-summary> previous summary, if any </prior-summary>
//! <user> / <assistant> / <tool> / <system> blocks, one per message
//! </conversation>
//! <read-files> ... </read-files>
//! <modified-files> ... </modified-files>
//! ```
//! Inside a block: text as is, `[tool_call: name(args)]`, `[tool_result: name = output]`,
//! `[reasoning: text]`, each cut to the spec's limits by [`truncate_chars`].

use super::constants::*;
use super::files::FileLists;
use super::mask::Masking;
use super::sections::{SUMMARY_SECTIONS, heading};
use super::truncate::truncate_chars;
use crate::message::{Message, Part};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write;

const TASK_TEMPLATE: &str = include_str!("prompt_task.md");

/// Everything the prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct PromptInput<'a> {
    /// The messages being compacted (those before the preserve boundary).
    pub messages: &'a [Message],
    pub masking: Masking,
    pub prior_summary: Option<&'a str>,
    pub files: &'a FileLists,
    /// Instructions of a manual compaction ("focus on the API design").
    pub focus: Option<&'a str>,
}

/// The `<task>` block's text: the template with the nine section headings filled in.
pub fn task_text() -> String {
    let sections: Vec<String> = SUMMARY_SECTIONS
        .iter()
        .map(|s| format!("{}\n{}", heading(s), s.asks_for))
        .collect();
    TASK_TEMPLATE
        .trim_end()
        .replace("{sections}", &sections.join("\n\n"))
}

/// Builds the compaction prompt.
pub fn build_compaction_prompt(input: &PromptInput) -> String {
    let mut out = String::with_capacity(4096 + input.messages.len() * 512);
    let _ = writeln!(out, "<task>\n{}\n</task>\n", task_text());
    if let Some(focus) = input.focus.map(str::trim).filter(|f| !f.is_empty()) {
        let _ = writeln!(
            out,
            "<focus>\n{}\n</focus>\n",
            truncate_chars(focus, MAX_TEXT_CHARS)
        );
    }
    out.push_str("<conversation>\n");
    if let Some(prior) = input.prior_summary.map(str::trim).filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "<prior-summary>\n{prior}\n</prior-summary>\n");
    }
    write_messages(&mut out, input.messages, input.masking);
    out.push_str("</conversation>\n\n");
    write_file_block(&mut out, "read-files", &input.files.read);
    out.push('\n');
    // The spec's modified files: those changed and those the session created.
    write_file_block(&mut out, "modified-files", input.files.changed());
    if !input.files.deleted.is_empty() {
        out.push('\n');
        write_file_block(&mut out, "deleted-files", &input.files.deleted);
    }
    out
}

/// The conversation blocks alone: one `<role>` block per message.
pub fn write_messages(out: &mut String, messages: &[Message], masking: Masking) {
    let names = call_names(messages);
    for (index, message) in messages.iter().enumerate() {
        write_message(out, message, index, masking, &names);
    }
}

/// Tool names by call id, so a result that does not name its tool is shown with its call's name.
pub fn call_names(messages: &[Message]) -> HashMap<&str, &str> {
    messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::ToolCall { id, name, .. } => Some((id.as_str(), name.as_str())),
            _ => None,
        })
        .collect()
}

/// One message's block; `index` is its position in the list `masking` was computed over.
pub fn write_message(
    out: &mut String,
    message: &Message,
    index: usize,
    masking: Masking,
    call_names: &HashMap<&str, &str>,
) {
    let tag = message.role.as_str();
    let _ = writeln!(out, "<{tag}>");
    for (pi, part) in message.parts.iter().enumerate() {
        match part {
            Part::Text { text } => {
                if !text.trim().is_empty() {
                    let _ = writeln!(out, "{}", truncate_chars(text, MAX_TEXT_CHARS));
                }
            }
            Part::Reasoning { text } => {
                let _ = writeln!(out, "[reasoning: {}]", truncate_chars(text, MAX_TEXT_CHARS));
            }
            Part::ToolCall { name, args, .. } => {
                let _ = writeln!(
                    out,
                    "[tool_call: {name}({})]",
                    truncate_chars(&render_args(args), MAX_TOOL_ARGS_CHARS)
                );
            }
            Part::ToolResult {
                call_id,
                name,
                output,
                is_error,
            } => {
                let name = name
                    .as_deref()
                    .or_else(|| call_names.get(call_id.as_str()).copied())
                    .unwrap_or(call_id);
                let error = if *is_error { " (error)" } else { "" };
                let output = if masking.is_masked(index, pi) {
                    MASKED_OUTPUT.into()
                } else {
                    truncate_chars(output, MAX_TOOL_OUTPUT_CHARS)
                };
                let _ = writeln!(out, "[tool_result: {name}{error} = {output}]");
            }
        }
    }
    let _ = writeln!(out, "</{tag}>");
}

/// Tool arguments as text: a string as it is (clients that forward OpenAI's `arguments`
/// string send JSON text), no arguments as nothing, anything else as compact JSON. The
/// estimator counts arguments the same way.
pub fn render_args(args: &Value) -> Cow<'_, str> {
    match args {
        Value::String(s) => Cow::Borrowed(s),
        Value::Null => Cow::Borrowed(""),
        other => Cow::Owned(other.to_string()),
    }
}

fn write_file_block<'a>(out: &mut String, tag: &str, paths: impl IntoIterator<Item = &'a String>) {
    let _ = writeln!(out, "<{tag}>");
    for path in paths {
        let _ = writeln!(out, "{path}");
    }
    let _ = writeln!(out, "</{tag}>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use serde_json::json;

    #[test]
    fn golden_prompt() {
        let messages = vec![
            Message::text(Role::User, "Fix the parser in src/parse.go"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        text: "Look first.".into(),
                    },
                    Part::Text {
                        text: "Reading it.".into(),
                    },
                    Part::ToolCall {
                        id: "c1".into(),
                        name: "read".into(),
                        args: json!({"file_path": "src/parse.go"}),
                    },
                ],
            },
            Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: "c1".into(),
                    name: None,
                    output: "package parse".into(),
                    is_error: false,
                }],
            },
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall {
                    id: "c2".into(),
                    name: "bash".into(),
                    args: json!({"command": "go test ./..."}),
                }],
            },
            Message {
                role: Role::User,
                parts: vec![Part::ToolResult {
                    call_id: "c2".into(),
                    name: Some("bash".into()),
                    output: "FAIL".into(),
                    is_error: true,
                }],
            },
        ];
        let files = FileLists {
            read: vec!["src/parse.go".into()],
            ..Default::default()
        };
        let prompt = build_compaction_prompt(&PromptInput {
            messages: &messages,
            masking: Masking::keep_recent(&messages, 1),
            prior_summary: Some("## 1. Primary Request and Intent\nEarlier."),
            files: &files,
            focus: Some("the parser"),
        });
        let expected = format!(
            "<task>\n{task}\n</task>\n\n\
             <focus>\nthe parser\n</focus>\n\n\
             <conversation>\n\
             <prior-summary>\n## 1. Primary Request and Intent\nEarlier.\n</prior-summary>\n\n\
             <user>\nFix the parser in src/parse.go\n</user>\n\
             <assistant>\n[reasoning: Look first.]\nReading it.\n[tool_call: read({{\"file_path\":\"src/parse.go\"}})]\n</assistant>\n\
             <tool>\n[tool_result: read = [output masked for compaction]]\n</tool>\n\
             <assistant>\n[tool_call: bash({{\"command\":\"go test ./...\"}})]\n</assistant>\n\
             <user>\n[tool_result: bash (error) = FAIL]\n</user>\n\
             </conversation>\n\n\
             <read-files>\nsrc/parse.go\n</read-files>\n\n\
             <modified-files>\n</modified-files>\n",
            task = task_text()
        );
        assert_eq!(prompt, expected);
    }

    #[test]
    fn the_task_asks_for_all_nine_sections_in_order() {
        let task = task_text();
        let mut last = 0;
        for s in &SUMMARY_SECTIONS {
            let at = task.find(&heading(s)).expect("section heading in task");
            assert!(at > last || s.number == 1);
            last = at;
        }
        assert!(!task.contains("{sections}"));
    }

    #[test]
    fn parts_are_cut_to_their_limits() {
        let long = "é".repeat(3000);
        let messages = vec![
            Message::text(Role::User, long.clone()),
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall {
                    id: "c".into(),
                    name: "write".into(),
                    args: json!({"content": long.clone()}),
                }],
            },
            Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: "c".into(),
                    name: None,
                    output: long.clone(),
                    is_error: false,
                }],
            },
        ];
        let prompt = build_compaction_prompt(&PromptInput {
            messages: &messages,
            masking: Masking::none(),
            prior_summary: None,
            files: &FileLists::default(),
            focus: None,
        });
        assert!(prompt.contains(&format!("{}…[truncated 1000 chars]", "é".repeat(2000))));
        // args: `{"content":"` is 12 chars, so 488 é fit in 500
        assert!(prompt.contains(&format!("{}…[truncated", "é".repeat(488))));
        assert!(!prompt.contains(&"é".repeat(2001)));
        assert!(!prompt.contains("<prior-summary>"));
        assert!(!prompt.contains("<focus>"));
    }
}
