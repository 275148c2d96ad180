//! A Responses request: `input` read as messages (see the module), `instructions` as the
//! request's own system text, and the conversation put back as items.

use super::{group, message_of};
use crate::provider::media;
use crate::provider::wire::{
    Native, Outgoing, Sent, UnreadableRequest, Wire, WireRequest, completion_tokens, listed,
    overhead_tokens, shown_args, shown_output,
};
use crate::transcript::parse_arguments;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::borrow::Cow;

/// Reads the request: `body` its fields but `input`, `conversation` the input as sent (its
/// items, gathered into runs, become the natives).
pub fn parse(body: &Value, conversation: Option<&str>) -> Result<WireRequest, UnreadableRequest> {
    const EXPECTED: &str = "`input`: a string or a list of items";
    let items = match conversation {
        Some(raw) if raw.starts_with('"') => {
            let text: String = serde_json::from_str(raw)
                .map_err(|_| UnreadableRequest(format!("expected {EXPECTED}")))?;
            let item = json!({"type": "message", "role": "user", "content": text});
            vec![serde_json::value::to_raw_value(&item).map_err(|e| e.to_string())?]
        }
        _ => listed(conversation, EXPECTED)?,
    };
    let (mut messages, mut natives, mut media) = (Vec::new(), Vec::new(), Vec::new());
    group(items, |parsed, sent| {
        messages.push(message_of(parsed));
        natives.push(Native::list(sent));
        media.push(media::measure_all(parsed, Wire::Responses));
    });
    Ok(WireRequest {
        messages: messages.into(),
        natives,
        media,
        system: body["instructions"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        overhead_tokens: overhead_tokens(body, "input"),
        completion_tokens: completion_tokens(body, &["max_output_tokens"]),
        has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty()),
        model: body["model"].as_str().unwrap_or_default().to_string(),
    })
}

/// The `input` items that go upstream (the client's own borrowed, not copied).
pub fn conversation<'a>(outgoing: &'a [Outgoing<'a>]) -> Vec<Sent<'a>> {
    let mut input = Vec::new();
    for o in outgoing {
        match o {
            Outgoing::Native(native) => input.extend(items(native).into_iter().map(Sent::Raw)),
            Outgoing::Patched { native, shown } => {
                input.extend(patched(native, shown).into_iter().map(Sent::owned))
            }
            Outgoing::Rendered(value) => input.push(Sent::Value(Cow::Borrowed(value))),
            Outgoing::Summary(text) => input
                .push(Sent::owned(json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text}]}))),
        }
    }
    input
}

/// A native's items as the client sent them: the run of items it stands for.
fn items(native: &Native) -> Vec<&RawValue> {
    serde_json::from_str(native.raw().get()).unwrap_or_default()
}

/// The client's items with each output (and a user message's text) as the context shows it,
/// and each call's arguments where the context shortened them.
fn patched(native: &Native, shown: &crate::message::Message) -> Vec<Value> {
    let mut out = match native.value() {
        Value::Array(items) => items,
        other => vec![other],
    };
    for item in &mut out {
        let id = item["call_id"].as_str().unwrap_or_default().to_string();
        if let Some(output) = shown_output(shown, &id) {
            item["output"] = Value::String(output.clone());
        } else if let Some(args) = shown_args(shown, &id) {
            match item["type"].as_str() {
                Some("function_call") if parse_arguments(&item["arguments"]) != *args => {
                    item["arguments"] = Value::String(super::context::arguments(args));
                }
                // Read as `{"input": …}` (see `super::item_parts`).
                Some("custom_tool_call") if args.get("input") != Some(&item["input"]) => {
                    if let Some(input) = args.get("input") {
                        item["input"] = input.clone();
                    }
                }
                _ => {}
            }
        } else if item["type"] == "message" {
            let text = shown.joined_text();
            if crate::provider::wire::text_of(&item["content"]) != text {
                let kind = match item["role"] == "assistant" {
                    true => "output_text",
                    false => "input_text",
                };
                // A user's images and files stay beside the text shown.
                item["content"] = match &item["content"] {
                    Value::Array(parts) => crate::provider::wire::with_text(parts, text, kind),
                    _ => json!([{"type": kind, "text": text}]),
                };
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    #[test]
    fn items_are_grouped_into_messages_and_sent_back_as_they_came() {
        let input = json!([
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-1"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.rs"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
            {"type": "compaction", "encrypted_content": "provider-summary"}
        ]);
        let body = json!({"model": "gpt", "instructions": "Be brief.", "input": input});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Responses
            .parse_value(&mut sent)
            .unwrap();
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant,
                Role::Tool,
                Role::User
            ]
        );
        assert_eq!(
            request.messages[2].tool_call_ids().collect::<Vec<_>>(),
            ["c1"]
        );
        assert_eq!(
            request.messages[5].tool_result_ids().collect::<Vec<_>>(),
            ["c2"]
        );
        assert_eq!(request.system, "Be brief.");
        let outgoing: Vec<Outgoing> = request.natives.iter().map(Outgoing::Native).collect();
        let out = crate::provider::wire::Wire::Responses.render_value(&sent, &outgoing);
        assert_eq!(
            out, body,
            "reasoning with its encrypted content, custom calls, the provider's compaction"
        );
    }

    /// Calls the context shortened go upstream shortened: a function call's arguments (a JSON
    /// string) and a custom call's input; the reasoning and text items as the client sent them.
    #[test]
    fn shortened_calls_go_up_with_their_shortened_arguments() {
        let input = json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-1"},
            {"type": "function_call", "call_id": "c1", "name": "write", "arguments": "{\"text\":\"long\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch long"}
        ]);
        let body = json!({"model": "gpt", "input": input});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Responses
            .parse_value(&mut sent)
            .unwrap();
        let cut = json!({"text": "lo [… cut …] ng"});
        let patch = json!({"input": "*** Begin [… cut …]"});
        let outgoing = vec![
            Outgoing::Patched {
                native: &request.natives[1],
                shown: crate::provider::wire::with_call_args(
                    &request.messages[1],
                    "c1",
                    cut.clone(),
                ),
            },
            Outgoing::Patched {
                native: &request.natives[3],
                shown: crate::provider::wire::with_call_args(&request.messages[3], "c2", patch),
            },
        ];
        let out = crate::provider::wire::Wire::Responses.render_value(&sent, &outgoing);
        let items = out["input"].as_array().unwrap();
        assert_eq!(items[0], input[1], "reasoning as sent");
        let arguments = items[1]["arguments"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), cut);
        assert_eq!(items[2]["input"], "*** Begin [… cut …]");
        assert_eq!(items[2]["call_id"], "c2");
    }

    /// A person's message shortened in the context keeps its images beside the text shown.
    #[test]
    fn a_shortened_user_message_keeps_its_images() {
        let image = json!({"type": "input_image", "image_url": "https://example.com/a.png"});
        let input = json!([{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "A long log."}, image]}]);
        let body = json!({"model": "gpt", "input": input});
        let mut sent = body.clone();
        let request = crate::provider::wire::Wire::Responses
            .parse_value(&mut sent)
            .unwrap();
        let outgoing = vec![Outgoing::Patched {
            native: &request.natives[0],
            shown: crate::message::Message::text(crate::message::Role::User, "A [… cut …] log."),
        }];
        let out = crate::provider::wire::Wire::Responses.render_value(&sent, &outgoing);
        assert_eq!(
            out["input"][0]["content"],
            json!([{"type": "input_text", "text": "A [… cut …] log."}, image])
        );
    }
}
