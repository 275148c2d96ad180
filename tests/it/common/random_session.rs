//! Random agent sessions for property tests: system messages, user messages and tool rounds
//! of random sizes, in a random order.

use compactd_core::compaction::{Message, Part, Role};
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Clone)]
pub enum Step {
    System(usize),
    User(usize),
    /// An assistant call and its result of this many characters.
    Round(usize),
}

/// A step, each kind with its weight and its largest size in characters:
/// `[(weight, max); 3]` for system, user and round.
pub fn step(kinds: [(u32, usize); 3]) -> impl Strategy<Value = Step> {
    let [system, user, round] = kinds;
    prop_oneof![
        system.0 => (10..system.1).prop_map(Step::System),
        user.0 => (10..user.1).prop_map(Step::User),
        round.0 => (10..round.1).prop_map(Step::Round),
    ]
}

pub fn messages(steps: &[Step]) -> Vec<Message> {
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::System(n) => out.push(Message::text(
                Role::System,
                format!("rule {i}: {}", "s".repeat(*n)),
            )),
            Step::User(n) => out.push(Message::text(
                Role::User,
                format!("ask {i}: {}", "u".repeat(*n)),
            )),
            Step::Round(n) => {
                let id = format!("c{i}");
                out.push(Message {
                    role: Role::Assistant,
                    parts: vec![Part::ToolCall {
                        id: id.clone(),
                        name: "bash".into(),
                        args: json!({"command": format!("cat f{i}.txt")}),
                    }],
                });
                out.push(Message {
                    role: Role::Tool,
                    parts: vec![Part::ToolResult {
                        call_id: id,
                        name: None,
                        // Distinct per step, so a swapped output would show.
                        output: format!("{i}:{}", "o".repeat(*n)),
                        is_error: false,
                    }],
                });
            }
        }
    }
    out
}
