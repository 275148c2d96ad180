//! What the images of a proxied message cost the model, in tokens.
//!
//! compactd reads an image as a note (`[image omitted]`, a few tokens), and the model bills it
//! by its size: Anthropic `width × height / 750` tokens once it fits 1,568 pixels on its long
//! side (about 1,600 at most), OpenAI 85 tokens and 170 a tile of 512 pixels once it fits
//! 2,048 square and 768 on its short side (85 in all at `"detail": "low"`). A screenshot is
//! 1,000 to 1,600 tokens either way, so an agent that takes them (a browser tool, `Read` of a
//! PNG) sent the model a context larger than compactd counted, past its trigger and up to
//! its window: every image's tokens are counted here, from its own dimensions where its
//! bytes are in the request (PNG, JPEG, GIF, WebP read from their headers, decoding only the
//! bytes the header needs) and as the largest an image can cost otherwise (a URL, a file id,
//! a format not read).

use super::wire::Wire;
use serde_json::Value;

/// Anthropic: an image whose long side passes this many pixels is scaled down to it.
const ANTHROPIC_LONG_EDGE: u64 = 1_568;
/// Anthropic: pixels a token.
const ANTHROPIC_PIXELS_PER_TOKEN: u64 = 750;
/// Anthropic: the most an image costs once scaled (and what one not read is counted at).
const ANTHROPIC_MAX: usize = 1_600;
/// OpenAI: what any image costs, and what one of `"detail": "low"` costs in all.
const OPENAI_BASE: usize = 85;
/// OpenAI: what each tile of [`OPENAI_TILE`] pixels square costs besides.
const OPENAI_PER_TILE: usize = 170;
const OPENAI_TILE: u64 = 512;
/// OpenAI: an image is first scaled to fit this square, then its short side to
/// [`OPENAI_SHORT_SIDE`].
const OPENAI_SQUARE: u64 = 2_048;
const OPENAI_SHORT_SIDE: u64 = 768;
/// OpenAI: the most an image costs at high detail (768 × 2,048: eight tiles), what one not
/// read is counted at.
const OPENAI_MAX: usize = OPENAI_BASE + 8 * OPENAI_PER_TILE;
/// How deep a message's JSON is searched for images (tool results hold them two levels
/// down; the parser refuses deeper than 128 anyway).
const MAX_DEPTH: usize = 16;

/// Tokens the images in `native` (one message as the client sent it; for the Responses API,
/// the list of its items) cost the model `wire` speaks to; 0 for a message without any.
pub(crate) fn tokens(native: &Value, wire: Wire) -> usize {
    let mut total = 0;
    each_image(native, MAX_DEPTH, &mut |image| {
        total += match wire {
            Wire::Anthropic => anthropic(image),
            Wire::Chat | Wire::Responses => openai(image),
        }
    });
    total
}

/// Calls `found` with every image block in `value`: Anthropic's `image`, Chat Completions'
/// `image_url`, the Responses API's `input_image`. A tool call's input is the model's JSON,
/// not content: an object there that says `"type": "image"` is not searched.
fn each_image(value: &Value, depth: usize, found: &mut impl FnMut(&Value)) {
    if depth == 0 {
        return;
    }
    match value {
        Value::Object(fields) => match fields.get("type").and_then(Value::as_str) {
            Some("image" | "image_url" | "input_image") => found(value),
            _ => fields
                .iter()
                .filter(|(key, v)| {
                    !matches!(key.as_str(), "input" | "tool_calls" | "arguments")
                        && (v.is_object() || v.is_array())
                })
                .for_each(|(_, v)| each_image(v, depth - 1, found)),
        },
        Value::Array(items) => items.iter().for_each(|v| each_image(v, depth - 1, found)),
        _ => {}
    }
}

/// An Anthropic image block's cost.
fn anthropic(block: &Value) -> usize {
    let source = &block["source"];
    let data = match source["type"].as_str() {
        Some("base64") => source["data"].as_str(),
        _ => None,
    };
    match data.and_then(|data| dimensions(&Base64(data.as_bytes()))) {
        Some((width, height)) => anthropic_tokens(width, height),
        None => ANTHROPIC_MAX,
    }
}

