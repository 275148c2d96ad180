//! Images as the model APIs bill them, for the mock models: a PNG's size read from its
//! header, then Anthropic's `width × height / 750` tokens once it fits 1,568 pixels on its
//! long side (1,600 at most), or OpenAI's 85 tokens and 170 a 512-pixel tile once it fits
//! 2,048 square and 768 on its short side. An image not read costs the most it can. The
//! image's base64 text is not counted as text: the providers do not read it as such.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

/// A PNG of `width` × `height` (its signature and header chunk, then filler), in base64.
pub fn png_base64(width: u32, height: u32) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 2, 0, 0, 0]);
    bytes.extend([0x5a; 64]);
    STANDARD.encode(bytes)
}

/// Tokens the images in `value` cost: Anthropic's count when `anthropic`, else OpenAI's.
pub fn image_tokens(value: &Value, anthropic: bool) -> usize {
    let mut total = 0;
    each_image(value, &mut |image| {
        let data = match image["type"].as_str() {
            Some("image") => image["source"]["data"].as_str().map(str::to_string),
            _ => {
                let url = image["image_url"]["url"]
                    .as_str()
                    .or(image["image_url"].as_str());
                url.and_then(|u| u.split_once(";base64,").map(|(_, d)| d.to_string()))
            }
        };
        let size = data.and_then(|d| png_size(&d));
        total += match (anthropic, size) {
            (true, Some((w, h))) => {
                let scale = (1568.0 / w.max(h) as f64).min(1.0);
                let (w, h) = ((w as f64 * scale) as u64, (h as f64 * scale) as u64);
                ((w * h).div_ceil(750) as usize).min(1_600)
            }
            (true, None) => 1_600,
            (false, _) if image["image_url"]["detail"] == "low" || image["detail"] == "low" => 85,
            (false, Some((w, h))) => {
                let scale = (2048.0 / w.max(h) as f64).min(1.0);
                let (w, h) = (w as f64 * scale, h as f64 * scale);
                let scale = (768.0 / w.min(h)).min(1.0);
                let (w, h) = ((w * scale).ceil() as u64, (h * scale).ceil() as u64);
                85 + 170 * (w.div_ceil(512) * h.div_ceil(512)) as usize
            }
            (false, None) => 85 + 170 * 8,
        };
    });
    total
}

/// `value` with every image's base64 text taken out (what is counted as text).
pub fn without_image_data(value: &Value) -> Value {
    match value {
        Value::Object(fields) => {
            let is_image = matches!(
                fields.get("type").and_then(Value::as_str),
                Some("image" | "image_url" | "input_image")
            );
            let mut out = serde_json::Map::new();
            for (key, v) in fields {
                let v = match (is_image, key.as_str()) {
                    (true, "source" | "image_url") => Value::Null,
                    _ => without_image_data(v),
                };
                out.insert(key.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(without_image_data).collect()),
        other => other.clone(),
    }
}

fn each_image(value: &Value, found: &mut impl FnMut(&Value)) {
    match value {
        Value::Object(fields) => match fields.get("type").and_then(Value::as_str) {
            Some("image" | "image_url" | "input_image") => found(value),
            _ => fields.values().for_each(|v| each_image(v, found)),
        },
        Value::Array(items) => items.iter().for_each(|v| each_image(v, found)),
        _ => {}
    }
}

fn png_size(data: &str) -> Option<(u64, u64)> {
    let bytes = STANDARD.decode(data).ok()?;
    let header = bytes.get(..24)?;
    (header.starts_with(b"\x89PNG") && &header[12..16] == b"IHDR").then(|| {
        let be = |b: &[u8]| b.iter().fold(0u64, |n, &x| n << 8 | u64::from(x));
        (be(&header[16..20]), be(&header[20..24]))
    })
}
