//! What the images and documents of a proxied message cost the model, in tokens: compactd
//! keeps such a block as a note of a few tokens (`[image omitted]`), and the model bills it by
//! what it holds (an image by its size: [`super::images`]; a PDF by its pages:
//! [`super::documents`]). Each API's reader counts every message's media beside its text.

use super::wire::Wire;
use super::{documents, images};
use crate::compaction::media::Media;
use serde_json::Value;

/// How deep a message's JSON is searched for media (tool results hold them two levels down;
/// the parser refuses deeper than 128 anyway).
const MAX_DEPTH: usize = 16;

/// What the images and documents in `native` (one message as the client sent it; for the
/// Responses API, the list of its items) cost the model `wire` speaks to, by where they sit
/// (outside tool results, or in the result of each call: see [`Media`]); empty for a message
/// without any.
pub fn measure(native: &Value, wire: Wire) -> Media {
    measure_all([native], wire)
}

/// The same for the items that make one message of the Responses API, together.
pub fn measure_all<'a>(natives: impl IntoIterator<Item = &'a Value>, wire: Wire) -> Media {
    let mut media = Media::default();
    let mut found = |block: &Value, kind, result: Option<&str>| {
        let tokens = match (kind, wire) {
            (Medium::Image, Wire::Anthropic) => images::anthropic(block),
            (Medium::Image, Wire::Chat | Wire::Responses) => images::openai(block),
            (Medium::Document, _) => documents::tokens(block),
        };
        match result {
            None => media.outside += tokens,
            Some(id) => match media.results.iter_mut().find(|(call, _)| call == id) {
                Some((_, n)) => *n += tokens,
                None => media.results.push((id.to_string(), tokens)),
            },
        }
    };
    for native in natives {
        each_medium(native, MAX_DEPTH, None, &mut found);
    }
    media
}

/// The kinds of block counted here.
#[derive(Debug, Clone, Copy)]
enum Medium {
    Image,
    Document,
}

