//! A Messages request as Claude Code and the Anthropic SDKs send it: `system` outside the
//! conversation (the client's, forwarded as it is), and `messages` of `user`, `assistant`
//! and, mid-conversation, `system` role, each read as compactd's message while its blocks
//! (thinking with signatures, images, cache marks, types compactd does not know) stay as sent.

use crate::message::{Message, Part, Role};
use crate::provider::media;
use crate::provider::wire::{
    Native, Outgoing, Sent, UnreadableRequest, Wire, WireRequest, completion_tokens, listed,
    overhead_tokens, parsed, shown_args, shown_output, text_of,
};
use serde_json::{Value, json};
use std::borrow::Cow;

/// Reads the request: `body` its fields but `messages`, `conversation` the messages as sent
/// (they become the natives, each read on its own).
pub fn parse(body: &Value, conversation: Option<&str>) -> Result<WireRequest, UnreadableRequest> {
    let list = listed(conversation, "a `messages` array")?;
    let mut messages = Vec::with_capacity(list.len());
    let mut media = Vec::with_capacity(list.len());
    for (i, raw) in list.iter().enumerate() {
        let native = parsed(raw);
        media.push(media::measure(&native, Wire::Anthropic));
        let role = match native["role"].as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("system") => Role::System,
            _ => {
                return Err(format!(
                    "messages[{i}]: unknown role {} (user, assistant or system)",
                    native["role"]
                )
                .into());
            }
        };
        messages.push(Message {
            role,
            parts: parts(role, &native["content"]),
        });
    }
    Ok(WireRequest {
        messages: messages.into(),
        natives: list.into_iter().map(Native::from_raw).collect(),
        media,
        system: text_of(&body["system"]),
        overhead_tokens: overhead_tokens(body, "messages"),
        completion_tokens: completion_tokens(body, &["max_tokens"]),
        has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty()),
        model: body["model"].as_str().unwrap_or_default().to_string(),
    })
}

