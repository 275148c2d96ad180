//! A whole JSON answer captured as it streams past, within a bound: every string in it is
//! kept as [`BoundedText`] keeps text (head and tail around a marker past the bound), so a
//! 100 MB answer is recorded in a few MB and still parses; the client gets every byte of it
//! regardless. An answer whose structure alone (outside its strings) passes the bound is
//! not recorded at all: the client's next call carries it.

use super::wire::BoundedText;

/// Captures one JSON document, fed in pieces.
#[derive(Debug, Default)]
pub struct BoundedJson {
    /// What is kept: the document with every string bounded.
    out: Vec<u8>,
    /// The raw bytes of the string being read, not yet decoded.
    raw: Vec<u8>,
    /// The string being read, decoded and bounded.
    text: Option<BoundedText>,
    escape: Escape,
    max_bytes: usize,
    /// Characters dropped from all strings.
    dropped: usize,
    /// Gave up: the structure is too large, or the document is not JSON.
    abandoned: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Escape {
    #[default]
    None,
    /// After a backslash.
    Backslash,
    /// Inside `\uXXXX`, this many hex digits to go.
    Unicode(u8),
}

/// Raw string bytes are decoded in pieces of about this size.
const DECODE_PIECE: usize = 64 * 1024;

impl BoundedJson {
    /// Keeps each string within `max_bytes`, and the whole within about twice that.
    pub fn new(max_bytes: usize) -> BoundedJson {
        BoundedJson {
            max_bytes,
            ..Default::default()
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.abandoned {
                return;
            }
            if self.text.is_none() {
                self.out.push(b);
                if b == b'"' {
                    self.text = Some(BoundedText::default());
                }
                if self.out.len() > 2 * self.max_bytes + 4096 {
                    self.abandon();
                }
                continue;
            }
            self.escape = match (self.escape, b) {
                (Escape::Backslash, b'u') => Escape::Unicode(4),
                (Escape::Backslash, _) => Escape::None,
                (Escape::Unicode(1), _) => Escape::None,
                (Escape::Unicode(n), _) => Escape::Unicode(n - 1),
                (Escape::None, b'\\') => Escape::Backslash,
                (Escape::None, b'"') => {
                    self.end_string();
                    continue;
                }
                (Escape::None, _) => Escape::None,
            };
            self.raw.push(b);
            if self.escape == Escape::None && b < 0x80 && self.raw.len() >= DECODE_PIECE {
                // Best effort: a piece that ends inside a surrogate pair waits for more.
                self.decode(false);
            }
        }
    }

    /// Decodes the raw bytes read so far into the string being read.
    fn decode(&mut self, last: bool) {
        let mut quoted = Vec::with_capacity(self.raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(&self.raw);
        quoted.push(b'"');
        match serde_json::from_slice::<String>(&quoted) {
            Ok(piece) => {
                if let Some(text) = self.text.as_mut() {
                    text.push(&piece, self.max_bytes);
                }
                self.raw.clear();
            }
            Err(_) if last || self.raw.len() > 4 * DECODE_PIECE => self.abandon(),
            Err(_) => {}
        }
    }

    fn end_string(&mut self) {
        self.decode(true);
        if let Some(text) = self.text.take() {
            let (text, dropped) = text.finish_counted(self.max_bytes);
            self.dropped += dropped;
            // The opening quote is in `out` already.
            let encoded = serde_json::to_string(&text).unwrap_or_else(|_| "\"\"".into());
            self.out.extend_from_slice(&encoded.as_bytes()[1..]);
        }
        self.escape = Escape::None;
    }

    fn abandon(&mut self) {
        self.abandoned = true;
        self.out = Vec::new();
        self.raw = Vec::new();
        self.text = None;
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.out.len() + self.raw.len() + self.text.as_ref().map_or(0, BoundedText::len)
    }

    /// The document kept, and how many characters its strings lost; `None` if abandoned or
    /// unfinished.
    pub fn finish(self) -> Option<(Vec<u8>, usize)> {
        (!self.abandoned && self.text.is_none()).then_some((self.out, self.dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn captured(doc: &str, max: usize, cut: usize) -> Option<(Value, usize)> {
        let mut capture = BoundedJson::new(max);
        for piece in doc.as_bytes().chunks(cut) {
            capture.feed(piece);
        }
        let (bytes, dropped) = capture.finish()?;
        Some((serde_json::from_slice(&bytes).unwrap(), dropped))
    }

    #[test]
    fn a_huge_string_keeps_its_head_and_tail_and_the_document_still_parses() {
        let text: String = (0..200_000).map(|i| format!("{i}\n\"é😀\\")).collect();
        let doc = json!({"choices": [{"message": {"role": "assistant", "content": text}}], "usage": {"prompt_tokens": 5}})
            .to_string();
        for cut in [1, 7, 4096, 1 << 20] {
            let (value, dropped) = captured(&doc, 10_000, cut).unwrap();
            let kept = value["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(
                kept,
                crate::provider::wire::bounded(&text, 10_000),
                "cut every {cut} bytes"
            );
            assert!(dropped > 1_000_000);
            assert_eq!(value["usage"]["prompt_tokens"], 5);
        }
        let small = json!({"a": "b\u{1F600}\n", "n": [1, 2.5, null]}).to_string();
        assert_eq!(
            captured(&small, 10_000, 3).unwrap().0,
            serde_json::from_str::<Value>(&small).unwrap()
        );
    }

    #[test]
    fn structure_beyond_the_bound_or_no_json_records_nothing() {
        let wide = format!("[{}1]", "1,".repeat(50_000));
        assert!(captured(&wide, 10_000, 512).is_none());
        assert!(captured("{\"a\": \"unterminated", 10_000, 4).is_none());
    }
}
