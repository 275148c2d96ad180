//! [`LazyEstimator`] (SPEC.md 5.5): token estimates without a tokenizer, from character counts.
//!
//! The spec's four characters a token holds for ASCII words and code. A digit, and a character
//! outside ASCII, counts for more ([`counted_chars`]): the models' tokenizers spend half a token
//! to almost two on a Chinese, Japanese or Korean character, a Greek, Hebrew, Arabic, Devanagari
//! or Thai letter, a symbol or an emoji, and a conversation in those reached its model at 3 to
//! 6.6 times the spec's estimate (Russian 1.9); they never join a digit to a letter and take
//! numbers at most three digits a token, so a lockfile's checksums, a git log's hashes, UUIDs
//! or a table of numbers reached it at 1.8 to 2.7 times (o200k, cl100k and Anthropic's
//! published tokenizer, docs/EVALUATION.md). They start a token where a word or a number
//! follows punctuation (`.get(`, `/usr/lib`, `c3.8-2.3,8.1`) and, o200k by its rule and all
//! of them in practice, where a capital follows a small letter (`camelCase`, base64), so
//! minified code, SVG paths and base64 reached them at 1.4 to 1.9 times what is counted
//! without those.

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

    /// Tokens of `chars` characters left out of `kept` (the middle of an answer too large to
    /// record, which its client sends back whole): counted as `kept`'s own characters count,
    /// since a middle reads like the head and tail kept around it. At a quarter token each, a
    /// Greek or Chinese answer's middle would count a quarter of its estimate.
    pub fn left_out(&self, kept: &Message, chars: usize) -> usize {
        if chars == 0 {
            return 0;
        }
        let (counted, real) = kept.parts.iter().fold((0, 0), |(counted, real), part| {
            let real_chars = part_measured(part, |text| text.chars().count());
            (counted + part_chars(part), real + real_chars)
        });
        let per_char = if real == 0 {
            1.0
        } else {
            counted as f64 / real as f64
        };
        self.chars((chars as f64 * per_char).ceil() as usize)
    }
}

/// The characters of `part` the estimate counts ([`counted_chars`]).
pub fn part_chars(part: &Part) -> usize {
    part_measured(part, counted_chars)
}

/// What `measure` gives for the text of `part` a model reads: its text, or a call's name and
/// arguments as the prompt prints them (a string argument without the quotes and escapes of
/// its JSON form), or an output.
fn part_measured(part: &Part, measure: impl Fn(&str) -> usize) -> usize {
    match part {
        Part::Text { text } | Part::Reasoning { text } => measure(text),
        Part::ToolCall { name, args, .. } => measure(name) + measure(&render_args(args)),
        Part::ToolResult { output, .. } => measure(output),
    }
}

/// The characters of `text` as the estimate counts them ([`Counter`]): ASCII as one each,
/// digits as two, a switch between letters and digits two more, a letter or digit after
/// punctuation two more and a capital after a small letter four more (a token of its own);
/// other characters as two or four. Budgets the engine gives in characters (a shortened
/// output's head and tail) are in these units too.
pub fn counted_chars(text: &str) -> usize {
    if text.is_ascii() {
        return text.len() + ascii_extra(text.as_bytes());
    }
    let mut counter = Counter::default();
    text.chars().for_each(|c| counter.add(c));
    counter.counted
}

/// What ASCII text counts beyond its length: one more for each digit, and [`pair_extra`] for
/// each pair of neighbours. Most of what agents write is ASCII, and every output is counted at
/// least once: the pairs are taken 32 at a time and summed in a byte (four at most each, a
/// digit's one included),
/// which the compiler turns into vector instructions (0.4 to 0.6 ns a byte here, BENCHMARKS.md;
/// a loop carrying the last character's kind took 0.7 when only digits counted).
fn ascii_extra(bytes: &[u8]) -> usize {
    let Some(&first) = bytes.first() else {
        return 0;
    };
    let rest = &bytes[1..];
    let pairs = bytes.chunks(32).zip(rest.chunks(32)).map(|(before, at)| {
        before
            .iter()
            .zip(at)
            .fold(0u8, |sum, (&b, &a)| sum + digit(a) + pair_extra(b, a))
    });
    usize::from(digit(first)) + pairs.map(usize::from).sum::<usize>()
}

