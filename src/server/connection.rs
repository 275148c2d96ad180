//! Serving one connection within bounds.
//!
//! Before hyper sees a connection, its first request head is read here: within
//! `[server] request_timeout_s`, at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`] headers, and parsed with
//! httparse, so a malformed request line, a header flood or an oversized head gets the API's
//! JSON error (400, 431, 408) rather than an empty answer. Then hyper serves the connection,
//! the bytes already read first: keep-alive requests after the first are held to the same
//! head limits by hyper, and a connection that sends nothing for the same time between
//! requests is closed. A client that half-closes after sending still gets its answer.

use super::error::ApiError;
use crate::protocol::ErrorCode;
use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A connection's byte stream: the Unix socket's, or the proxy's loopback TCP listener's.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}
use tokio_util::sync::CancellationToken;

/// The most bytes a request head (request line and headers) may take.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a request may have.
pub const MAX_HEADERS: usize = 64;

/// How long a connection has to send its first request head, and then each next one.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A connection that sends no request within this is closed (on the loopback listener,
    /// a few seconds: idle connections there are any local user's to hoard).
    pub first: Duration,
    /// Every later head, and the idle time between keep-alive requests.
    pub next: Duration,
}

/// Serves `stream` until the client closes it, a timeout hits, or `shutdown` fires (then the
/// request in flight is finished first).
pub async fn serve<S: Stream>(
    mut stream: S,
    app: Router,
    timeouts: Timeouts,
    shutdown: CancellationToken,
) {
    let Timeouts {
        first,
        next: timeout,
    } = timeouts;
    let head = tokio::select! {
        head = tokio::time::timeout(first, read_first_head(&mut stream)) => head,
        _ = shutdown.cancelled() => return,
    };
    let buffered = match head {
        Ok(Ok(Some(buffered))) => buffered,
        // Closed before a request: nothing to answer.
        Ok(Ok(None)) => return,
        Ok(Err(error)) => return refuse(stream, error).await,
        Err(_) => {
            let error = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::Timeout,
                format!(
                    "the request head did not arrive within {} s",
                    first.as_secs()
                ),
            );
            return refuse(stream, error).await;
        }
    };
    let io = TokioIo::new(Rewind {
        prefix: buffered,
        at: 0,
        inner: stream,
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        // Parsed past our limit, so a later request of the connection over it reaches
        // [`head_limits`] and gets the JSON 431, as the first one does.
        .max_headers(MAX_HEADERS * 4)
        .half_close(true)
        .keep_alive(true);
    let connection = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Writes `error` as a complete HTTP response and closes the connection.
pub async fn refuse<S: Stream>(mut stream: S, error: ApiError) {
    let body =
        serde_json::json!({"error": {"code": error.code, "message": error.message}}).to_string();
    let reason = error.status.canonical_reason().unwrap_or("Error");
    let retry = error
        .retry_after
        .map(|s| format!("retry-after: {s}\r\n"))
        .unwrap_or_default();
    let response = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}",
        error.status.as_u16(),
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
    linger(&mut stream).await;
}

/// Reads and drops what the client still sends, for a moment, before the connection closes:
/// closing a socket with unread bytes makes the kernel reset it, and a client still writing
/// (the rest of an oversized head, say) then loses the answer it was sent. Bounded in time
/// and bytes, so a client cannot hold the connection open this way.
async fn linger<S: Stream>(stream: &mut S) {
    const LINGER: Duration = Duration::from_secs(2);
    const MAX_DRAINED: usize = 1 << 20;
    let mut drained = 0;
    let mut sink = [0u8; 8192];
    let _ = tokio::time::timeout(LINGER, async {
        while drained < MAX_DRAINED {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Reads until the first request head is complete and checks it; returns everything read
/// (the head and whatever of the body came with it), or `None` if the client closed first.
async fn read_first_head<S: Stream>(stream: &mut S) -> Result<Option<Vec<u8>>, ApiError> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| ApiError::bad_request(format!("cannot read the request: {e}")))?;
        if n == 0 {
            if buffer.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            return Err(ApiError::bad_request("the request ended inside its head"));
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&buffer) {
            check_head(&buffer[..end])?;
            return Ok(Some(buffer));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err(too_large_head());
        }
    }
}

fn find_head_end(buffer: &[u8]) -> Option<usize> {
    buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// Holds every request of a connection, not only its first, to [`MAX_HEADERS`]: a kept-alive
/// request over it is answered with the JSON 431, and the connection closes after it.
pub async fn head_limits(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if request.headers().len() > MAX_HEADERS {
        let mut refused = too_large_head().into_response();
        refused.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        return refused;
    }
    next.run(request).await
}

fn too_large_head() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ErrorCode::TooLarge,
        format!(
            "the request head is larger than {MAX_HEAD_BYTES} bytes or has more than {MAX_HEADERS} headers"
        ),
    )
}

/// A request head httparse accepts, within the limits.
fn check_head(head: &[u8]) -> Result<(), ApiError> {
    if head.len() > MAX_HEAD_BYTES {
        return Err(too_large_head());
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            if !matches!(request.version, Some(1) | Some(0)) {
                return Err(ApiError::new(
                    StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                    ErrorCode::BadRequest,
                    "only HTTP/1.0 and HTTP/1.1 are served",
                ));
            }
            check_framing(request.headers)
        }
        Ok(httparse::Status::Partial) => Err(ApiError::bad_request("incomplete request head")),
        Err(httparse::Error::TooManyHeaders) => Err(too_large_head()),
        Err(e) => Err(ApiError::bad_request(format!("malformed request: {e}"))),
    }
}

/// Headers that frame the body must be ones hyper can follow, or it would refuse the request
/// without the JSON error: a numeric Content-Length (the same in every copy), and only
/// `chunked` as Transfer-Encoding.
fn check_framing(headers: &[httparse::Header]) -> Result<(), ApiError> {
    let mut length: Option<&[u8]> = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("content-length") {
            let value = header.value.trim_ascii();
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) || value.len() > 19 {
                return Err(ApiError::bad_request(
                    "Content-Length must be a number of bytes",
                ));
            }
            if length.is_some_and(|l| l != value) {
                return Err(ApiError::bad_request("conflicting Content-Length headers"));
            }
            length = Some(value);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding")
            && !header.value.trim_ascii().eq_ignore_ascii_case(b"chunked")
        {
            return Err(ApiError::bad_request(
                "only the chunked Transfer-Encoding is accepted",
            ));
        }
    }
    Ok(())
}

/// A stream that first yields bytes already read from it.
struct Rewind<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: Stream> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            if self.at == self.prefix.len() {
                self.prefix = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: Stream> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_checked() {
        assert!(check_head(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").is_ok());
        let e = check_head(b"GET /health HTTP/9\r\n\r\n").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = check_head(b"GE T /\r\n\r\n").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let flood: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
        let e = check_head(format!("GET / HTTP/1.1\r\n{flood}\r\n").as_bytes()).unwrap_err();
        assert_eq!(e.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            assert_eq!(
                check_head(bad.as_bytes()).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }
}
