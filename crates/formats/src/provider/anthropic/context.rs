//! The Anthropic Messages API's `{"system", "messages"}`: system text lifted out, roles
//! alternating from a user message, `tool_use` blocks in the assistant message and the
//! `tool_result` blocks answering them first in the next user message, consecutive
//! same-role messages merged, no empty text blocks.

use crate::message::Message;
use crate::provider::{Turn, Turns, api_id, api_name};
use serde::Serialize;
use serde_json::{Value, json};

/// A request body's conversation: `system` (absent without system text) and `messages`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conversation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<Value>,
}

/// What opens a conversation that would otherwise start with the assistant (the API wants a
/// user message first).
pub const CONTINUES: &str = "[the conversation continues]";

/// A tool result with no output (the API wants content).
const NO_OUTPUT: &str = "(no output)";

/// `conversation` ready for `POST /v1/messages`.
pub fn conversation(messages: &[Message]) -> Conversation {
    let mut system = Vec::new();
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for turn in Turns::of(messages).0 {
        match turn {
            Turn::System(text) => system.push(text),
            Turn::User(text) => push(&mut out, "user", vec![text_block(text)]),
            Turn::Assistant {
                text,
                calls,
                results,
            } => {
                let mut blocks = Vec::with_capacity(1 + calls.len());
                if !text.trim().is_empty() {
                    blocks.push(text_block(text));
                }
                blocks.extend(calls.iter().map(|c| {
                    json!({"type": "tool_use", "id": api_id(&c.id), "name": api_name(&c.name), "input": input(&c.args)})
                }));
                push(&mut out, "assistant", blocks);
                if !results.is_empty() {
                    let blocks = results
                        .into_iter()
                        .map(|r| {
                            let mut block = json!({
                                "type": "tool_result",
                                "tool_use_id": api_id(&r.call_id),
                                "content": if r.output.is_empty() { NO_OUTPUT.to_string() } else { r.output },
                            });
                            if r.is_error {
                                block["is_error"] = Value::Bool(true);
                            }
                            block
                        })
                        .collect();
                    push(&mut out, "user", blocks);
                }
            }
        }
    }
    if out.first().is_some_and(|(role, _)| *role == "assistant") {
        out.insert(0, ("user", vec![text_block(CONTINUES.into())]));
    }
    // A final assistant message is a prefill, which may not end in whitespace.
    if let Some(("assistant", blocks)) = out.last_mut()
        && let Some(Value::String(text)) = blocks.last_mut().and_then(|b| b.get_mut("text"))
    {
        let trimmed = text.trim_end().len();
        text.truncate(trimmed);
    }
    Conversation {
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages: out
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect(),
    }
}

/// Appends `blocks` as a `role` message, merged into the previous message if it has the same
/// role. Merging never puts text before a tool result: results only ever open a user message
/// (they follow the assistant message that called).
fn push(out: &mut Vec<(&'static str, Vec<Value>)>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((last, content)) if *last == role => content.extend(blocks),
        _ => out.push((role, blocks)),
    }
}

fn text_block(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// A call's arguments as the object `input` must be: a JSON string is parsed, anything else
/// that is not an object is wrapped.
pub(super) fn input(args: &Value) -> Value {
    match args {
        Value::Object(_) => args.clone(),
        Value::Null => json!({}),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(parsed @ Value::Object(_)) => parsed,
            _ => json!({"input": s}),
        },
        other => json!({"input": other}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Part, Role};
    use crate::provider::fixtures::{call, result};

    #[test]
    fn system_is_lifted_roles_alternate_and_results_come_first() {
        let messages = vec![
            Message::text(Role::System, "be brief"),
            Message::text(Role::User, "list files"),
            Message::text(Role::User, "and count them"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text {
                        text: "Sure.".into(),
                    },
                    call("a"),
                ],
            },
            Message {
                role: Role::Tool,
                parts: vec![result("a", "")],
            },
            Message::text(Role::User, "thanks"),
            Message::text(Role::System, "late rule"),
            Message::text(Role::Assistant, "Done.  \n"),
        ];
        let c = conversation(&messages);
        assert_eq!(c.system.as_deref(), Some("be brief\n\nlate rule"));
        let roles: Vec<&str> = c
            .messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
        assert_eq!(
            c.messages[0]["content"].as_array().unwrap().len(),
            2,
            "merged"
        );
        assert_eq!(c.messages[1]["content"][1]["type"], "tool_use");
        assert_eq!(
            c.messages[1]["content"][1]["input"],
            json!({"command": "ls"})
        );
        let user = &c.messages[2]["content"];
        assert_eq!(user[0]["type"], "tool_result");
        assert_eq!(user[0]["content"], NO_OUTPUT);
        assert_eq!(user[1]["text"], "thanks");
        assert_eq!(c.messages[3]["content"][0]["text"], "Done.");
    }

    #[test]
    fn an_assistant_first_conversation_gets_a_user_opening() {
        let c = conversation(&[Message::text(Role::Assistant, "Hello")]);
        assert_eq!(c.system, None);
        assert_eq!(c.messages[0]["content"][0]["text"], CONTINUES);
        assert_eq!(c.messages[1]["role"], "assistant");
    }

    #[test]
    fn string_arguments_become_an_object() {
        assert_eq!(input(&json!(r#"{"a":1}"#)), json!({"a": 1}));
        assert_eq!(input(&json!("ls -la")), json!({"input": "ls -la"}));
        assert_eq!(input(&json!([1])), json!({"input": [1]}));
    }
}
