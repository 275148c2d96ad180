//! Serving one connection within bounds.
//!
//! Before hyper sees a connection, its first request head is read here: within the first
//! request's deadline, at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`] headers, and parsed with
//! httparse, so a malformed request line, a header flood or an oversized head gets the API's
//! JSON error (400, 431, 408) rather than an empty answer. Then hyper serves the connection
//! through [`HeadGuard`], which holds every later head to the same check; a failing one,
//! or one that stops arriving, gets the same JSON error. A connection that sends nothing for
//! `[server] request_timeout_s` between requests is closed. A client that half-closes after
//! sending still gets its answer.

use super::error::ApiError;
use super::request_heads::{
    HeadGuard, check_head, find_head_end, head_timed_out, refusal_bytes, too_large_head,
};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A connection's byte stream: the Unix socket's, or the proxy's loopback TCP listener's.
pub(super) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}
use tokio_util::sync::CancellationToken;

pub(super) use super::request_heads::{MAX_HEAD_BYTES, MAX_HEADERS};

/// How long a connection has to send its first request head, and then each next one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    /// A connection that sends no request within this is closed (on the loopback listener,
    /// a few seconds: idle connections there are any local user's to hoard).
    pub first: Duration,
    /// Every later head, and the idle time between keep-alive requests.
    pub next: Duration,
}

/// Serves `stream` until the client closes it, a timeout hits, or `shutdown` fires (then the
/// request in flight is finished first).
pub(super) async fn serve<S: Stream>(
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
        Err(_) => return refuse(stream, head_timed_out(first)).await,
    };
    let mut owed = None;
    serve_checked(
        HeadGuard::new(&mut stream, buffered, timeout, &mut owed),
        app,
        timeout,
        shutdown,
    )
    .await;
    // A later head refused, or timed out while arriving: hyper has said nothing of it.
    if let Some(error) = owed {
        refuse(stream, error).await;
    }
}

/// hyper serves the connection, reading it through its guard.
async fn serve_checked<S: AsyncRead + AsyncWrite + Unpin>(
    guard: HeadGuard<'_, S>,
    app: Router,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let io = TokioIo::new(guard);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        // Above ours: hyper is handed only heads the guard checked, and never answers one
        // with its own empty 431.
        .max_buf_size(2 * MAX_HEAD_BYTES)
        .max_headers(2 * MAX_HEADERS)
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
pub(super) async fn refuse<S: Stream>(mut stream: S, error: ApiError) {
    let response = refusal_bytes(&error);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(&response).await;
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
