//! compactd's messages as Responses input items: system text as developer messages, user text
//! as input text, an assistant's text and calls as output text and `function_call` items,
//! results as `function_call_output` right after their call (the shared [`Turns`]).

use crate::message::Message;
use crate::provider::{Turn, Turns, api_id, api_name};
use serde_json::{Value, json};

pub fn items(messages: &[Message]) -> Vec<Value> {
    let mut out = Vec::new();
    for turn in Turns::of(messages).0 {
        match turn {
            Turn::System(text) => out.push(json!({"type": "message", "role": "developer",
                "content": [{"type": "input_text", "text": text}]})),
            Turn::User(text) => out.push(json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text}]})),
            Turn::Assistant {
                text,
                calls,
                results,
            } => {
                if !text.trim().is_empty() {
                    out.push(json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}));
                }
                for c in &calls {
                    out.push(json!({"type": "function_call", "call_id": api_id(&c.id),
                        "name": api_name(&c.name), "arguments": arguments(&c.args)}));
                }
                for r in results {
                    out.push(
                        json!({"type": "function_call_output", "call_id": api_id(&r.call_id),
                        "output": r.output}),
                    );
                }
            }
        }
    }
    out
}

/// A call's arguments as the JSON string a `function_call` item carries; a string is taken
/// as already serialized.
pub(super) fn arguments(args: &Value) -> String {
    match args {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
