//! Every request head of a connection, not only its first, checked before hyper reads it.
//!
//! hyper refuses a head over its buffer with an empty `431` of its own, and has no hook to
//! make that answer the API's JSON error. So the connection's bytes pass through
//! [`HeadGuard`] on their way to hyper: it follows the requests' framing (a head, then a
//! body of `Content-Length` bytes or in chunks, then the next head), holds each head back
//! until it is complete, and checks it with [`check_head`] (the same check the first head
//! gets in `connection`). A head that fails is never given to hyper: hyper sees the client
//! end instead and finishes the answers it owes; then `connection` writes the JSON refusal
//! the guard left it, as it does for a first head. A head still arriving when hyper's header
//! timeout ends the connection (hyper would close without a word) is answered with the
//! JSON 408 the same way.

use super::error::ApiError;
use crate::protocol::ErrorCode;
use axum::http::StatusCode;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes a request head (request line and headers) may take.
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a request may have.
pub(super) const MAX_HEADERS: usize = 64;

/// How much is read at a time while a head is expected.
const READ_SIZE: usize = 8192;

/// hyper's header timeout starts when the connection goes idle, a head's first byte a moment
/// later: a head still arriving when hyper closes within this of its timeout was timed out.
const HEAD_TIMEOUT_SLACK: Duration = Duration::from_millis(500);

/// What follows a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body, or what is left of one of known length.
    Length(u64),
    /// A chunked body, at this point of it.
    Chunked(Chunk),
}

/// Where a chunked body is (RFC 9112 §7.1), byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// The chunk-size line; `size` so far, whether a digit came, `ext` once past the digits.
    Size { size: u64, digits: bool, ext: bool },
    /// Chunk data still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd(u8),
    /// Trailer lines after the last chunk; `line` bytes of the current one.
    Trailer { line: usize },
}

/// Where a request head ends (after its blank line), if it has.
pub(super) fn find_head_end(buffer: &[u8]) -> Option<usize> {
    buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

pub(super) fn too_large_head() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ErrorCode::TooLarge,
        format!(
            "the request head is larger than {MAX_HEAD_BYTES} bytes or has more than {MAX_HEADERS} headers"
        ),
    )
}

pub(super) fn head_timed_out(timeout: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        ErrorCode::Timeout,
        format!(
            "the request head did not arrive within {} s",
            timeout.as_secs()
        ),
    )
}

/// A request head httparse accepts, within the limits, and how its body is framed.
pub(super) fn check_head(head: &[u8]) -> Result<Framing, ApiError> {
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
            check_framing(request.headers, request.version == Some(1))
        }
        Ok(httparse::Status::Partial) => Err(ApiError::bad_request("incomplete request head")),
        Err(httparse::Error::TooManyHeaders) => Err(too_large_head()),
        Err(e) => Err(ApiError::bad_request(format!("malformed request: {e}"))),
    }
}

/// Headers that frame the body must be ones hyper can follow, or it would refuse the request
/// without the JSON error: a numeric Content-Length (the same in every copy), and only
/// `chunked` as Transfer-Encoding (which, as in hyper, wins over a Content-Length), and that
/// only in HTTP/1.1 (RFC 9112 §6.1: HTTP/1.0 has no chunked bodies).
fn check_framing(headers: &[httparse::Header], http_11: bool) -> Result<Framing, ApiError> {
    let mut length: Option<&[u8]> = None;
    let mut chunked = false;
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
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http_11 {
                return Err(ApiError::bad_request(
                    "Transfer-Encoding is not accepted in an HTTP/1.0 request; send Content-Length",
                ));
            }
            if !header.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(ApiError::bad_request(
                    "only the chunked Transfer-Encoding is accepted",
                ));
            }
            chunked = true;
        }
    }
    if chunked {
        return Ok(Framing::Chunked(Chunk::Size {
            size: 0,
            digits: false,
            ext: false,
        }));
    }
    // At most 19 digits: it fits.
    let length = length.map_or(0, |l| {
        l.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
    });
    Ok(Framing::Length(length))
}

