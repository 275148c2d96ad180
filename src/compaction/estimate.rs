//! [`LazyEstimator`] (SPEC.md 5.5): token estimates without a tokenizer, from character counts.
//!
//! The spec's four characters a token holds for ASCII text. Outside it a character counts for
//! more ([`counted_chars`]): the models' tokenizers spend half a token to almost two on a
//! Chinese, Japanese or Korean character, a Greek, Hebrew, Arabic, Devanagari or Thai letter, a
//! symbol or an emoji, and a conversation in those reached its model at 3 to 6.6 times the
//! spec's estimate (Russian 1.9; o200k, cl100k and Anthropic's published tokenizer,
//! docs/EVALUATION.md).

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
        self.chars(counted_chars(text))
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

/// The characters of `part` the estimate counts ([`counted_chars`]).
pub(crate) fn part_chars(part: &Part) -> usize {
    match part {
        Part::Text { text } | Part::Reasoning { text } => counted_chars(text),
        // Arguments are counted as the prompt prints them (a string argument without the
        // quotes and escapes of its JSON form).
        Part::ToolCall { name, args, .. } => {
            counted_chars(name) + counted_chars(&render_args(args))
        }
        Part::ToolResult { output, .. } => counted_chars(output),
    }
}

/// The characters of `text` as the estimate counts them ([`char_count`]): ASCII as one
/// each, other characters as two or four. Budgets the engine gives in characters (a shortened
/// output's head and tail) are in these units too.
pub fn counted_chars(text: &str) -> usize {
    // ASCII (most of what agents write) is counted by its length, at no cost.
    if text.is_ascii() {
        return text.len();
    }
    text.chars().map(char_count).sum()
}

/// What one character counts for: one if ASCII; two for a Latin letter with its accents or
/// a Cyrillic one (the tokenizers spend 0.3 to 0.5 tokens on each: about the bytes the
/// origin counts); four, a token of its own, for any other (CJK, Greek, Hebrew, Arabic,
/// Indic and Thai letters, Vietnamese's doubly accented ones, symbols, arrows, emoji: 0.5
/// to 1.8 tokens each).
fn char_count(c: char) -> usize {
    match u32::from(c) {
        0..=0x7F => 1,
        0x80..=0x24F | 0x300..=0x36F | 0x400..=0x52F => 2,
        _ => 4,
    }
}

/// The byte offset in `text` where the characters before it count `n` or more
/// ([`counted_chars`]); the text's length when the whole of it counts less.
pub(crate) fn byte_at_count(text: &str, n: usize) -> usize {
    let mut counted = 0;
    for (at, c) in text.char_indices() {
        if counted >= n {
            return at;
        }
        counted += char_count(c);
    }
    text.len()
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
        // Accented Latin and Cyrillic letters count two, as many as their bytes.
        assert_eq!(e.text("éèêë"), 2);
        assert_eq!(e.text("жжжж"), 2);
        // A CJK character, a Greek letter, an arrow or an emoji is one token on its own.
        assert_eq!(e.text("日本語字"), 4);
        assert_eq!(e.text("한국어"), 3);
        assert_eq!(e.text("カタカナ、"), 5);
        assert_eq!(e.text("αβγ"), 3);
        assert_eq!(e.text("1→🦀"), 3);
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
