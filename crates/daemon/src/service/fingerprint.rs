//! What a proxied message is recognised by when a client sends it again: its fingerprint
//! (everything the client re-sends the same) and the fingerprint of its opening (its first
//! paragraph). Both are stored with the message and matched against every later request, so
//! they are a format: the same message must give the same numbers in every build (a test pins
//! them against the way the first builds computed them).
//!
//! A client resends its whole conversation with every call, so these run for every message of
//! every call: they hash the message's pieces straight into the hash, copying nothing.

use crate::fnv::Fnv;
use crate::message::{Message, Part, Role};
use crate::provider::wire::bounded;
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;

/// The fingerprint a proxied message is matched by: its role and what the client re-sends
/// the same whatever its SDK (text without surrounding whitespace, calls, results' outputs),
/// not what SDKs drop or re-encode (reasoning, empty text, a result's tool name). Text is
/// taken as a recording within `bound` keeps it ([`bounded`]), so an answer recorded with its
/// middle cut out matches the whole answer the client sends back.
///
/// The bytes hashed are the role, then the JSON of those parts as [`Part`] serializes them.
pub fn fingerprint(message: &Message, bound: usize) -> i64 {
    let mut hash = Fnv::default();
    hash.feed(message.role.as_str().as_bytes());
    let kept: Vec<Essential> = message
        .parts
        .iter()
        .filter_map(|part| Essential::of(part, bound))
        .collect();
    // Writing into the hash cannot fail, nor can serializing these parts.
    let _ = serde_json::to_writer(&mut hash, &kept);
    hash.finish() as i64
}

/// A part as the fingerprint sees it, borrowed: serialized exactly as the [`Part`] it stands
/// for would be (same tags, same field order, a result without its tool name).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Essential<'a> {
    Text {
        text: Cow<'a, str>,
    },
    ToolCall {
        id: &'a str,
        name: &'a str,
        args: &'a Value,
    },
    ToolResult {
        call_id: &'a str,
        output: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        is_error: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl<'a> Essential<'a> {
    /// `part` as the fingerprint sees it: a text as a recording within `bound` keeps it,
    /// trimmed (borrowed unless it is longer than `bound`).
    fn of(part: &'a Part, bound: usize) -> Option<Essential<'a>> {
        match part {
            Part::Reasoning { .. } => None,
            Part::Text { text } if text.trim().is_empty() => None,
            Part::Text { text } => Some(Essential::Text {
                text: match bounded(text, bound) {
                    Cow::Borrowed(kept) => Cow::Borrowed(kept.trim()),
                    Cow::Owned(kept) => Cow::Owned(kept.trim().to_string()),
                },
            }),
            Part::ToolCall { id, name, args } => Some(Essential::ToolCall { id, name, args }),
            Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } => Some(Essential::ToolResult {
                call_id,
                output,
                is_error: *is_error,
            }),
        }
    }
}

/// The fingerprint of a user message's opening: its role and its first paragraph (up to a
/// blank line, at most 500 characters); `None` for other messages (a task, the only thing
/// openings are compared with, is a user message). Clients put the same instruction back with
/// reminders appended or trailing spaces (aider restoring its history): the opening stays.
pub(crate) fn opening(message: &Message) -> Option<i64> {
    (message.role == Role::User).then(|| opening_of(message))
}

/// The fingerprint of any message's opening.
fn opening_of(message: &Message) -> i64 {
    let mut texts = message.parts.iter().filter_map(|part| match part {
        Part::Text { text } => Some(text.as_str()),
        _ => None,
    });
    // The text parts joined by newlines; most messages have one, which is not copied.
    let joined = match (texts.next(), texts.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(only), None) => Cow::Borrowed(only),
        (Some(_), Some(_)) => Cow::Owned(message.joined_text()),
    };
    let first = joined
        .trim()
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .trim();
    let first = match first.char_indices().nth(OPENING_CHARS) {
        Some((end, _)) => &first[..end],
        None => first,
    };
    let mut hash = Fnv::default();
    hash.feed(message.role.as_str().as_bytes());
    hash.feed(b"\0");
    hash.feed(first.as_bytes());
    hash.finish() as i64
}

/// How much of its first paragraph a message's opening is.
const OPENING_CHARS: usize = 500;