/// An image of `width` × `height` pixels to Anthropic: scaled to fit its long edge, a token
/// a [`ANTHROPIC_PIXELS_PER_TOKEN`] pixels, at most [`ANTHROPIC_MAX`].
fn anthropic_tokens(width: u64, height: u64) -> usize {
    let (width, height) = fit(width, height, ANTHROPIC_LONG_EDGE, ANTHROPIC_LONG_EDGE);
    let tokens = (width * height).div_ceil(ANTHROPIC_PIXELS_PER_TOKEN);
    (tokens as usize).clamp(1, ANTHROPIC_MAX)
}

/// A Chat Completions `image_url` or Responses `input_image` part's cost.
fn openai(part: &Value) -> usize {
    // Chat: {"image_url": {"url", "detail"}}; Responses: {"image_url": "...", "detail"}.
    let (url, detail) = match &part["image_url"] {
        Value::Object(inner) => (
            inner.get("url").and_then(Value::as_str),
            inner.get("detail").and_then(Value::as_str),
        ),
        other => (other.as_str(), part["detail"].as_str()),
    };
    if detail == Some("low") {
        return OPENAI_BASE;
    }
    let data = url
        .and_then(|url| url.strip_prefix("data:"))
        .and_then(|rest| {
            let (kind, data) = rest.split_once(',')?;
            kind.ends_with(";base64").then_some(data)
        });
    match data.and_then(|data| dimensions(&Base64(data.as_bytes()))) {
        Some((width, height)) => openai_tokens(width, height),
        None => OPENAI_MAX,
    }
}

/// An image of `width` × `height` pixels to OpenAI at high detail.
fn openai_tokens(width: u64, height: u64) -> usize {
    let (width, height) = fit(width, height, OPENAI_SQUARE, OPENAI_SQUARE);
    let short = width.min(height);
    let (width, height) = match short > OPENAI_SHORT_SIDE {
        true => (
            (width * OPENAI_SHORT_SIDE).div_ceil(short),
            (height * OPENAI_SHORT_SIDE).div_ceil(short),
        ),
        false => (width, height),
    };
    let tiles = width.div_ceil(OPENAI_TILE) * height.div_ceil(OPENAI_TILE);
    (OPENAI_BASE + OPENAI_PER_TILE * tiles as usize).min(OPENAI_MAX)
}

/// `width` × `height` scaled down (aspect kept) to fit `max_width` × `max_height`.
fn fit(width: u64, height: u64, max_width: u64, max_height: u64) -> (u64, u64) {
    let (width, height) = (width.max(1), height.max(1));
    if width <= max_width && height <= max_height {
        return (width, height);
    }
    // Scaled by the smaller of the two ratios, in integers: max/width < max/height.
    match width * max_height >= height * max_width {
        true => (max_width, (height * max_width / width).max(1)),
        false => ((width * max_height / height).max(1), max_height),
    }
}

/// An image's width and height from its first bytes: PNG, GIF, WebP or JPEG; `None` for
/// anything else, or bytes that are not what they claim.
fn dimensions(bytes: &Base64) -> Option<(u64, u64)> {
    let head = bytes.range(0, 30)?;
    let dims = if head.starts_with(b"\x89PNG\r\n\x1a\n") && &head[12..16] == b"IHDR" {
        (be(&head[16..20]), be(&head[20..24]))
    } else if head.starts_with(b"GIF8") {
        (le(&head[6..8]), le(&head[8..10]))
    } else if head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        webp(&head)?
    } else if head.starts_with(b"\xff\xd8") {
        jpeg(bytes)?
    } else {
        return None;
    };
    (dims.0 > 0 && dims.1 > 0).then_some(dims)
}