/// Content as compactd's parts: text, thinking (reasoning), tool use and results; other
/// blocks stand as a short note of their type (the native keeps them whole). Never empty.
pub fn parts(role: Role, content: &Value) -> Vec<Part> {
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

/// The `messages` that go upstream (the client's own borrowed, not copied).
pub fn conversation<'a>(outgoing: &'a [Outgoing<'a>]) -> Vec<Sent<'a>> {
    outgoing
        .iter()
        .map(|o| match o {
            Outgoing::Native(native) => Sent::Raw(native.raw()),
            Outgoing::Patched { native, shown } => Sent::owned(patched(&native.value(), shown)),
            Outgoing::Rendered(value) => Sent::Value(Cow::Borrowed(value)),
            Outgoing::Summary(text) => {
                Sent::owned(json!({"role": "user", "content": [{"type": "text", "text": text}]}))
            }
        })
        .collect()
}

/// The client's message with each tool result's content, and a user message's text, as the
/// context shows them, and each call's input where the context shortened it; every other
/// block (images, cache marks) stays.
fn patched(native: &Value, shown: &Message) -> Value {
    let mut out = native.clone();
    let text: String = shown.joined_text();
    let original = Message {
        role: Role::User,
        parts: parts(Role::User, &native["content"]),
    };
    let same_text = original.joined_text() == text;
    match &mut out["content"] {
        Value::String(s) => *s = text,
        Value::Array(blocks) => {
            let mut replaced_text = false;
            for block in blocks.iter_mut() {
                match block["type"].as_str() {
                    Some("tool_result") => {
                        let id = block["tool_use_id"].as_str().unwrap_or_default();
                        // An output the context shows as it was keeps the client's blocks
                        // (tool references, images), which text would lose.
                        if let Some(output) = shown_output(shown, id)
                            && shown_output(&original, id) != Some(output)
                        {
                            block["content"] = Value::String(output.clone());
                        }
                    }
                    Some("tool_use") => {
                        let id = block["id"].as_str().unwrap_or_default();
                        if let Some(args) = shown_args(shown, id)
                            && *args != block["input"]
                        {
                            block["input"] = super::context::input(args);
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
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Anthropic
            .parse_value(&mut sent)
            .unwrap();
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
        let outgoing: Vec<Outgoing> = request.natives.iter().map(Outgoing::Native).collect();
        let out = crate::provider::wire::Wire::Anthropic.render_value(&sent, &outgoing);
        assert_eq!(
            out, body,
            "thinking with its signature, unknown blocks, cache marks, extra fields"
        );
    }

    #[test]
    fn a_shortened_result_keeps_the_other_blocks_and_marks() {
        let body = body();
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Anthropic
            .parse_value(&mut sent)
            .unwrap();
        let shown = Message {
            role: Role::User,
            parts: vec![Part::ToolResult {
                call_id: "t1".into(),
                name: None,
                output: "a.rs [… cut …]".into(),
                is_error: false,
            }],
        };
        let outgoing = vec![
            Outgoing::Native(&request.natives[2]),
            Outgoing::Patched {
                native: &request.natives[3],
                shown,
            },
        ];
        let out = crate::provider::wire::Wire::Anthropic.render_value(&sent, &outgoing);
        let blocks = out["messages"][1]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["content"], "a.rs [… cut …]");
        assert_eq!(blocks[0]["cache_control"]["type"], "ephemeral");
        assert_eq!(blocks[1]["type"], "image");
        assert_eq!(out["messages"][0]["content"][0]["signature"], "sig-1");
    }

    /// Claude Code's ToolSearch answers with tool references (the deferred tools it loads):
    /// a message whose other output the context masks keeps them as the client sent them.
    #[test]
    fn an_output_shown_as_it_was_keeps_its_blocks_in_a_patched_message() {
        let mut sent = json!({"model": "claude", "messages": [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "s1", "name": "ToolSearch", "input": {"query": "select:TaskCreate"}},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "cat big.log"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "s1", "content": [{"type": "tool_reference", "tool_name": "TaskCreate"}]},
                {"type": "tool_result", "tool_use_id": "t1", "content": "a very long log"}]}
        ]});
        let body = sent.clone();
        let request = crate::provider::wire::Wire::Anthropic
            .parse_value(&mut sent)
            .unwrap();
        let mut shown = request.messages[1].clone();
        if let Part::ToolResult { output, .. } = &mut shown.parts[1] {
            *output = "[output of Bash masked: 15 chars]".into();
        }
        let outgoing = vec![
            Outgoing::Native(&request.natives[0]),
            Outgoing::Patched {
                native: &request.natives[1],
                shown,
            },
        ];
        let out = crate::provider::wire::Wire::Anthropic.render_value(&sent, &outgoing);
        let blocks = &out["messages"][1]["content"];
        assert_eq!(
            blocks[0], body["messages"][1]["content"][0],
            "tool references as sent"
        );
        assert_eq!(blocks[1]["content"], "[output of Bash masked: 15 chars]");
    }

    /// A call the context shortened (its input alone too large for the window) goes upstream
    /// shortened; the thinking and the other blocks as the client sent them.
    #[test]
    fn a_shortened_call_goes_up_with_its_shortened_input() {
        let body = body();
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Anthropic
            .parse_value(&mut sent)
            .unwrap();
        let cut = json!({"command": "ls [… cut …]"});
        let outgoing = vec![Outgoing::Patched {
            native: &request.natives[2],
            shown: crate::provider::wire::with_call_args(&request.messages[2], "t1", cut.clone()),
        }];
        let out = crate::provider::wire::Wire::Anthropic.render_value(&sent, &outgoing);
        let blocks = &out["messages"][0]["content"];
        assert_eq!(blocks[2]["input"], cut);
        assert_eq!(
            blocks[0], body["messages"][2]["content"][0],
            "thinking as sent"
        );
        assert_eq!(blocks[1], body["messages"][2]["content"][1]);
    }
}
