//! The OpenAI Responses API (`POST /v1/responses`), as its documentation states the rules:
//! - `input` is a string or a list of items: messages (`user`, `assistant`, `system`,
//!   `developer`), `function_call` and `function_call_output`, `custom_tool_call` and
//!   `custom_tool_call_output`, `reasoning`, and other item types passed on as they are;
//! - every `*_call_output` answers a call of that `call_id` earlier in the input, and every
//!   call is answered ("No tool output found for function call ...");
//! - a `reasoning` item is followed by the item it preceded, and its `encrypted_content` is
//!   what the API gave out;
//! - message content is not empty; the prompt fits the model's window.

use super::{Action, Shared, Task, decide, sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashSet;

fn is_call(kind: &str) -> bool {
    matches!(
        kind,
        "function_call" | "custom_tool_call" | "local_shell_call"
    )
}

fn is_output(kind: &str) -> bool {
    matches!(
        kind,
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output"
    )
}

pub fn validate(shared: &Shared, body: &Value) -> Result<(), String> {
    let items = match &body["input"] {
        Value::String(s) if !s.is_empty() => return Ok(()),
        Value::Array(items) if !items.is_empty() => items,
        _ if body["previous_response_id"].is_string() => return Ok(()),
        _ => return Err("Missing required parameter: 'input'.".into()),
    };
    let mut calls = HashSet::new();
    let mut answered = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        let call_id = item["call_id"].as_str().unwrap_or("").to_string();
        if is_call(kind) {
            calls.insert(call_id);
        } else if is_output(kind) {
            if !calls.contains(&call_id) {
                return Err(format!(
                    "No tool call found for function call output with call_id {call_id}."
                ));
            }
            answered.insert(call_id);
        } else if kind == "reasoning" {
            if i + 1 == items.len() {
                return Err(format!(
                    "Item '{}' of type 'reasoning' was provided without its required following item.",
                    item["id"].as_str().unwrap_or("")
                ));
            }
            if let Some(encrypted) = item["encrypted_content"].as_str()
                && !shared.issued(encrypted)
            {
                return Err(format!(
                    "The encrypted content for item {} could not be verified.",
                    item["id"].as_str().unwrap_or("")
                ));
            }
        } else if kind == "message" {
            let empty = match &item["content"] {
                Value::String(s) => s.is_empty(),
                Value::Array(parts) => parts.is_empty(),
                _ => true,
            };
            if empty {
                return Err(format!("Invalid 'input[{i}].content': empty content."));
            }
        }
    }
    if let Some(unanswered) = calls.iter().find(|c| !answered.contains(*c)) {
        return Err(format!(
            "No tool output found for function call {unanswered}."
        ));
    }
    Ok(())
}

fn newest_output(items: &[Value]) -> Option<String> {
    items
        .iter()
        .rev()
        .filter(|i| i["type"].as_str().is_some_and(is_output))
        .map(|i| super::text_of(&i["output"]))
        .find(|output| !super::is_side_output(output))
}

pub fn answer(
    shared: &Shared,
    task: &Task,
    body: &Value,
    tokens: usize,
    window: usize,
) -> Result<Response, String> {
    validate(shared, body)?;
    if tokens > window {
        return Err(format!(
            "Your input exceeds the context window of this model ({tokens} tokens > {window})."
        ));
    }
    let items = body["input"].as_array().cloned().unwrap_or_default();
    let shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["name"] == "exec_command");
    let action = decide(task, newest_output(&items).as_deref(), shell);
    let mut output = Vec::new();
    let wants_reasoning = body["include"]
        .as_array()
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    if wants_reasoning {
        let id = format!("rs_{:08}", shared.next_id());
        output.push(json!({"type": "reasoning", "id": id, "summary": [], "encrypted_content": shared.sign(&id)}));
    }
    match &action {
        Action::Run { step, command } => {
            output.push(json!({"type": "message", "id": format!("msg_{:08}", shared.next_id()), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": format!("Running step {step}."), "annotations": []}]}));
            output.push(json!({"type": "function_call", "id": format!("fc_{:08}", shared.next_id()), "call_id": format!("call_{:08}", shared.next_id()),
                "name": "exec_command", "arguments": json!({"cmd": command}).to_string(), "status": "completed"}));
            if task.parallel_calls {
                output.push(json!({"type": "function_call", "id": format!("fc_{:08}", shared.next_id()), "call_id": format!("call_{:08}", shared.next_id()),
                    "name": "exec_command", "arguments": json!({"cmd": super::side_command(*step)}).to_string(), "status": "completed"}));
            }
        }
        Action::Finish(text) | Action::Text(text) => {
            output.push(json!({"type": "message", "id": format!("msg_{:08}", shared.next_id()), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}));
        }
    }
    let usage = json!({"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 20});
    let response = json!({"id": format!("resp_{:08}", shared.next_id()), "object": "response", "status": "completed",
        "model": body["model"], "output": output, "usage": usage});
    if body["stream"] != true {
        return Ok(axum::Json(response).into_response());
    }
    let mut in_progress = response.clone();
    in_progress["status"] = json!("in_progress");
    in_progress["output"] = json!([]);
    let mut events = vec![(
        Some("response.created".to_string()),
        json!({"type": "response.created", "response": in_progress}),
    )];
    for (index, item) in output.iter().enumerate() {
        events.push((
            Some("response.output_item.added".into()),
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        ));
        if item["type"] == "message" {
            events.push((
                Some("response.output_text.delta".into()),
                json!({"type": "response.output_text.delta", "output_index": index,
                "content_index": 0, "item_id": item["id"], "delta": item["content"][0]["text"]}),
            ));
        }
        events.push((
            Some("response.output_item.done".into()),
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        ));
    }
    events.push((
        Some("response.completed".into()),
        json!({"type": "response.completed", "response": response}),
    ));
    Ok(sse(events, false))
}
