//! Images and PDFs as the model APIs bill them, for the mock models: a PNG's size read from
//! its header, then Anthropic's `width × height / 750` tokens once it fits 1,568 pixels on
//! its long side (1,600 at most), or OpenAI's 85 tokens and 170 a 512-pixel tile once it fits
//! 2,048 square and 768 on its short side. An image not read costs the most it can. A PDF
//! (Anthropic's `document` block) costs 2,347 tokens a page, what a page of text was measured
//! to cost Claude, its pages those of the tests' own (uncompressed) files. The base64 text is
//! not counted as text: the providers do not read it as such.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use flate2::write::ZlibEncoder;
use flate2::{Compression, Crc};
use serde_json::Value;
use std::io::Write;

/// A PNG of `width` × `height` (its signature and header chunk, then filler), in base64.
pub fn png_base64(width: u32, height: u32) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 2, 0, 0, 0]);
    bytes.extend([0x5a; 64]);
    STANDARD.encode(bytes)
}

/// What a page of a PDF costs the mock.
pub const PDF_PAGE_TOKENS: usize = 2_347;

/// A PDF of `pages` pages of text, in base64.
pub fn pdf_base64(pages: usize) -> String {
    STANDARD.encode(pdf_file(pages))
}

/// A PDF file of `pages` pages of text, each object plain (PDF 1.4).
pub fn pdf_file(pages: usize) -> Vec<u8> {
    let mut objects = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} >>",
            (0..pages)
                .map(|i| format!("{} 0 R", 3 + 2 * i))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    ];
    for i in 0..pages {
        objects.push(format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {} 0 R >>",
            4 + 2 * i
        ));
        let text = format!(
            "BT /F1 12 Tf 72 700 Td (Page {} of the report.) Tj ET",
            i + 1
        );
        objects.push(format!(
            "<< /Length {} >>\nstream\n{text}\nendstream",
            text.len()
        ));
    }
    let mut file = "%PDF-1.4\n".to_string();
    for (n, object) in objects.iter().enumerate() {
        file.push_str(&format!("{} 0 obj\n{object}\nendobj\n", n + 1));
    }
    file.push_str("%%EOF\n");
    file.into_bytes()
}

/// Tokens the images and PDFs in `value` cost: Anthropic's count when `anthropic`, else
/// OpenAI's.
pub fn media_tokens(value: &Value, anthropic: bool) -> usize {
    let mut total = 0;
    each_medium(value, &mut |image| {
        if image["type"] == "document" {
            let data = image["source"]["data"].as_str().unwrap_or_default();
            let pdf = STANDARD.decode(data).unwrap_or_default();
            let text = String::from_utf8_lossy(&pdf);
            let pages = text.matches("/Type /Page ").count().max(1);
            total += pages * PDF_PAGE_TOKENS;
            return;
        }
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

/// `value` with every image's and PDF's base64 text taken out (what is counted as text).
pub fn without_media_data(value: &Value) -> Value {
    match value {
        Value::Object(fields) => {
            let is_image = matches!(
                fields.get("type").and_then(Value::as_str),
                Some("image" | "image_url" | "input_image" | "document")
            );
            let mut out = serde_json::Map::new();
            for (key, v) in fields {
                let v = match (is_image, key.as_str()) {
                    (true, "source" | "image_url") => Value::Null,
                    _ => without_media_data(v),
                };
                out.insert(key.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(without_media_data).collect()),
        other => other.clone(),
    }
}

fn each_medium(value: &Value, found: &mut impl FnMut(&Value)) {
    match value {
        Value::Object(fields) => match fields.get("type").and_then(Value::as_str) {
            Some("image" | "image_url" | "input_image" | "document") => found(value),
            _ => fields.values().for_each(|v| each_medium(v, found)),
        },
        Value::Array(items) => items.iter().for_each(|v| each_medium(v, found)),
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

/// A whole PNG file of `width` × `height` (one bit a pixel, all black; its pixels in stored
/// deflate blocks, uncompressed): what an agent's `Read` of an image finds on disk, about
/// `width × height / 8` bytes.
pub fn png_file(width: u32, height: u32) -> Vec<u8> {
    let row = 1 + (width as usize).div_ceil(8);
    let pixels = vec![0u8; row * height as usize];
    let mut zlib = ZlibEncoder::new(Vec::new(), Compression::none());
    zlib.write_all(&pixels).unwrap();
    let zlib = zlib.finish().unwrap();
    let mut file = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = width.to_be_bytes().to_vec();
    header.extend(height.to_be_bytes());
    header.extend([1, 0, 0, 0, 0]);
    for (kind, data) in [
        (&b"IHDR"[..], header),
        (b"IDAT", zlib),
        (b"IEND", Vec::new()),
    ] {
        file.extend((data.len() as u32).to_be_bytes());
        let mut chunk = kind.to_vec();
        chunk.extend(data);
        let mut crc = Crc::new();
        crc.update(&chunk);
        file.extend(chunk);
        file.extend(crc.sum().to_be_bytes());
    }
    file
}
