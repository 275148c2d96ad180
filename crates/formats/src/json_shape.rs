//! How many JSON objects and arrays a document will unfold into once parsed, and how deep
//! they nest, read without parsing it: what a request body is charged and bounded by before
//! anything of it is parsed (the daemon's body reading).
//!
//! Two kinds are counted. The document's own (brackets outside strings), and those a string
//! may hold: tool call arguments come as JSON *inside* a string (OpenAI's `arguments`), and
//! compactd parses them ([`crate::transcript::parse_arguments`]), so 32 MiB of arguments
//! such as `"[{\"a\":0},{\"a\":0},…]"` would otherwise unfold into gigabytes no count saw.
//! A string that starts with a bracket (written as itself or as a `\u` escape) is counted as
//! JSON: every bracket in it, written either way. That is at least what parsing it makes;
//! a string that does not start with a bracket is never parsed into objects or arrays.

/// The objects and arrays a JSON document holds (see the module), and how deep those outside
/// strings nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    pub containers: usize,
    pub depth: usize,
}

impl Shape {
    /// Every request body passes here, a proxied conversation of tens of thousands of
    /// messages (megabytes, mostly strings) with every call: a string's inside is skipped to
    /// its next quote or backslash with `memchr`, not looked at byte by byte (that loop took
    /// 8% of the daemon's time on such a call); only strings that start as JSON are read
    /// through.
    pub fn of(bytes: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let mut depth = 0usize;
        let mut at = 0;
        while let Some(&b) = bytes.get(at) {
            at += 1;
            match b {
                b'"' if opens_json(&bytes[at..]) => {
                    let (end, brackets) = json_string(bytes, at);
                    shape.containers += brackets;
                    at = end;
                }
                b'"' => at = past_string(bytes, at),
                _ => shape.count(&mut depth, b),
            }
        }
        shape
    }

    /// Counts `b`, a byte outside strings, if it opens or closes a container; `depth` is how
    /// deep the containers open before it nest.
    fn count(&mut self, depth: &mut usize, b: u8) {
        match b {
            b'{' | b'[' => {
                self.containers += 1;
                *depth += 1;
                self.depth = self.depth.max(*depth);
            }
            b'}' | b']' => *depth = depth.saturating_sub(1),
            _ => {}
        }
    }
}

/// Whether a string whose inside starts `inside` starts with a bracket, written as itself or
/// escaped.
fn opens_json(inside: &[u8]) -> bool {
    matches!(inside.first(), Some(b'{' | b'['))
        || inside.get(..2) == Some(b"\\u") && inside.get(2..6).is_some_and(escaped_bracket)
}

/// Whether the four hex digits of a `\u` escape are `{` or `[`.
fn escaped_bracket(hex: &[u8]) -> bool {
    hex.eq_ignore_ascii_case(b"007b") || hex.eq_ignore_ascii_case(b"005b")
}

/// Where the string whose inside starts at `at` ends (just past its closing quote; past the
/// end if it never closes), and how many brackets it holds, written either way.
fn json_string(bytes: &[u8], mut at: usize) -> (usize, usize) {
    let mut brackets = 0;
    while let Some(&b) = bytes.get(at) {
        match b {
            b'"' => return (at + 1, brackets),
            b'{' | b'[' => {
                brackets += 1;
                at += 1;
            }
            b'\\' => {
                let escape = bytes.get(at + 1..at + 6);
                if escape.is_some_and(|e| e[0] == b'u' && escaped_bracket(&e[1..])) {
                    brackets += 1;
                    at += 6;
                } else {
                    at += 2;
                }
            }
            _ => at += 1,
        }
    }
    (bytes.len(), brackets)
}

/// Where the string whose inside starts at `at` ends (just past its closing quote; past the
/// end if it never closes): an escaped byte, a quote too, never closes it.
fn past_string(bytes: &[u8], mut at: usize) -> usize {
    while let Some(rest) = bytes.get(at..) {
        match memchr::memchr2(b'"', b'\\', rest) {
            Some(found) if rest[found] == b'"' => return at + found + 1,
            Some(found) => at += found + 2,
            None => break,
        }
    }
    bytes.len()
}

