//! Pinned messages: the instructions a session is run by, never summarized away.
//!
//! System messages, and the session's task (its first user instruction) when it is at most
//! `pin_first_user_tokens`, stay verbatim in every context: once compacted past, they stand in
//! front of the summary, in their original order. They count toward the session's tokens and
//! come out of the room the summary and the tail share, so a context still never exceeds the
//! limit; a session whose pinned messages alone leave no room is refused, not overflowed.

use super::config::CompactionConfig;
use super::instruction::is_instruction;
use crate::message::{Message, Role};

/// Whether a message is pinned; `is_task` says it is the session's first user instruction.
pub fn is_pinned(
    message: &Message,
    tokens: usize,
    is_task: bool,
    config: &CompactionConfig,
) -> bool {
    message.role == Role::System || (is_task && tokens <= config.pin_first_user_tokens)
}

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
        let flags: Vec<bool> = messages
            .iter()
            .zip(tokens)
            .enumerate()
            .map(|(i, (m, &t))| is_pinned(m, t, task == Some(i), config))
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
}
