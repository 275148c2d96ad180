//! The OpenAI Responses API (Codex CLI speaks only this): a proxied call's request
//! ([`request`]) and answer ([`reply`]).
//!
//! Its conversation is a list of items rather than messages. compactd reads it as messages:
//! the items the model produced in one turn (reasoning, text, function and custom tool calls,
//! and any other call the API makes) are one assistant message, each call's output a tool
//! message, each input message a message of its role. Each keeps its items as they were sent:
//! reasoning items travel with their `encrypted_content`, and never apart from the item they
//! preceded. A client that sends `previous_response_id` keeps its history upstream; such calls
//! are passed on unchanged.

pub mod context;
pub mod reply;
pub mod request;

use crate::message::{Message, Part, Role};
use serde_json::Value;
use serde_json::value::RawValue;

/// Whether an item is one the model produces in its turn (so it belongs to the assistant
/// message): anything that is not an input message or a tool's output.
fn from_the_model(item: &Value) -> bool {
    match item["type"].as_str().unwrap_or("message") {
        "message" => item["role"] == "assistant",
        kind => !is_output(kind) && !matches!(kind, "item_reference" | "compaction"),
    }
}

fn is_output(kind: &str) -> bool {
    kind.ends_with("_output")
}

/// A run of items as compactd's message: `role` from the first, parts from all.
pub fn message_of(items: &[Value]) -> Message {
    let first = &items[0];
    let kind = first["type"].as_str().unwrap_or("message");
    let role = if from_the_model(first) {
        Role::Assistant
    } else if is_output(kind) {
        Role::Tool
    } else {
        match first["role"].as_str() {
            Some("system" | "developer") => Role::System,
            _ => Role::User,
        }
    };
    let mut parts = Vec::new();
    for item in items {
        parts.extend(item_parts(item));
    }
    if parts.is_empty() {
        parts.push(Part::Text {
            text: String::new(),
        });
    }
    Message { role, parts }
}

fn item_parts(item: &Value) -> Vec<Part> {
    let text = |v: &Value| crate::provider::wire::text_of(v);
    match item["type"].as_str().unwrap_or("message") {
        "message" => vec![Part::Text {
            text: text(&item["content"]),
        }],
        "reasoning" => vec![Part::Reasoning {
            text: text(&item["summary"]),
        }],
        "function_call" => vec![Part::ToolCall {
            id: call_id(item),
            name: item["name"].as_str().unwrap_or("function").to_string(),
            args: crate::transcript::parse_arguments(&item["arguments"]),
        }],
        "custom_tool_call" => vec![Part::ToolCall {
            id: call_id(item),
            name: item["name"].as_str().unwrap_or("tool").to_string(),
            args: serde_json::json!({"input": item["input"]}),
        }],
        kind if is_output(kind) => vec![Part::ToolResult {
            call_id: call_id(item),
            name: None,
            output: match &item["output"] {
                Value::String(s) => s.clone(),
                other => text(other),
            },
            is_error: false,
        }],
        kind if kind.ends_with("_call") && item["call_id"].is_string() => vec![Part::ToolCall {
            id: call_id(item),
            name: kind.to_string(),
            args: item["action"].clone(),
        }],
        other => vec![Part::Text {
            text: format!("[{other}]"),
        }],
    }
}

fn call_id(item: &Value) -> String {
    item["call_id"]
        .as_str()
        .or_else(|| item["id"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Items gathered into runs that are one message each, read one at a time: `run` gets each
/// run (its items parsed, and as the client sent them) once the next item starts another, so
/// only one run is ever held parsed.
pub fn group(items: Vec<Box<RawValue>>, mut run: impl FnMut(&[Value], &[Box<RawValue>])) {
    let (mut parsed, mut sent): (Vec<Value>, Vec<Box<RawValue>>) = (Vec::new(), Vec::new());
    for raw in items {
        let item = crate::provider::wire::parsed(&raw);
        let joins = from_the_model(&item) && parsed.first().is_some_and(from_the_model);
        if !joins && !parsed.is_empty() {
            run(&parsed, &sent);
            parsed.clear();
            sent.clear();
        }
        parsed.push(item);
        sent.push(raw);
    }
    if !parsed.is_empty() {
        run(&parsed, &sent);
    }
}