/// The objects and arrays in a parsed value, itself included.
#[cfg(test)]
pub fn containers(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(containers).sum::<usize>(),
        serde_json::Value::Object(map) => 1 + map.values().map(containers).sum::<usize>(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn the_shape_counts_containers_outside_strings_and_in_strings_that_are_json() {
        let body = br#"{"messages": [{"role": "user", "content": "a {[\"]} b"}, {"x": [1, [2]]}]}"#;
        assert_eq!(
            Shape::of(body),
            Shape {
                containers: 6,
                depth: 5
            }
        );
        let deep = "[".repeat(5_000);
        assert_eq!(Shape::of(deep.as_bytes()).depth, 5_000);
        // Arguments in a string, as OpenAI sends them, brackets escaped or not.
        let call = json!({"arguments": "[{\"a\":0},{\"b\":[1]}]"}).to_string();
        assert_eq!(Shape::of(call.as_bytes()).containers, 1 + 4);
        let escaped = r#"{"arguments": "\u005b{\"a\":0},\u007B\"b\":\u005B1]}]"}"#;
        assert_eq!(Shape::of(escaped.as_bytes()).containers, 1 + 4);
    }

    /// The shape as it was first read, a byte at a time (strings entered and left byte by
    /// byte, none read as JSON).
    fn shape_byte_by_byte(bytes: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &b in bytes {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                _ => shape.count(&mut depth, b),
            }
        }
        shape
    }

    proptest::proptest! {
        /// Skipping strings finds what reading every byte finds, in any bytes: escapes at the
        /// end, unclosed strings, brackets and quotes inside strings, stray closers; strings
        /// that open as JSON only add to it.
        #[test]
        fn skipping_strings_reads_the_same_shape(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(b"\"".to_vec()),
                    proptest::strategy::Just(b"\\".to_vec()),
                    proptest::strategy::Just(b"\\\"".to_vec()),
                    proptest::strategy::Just(b"{[".to_vec()),
                    proptest::strategy::Just(b"]}".to_vec()),
                    proptest::collection::vec(proptest::num::u8::ANY, 0..40),
                ],
                0..40,
            )
        ) {
            let body = pieces.concat();
            let read = Shape::of(&body);
            let plain = shape_byte_by_byte(&body);
            proptest::prop_assert_eq!(read.depth, plain.depth);
            proptest::prop_assert!(read.containers >= plain.containers);
            let quoteless: Vec<u8> = body.iter().copied().filter(|&b| b != b'"').collect();
            proptest::prop_assert_eq!(Shape::of(&quoteless), shape_byte_by_byte(&quoteless));
        }

        /// Whatever a string holds, parsing it as arguments makes no more objects and arrays
        /// than the shape counted in it.
        #[test]
        fn arguments_in_a_string_unfold_into_no_more_than_counted(
            value in arb_json(),
            lead in proptest::prop_oneof![
                proptest::strategy::Just(""),
                proptest::strategy::Just(" "),
                proptest::strategy::Just("\n"),
            ],
            escape_brackets: bool,
        ) {
            let text = format!("{lead}{value}");
            let mut encoded = Value::String(text.clone()).to_string();
            if escape_brackets {
                encoded = encoded.replace('{', "\\u007b").replace('[', "\\u005B");
            }
            let parsed = crate::transcript::parse_arguments(&Value::String(text));
            proptest::prop_assert!(
                containers(&parsed) <= Shape::of(encoded.as_bytes()).containers,
                "{} unfolds into {} > {}", encoded, containers(&parsed), Shape::of(encoded.as_bytes()).containers
            );
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i32>().prop_map(Value::from),
            "[a-z{}\\[\\]\" ]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\\[{]{0,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
