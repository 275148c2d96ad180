//! [`Turns`]: a conversation regrouped the way model APIs want it, each assistant message
//! followed by the results of its calls.

use crate::message::{Message, Part, Role};
use serde_json::Value;
use std::collections::HashMap;

/// What answers a call whose result was never recorded, so a request stays valid.
pub const NO_RESULT: &str = "[no result was recorded for this call]";

/// One turn of a conversation, in the order it is sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// System text (instructions).
    System(String),
    /// What the user (or a harness speaking as the user) wrote; never empty.
    User(String),
    /// An assistant message and, right after it, the results of its calls in call order.
    Assistant {
        text: String,
        calls: Vec<Call>,
        results: Vec<CallResult>,
    },
}

/// A tool call of an assistant turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub args: Value,
}

/// The result of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub call_id: String,
    pub output: String,
    pub is_error: bool,
}

/// A conversation as turns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Turns(pub Vec<Turn>);

impl Turns {
    /// Regroups `messages`: results move next to their call (the nearest earlier unanswered
    /// call with that id), a result with no such call becomes user text (nothing is dropped),
    /// unanswered calls are answered with [`NO_RESULT`] unless the conversation ends with
    /// them, and reasoning and empty texts are left out.
    pub fn of(messages: &[Message]) -> Turns {
        let mut builder = Builder::default();
        for message in messages {
            match message.role {
                Role::System => builder.system(message),
                Role::Assistant => builder.assistant(message),
                Role::User | Role::Tool => builder.user(message),
            }
        }
        let mut turns = builder.turns;
        let last = turns.len().saturating_sub(1);
        for (i, turn) in turns.iter_mut().enumerate() {
            if let Turn::Assistant { calls, results, .. } = turn {
                order_results(calls, results, i != last);
            }
        }
        Turns(turns)
    }
}

/// Turns being built, message by message.
#[derive(Default)]
struct Builder {
    turns: Vec<Turn>,
    /// Call id -> index of the assistant turn still waiting for its result.
    pending: HashMap<String, usize>,
}

impl Builder {
    fn system(&mut self, message: &Message) {
        let text = joined_text(&message.parts);
        if !text.trim().is_empty() {
            self.turns.push(Turn::System(text));
        }
    }

    fn assistant(&mut self, message: &Message) {
        let calls: Vec<Call> = message
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall { id, name, args } => Some(Call {
                    id: id.clone(),
                    name: name.clone(),
                    args: args.clone(),
                }),
                _ => None,
            })
            .collect();
        let text = joined_text(&message.parts);
        if calls.is_empty() && text.trim().is_empty() {
            return;
        }
        for call in &calls {
            self.pending.insert(call.id.clone(), self.turns.len());
        }
        self.turns.push(Turn::Assistant {
            text,
            calls,
            results: Vec::new(),
        });
    }

    /// A user or tool message: each result goes to its call's turn, or, answering nothing
    /// pending, becomes text of this turn.
    fn user(&mut self, message: &Message) {
        let mut text = joined_text(&message.parts);
        for part in &message.parts {
            let Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } = part
            else {
                continue;
            };
            let turn = self.pending.remove(call_id).map(|at| &mut self.turns[at]);
            if let Some(Turn::Assistant { results, .. }) = turn {
                results.push(CallResult {
                    call_id: call_id.clone(),
                    output: output.clone(),
                    is_error: *is_error,
                });
            } else {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&format!("[result of tool call {call_id}]\n{output}"));
            }
        }
        if !text.trim().is_empty() {
            self.turns.push(Turn::User(text));
        }
    }
}

/// Puts `results` in call order; with `answer_all`, a call without a result gets [`NO_RESULT`].
/// (Each call id has at most one result here: the first one took it off `pending`.)
fn order_results(calls: &[Call], results: &mut Vec<CallResult>, answer_all: bool) {
    let mut found = std::mem::take(results);
    for call in calls {
        match found.iter().position(|r| r.call_id == call.id) {
            Some(at) => results.push(found.swap_remove(at)),
            None if answer_all => results.push(CallResult {
                call_id: call.id.clone(),
                output: NO_RESULT.into(),
                is_error: true,
            }),
            None => {}
        }
    }
}

/// The text parts of a message, joined by blank lines; empty ones left out.
fn joined_text(parts: &[Part]) -> String {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.trim().is_empty() => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n\n")
}