/// A WebP's canvas from its first 30 bytes (lossy `VP8 `, lossless `VP8L`, extended `VP8X`).
fn webp(head: &[u8]) -> Option<(u64, u64)> {
    match &head[12..16] {
        b"VP8 " => Some((le(&head[26..28]) & 0x3fff, le(&head[28..30]) & 0x3fff)),
        b"VP8L" => {
            let bits = le(&head[21..25]);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => Some((le(&head[24..27]) + 1, le(&head[27..30]) + 1)),
        _ => None,
    }
}

/// A JPEG's size from its frame header (SOF), walking the segments before it by their
/// lengths: only the segments' heads are decoded, however large the metadata before them.
fn jpeg(bytes: &Base64) -> Option<(u64, u64)> {
    let mut at = 2;
    for _ in 0..1_000 {
        let marker = bytes.range(at, 2)?;
        if marker[0] != 0xff {
            return None;
        }
        match marker[1] {
            // Fill bytes, then markers without a length.
            0xff => at += 1,
            0x01 | 0xd0..=0xd7 => at += 2,
            0xc0..=0xc3 | 0xc5..=0xc7 | 0xc9..=0xcb | 0xcd..=0xcf => {
                let frame = bytes.range(at + 5, 4)?;
                return Some((be(&frame[2..4]), be(&frame[0..2])));
            }
            // The image's data begins (or it ends) before any frame header: not a JPEG.
            0xd9 | 0xda => return None,
            _ => at += 2 + be(&bytes.range(at + 2, 2)?) as usize,
        }
    }
    None
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, &b| n << 8 | u64::from(b))
}

fn le(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |n, &b| n << 8 | u64::from(b))
}

/// Standard base64 text read at any byte offset, decoding only the 4-character groups that
/// hold the bytes asked for (an image's header, a JPEG's segment heads).
struct Base64<'a>(&'a [u8]);