/// The hash of some text (a request's instructions).
pub(crate) fn text_hash(text: &str) -> i64 {
    Fnv::of(text.as_bytes()) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The fingerprint as the first builds computed it (the parts cloned, serialized to a
    /// buffer, the buffer hashed): stored fingerprints were made this way.
    fn fingerprint_as_first_built(message: &Message, bound: usize) -> i64 {
        let essential: Vec<Part> = message
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Reasoning { .. } => None,
                Part::Text { text } if text.trim().is_empty() => None,
                Part::Text { text } => Some(Part::Text {
                    text: bounded(text, bound).trim().to_string(),
                }),
                Part::ToolResult {
                    call_id,
                    output,
                    is_error,
                    ..
                } => Some(Part::ToolResult {
                    call_id: call_id.clone(),
                    name: None,
                    output: output.clone(),
                    is_error: *is_error,
                }),
                other => Some(other.clone()),
            })
            .collect();
        let mut bytes = message.role.as_str().as_bytes().to_vec();
        bytes.extend(serde_json::to_vec(&essential).unwrap_or_default());
        Fnv::of(&bytes) as i64
    }

    /// The opening as the first builds computed it.
    fn opening_as_first_built(message: &Message) -> i64 {
        let text = message.joined_text();
        let first = text.trim().split("\n\n").next().unwrap_or_default();
        let first: String = first.trim().chars().take(500).collect();
        Fnv::of(format!("{}\0{first}", message.role.as_str()).as_bytes()) as i64
    }

    fn text() -> impl Strategy<Value = String> {
        // Blank lines, surrounding spaces, non-ASCII, quotes and long runs: what the opening's
        // and the JSON's edges are made of.
        prop::collection::vec(
            prop_oneof![
                Just("\n\n".to_string()),
                Just("  ".to_string()),
                Just("é\"\\\u{1F600}".to_string()),
                "[a-z ]{0,40}",
                Just("x".repeat(300)),
            ],
            0..8,
        )
        .prop_map(|pieces| pieces.concat())
    }

    fn part() -> impl Strategy<Value = Part> {
        prop_oneof![
            text().prop_map(|text| Part::Text { text }),
            text().prop_map(|text| Part::Reasoning { text }),
            (text(), text()).prop_map(|(id, command)| Part::ToolCall {
                id,
                name: "bash".into(),
                args: json!({"command": command, "n": 3}),
            }),
            (text(), any::<bool>(), text(), any::<bool>()).prop_map(
                |(call_id, named, output, is_error)| Part::ToolResult {
                    call_id,
                    name: named.then(|| "bash".to_string()),
                    output,
                    is_error,
                }
            ),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        (
            prop_oneof![
                Just(Role::User),
                Just(Role::Assistant),
                Just(Role::System),
                Just(Role::Tool)
            ],
            prop::collection::vec(part(), 0..5),
        )
            .prop_map(|(role, parts)| Message { role, parts })
    }

    proptest! {
        #[test]
        fn fingerprints_and_openings_are_what_the_first_builds_stored(
            message in message(),
            bound in prop_oneof![Just(1usize << 20), 10usize..400],
        ) {
            prop_assert_eq!(
                fingerprint(&message, bound),
                fingerprint_as_first_built(&message, bound)
            );
            prop_assert_eq!(opening_of(&message), opening_as_first_built(&message));
            prop_assert_eq!(opening(&message).is_some(), message.role == Role::User);
        }
    }

    #[test]
    fn a_resent_message_has_the_same_fingerprint_and_an_edited_one_does_not() {
        let sent = Message {
            role: Role::Assistant,
            parts: vec![
                Part::Reasoning { text: "hmm".into() },
                Part::Text {
                    text: "done\n".into(),
                },
            ],
        };
        assert_eq!(
            fingerprint(&sent, 1 << 20),
            fingerprint(&Message::text(Role::Assistant, "done"), 1 << 20)
        );
        assert_ne!(
            fingerprint(&sent, 1 << 20),
            fingerprint(&Message::text(Role::Assistant, "done!"), 1 << 20)
        );
        assert_ne!(
            fingerprint(&sent, 1 << 20),
            fingerprint(&Message::text(Role::User, "done"), 1 << 20)
        );
    }

    /// Stored fingerprints are matched against every later call: these values were stored by
    /// the builds of 2026-11 and must never change (a change to `Part`'s JSON would change
    /// the first builds' way of computing them too, so they are pinned as numbers).
    #[test]
    fn fingerprints_stay_what_was_stored() {
        let call = Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "c1".into(),
                name: "bash".into(),
                args: json!({"command": "ls"}),
            }],
        };
        let result = Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "c1".into(),
                name: Some("bash".into()),
                output: "a.rs".into(),
                is_error: true,
            }],
        };
        let task = Message::text(Role::User, "fix the tests");
        assert_eq!(fingerprint(&task, 1 << 20), -674525506178978221);
        assert_eq!(fingerprint(&call, 1 << 20), -8406021641174687293);
        assert_eq!(fingerprint(&result, 1 << 20), 8485085080764525711);
        let with_more = Message::text(Role::User, "fix the tests\n\nand more");
        assert_eq!(opening(&with_more), Some(6224973040103970411));
    }
}
