//! Deterministic synthetic sessions for benchmarks: an agent reading, editing and testing
//! code, about 1 KB of text per message, so a 10,000-message session is about 10 MB.

use compactd_core::message::{Message, Part, Role};
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

/// Synthetic sessions `compactd replay` takes by name (`synthetic:NAME`), for what the shared
/// transcripts hold too little of.
pub const NAMED: &[&str] = &["large-outputs", "chatty"];

/// The named synthetic session, if `name` is one.
pub fn named(name: &str) -> Option<Vec<Message>> {
    match name {
        "large-outputs" => Some(large_outputs(40, 12_000)),
        "chatty" => Some(chatty(60)),
        _ => None,
    }
}

/// A task, then `steps` shell steps whose outputs are `output_chars` characters each (12,000
/// is about 3,000 tokens: at a 16,000-token window, a few outputs fill the budget), with a
/// distinct first and last line so a reader can tell whether the head and tail arrived.
pub fn large_outputs(steps: usize, output_chars: usize) -> Vec<Message> {
    let mut messages = vec![Message::text(
        Role::User,
        "Find out why the nightly build fails; read the logs it left.",
    )];
    for i in 0..steps {
        let id = format!("call_{i}");
        messages.push(Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: format!("Reading log {i}."),
                },
                Part::ToolCall {
                    id: id.clone(),
                    name: "bash".into(),
                    args: json!({"command": format!("cat /var/log/build/{i}.log")}),
                },
            ],
        });
        let head = format!("BEGIN build log {i}\n");
        let tail = format!("END build log {i}: exit status {}\n", i % 3);
        let line = format!("step {i}: compiling crate and running the tests of the module\n");
        let body = line.repeat(output_chars.saturating_sub(head.len() + tail.len()) / line.len());
        messages.push(Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id,
                name: None,
                output: format!("{head}{body}{tail}"),
                is_error: false,
            }],
        });
    }
    messages.push(Message::text(Role::Assistant, "The logs are read."));
    messages
}

/// `turns` user instructions of 100 to 2,000 characters, each answered in a few words: a
/// session whose instructions alone outgrow a summary's usual budget.
pub fn chatty(turns: usize) -> Vec<Message> {
    let clause = "please also keep the public API unchanged and the tests green, ";
    let mut messages = Vec::with_capacity(2 * turns);
    for i in 0..turns {
        let chars = 100 + (i * 317) % 1_900;
        let text = format!(
            "Instruction {i}: {}",
            clause.repeat(chars / clause.len() + 1)
        );
        let text: String = text.chars().take(chars).collect();
        messages.push(Message::text(Role::User, text));
        messages.push(Message::text(
            Role::Assistant,
            format!("Done with instruction {i}."),
        ));
    }
    messages
}
