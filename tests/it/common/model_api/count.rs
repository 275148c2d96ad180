//! How the model API counts a request: every character of text it holds (messages, system,
//! instructions, tool definitions), `chars_per_token` to a token, with a few tokens per
//! message for its framing. A model server counts everything it is sent, not only the
//! conversation; and its tokenizer counts code at fewer characters a token than compactd's
//! four (about 2.5: the shared transcripts' own usage figures, docs/EVALUATION.md). Images
//! are billed by their size, as the APIs document, not by their base64 text (see
//! [`crate::common::vision`]).

use serde_json::Value;

/// Tokens of a request body sent to Anthropic's API (`anthropic`) or OpenAI's.
pub fn request_tokens(body: &Value, chars_per_token: usize, anthropic: bool) -> usize {
    let images = crate::common::vision::media_tokens(body, anthropic);
    let body = &crate::common::vision::without_media_data(body);
    let mut chars = 0;
    let mut items = 0;
    for key in [
        "system",
        "messages",
        "tools",
        "input",
        "instructions",
        "tool_choice",
        "response_format",
        "text",
    ] {
        chars += text_chars(&body[key]);
        items += body[key].as_array().map_or(0, Vec::len);
    }
    chars.div_ceil(chars_per_token) + 4 * items + images
}

/// Characters of every string in `value` (keys included for objects: schemas are read whole).
fn text_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| k.len() + text_chars(v)).sum(),
        Value::Number(n) => n.to_string().len(),
        _ => 0,
    }
}