/// What byte `a` counts after byte `b`, beyond what it counts on its own (neither outside
/// ASCII's letters, digits and punctuation counts anything): two for a letter and a digit side
/// by side, two for a letter or digit after punctuation, four for a capital after a small
/// letter. The cases exclude one another.
fn pair_extra(b: u8, a: u8) -> u8 {
    let switch = (digit(b) & letter(a)) | (letter(b) & digit(a));
    let after_punctuation = punctuation(b) & (letter(a) | digit(a));
    let capital_after_small = u8::from(b.is_ascii_lowercase()) & u8::from(a.is_ascii_uppercase());
    2 * switch + 2 * after_punctuation + 4 * capital_after_small
}

fn digit(b: u8) -> u8 {
    u8::from(b.is_ascii_digit())
}

fn letter(b: u8) -> u8 {
    u8::from(b.is_ascii_alphabetic())
}

fn punctuation(b: u8) -> u8 {
    u8::from(b.is_ascii_punctuation())
}

/// The byte offset in `text` where the characters before it count `n` or more
/// ([`counted_chars`]); the text's length when the whole of it counts less.
pub fn byte_at_count(text: &str, n: usize) -> usize {
    let mut counter = Counter::default();
    for (at, c) in text.char_indices() {
        if counter.counted >= n {
            return at;
        }
        counter.add(c);
    }
    text.len()
}

/// A text's characters counted in order, each as [`char_count`] says and with what it counts
/// after the character before it ([`pair_extra`]): the tokenizers never join a digit to a
/// letter, so `a3f9` is four tokens, not one, and a git log's hashes, a lockfile's checksums
/// or UUIDs cost the models 2.1 to 2.7 times the spec's estimate and 0.9 to 1.2 times this one.
#[derive(Default)]
struct Counter {
    counted: usize,
    /// The last character, if ASCII (or in Latin-1's upper half, which counts as no letter,
    /// digit or punctuation); else 0.
    last: u8,
}

impl Counter {
    fn add(&mut self, c: char) {
        let b = u8::try_from(c).unwrap_or(0);
        self.counted += char_count(c) + usize::from(pair_extra(self.last, b));
        self.last = b;
    }
}

