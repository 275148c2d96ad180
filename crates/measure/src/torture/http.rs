//! Raw HTTP exchanges over the daemon's socket, for requests no well-behaved client sends.

use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// What came back for a raw request.
#[derive(Debug, Clone)]
pub(super) struct Exchange {
    /// The status code, if a response head came back.
    pub status: Option<u16>,
    pub body: Vec<u8>,
}

impl Exchange {
    /// Whether the body is the API's error shape: `{"error": {"code", "message"}}`.
    pub(super) fn is_json_error(&self) -> bool {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .is_ok_and(|v| v["error"]["code"].is_string() && v["error"]["message"].is_string())
    }
}

/// Sends `request`, closes the write side, and reads the answer (within `timeout`).
pub(super) async fn exchange(socket: &Path, request: &[u8], timeout: Duration) -> Exchange {
    let attempt = async {
        let mut stream = UnixStream::connect(socket).await.ok()?;
        stream.write_all(request).await.ok()?;
        let _ = stream.shutdown().await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        Some(answer)
    };
    let answer = tokio::time::timeout(timeout, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    parse(&answer)
}

/// Splits a raw HTTP/1.1 response into its status and body (de-chunked when chunked).
pub(super) fn parse(answer: &[u8]) -> Exchange {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Exchange {
            status: None,
            body: Vec::new(),
        };
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    let mut body = answer[end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Exchange { status, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..line_end]).trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = &raw[(end + 2).min(raw.len())..];
    }
    out
}

/// A request with a body, as raw bytes.
pub(super) fn request(
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: compactd\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}
