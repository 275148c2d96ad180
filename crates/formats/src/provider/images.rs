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

use super::base64_text::Base64;
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
pub(super) const OPENAI_MAX: usize = OPENAI_BASE + 8 * OPENAI_PER_TILE;

/// An Anthropic image block's cost.
pub(super) fn anthropic(block: &Value) -> usize {
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
pub(super) fn openai(part: &Value) -> usize {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::provider::base64_text::tests::encoded as base64;

    /// A PNG's signature and header chunk (all a reader of its size needs), then some data.
    pub fn png(width: u32, height: u32) -> Vec<u8> {
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
}