impl Base64<'_> {
    /// `len` bytes from `offset`; `None` past the end or over a character that is not base64.
    fn range(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len + 3);
        let mut group = offset / 3;
        while out.len() < offset % 3 + len {
            let chars = self.0.get(group * 4..group * 4 + 4)?;
            let mut n: u32 = 0;
            let mut bytes = 3;
            for (i, &c) in chars.iter().enumerate() {
                let value = match c {
                    b'A'..=b'Z' => c - b'A',
                    b'a'..=b'z' => c - b'a' + 26,
                    b'0'..=b'9' => c - b'0' + 52,
                    b'+' | b'-' => 62,
                    b'/' | b'_' => 63,
                    b'=' if i >= 2 => {
                        bytes = bytes.min(i - 1);
                        0
                    }
                    _ => return None,
                };
                n = n << 6 | u32::from(value);
            }
            out.extend_from_slice(&n.to_be_bytes()[1..1 + bytes]);
            if bytes < 3 {
                break;
            }
            group += 1;
        }
        let start = offset % 3;
        out.get(start..start + len).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Standard base64, as SDKs write an image's bytes.
    fn base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..4 {
                match i <= chunk.len() {
                    true => out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char),
                    false => out.push('='),
                }
            }
        }
        out
    }

    /// A PNG's signature and header chunk (all a reader of its size needs), then some data.
    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
        bytes.extend([0x42; 100]);
        bytes
    }

    fn jpeg_bytes(width: u16, height: u16, metadata: usize) -> Vec<u8> {
        let mut bytes = vec![0xff, 0xd8];
        // An APP1 (EXIF) segment of `metadata` bytes, then a quantization table, then SOF2.
        bytes.extend([0xff, 0xe1]);
        bytes.extend(((metadata + 2) as u16).to_be_bytes());
        bytes.extend(std::iter::repeat_n(0x11, metadata));
        bytes.extend([0xff, 0xdb, 0x00, 0x04, 0x00, 0x01]);
        bytes.extend([0xff, 0xc2, 0x00, 0x11, 0x08]);
        bytes.extend(height.to_be_bytes());
        bytes.extend(width.to_be_bytes());
        bytes.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1, 0xff, 0xda]);
        bytes
    }

    fn read(bytes: &[u8]) -> Option<(u64, u64)> {
        dimensions(&Base64(base64(bytes).as_bytes()))
    }

    #[test]
    fn each_format_tells_its_size_from_its_header() {
        assert_eq!(read(&png(1366, 768)), Some((1366, 768)));
        let mut gif = b"GIF89a".to_vec();
        gif.extend([0x56, 0x05, 0x00, 0x03, 0, 0, 0, 0]);
        gif.extend([0; 20]);
        assert_eq!(read(&gif), Some((1366, 768)));
        // A JPEG's frame header behind 60 KB of EXIF: found by the segments' lengths.
        assert_eq!(read(&jpeg_bytes(4032, 3024, 60_000)), Some((4032, 3024)));
        let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
        vp8x.extend([0x55, 0x05, 0x00, 0xff, 0x02, 0x00]);
        assert_eq!(read(&vp8x), Some((1366, 768)));
        let mut vp8l = b"RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f".to_vec();
        let bits: u32 = (1366 - 1) | (768 - 1) << 14;
        vp8l.extend(bits.to_le_bytes());
        vp8l.extend([0; 8]);
        assert_eq!(read(&vp8l), Some((1366, 768)));
        // Not an image, or cut short: not read.
        assert_eq!(read(b"hello, this is not an image at all"), None);
        assert_eq!(read(&png(1366, 768)[..20]), None);
        assert_eq!(
            dimensions(&Base64(b"not base64 at all!!! ...........")),
            None
        );
    }

    #[test]
    fn a_range_decodes_at_any_offset_and_stops_at_the_padding() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = base64(&bytes[..100]);
        let decoded = Base64(text.as_bytes());
        for offset in [0, 1, 2, 3, 50, 97] {
            assert_eq!(
                decoded.range(offset, 3),
                Some(bytes[offset..offset + 3].to_vec())
            );
        }
        assert_eq!(decoded.range(98, 2), Some(vec![98, 99]));
        assert_eq!(decoded.range(99, 2), None, "past the end");
    }

    #[test]
    fn the_providers_formulas() {
        // A 1366 × 768 screenshot: Anthropic 1366 × 768 / 750; OpenAI 3 × 2 tiles.
        assert_eq!(anthropic_tokens(1366, 768), 1_399);
        assert_eq!(openai_tokens(1366, 768), 85 + 170 * 6);
        // A phone photo: Anthropic scales it to 1568 wide and caps it; OpenAI to 2048, then
        // 768 on its short side (1024 × 768: 2 × 2 tiles).
        assert_eq!(anthropic_tokens(4032, 3024), 1_600);
        assert_eq!(openai_tokens(4032, 3024), 85 + 170 * 4);
        // Small images cost little, never nothing.
        assert_eq!(anthropic_tokens(10, 10), 1);
        assert_eq!(openai_tokens(10, 10), 85 + 170);
    }

    #[test]
    fn images_are_found_where_each_api_puts_them_and_counted_as_it_bills() {
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

    /// Each API's reader counts every message's images beside it (the Responses API's per
    /// run of items that make one message), and nothing for a message without any.
    #[test]
    fn each_api_reader_counts_its_messages_images() {
        let data = base64(&png(1366, 768));
        let url = format!("data:image/png;base64,{data}");
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
        let mut anthropic = json!({"model": "claude", "max_tokens": 10, "messages": [
            {"role": "user", "content": "Look."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image, image]}]}]});
        let read = Wire::Anthropic.parse_value(&mut anthropic).unwrap();
        assert_eq!(read.image_tokens, [0, 0, 2 * 1_399]);
        let mut chat = json!({"model": "gpt", "messages": [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": [{"type": "text", "text": "Look."}, {"type": "image_url", "image_url": {"url": url}}]}]});
        let read = Wire::Chat.parse_value(&mut chat).unwrap();
        assert_eq!(read.image_tokens, [0, 1_105]);
        let mut responses = json!({"model": "gpt", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look."}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_image", "image_url": url, "detail": "low"}]}]});
        let read = Wire::Responses.parse_value(&mut responses).unwrap();
        assert_eq!(read.messages.len(), read.image_tokens.len());
        assert_eq!(read.image_tokens.iter().sum::<usize>(), 85);
        assert_eq!(read.image_tokens[0], 0);
    }
}
