//! [`Turns`]: a conversation regrouped the way model APIs want it, each assistant message
//! followed by the results of its calls.

use crate::message::{Message, Part, Role};
use serde_json::Value;
use std::collections::HashMap;

/// What answers a call whose result was never recorded, so a request stays valid.
pub(super) const NO_RESULT: &str = "[no result was recorded for this call]";

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
    /// Call id (as the client gave it) -> the assistant turn still waiting for its result,
    /// and the id its call has there.
    pending: HashMap<String, (usize, String)>,
    /// Every call id given out so far: ids are unique in a request (Anthropic refuses a
    /// repeated `tool_use` id), so a client's reused id is renamed in the later call.
    used: std::collections::HashSet<String>,
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
        let mut calls = calls;
        for call in &mut calls {
            let unique = self.unique(&call.id);
            self.pending.insert(
                std::mem::replace(&mut call.id, unique.clone()),
                (self.turns.len(), unique),
            );
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
            let pending = self.pending.remove(call_id);
            let turn = pending.as_ref().map(|(at, _)| &mut self.turns[*at]);
            if let (Some(Turn::Assistant { results, .. }), Some((_, id))) = (turn, &pending) {
                results.push(CallResult {
                    call_id: id.clone(),
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

impl Builder {
    /// `id`, or, if a call had it already, `id_2` (`_3`, ...): the first one not given out.
    fn unique(&mut self, id: &str) -> String {
        let mut unique = id.to_string();
        let mut n = 1;
        while self.used.contains(&unique) {
            n += 1;
            unique = format!("{id}_{n}");
        }
        self.used.insert(unique.clone());
        unique
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> Message {
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.into(),
                name: "bash".into(),
                args: json!({}),
            }],
        }
    }

    fn result(id: &str, output: &str) -> Message {
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id.into(),
                name: None,
                output: output.into(),
                is_error: false,
            }],
        }
    }

    #[test]
    fn a_reused_call_id_is_renamed_and_its_result_follows_it() {
        let turns = Turns::of(&[
            call("c1"),
            result("c1", "first"),
            call("c1"),
            result("c1", "second"),
        ]);
        let ids: Vec<(String, String, String)> = turns
            .0
            .iter()
            .filter_map(|t| match t {
                Turn::Assistant { calls, results, .. } => Some((
                    calls[0].id.clone(),
                    results[0].call_id.clone(),
                    results[0].output.clone(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            ids,
            [
                ("c1".into(), "c1".into(), "first".into()),
                ("c1_2".into(), "c1_2".into(), "second".into())
            ]
        );
    }
}
