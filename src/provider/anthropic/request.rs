//! A Messages request as Claude Code and the Anthropic SDKs send it: `system` outside the
//! conversation (the client's, forwarded as it is), and `messages` of `user`, `assistant`
//! and, mid-conversation, `system` role, each read as compactd's message while its blocks
//! (thinking with signatures, images, cache marks, types compactd does not know) stay as sent.

use crate::message::{Message, Part, Role};
use crate::provider::wire::{Outgoing, WireRequest, overhead_tokens, text_of};
use serde_json::{Value, json};

pub fn parse(body: &Value) -> Result<WireRequest, String> {
    let list = body["messages"]
        .as_array()
        .ok_or("expected a `messages` array")?;
    let mut messages = Vec::with_capacity(list.len());
    for (i, native) in list.iter().enumerate() {
        let role = match native["role"].as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("system") => Role::System,
            other => return Err(format!("messages[{i}]: unknown role {other:?}")),
        };
        messages.push(Message {
            role,
            parts: parts(role, &native["content"]),
        });
    }
    Ok(WireRequest {
        messages,
        natives: list.clone(),
        system: text_of(&body["system"]),
        overhead_tokens: overhead_tokens(body, "messages"),
        has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty()),
        model: body["model"].as_str().unwrap_or_default().to_string(),
    })
}

/// Content as compactd's parts: text, thinking (reasoning), tool use and results; other
/// blocks stand as a short note of their type (the native keeps them whole). Never empty.
pub(crate) fn parts(role: Role, content: &Value) -> Vec<Part> {
    let mut parts = crate::transcript::anthropic_parts(content);
    if let Value::Array(blocks) = content {
        for block in blocks {
            match block["type"].as_str() {
                Some("redacted_thinking") => parts.push(Part::Reasoning {
                    text: String::new(),
                }),
                Some("text" | "thinking" | "tool_use" | "tool_result" | "image") => {}
                Some(other) if role != Role::System => parts.push(Part::Text {
                    text: format!("[{other}]"),
                }),
                _ => {}
            }
        }
    }
    if parts.is_empty() {
        parts.push(Part::Text {
            text: String::new(),
        });
    }
    parts
}

pub fn render(body: &mut Value, outgoing: &[Outgoing]) {
    let messages = outgoing
        .iter()
        .map(|o| match o {
            Outgoing::Native(native) => (*native).clone(),
            Outgoing::Patched { native, shown } => patched(native, shown),
            Outgoing::Rendered(value) => value.clone(),
            Outgoing::Summary(text) => {
                json!({"role": "user", "content": [{"type": "text", "text": text}]})
            }
        })
        .collect();
    body["messages"] = Value::Array(messages);
}

/// The client's message with each tool result's content, and a user message's text, as the
/// context shows them; every other block (images, cache marks) stays.
fn patched(native: &Value, shown: &Message) -> Value {
    let mut out = native.clone();
    let text: String = shown.joined_text();
    let original = parts(Role::User, &native["content"]);
    let same_text = Message {
        role: Role::User,
        parts: original,
    }
    .joined_text()
        == text;
    match &mut out["content"] {
        Value::String(s) => *s = text,
        Value::Array(blocks) => {
            let mut replaced_text = false;
            for block in blocks.iter_mut() {
                match block["type"].as_str() {
                    Some("tool_result") => {
                        let id = block["tool_use_id"].as_str().unwrap_or_default();
                        if let Some(output) = shown.parts.iter().find_map(|p| match p {
                            Part::ToolResult {
                                call_id, output, ..
                            } if call_id == id => Some(output),
                            _ => None,
                        }) {
                            block["content"] = Value::String(output.clone());
                        }
                    }
                    Some("text") if !same_text => {
                        // The shortened text stands in the first text block; the others go.
                        if replaced_text {
                            block["text"] = Value::Null;
                        } else {
                            block["text"] = Value::String(text.clone());
                            replaced_text = true;
                        }
                    }
                    _ => {}
                }
            }
            blocks.retain(|b| !(b["type"] == "text" && b["text"].is_null()));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> Value {
        json!({"model": "claude", "system": [{"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
            {"role": "system", "content": [{"type": "text", "text": "Environment: linux"}], "output_config": {"effort": "medium"}},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "", "signature": "sig-1"},
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a.rs\nb.rs", "cache_control": {"type": "ephemeral"}},
                {"type": "image", "source": {"type": "base64", "data": "xyz"}}]}
        ]})
    }

    #[test]
    fn every_block_is_read_and_sent_back_as_the_client_sent_it() {
        let body = body();
        let request = parse(&body).unwrap();
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::User, Role::System, Role::Assistant, Role::User]
        );
        assert_eq!(request.system, "Be careful.");
        assert!(request.has_tools && request.overhead_tokens > 0);
        assert!(matches!(
            request.messages[2].parts[0],
            Part::Reasoning { .. }
        ));
        let mut out = body.clone();
        let outgoing: Vec<Outgoing> = request.natives.iter().map(Outgoing::Native).collect();
        render(&mut out, &outgoing);
        assert_eq!(
            out, body,
            "thinking with its signature, unknown blocks, cache marks, extra fields"
        );
    }

    #[test]
    fn a_shortened_result_keeps_the_other_blocks_and_marks() {
        let body = body();
        let request = parse(&body).unwrap();
        let shown = Message {
            role: Role::User,
            parts: vec![Part::ToolResult {
                call_id: "t1".into(),
                name: None,
                output: "a.rs [… cut …]".into(),
                is_error: false,
            }],
        };
        let mut out = body.clone();
        let outgoing = vec![
            Outgoing::Native(&request.natives[2]),
            Outgoing::Patched {
                native: &request.natives[3],
                shown,
            },
        ];
        render(&mut out, &outgoing);
        let blocks = out["messages"][1]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["content"], "a.rs [… cut …]");
        assert_eq!(blocks[0]["cache_control"]["type"], "ephemeral");
        assert_eq!(blocks[1]["type"], "image");
        assert_eq!(out["messages"][0]["content"][0]["signature"], "sig-1");
    }
}
