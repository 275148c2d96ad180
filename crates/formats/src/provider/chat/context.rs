//! OpenAI Chat Completions `messages`: system and user text as `content` strings, assistant
//! `tool_calls` (`arguments` a JSON string), and one `role: "tool"` message per result right
//! after the assistant message that called it. DeepSeek and other OpenAI-compatible APIs take
//! the same shape.

use crate::message::Message;
use crate::provider::{Turn, Turns, api_id, api_name};
use serde_json::{Value, json};

/// `messages` ready for `POST /v1/chat/completions`.
pub fn messages(conversation: &[Message]) -> Vec<Value> {
    let mut out = Vec::with_capacity(conversation.len());
    for turn in Turns::of(conversation).0 {
        match turn {
            Turn::System(text) => out.push(json!({"role": "system", "content": text})),
            Turn::User(text) => out.push(json!({"role": "user", "content": text})),
            Turn::Assistant {
                text,
                calls,
                results,
            } => {
                let mut message = json!({
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { Value::String(text) },
                });
                if !calls.is_empty() {
                    message["tool_calls"] = calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": api_id(&c.id),
                                "type": "function",
                                "function": {"name": api_name(&c.name), "arguments": arguments(&c.args)},
                            })
                        })
                        .collect();
                }
                out.push(message);
                for r in results {
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": api_id(&r.call_id),
                        "content": r.output,
                    }));
                }
            }
        }
    }
    out
}

/// A call's arguments as the JSON string the API wants; a string is taken as already
/// serialized, missing arguments are `{}`.
pub(super) fn arguments(args: &Value) -> String {
    match args {
        Value::String(s) => s.clone(),
        Value::Null => "{}".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Part, Role};
    use crate::provider::fixtures::{call, result};

    #[test]
    fn calls_are_followed_by_their_results_and_text_stays_where_it_was() {
        let conversation = vec![
            Message::text(Role::System, "be brief"),
            Message::text(Role::User, "list files"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning { text: "hmm".into() },
                    Part::Text {
                        text: "Listing.".into(),
                    },
                    call("a"),
                    call("b"),
                ],
            },
            // Anthropic-style: results inside a user message, in another order, with text.
            Message {
                role: Role::User,
                parts: vec![
                    result("b", "B"),
                    result("a", "A"),
                    Part::Text {
                        text: "thanks".into(),
                    },
                ],
            },
            Message {
                role: Role::Assistant,
                parts: vec![call("c")],
            },
        ];
        let out = messages(&conversation);
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "user",
                "assistant"
            ]
        );
        assert_eq!(out[2]["content"], "Listing.");
        assert_eq!(
            out[2]["tool_calls"][1]["function"]["arguments"],
            r#"{"command":"ls"}"#
        );
        assert_eq!(
            (out[3]["tool_call_id"].as_str(), out[3]["content"].as_str()),
            (Some("a"), Some("A"))
        );
        assert_eq!(out[4]["tool_call_id"], "b");
        assert_eq!(out[5]["content"], "thanks");
        // The last call is the agent's to answer.
        assert_eq!(out[6]["content"], Value::Null);
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn an_unanswered_call_before_the_end_is_answered_and_a_stray_result_becomes_text() {
        let conversation = vec![
            Message::text(Role::User, "go"),
            Message {
                role: Role::Assistant,
                parts: vec![call("x")],
            },
            Message::text(Role::User, "stop, do something else"),
            Message {
                role: Role::Tool,
                parts: vec![result("zz", "late output")],
            },
        ];
        let out = messages(&conversation);
        assert_eq!(out[2]["role"], "tool");
        assert_eq!(out[2]["content"], crate::provider::turns::NO_RESULT);
        assert_eq!(out[3]["content"], "stop, do something else");
        assert_eq!(out[4]["role"], "user");
        assert!(out[4]["content"].as_str().unwrap().contains("late output"));
    }
}
