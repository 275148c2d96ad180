//! Deterministic synthetic sessions for benchmarks: an agent reading, editing and testing
//! code, about 1 KB of text per message, so a 10,000-message session is about 10 MB.

use crate::message::{Message, Part, Role};
use serde_json::json;

/// A session of `n` messages: user requests, assistant turns with tool calls, tool results.
pub fn synthetic_session(n: usize) -> Vec<Message> {
    let filler = "The quick brown fox jumps over the lazy dog while the compiler checks types. ";
    let mut messages = Vec::with_capacity(n);
    let mut i = 0;
    while messages.len() < n {
        let id = format!("call_{i}");
        let path = format!("/work/project/src/module_{}.rs", i % 97);
        let message = match i % 4 {
            0 => Message::text(Role::User, format!("Request {i}: {}", filler.repeat(12))),
            1 => Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text {
                        text: format!("Step {i}: {}", filler.repeat(6)),
                    },
                    Part::ToolCall {
                        id: id.clone(),
                        name: if i % 8 == 1 {
                            "bash".into()
                        } else {
                            "read".into()
                        },
                        args: if i % 8 == 1 {
                            json!({"command": format!("grep -n fn {path} && sed -i 's/a/b/' {path}")})
                        } else {
                            json!({"file_path": path})
                        },
                    },
                ],
            },
            2 => Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: format!("call_{}", i - 1),
                    name: None,
                    output: format!("fn item_{i}() {{}}\n").repeat(60),
                    is_error: i % 40 == 2,
                }],
            },
            _ => Message::text(Role::Assistant, format!("Done {i}: {}", filler.repeat(12))),
        };
        messages.push(message);
        i += 1;
    }
    messages
}
