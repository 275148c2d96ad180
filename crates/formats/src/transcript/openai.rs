//! OpenAI chat message arrays (and mini-swe-agent trajectories, which hold one): `tool_calls`
//! with JSON-string arguments, `role: "tool"` results, optional `reasoning_content`.

use super::{Draft, content_text, parse_arguments};
use crate::message::{Message, Part, Role};
use serde_json::Value;

/// `[...]` or `{"messages": [...]}`.
pub(super) fn convert_list(value: &Value) -> Result<Draft, super::Malformed> {
    let list = match value {
        Value::Array(list) => list,
        Value::Object(map) => map
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("expected a message array or {\"messages\": [...]}")?,
        _ => return Err("expected a message array".into()),
    };
    let mut draft = Draft::default();
    for message in list {
        convert_message(message, &mut draft);
    }
    Ok(draft)
}

/// `{"messages": [...], "trajectory_format": "mini-swe-agent-1.1", ...}`; the final `exit`
/// message (the run's end, not sent to the model) is skipped.
pub(super) fn convert_mini_swe_agent(value: &Value) -> Result<Draft, super::Malformed> {
    let list = value["messages"].as_array().ok_or("no messages array")?;
    let mut draft = Draft {
        session_hint: value["instance_id"].as_str().map(str::to_string),
        submission: value["info"]["submission"].as_str().map(str::to_string),
        ..Default::default()
    };
    for message in list {
        if message["role"] == "exit" {
            draft.skip("exit records (the run's end, not sent to the model)");
            continue;
        }
        convert_message(message, &mut draft);
    }
    Ok(draft)
}

/// One OpenAI-style message (also SWE-agent's function-calling history entries).
pub(super) fn convert_message(message: &Value, draft: &mut Draft) {
    let role = match message["role"].as_str() {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("system") | Some("developer") => Role::System,
        Some("tool") => Role::Tool,
        _ => {
            draft.skip("messages with an unknown role");
            return;
        }
    };
    let text = content_text(&message["content"], draft);
    let mut parts = Vec::new();
    if role == Role::Tool {
        let call_id = message["tool_call_id"]
            .as_str()
            .or_else(|| message["tool_call_ids"][0].as_str())
            .unwrap_or_default()
            .to_string();
        if message["tool_call_ids"]
            .as_array()
            .is_some_and(|ids| ids.len() > 1)
        {
            draft.skip("extra call ids of a shared tool message (answered by its first id)");
        }
        parts.push(Part::ToolResult {
            call_id,
            name: message["name"].as_str().map(str::to_string),
            output: text.unwrap_or_default(),
            is_error: false,
        });
    } else {
        if let Some(reasoning) = message["reasoning_content"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            parts.push(Part::Reasoning {
                text: reasoning.to_string(),
            });
        }
        let has_calls = message["tool_calls"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        match text {
            Some(text) if !text.is_empty() || !has_calls => parts.push(Part::Text { text }),
            _ => {}
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            parts.push(Part::ToolCall {
                id: call["id"].as_str().unwrap_or_default().to_string(),
                name: call["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                args: parse_arguments(&call["function"]["arguments"]),
            });
        }
    }
    draft.messages.push(Message { role, parts });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_calls_with_string_arguments_and_tool_results_convert() {
        let value = json!([
            {"role": "system", "content": "be helpful"},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "reasoning_content": "think",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ]);
        let draft = convert_list(&value).unwrap();
        assert_eq!(draft.messages.len(), 4);
        let assistant = &draft.messages[2];
        assert!(matches!(&assistant.parts[0], Part::Reasoning { text } if text == "think"));
        assert!(
            matches!(&assistant.parts[1], Part::ToolCall { args, .. } if args["command"] == "ls")
        );
        assert_eq!(
            assistant.parts.len(),
            2,
            "an empty content next to calls is no part"
        );
        assert!(
            matches!(&draft.messages[3].parts[0], Part::ToolResult { call_id, output, .. } if call_id == "c1" && output == "a.txt")
        );
    }
}