impl Chunk {
    /// Follows one byte of a chunked body: the next state, or `None` when the body ended with
    /// this byte. A body hyper will refuse anyway (a bad size) ends the scan as `Err`. A size
    /// is refused as hyper refuses it, by its value (over 64 bits), never by its digits:
    /// hyper takes any number of leading zeros, and a size of 19 digits once left every later
    /// head of its connection unchecked.
    fn step(self, byte: u8) -> Result<Option<Chunk>, ()> {
        Ok(Some(match self {
            Chunk::Size { size, digits, ext } => match byte {
                b'\n' if !digits => return Err(()),
                b'\n' if size == 0 => Chunk::Trailer { line: 0 },
                b'\n' => Chunk::Data(size),
                b'\r' => Chunk::Size { size, digits, ext },
                _ if ext => Chunk::Size { size, digits, ext },
                b';' | b' ' | b'\t' => Chunk::Size {
                    size,
                    digits,
                    ext: true,
                },
                _ => {
                    let digit = (byte as char).to_digit(16).ok_or(())?;
                    let size = size.checked_mul(16).ok_or(())?;
                    Chunk::Size {
                        size: size.checked_add(u64::from(digit)).ok_or(())?,
                        digits: true,
                        ext,
                    }
                }
            },
            Chunk::Data(n) if n > 1 => Chunk::Data(n - 1),
            Chunk::Data(_) => Chunk::DataEnd(2),
            Chunk::DataEnd(1) => Chunk::Size {
                size: 0,
                digits: false,
                ext: false,
            },
            Chunk::DataEnd(n) => Chunk::DataEnd(n - 1),
            Chunk::Trailer { line } => match byte {
                b'\n' if line == 0 => return Ok(None),
                b'\n' => Chunk::Trailer { line: 0 },
                b'\r' => Chunk::Trailer { line },
                _ => Chunk::Trailer { line: line + 1 },
            },
        }))
    }
}

/// Where the guard is in the client's byte stream.
#[derive(Debug)]
enum Scan {
    /// Collecting a head (held back from hyper until checked).
    Head,
    /// Passing a body through.
    Body(Framing),
    /// Framing hyper will refuse on its own: bytes pass unjudged until it closes.
    Unjudged,
    /// A head failed its check: hyper is told the client ended.
    Refused,
}

/// The connection's stream as hyper reads it: every head checked first (see the module doc).
pub(super) struct HeadGuard<'a, S: AsyncRead + AsyncWrite + Unpin> {
    inner: S,
    /// The answer the connection still owes the client, read once hyper is done.
    owed: &'a mut Option<ApiError>,
    scan: Scan,
    /// The head being collected.
    head: Vec<u8>,
    /// Bytes checked and not yet given to hyper.
    ready: Vec<u8>,
    at: usize,
    /// Where heads and what follows them are read to be checked: allocated once, on the
    /// first read, so no read zeroes a buffer of its own (that showed in every request).
    incoming: Vec<u8>,
    /// When the first byte of the head being collected came, and how long a head may take.
    head_started: Option<Instant>,
    head_timeout: Duration,
}