/// What one character counts for on its own: one if ASCII, but two for a digit (numbers
/// are split into tokens of at most three digits: a third of a token to a whole one each);
/// two for a Latin letter with its accents or a Cyrillic one (the tokenizers spend 0.3 to 0.5
/// tokens on each: about the bytes the origin counts); four, a token of its own, for any
/// other (CJK, Greek, Hebrew, Arabic, Indic and Thai letters, Vietnamese's doubly accented
/// ones, symbols, arrows, emoji: 0.5 to 1.8 tokens each).
fn char_count(c: char) -> usize {
    match u32::from(c) {
        0x30..=0x39 => 2,
        0..=0x7F => 1,
        0x80..=0x24F | 0x300..=0x36F | 0x400..=0x52F => 2,
        _ => 4,
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
    fn digits_count_two_and_a_switch_from_letters_two_more() {
        let e = LazyEstimator::default();
        // "a3f9" is four tokens to a tokenizer, not one; "1234" two.
        assert_eq!(counted_chars("a3f9"), 12);
        assert_eq!(e.text("1234"), 2);
        // cl100k and o200k: 26 tokens, Anthropic's published tokenizer 25; the spec 12.
        assert_eq!(
            e.text("commit 9c1185a5c5e9fc54612808977ee8f548b2258d31"),
            28
        );
        // Outside ASCII's fast path too; an accented letter is no ASCII letter.
        assert_eq!(counted_chars("é1"), 4);
        assert_eq!(counted_chars("é1a"), 7);
        assert_eq!(byte_at_count("ab12cd", 4), 3);
    }

    #[test]
    fn punctuation_before_a_word_and_a_capital_after_a_small_letter_count_more() {
        let e = LazyEstimator::default();
        // o200k 5, cl100k 6, Anthropic's published tokenizer 8; the spec 4, without these 4.
        assert_eq!(counted_chars("foo.barBaz(x)"), 13 + 2 + 4 + 2);
        assert_eq!(e.text("foo.barBaz(x)"), 6);
        // Minified code: o200k 44, cl100k 45, Anthropic's 56 (without these 35).
        let minified = "return is(o,u)?o:u}}function mergeIntoCollectionWith(s,o,i){return \
                        0===(i=i.filter((function(s){return 0!==s.size}))).length?s:0!==s.size";
        assert_eq!(e.text(minified), 49);
        // An SVG path: 24 tokens to all three (without these 10).
        assert_eq!(e.text("c3.8-2.3,8.1-3.5,12.9-3.5"), 16);
        // Base64: 44 to 46 (without these 24).
        assert_eq!(
            e.text("hHfLwuBz0FEjVXx7I4/T1+4TdxKCAtp4McW0AZ8VktUzSS+zDz+yJEMcEwz"),
            37
        );
        // Prose moves little: a word after a space counts as before, a capital after one too.
        assert_eq!(e.text("The parser fails on the third fixture."), 10);
        // Outside ASCII's fast path the same.
        assert_eq!(counted_chars("é.aB"), 2 + 1 + 1 + 2 + 1 + 4);
    }

    proptest::proptest! {
        /// ASCII's vectorized count and the character-by-character one (which cuts texts at
        /// a count) agree, wherever the texts are split.
        #[test]
        fn the_fast_count_agrees_with_the_one_that_cuts(text in "[a-fA-F0-9 \\-./é日]{0,200}") {
            let mut counter = Counter::default();
            text.chars().for_each(|c| counter.add(c));
            proptest::prop_assert_eq!(counter.counted, counted_chars(&text));
            let ascii: String = text.chars().filter(char::is_ascii).collect();
            let mut counter = Counter::default();
            ascii.chars().for_each(|c| counter.add(c));
            proptest::prop_assert_eq!(counter.counted, counted_chars(&ascii));
            proptest::prop_assert_eq!(byte_at_count(&ascii, counted_chars(&ascii) + 1), ascii.len());
        }
    }

    #[test]
    fn what_was_left_out_counts_as_what_was_kept() {
        let e = LazyEstimator::default();
        let kept = |text: &str| Message::text(Role::Assistant, text);
        // English: a quarter token a character, as before.
        assert_eq!(e.left_out(&kept("head tail"), 4_000), 1_000);
        // Greek or Chinese: a token a character, not a quarter.
        assert_eq!(e.left_out(&kept("αβγ"), 4_000), 4_000);
        assert_eq!(e.left_out(&kept("日本語"), 4_000), 4_000);
        assert_eq!(e.left_out(&kept("日本語"), 0), 0);
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
        // 40 + 4 ("bash") + 16 ({"command":"ls"}, and two for each word after a quote) = 64
        assert_eq!(e.message(&m), 16);
    }

    #[test]
    fn string_arguments_count_as_the_prompt_prints_them() {
        // An OpenAI-style `arguments` string: 17 characters (two more for each word after a
        // quote), not the 23 of its JSON form.
        let args = serde_json::Value::String(r#"{"command": "ls"}"#.into());
        assert_eq!(
            part_chars(&Part::ToolCall {
                id: "c".into(),
                name: "bash".into(),
                args
            }),
            4 + 17 + 4
        );
    }
}
