//! A Chat Completions request: `messages` read as compactd's messages (one per entry, system
//! and developer messages included), and the conversation put back in their place.

use crate::message::{Message, Part, Role};
use crate::provider::media;
use crate::provider::wire::{
    Native, Outgoing, Sent, UnreadableRequest, Wire, WireRequest, completion_tokens, listed,
    overhead_tokens, parsed, shown_args, text_of, with_text,
};
use crate::transcript::parse_arguments;
use serde_json::{Value, json};
use std::borrow::Cow;

/// Reads the request: `body` its fields but `messages`, `conversation` the messages as sent
/// (they become the natives, each read on its own).
pub fn parse(body: &Value, conversation: Option<&str>) -> Result<WireRequest, UnreadableRequest> {
    let list = listed(conversation, "a `messages` array")?;
    let mut messages = Vec::with_capacity(list.len());
    let mut media = Vec::with_capacity(list.len());
    let mut system = Vec::new();
    for (i, raw) in list.iter().enumerate() {
        let native = parsed(raw);
        media.push(media::measure(&native, Wire::Chat));
        let mut message = crate::transcript::openai_message(&native).ok_or_else(|| {
            format!(
                "messages[{i}]: unknown role {} (system, developer, user, assistant or tool)",
                native["role"]
            )
        })?;
        if message.parts.is_empty() {
            message.parts.push(Part::Text {
                text: String::new(),
            });
        }
        if message.role == Role::System && messages.iter().all(|m: &Message| m.role == Role::System)
        {
            system.push(message.joined_text());
        }
        messages.push(message);
    }
    Ok(WireRequest {
        messages: messages.into(),
        natives: list.into_iter().map(Native::from_raw).collect(),
        media,
        system: system.join("\n"),
        overhead_tokens: overhead_tokens(body, "messages"),
        completion_tokens: completion_tokens(body, &["max_completion_tokens", "max_tokens"]),
        has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty())
            || body["functions"].as_array().is_some_and(|f| !f.is_empty()),
        model: body["model"].as_str().unwrap_or_default().to_string(),
    })
}

/// The `messages` that go upstream (the client's own borrowed, not copied).
pub fn conversation<'a>(outgoing: &'a [Outgoing<'a>]) -> Vec<Sent<'a>> {
    outgoing
        .iter()
        .map(|o| match o {
            Outgoing::Native(native) => Sent::Raw(native.raw()),
            Outgoing::Patched { native, shown } => Sent::owned(patched(&native.value(), shown)),
            Outgoing::Rendered(value) => Sent::Value(Cow::Borrowed(value)),
            Outgoing::Summary(text) => Sent::owned(json!({"role": "user", "content": text})),
        })
        .collect()
}

/// The client's message with the output (a tool message) or text (a user message) the
/// context shows in place of its own, and each call's arguments where the context shortened
/// them. A user's images and files stay beside the text shown (their tokens are counted in
/// what the message costs: see `compaction::media`); a tool's output shown otherwise is that
/// text alone.
fn patched(native: &Value, shown: &Message) -> Value {
    let mut out = native.clone();
    let (text, is_output) = match shown.parts.first() {
        Some(Part::ToolResult { output, .. }) => (output.clone(), true),
        _ => (shown.joined_text(), false),
    };
    if text_of(&native["content"]) != text {
        out["content"] = match &native["content"] {
            Value::Array(parts) if !is_output => with_text(parts, text, "text"),
            _ => Value::String(text),
        };
    }
    let calls = out.get_mut("tool_calls").and_then(Value::as_array_mut);
    for call in calls.into_iter().flatten() {
        let id = call["id"].as_str().unwrap_or_default();
        if let Some(args) = shown_args(shown, id)
            && parse_arguments(&call["function"]["arguments"]) != *args
        {
            call["function"]["arguments"] = Value::String(super::context::arguments(args));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A person's message shortened in the context goes up with its text's head and tail in
    /// place of its text, and its images as the client sent them (the model is billed for
    /// them, and compactd counts them).
    #[test]
    fn a_shortened_user_message_keeps_its_images() {
        let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
        let body = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "A long log."}, image, {"type": "text", "text": "More log."}]}]});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Chat
            .parse_value(&mut sent)
            .unwrap();
        let shown = Message::text(Role::User, "A long [… cut …] log.");
        let outgoing = vec![Outgoing::Patched {
            native: &request.natives[0],
            shown,
        }];
        let out = crate::provider::wire::Wire::Chat.render_value(&sent, &outgoing);
        assert_eq!(
            out["messages"][0]["content"],
            json!([{"type": "text", "text": "A long [… cut …] log."}, image])
        );
    }

    #[test]
    fn messages_go_back_as_sent_and_a_masked_output_replaces_only_the_content() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "Fix it.", "name": "me"},
            {"role": "assistant", "content": null, "reasoning_content": "hmm",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.rs"}]});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Chat
            .parse_value(&mut sent)
            .unwrap();
        assert_eq!(request.system, "Rules.");
        assert_eq!(request.messages.len(), 4);
        let shown = Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "c1".into(),
                name: None,
                output: "[output of bash masked]".into(),
                is_error: false,
            }],
        };
        let outgoing = vec![
            Outgoing::Native(&request.natives[1]),
            Outgoing::Native(&request.natives[2]),
            Outgoing::Patched {
                native: &request.natives[3],
                shown,
            },
        ];

        let out = crate::provider::wire::Wire::Chat.render_value(&sent, &outgoing);
        assert_eq!(out["messages"][0], body["messages"][1]);
        assert_eq!(out["messages"][1]["reasoning_content"], "hmm");
        assert_eq!(
            out["messages"][2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "[output of bash masked]"})
        );
    }

    /// A call the context shortened goes upstream with the shortened arguments, still a JSON
    /// string; the rest of the message as the client sent it.
    #[test]
    fn a_shortened_call_goes_up_with_its_shortened_arguments() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": null, "reasoning_content": "hmm",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "write", "arguments": "{\"path\":\"a.rs\",\"text\":\"long\"}"}}]}]});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Chat
            .parse_value(&mut sent)
            .unwrap();
        let cut = json!({"path": "a.rs", "text": "lo [… cut …] ng"});
        let outgoing = vec![Outgoing::Patched {
            native: &request.natives[1],
            shown: crate::provider::wire::with_call_args(&request.messages[1], "c1", cut.clone()),
        }];
        let out = crate::provider::wire::Wire::Chat.render_value(&sent, &outgoing);
        let message = &out["messages"][0];
        let arguments = message["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap();
        assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), cut);
        assert_eq!(message["reasoning_content"], "hmm");
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["id"], "c1");
    }
}