impl<'a, S: AsyncRead + AsyncWrite + Unpin> HeadGuard<'a, S> {
    /// Guards `inner`, whose first bytes (a head already checked, and what came after it)
    /// were read into `read`; a later head has `head_timeout` to arrive. When hyper drops the
    /// guard, `owed` holds the JSON error the client is still to be sent, if any.
    pub(super) fn new(
        inner: S,
        read: Vec<u8>,
        head_timeout: Duration,
        owed: &'a mut Option<ApiError>,
    ) -> HeadGuard<'a, S> {
        let mut guard = HeadGuard {
            inner,
            owed,
            scan: Scan::Head,
            head: Vec::new(),
            ready: Vec::with_capacity(read.len()),
            at: 0,
            incoming: Vec::new(),
            head_started: None,
            head_timeout,
        };
        guard.take(&read);
        guard
    }

    /// Follows `bytes` from the client: what is checked goes to `ready`, a head's bytes to
    /// `head` until it is complete.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.scan {
                Scan::Refused => return,
                Scan::Unjudged => {
                    self.ready.extend_from_slice(bytes);
                    return;
                }
                Scan::Body(Framing::Length(left)) => {
                    let n = bytes
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    self.ready.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.scan = Scan::Head;
                    }
                }
                Scan::Body(Framing::Chunked(chunk)) => {
                    let (passed, ended) = follow_chunks(chunk, bytes);
                    self.ready.extend_from_slice(&bytes[..passed]);
                    bytes = &bytes[passed..];
                    if let Some(next) = ended {
                        self.scan = next;
                    }
                }
                Scan::Head => bytes = self.take_head(bytes),
            }
        }
    }

    /// Adds to the head being collected; once complete and checked it is ready for hyper.
    /// Returns what follows the head.
    fn take_head<'b>(&mut self, bytes: &'b [u8]) -> &'b [u8] {
        if self.head.is_empty() {
            self.head_started = Some(Instant::now());
        }
        let from = self.head.len().saturating_sub(3);
        let room = (MAX_HEAD_BYTES + 1).saturating_sub(self.head.len());
        let taken = bytes.len().min(room);
        self.head.extend_from_slice(&bytes[..taken]);
        let Some(end) = find_head_end(&self.head[from..]).map(|e| from + e) else {
            if self.head.len() > MAX_HEAD_BYTES {
                self.refuse(too_large_head());
            }
            return &[];
        };
        // What was taken past the head's end goes back to the scan.
        let rest = &bytes[taken - (self.head.len() - end)..];
        self.head.truncate(end);
        match check_head(&self.head) {
            Ok(framing) => {
                self.ready.extend_from_slice(&self.head);
                self.head.clear();
                self.scan = match framing {
                    Framing::Length(0) => Scan::Head,
                    framing => Scan::Body(framing),
                };
                rest
            }
            Err(error) => {
                self.refuse(error);
                &[]
            }
        }
    }

    fn refuse(&mut self, error: ApiError) {
        tracing::debug!(status = %error.status, message = %error.message, "refused a later request head");
        self.scan = Scan::Refused;
        self.head = Vec::new();
        *self.owed = Some(error);
    }

    /// Part of a head has come and the rest not yet.
    fn head_arriving(&self) -> bool {
        matches!(self.scan, Scan::Head) && !self.head.is_empty()
    }

    /// For a head still arriving when hyper is done, a timeout: hyper ends a connection whose
    /// head does not arrive within its header timeout (counted from when it went idle)
    /// without a word. Ended sooner (by a shutdown), the connection closes as hyper closes it.
    fn timed_out_head(&self) -> Option<ApiError> {
        let waited = self.head_started.map(|t| t.elapsed()).unwrap_or_default();
        (self.head_arriving() && waited + HEAD_TIMEOUT_SLACK >= self.head_timeout)
            .then(|| head_timed_out(self.head_timeout))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Drop for HeadGuard<'_, S> {
    /// A refused head's answer is already owed; else a head that timed out arriving.
    fn drop(&mut self) {
        if self.owed.is_none() {
            *self.owed = self.timed_out_head();
        }
    }
}