/// Calls `found` with every image block in `value` (Anthropic's `image`, Chat Completions'
/// `image_url`, the Responses API's `input_image`) and every document (Anthropic's
/// `document`, Chat's `file`, Responses' `input_file`), and the id of the call whose result
/// holds it, if one does (`result`: Anthropic's `tool_result` block, Chat's `tool` message,
/// the Responses API's `…_output` item). A tool call's input is the model's JSON, not
/// content: an object there that says `"type": "image"` is not searched.
fn each_medium<'a>(
    value: &'a Value,
    depth: usize,
    result: Option<&'a str>,
    found: &mut impl FnMut(&Value, Medium, Option<&str>),
) {
    if depth == 0 {
        return;
    }
    match value {
        Value::Object(fields) => {
            let kind = fields.get("type").and_then(Value::as_str);
            match kind {
                Some("image" | "image_url" | "input_image") => found(value, Medium::Image, result),
                Some("document" | "file" | "input_file") => found(value, Medium::Document, result),
                _ => {
                    let result = result.or_else(|| result_of(fields, kind));
                    fields
                        .iter()
                        .filter(|(key, v)| {
                            !matches!(key.as_str(), "input" | "tool_calls" | "arguments")
                                && (v.is_object() || v.is_array())
                        })
                        .for_each(|(_, v)| each_medium(v, depth - 1, result, found))
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| each_medium(v, depth - 1, result, found)),
        _ => {}
    }
}

/// The call id of a tool's result, when `fields` (of type `kind`) are one.
fn result_of<'a>(
    fields: &'a serde_json::Map<String, Value>,
    kind: Option<&str>,
) -> Option<&'a str> {
    let key = match kind {
        Some("tool_result") => "tool_use_id",
        Some(kind) if kind.ends_with("_output") => "call_id",
        _ if fields.get("role").and_then(Value::as_str) == Some("tool") => "tool_call_id",
        _ => return None,
    };
    fields.get(key).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::base64_text::tests::encoded as base64;
    use crate::provider::documents::PAGE_TOKENS;
    use crate::provider::documents::tests::pdf;
    use crate::provider::images::OPENAI_MAX;
    use crate::provider::images::tests::png;
    use serde_json::json;

    fn tokens(native: &Value, wire: Wire) -> usize {
        measure(native, wire).total()
    }

    fn totals(read: &crate::provider::wire::WireRequest) -> Vec<usize> {
        read.media.iter().map(Media::total).collect()
    }

    #[test]
    fn media_are_found_where_each_api_puts_them_and_counted_as_it_bills() {
        let data = base64(&png(1366, 768));
        // Claude Code: a screenshot in a tool result, and a user's pasted image by URL.
        let anthropic = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "Screenshot taken"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]});
        assert_eq!(tokens(&anthropic, Wire::Anthropic), 1_399 + 1_600);
        let chat = json!({"role": "user", "content": [
            {"type": "text", "text": "What is on screen?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}"), "detail": "low"}}]});
        assert_eq!(tokens(&chat, Wire::Chat), 1_105 + 85);
        let responses = json!([{"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": format!("data:image/png;base64,{data}")},
            {"type": "input_image", "file_id": "file-1"}]}]);
        assert_eq!(tokens(&responses, Wire::Responses), 1_105 + OPENAI_MAX);
        let text_only = json!({"role": "user", "content": "no images: {\"type\": \"image\"}"});
        assert_eq!(tokens(&text_only, Wire::Anthropic), 0);
        // A tool call whose input happens to hold such an object holds no image.
        let call = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
            "name": "draw", "input": {"shapes": [{"type": "image", "source": {}}]}}]});
        assert_eq!(tokens(&call, Wire::Anthropic), 0);
    }

    /// Media inside a tool's result are told from those beside it: a result the context
    /// masks or shortens goes up as text, its media dropped, and the others stay.
    #[test]
    fn media_are_told_by_the_result_that_holds_them() {
        let data = base64(&png(1366, 768));
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
        let anthropic = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [image]},
            {"type": "tool_result", "tool_use_id": "t2", "content": [image, image]},
            {"type": "text", "text": "And this:"}, image]});
        let media = measure(&anthropic, Wire::Anthropic);
        assert_eq!(media.outside, 1_399);
        assert_eq!(
            media.results,
            [("t1".to_string(), 1_399), ("t2".to_string(), 2 * 1_399)]
        );
        let url = format!("data:image/png;base64,{data}");
        let chat_tool = json!({"role": "tool", "tool_call_id": "c1", "content": [
            {"type": "image_url", "image_url": {"url": url}}]});
        assert_eq!(
            measure(&chat_tool, Wire::Chat).results,
            [("c1".to_string(), 1_105)]
        );
        let chat_user =
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]});
        assert_eq!(measure(&chat_user, Wire::Chat).outside, 1_105);
    }

    /// Each API's reader counts every message's images beside it (the Responses API's per
    /// run of items that make one message), and nothing for a message without any.
    #[test]
    fn each_api_reader_counts_its_messages_media() {
        let data = base64(&png(1366, 768));
        let url = format!("data:image/png;base64,{data}");
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
        let mut anthropic = json!({"model": "claude", "max_tokens": 10, "messages": [
            {"role": "user", "content": "Look."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image, image]}]}]});
        let read = Wire::Anthropic.parse_value(&mut anthropic).unwrap();
        assert_eq!(totals(&read), [0, 0, 2 * 1_399]);
        assert_eq!(read.media[2].results, [("t1".to_string(), 2 * 1_399)]);
        let mut chat = json!({"model": "gpt", "messages": [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": [{"type": "text", "text": "Look."}, {"type": "image_url", "image_url": {"url": url}}]}]});
        let read = Wire::Chat.parse_value(&mut chat).unwrap();
        assert_eq!(totals(&read), [0, 1_105]);
        assert_eq!(read.media[1].outside, 1_105);
        let mut responses = json!({"model": "gpt", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look."}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_image", "image_url": url, "detail": "low"}]}]});
        let read = Wire::Responses.parse_value(&mut responses).unwrap();
        assert_eq!(read.messages.len(), read.media.len());
        assert_eq!(totals(&read).iter().sum::<usize>(), 85);
        assert_eq!(totals(&read)[0], 0);
        assert!(
            read.media
                .iter()
                .any(|m| m.results == [("c1".to_string(), 85)])
        );
    }

    /// Claude Code's `Read` of a PDF, as it sends it; Chat's and Responses' inline files.
    #[test]
    fn documents_are_found_where_each_api_puts_them_and_counted_by_their_pages() {
        let data = base64(&pdf(3, true));
        let claude_code = json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": "toolu_01", "content": [
                {"type": "text", "text": "PDF file read: /work/report.pdf (1.2KB)"},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}]}]});
        assert_eq!(tokens(&claude_code, Wire::Anthropic), 3 * PAGE_TOKENS);
        let url = format!("data:application/pdf;base64,{data}");
        let chat = json!({"role": "user", "content": [
            {"type": "file", "file": {"filename": "report.pdf", "file_data": url}}]});
        assert_eq!(tokens(&chat, Wire::Chat), 3 * PAGE_TOKENS);
        let responses = json!([{"type": "message", "role": "user", "content": [
            {"type": "input_file", "filename": "report.pdf", "file_data": url},
            {"type": "input_file", "file_id": "file-1"}]}]);
        assert_eq!(tokens(&responses, Wire::Responses), 4 * PAGE_TOKENS);
    }
}
