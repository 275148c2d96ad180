//! Pinned messages: the instructions a session is run by, never summarized away.
//!
//! System messages, and the session's task (its first user instruction) when it is at most
//! `pin_first_user_tokens` (with the calls it answers, when it answers those of the message
//! right before it; not at all when it answers calls further back, for a result must never
//! stand without its call), stay verbatim in every context: once compacted past, they stand in
//! front of the summary, in their original order. They count toward the session's tokens and
//! come out of the room the summary and the tail share, so a context still never exceeds the
//! limit; a session whose pinned messages alone leave no room is refused, not overflowed.

use super::config::CompactionConfig;
use super::instruction::is_instruction;
use crate::message::{Message, Role};

/// The pins of a whole session, from its first message: used where a list of messages stands
/// for a session (`compactd plan`, `compactd summarize`); the store decides the same at append.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    /// One flag per message.
    pub flags: Vec<bool>,
    /// Tokens of the pinned messages.
    pub tokens: usize,
    /// Index of the session's task (first user instruction), pinned or not.
    pub task: Option<usize>,
}

impl Pins {
    pub fn of(messages: &[Message], tokens: &[usize], config: &CompactionConfig) -> Pins {
        let task = messages.iter().position(is_instruction);
        // The task with the message before it, when it answers every call of that message and
        // no other ([`Message::task_start`]); never a result without its call.
        let pinned_task = task
            .and_then(|t| {
                let start = Message::task_start(messages, t);
                let answers = messages[t].tool_result_ids().next().is_some();
                (start < t || !answers).then_some(start..t + 1)
            })
            .filter(|range| {
                tokens[range.clone()].iter().sum::<usize>() <= config.pin_first_user_tokens
            });
        let flags: Vec<bool> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.role == Role::System || pinned_task.as_ref().is_some_and(|r| r.contains(&i))
            })
            .collect();
        let tokens = flags
            .iter()
            .zip(tokens)
            .filter(|(pinned, _)| **pinned)
            .map(|(_, t)| t)
            .sum();
        Pins {
            flags,
            tokens,
            task,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Part;

    #[test]
    fn system_messages_and_a_task_within_the_pin_size_are_pinned() {
        let messages = vec![
            Message::text(Role::System, "You are an agent."),
            Message::text(Role::User, "[Request interrupted by user]"),
            Message::text(Role::User, "Fix the bug in parse.rs"),
            Message::text(Role::Assistant, "ok"),
            Message::text(Role::User, "and add a test"),
        ];
        let config = CompactionConfig::default();
        let pins = Pins::of(&messages, &[5, 7, 6, 1, 4], &config);
        assert_eq!(pins.flags, [true, false, true, false, false]);
        assert_eq!(pins.tokens, 11);
        assert_eq!(pins.task, Some(2));
        let small = CompactionConfig {
            pin_first_user_tokens: 5,
            ..config
        };
        let pins = Pins::of(&messages, &[5, 7, 6, 1, 4], &small);
        assert_eq!(
            pins.flags,
            [true, false, false, false, false],
            "task too large"
        );
        assert_eq!(pins.task, Some(2));
    }

    /// A task that answers the calls of the message before it (Claude Code's fork: the
    /// `Agent` call's result beside the directive) is pinned with that message; one that
    /// answers calls further back is not pinned, as the store decides.
    #[test]
    fn a_task_beside_the_results_of_the_calls_before_it_is_pinned_with_them() {
        let call = |id: &str| Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.into(),
                name: "Agent".into(),
                args: serde_json::Value::Null,
            }],
        };
        let directive = |id: &str| Message {
            role: Role::User,
            parts: vec![
                Part::ToolResult {
                    call_id: id.into(),
                    name: None,
                    output: "Fork started".into(),
                    is_error: false,
                },
                Part::Text {
                    text: "Your directive: run the sub-steps".into(),
                },
            ],
        };
        let system = Message::text(Role::System, "You are an agent.");
        let config = CompactionConfig::default();
        let pins = Pins::of(
            &[system.clone(), call("a"), directive("a")],
            &[5, 3, 4],
            &config,
        );
        assert_eq!(pins.flags, [true, true, true]);
        assert_eq!((pins.tokens, pins.task), (12, Some(2)));
        let further_back = [
            system,
            call("a"),
            Message::text(Role::Assistant, "ok"),
            directive("a"),
        ];
        let pins = Pins::of(&further_back, &[5, 3, 1, 4], &config);
        assert_eq!(pins.flags, [true, false, false, false]);
        assert_eq!(pins.task, Some(3));
    }
}
