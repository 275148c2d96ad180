//! [`LazyEstimator`] (SPEC.md 5.5): token estimates without a tokenizer, from character counts.

use super::constants::DEFAULT_TOKENS_PER_CHAR;
use super::prompt::render_args;
use crate::message::{Message, Part};

/// Estimates tokens as characters times `tokens_per_char` (0.25: about four characters a token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LazyEstimator {
    pub tokens_per_char: f64,
}

impl Default for LazyEstimator {
    fn default() -> Self {
        LazyEstimator {
            tokens_per_char: DEFAULT_TOKENS_PER_CHAR,
        }
    }
}

impl LazyEstimator {
    /// Tokens for `chars` characters, rounded up so nothing non-empty costs zero.
    pub fn chars(&self, chars: usize) -> usize {
        (chars as f64 * self.tokens_per_char).ceil() as usize
    }

    pub fn text(&self, text: &str) -> usize {
        self.chars(text.chars().count())
    }

    /// Tokens of everything a model would read of the message: text, reasoning, tool names,
    /// arguments (as JSON) and outputs.
    pub fn message(&self, message: &Message) -> usize {
        let chars: usize = message.parts.iter().map(part_chars).sum();
        self.chars(chars)
    }

    pub fn messages(&self, messages: &[Message]) -> usize {
        messages.iter().map(|m| self.message(m)).sum()
    }
}

/// The characters of `part` the estimate counts.
pub(crate) fn part_chars(part: &Part) -> usize {
    match part {
        Part::Text { text } | Part::Reasoning { text } => text.chars().count(),
        // Arguments are counted as the prompt prints them (a string argument without the
        // quotes and escapes of its JSON form).
        Part::ToolCall { name, args, .. } => {
            name.chars().count() + render_args(args).chars().count()
        }
        Part::ToolResult { output, .. } => output.chars().count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    #[test]
    fn four_characters_make_a_token_and_partial_tokens_round_up() {
        let e = LazyEstimator::default();
        assert_eq!(e.text(""), 0);
        assert_eq!(e.text("abcd"), 1);
        assert_eq!(e.text("abcde"), 2);
        // Characters, not bytes: four 3-byte characters are one token.
        assert_eq!(e.text("日本語字"), 1);
    }

    #[test]
    fn a_message_counts_every_part() {
        let e = LazyEstimator::default();
        let m = Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: "a".repeat(40),
                },
                Part::ToolCall {
                    id: "c".into(),
                    name: "bash".into(),
                    args: serde_json::json!({"command": "ls"}),
                },
            ],
        };
        // 40 + 4 ("bash") + 16 ({"command":"ls"}) = 60 chars
        assert_eq!(e.message(&m), 15);
    }

    #[test]
    fn string_arguments_count_as_the_prompt_prints_them() {
        // An OpenAI-style `arguments` string: 17 characters, not the 23 of its JSON form.
        let args = serde_json::Value::String(r#"{"command": "ls"}"#.into());
        assert_eq!(
            part_chars(&Part::ToolCall {
                id: "c".into(),
                name: "bash".into(),
                args
            }),
            4 + 17
        );
    }
}
