//! A Responses request: `input` read as messages (see the module), `instructions` as the
//! request's own system text, and the conversation put back as items.

use super::{group, message_of};
use crate::message::Part;
use crate::provider::wire::{Outgoing, WireRequest, overhead_tokens};
use serde_json::{Value, json};

pub fn parse(body: &Value) -> Result<WireRequest, String> {
    let items = match &body["input"] {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": s})],
        Value::Array(items) => items.clone(),
        _ => return Err("expected `input`: a string or a list of items".into()),
    };
    let runs = group(&items);
    Ok(WireRequest {
        messages: runs.iter().map(|run| message_of(run)).collect(),
        natives: runs.into_iter().map(Value::Array).collect(),
        system: body["instructions"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        overhead_tokens: overhead_tokens(body, "input"),
        has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty()),
        model: body["model"].as_str().unwrap_or_default().to_string(),
    })
}

pub fn render(body: &mut Value, outgoing: &[Outgoing]) {
    let mut input = Vec::new();
    for o in outgoing {
        match o {
            Outgoing::Native(native) => input.extend(items(native)),
            Outgoing::Patched { native, shown } => input.extend(patched(native, shown)),
            Outgoing::Rendered(value) => input.push(value.clone()),
            Outgoing::Summary(text) => input.push(json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text}]})),
        }
    }
    body["input"] = Value::Array(input);
}

fn items(native: &Value) -> Vec<Value> {
    match native {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    }
}

/// The client's items with each output (and a user message's text) as the context shows it.
fn patched(native: &Value, shown: &crate::message::Message) -> Vec<Value> {
    let mut out = items(native);
    for item in &mut out {
        let id = item["call_id"].as_str().unwrap_or_default().to_string();
        if let Some(output) = shown.parts.iter().find_map(|p| match p {
            Part::ToolResult {
                call_id, output, ..
            } if *call_id == id => Some(output),
            _ => None,
        }) {
            item["output"] = Value::String(output.clone());
        } else if item["type"] == "message" {
            let text = shown.joined_text();
            if crate::provider::wire::text_of(&item["content"]) != text {
                item["content"] = json!([{"type": "input_text", "text": text}]);
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
        let request = parse(&body).unwrap();
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
        let mut out = body.clone();
        let outgoing: Vec<Outgoing> = request.natives.iter().map(Outgoing::Native).collect();
        render(&mut out, &outgoing);
        assert_eq!(
            out, body,
            "reasoning with its encrypted content, custom calls, the provider's compaction"
        );
    }
}