/// Follows a chunked body through `bytes`: how many of them belong to it, and what comes
/// next if it ended among them (the next head, or unjudged bytes after a broken framing).
fn follow_chunks(chunk: &mut Chunk, bytes: &[u8]) -> (usize, Option<Scan>) {
    let mut passed = 0;
    while passed < bytes.len() {
        if let Chunk::Data(left) = chunk {
            // A chunk's data passes whole, not byte by byte.
            let n = (bytes.len() - passed).min(usize::try_from(*left).unwrap_or(usize::MAX));
            passed += n;
            *left -= n as u64;
            if *left == 0 {
                *chunk = Chunk::DataEnd(2);
            }
            continue;
        }
        let byte = bytes[passed];
        passed += 1;
        match chunk.step(byte) {
            Ok(Some(state)) => *chunk = state,
            Ok(None) => return (passed, Some(Scan::Head)),
            Err(()) => return (passed, Some(Scan::Unjudged)),
        }
    }
    (passed, None)
}

/// `error` as a complete HTTP response that closes the connection.
pub(super) fn refusal_bytes(error: &ApiError) -> Vec<u8> {
    let body =
        serde_json::json!({"error": {"code": error.code, "message": error.message}}).to_string();
    let reason = error.status.canonical_reason().unwrap_or("Error");
    let retry = error
        .retry_after
        .map(|s| format!("retry-after: {s}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}",
        error.status.as_u16(),
        body.len()
    )
    .into_bytes()
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadGuard<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.at);
                buf.put_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if matches!(this.scan, Scan::Refused) {
                // hyper reads the client's end; the refusal is written once it is done.
                return Poll::Ready(Ok(()));
            }
            if let Scan::Body(Framing::Length(left)) = &mut this.scan {
                // A body of known length goes straight into hyper's buffer (a proxied call's
                // can be megabytes); what came after its end is the next head's, taken back.
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let got = (buf.filled().len() - before) as u64;
                if got <= *left {
                    *left -= got;
                    if *left == 0 {
                        this.scan = Scan::Head;
                    }
                    return Poll::Ready(Ok(()));
                }
                let end = before + *left as usize;
                let after = buf.filled()[end..].to_vec();
                buf.set_filled(end);
                this.scan = Scan::Head;
                this.take(&after);
                return Poll::Ready(Ok(()));
            }
            let mut incoming = std::mem::take(&mut this.incoming);
            incoming.resize(READ_SIZE, 0);
            let mut read = ReadBuf::new(&mut incoming);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            let got = read.filled().len();
            if let Poll::Ready(Ok(())) = polled {
                this.take(&incoming[..got]);
            }
            this.incoming = incoming;
            ready!(polled)?;
            if got == 0 {
                // The client's end; a head it left unfinished is dropped with it.
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for HeadGuard<'_, S> {
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
        if self.owed.is_some() || self.head_arriving() {
            // The connection may still owe an answer: written once hyper is done.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What hyper reads through a guard when the client sends `sent` and ends, and what the
    /// client reads back once hyper (here: after its reads) closes the connection.
    async fn through_guard(sent: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(sent).await.unwrap();
        client.shutdown().await.unwrap();
        let mut server = server;
        let mut owed = None;
        let mut guard = HeadGuard::new(&mut server, Vec::new(), Duration::from_secs(30), &mut owed);
        let mut seen = Vec::new();
        guard.read_to_end(&mut seen).await.unwrap();
        guard.shutdown().await.unwrap();
        drop(guard);
        match owed {
            Some(error) => super::super::connection::refuse(server, error).await,
            None => drop(server),
        }
        let mut answered = Vec::new();
        client.read_to_end(&mut answered).await.unwrap();
        (seen, answered)
    }

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
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                check_head(bad.as_bytes()).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn bodies_pass_whole_and_the_next_heads_are_found_after_them() {
        // A body holding what looks like a blank line and a head, by length and in chunks.
        let fake = "x\r\n\r\nGET /evil HTTP/1.1\r\n\r\n";
        let sent = format!(
            "POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{fake}\
             POST /b HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
             {:x};ext=1\r\n{fake}\r\n3\r\nabc\r\n0\r\nx-trailer: t\r\n\r\n\
             GET /c HTTP/1.1\r\nhost: x\r\n\r\n",
            fake.len(),
            fake.len()
        );
        let (seen, answered) = through_guard(sent.as_bytes()).await;
        assert_eq!(String::from_utf8(seen).unwrap(), sent);
        assert!(answered.is_empty());
    }

    /// A chunk size hyper takes (leading zeros, 19 digits and more) is followed to its end,
    /// so the head after the body is checked: a size of 19 digits ended the scan, and the
    /// later heads of the connection (70 headers, one over 64 KiB) reached hyper unchecked.
    /// A size over 64 bits, which hyper refuses too, ends it.
    #[tokio::test]
    async fn a_chunk_size_of_many_digits_is_followed_and_the_next_head_still_checked() {
        let flood: String = (0..70).map(|i| format!("x-h{i}: v\r\n")).collect();
        let sent = format!(
            "POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
             {:0>19}\r\nabc\r\n{:0>300}\r\n\r\nGET /b HTTP/1.1\r\n{flood}\r\n",
            "3", "0"
        );
        let (seen, answered) = through_guard(sent.as_bytes()).await;
        let seen = String::from_utf8(seen).unwrap();
        assert!(!seen.contains("GET /b"), "the flooded head is withheld");
        let answered = String::from_utf8(answered).unwrap();
        assert!(answered.starts_with("HTTP/1.1 431"), "{answered}");
        let mut chunk = Chunk::Size {
            size: 0,
            digits: false,
            ext: false,
        };
        let (_, ended) = follow_chunks(&mut chunk, b"10000000000000000\r\n");
        assert!(matches!(ended, Some(Scan::Unjudged)), "over 64 bits");
    }

    #[tokio::test]
    async fn a_large_body_passes_straight_through_and_the_head_after_it_is_still_checked() {
        // Larger than a read: the body's later reads go straight into the reader's buffer,
        // and the read that passes its end gives the rest back to the scan.
        let body = "GET /x HTTP/1.1\r\n\r\n".repeat(10_000);
        let allowed = format!(
            "POST /a HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}GET /b HTTP/1.1\r\n\r\n",
            body.len()
        );
        let refused = "GET /c HTTP/7\r\n\r\n";
        let (seen, answered) = through_guard(format!("{allowed}{refused}").as_bytes()).await;
        assert!(
            seen == allowed.as_bytes(),
            "hyper sees the body and /b, not /c"
        );
        let answered = String::from_utf8(answered).unwrap();
        assert!(answered.starts_with("HTTP/1.1 400"), "{answered}");
        assert!(answered.contains("malformed request"), "{answered}");
    }

    #[tokio::test]
    async fn a_later_head_over_the_limits_is_withheld_and_answered_in_json() {
        let first = "GET /a HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi";
        let huge = format!(
            "GET /b HTTP/1.1\r\nx-big: {}\r\n\r\n",
            "v".repeat(MAX_HEAD_BYTES)
        );
        let flood: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let crowded = format!("GET /b HTTP/1.1\r\n{flood}\r\n");
        for later in [huge, crowded, "GET /b HTTP/3\r\n\r\n".to_string()] {
            let (seen, answered) = through_guard(format!("{first}{later}").as_bytes()).await;
            assert_eq!(
                String::from_utf8(seen).unwrap(),
                first,
                "hyper sees only the first"
            );
            let answered = String::from_utf8(answered).unwrap();
            let (head, body) = answered.split_once("\r\n\r\n").unwrap();
            assert!(
                head.starts_with("HTTP/1.1 4") || head.starts_with("HTTP/1.1 5"),
                "{head}"
            );
            assert!(head.contains("connection: close"), "{head}");
            let error: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(error["error"]["message"].is_string(), "{body}");
        }
    }

    #[tokio::test]
    async fn a_head_the_client_leaves_unfinished_is_dropped_with_its_end() {
        let sent = "GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhos";
        let (seen, answered) = through_guard(sent.as_bytes()).await;
        assert_eq!(seen, b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(answered.is_empty());
    }
}
