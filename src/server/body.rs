//! Reading request bodies within bounds, whatever the client does, and charging each for what
//! it costs once parsed.
//!
//! Every request with a body passes [`api_bodies`] or [`proxy_bodies`] before its handler: the
//! body is read into one buffer (at most `[server] max_body_bytes`, or `[proxy]
//! max_body_bytes` for the proxy's routes) within `[server] request_timeout_s`, after taking
//! its size from the request budget every listener shares ([`crate::service::memory`]). Once
//! read, it is scanned (not parsed) for how many JSON objects and arrays it holds and how deep
//! they nest: a parsed message costs far more than its bytes (220,000 tiny messages are 7.5 MB
//! of JSON and over 200 MB parsed), so the charge grows to what parsing and handling it will
//! hold, and the charge is kept until the handler has answered. A body that holds more than
//! [`MAX_CONTAINERS`] or nests deeper than [`MAX_DEPTH`] is refused before it is parsed. A
//! client that trickles a body, or many clients sending large ones at once on both doors,
//! cannot grow the daemon's memory beyond the budget.

use super::error::ApiError;
use crate::compaction::microcompact::thousands;
use crate::protocol::ErrorCode;
use crate::service::Service;
use crate::service::memory::{BYTE_COST, Budget, CONTAINER_COST, Charge};
use axum::body::{Body, HttpBody as _};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;

/// How long a request waits for room in the budget before it is told to retry.
const BUDGET_WAIT: Duration = Duration::from_secs(5);
/// What a body of unknown length is charged before any of it has come.
const UNDECLARED_FIRST_CHARGE: usize = 64 * 1024;
/// JSON objects and arrays one request may hold (a message is one, each of its parts one).
pub(super) const MAX_CONTAINERS: usize = 50_000;
/// How deep JSON objects and arrays may nest in one request.
pub(super) const MAX_DEPTH: usize = 64;

/// The API's routes: bodies up to `[server] max_body_bytes`.
pub(super) async fn api_bodies(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    let limit = service.settings().config.server.max_body_bytes;
    bounded(
        &service,
        Limit::new(limit, "[server] max_body_bytes"),
        req,
        next,
    )
    .await
}

/// The proxy's routes: a whole conversation comes with every call, up to `[proxy]
/// max_body_bytes`.
pub(super) async fn proxy_bodies(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    let limit = service.settings().config.proxy.max_body_bytes;
    bounded(
        &service,
        Limit::new(limit, "[proxy] max_body_bytes"),
        req,
        next,
    )
    .await
}

/// A body limit and the setting it comes from.
#[derive(Debug, Clone, Copy)]
struct Limit {
    bytes: usize,
    setting: &'static str,
}

impl Limit {
    fn new(bytes: usize, setting: &'static str) -> Limit {
        Limit { bytes, setting }
    }

    fn exceeded(self) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooLarge,
            format!(
                "request body is larger than the limit of {} bytes ({})",
                self.bytes, self.setting
            ),
        )
    }
}

async fn bounded(service: &Arc<Service>, limit: Limit, req: Request, next: Next) -> Response {
    if req.body().size_hint().exact() == Some(0) {
        return next.run(req).await;
    }
    match read_charged(service, limit, req).await {
        Ok((req, charge)) => {
            let response = next.run(req).await;
            // The parsed body and everything made of it are gone once the handler answered
            // (a streamed answer's recording is charged on its own as it grows).
            drop(charge);
            response
        }
        Err(e) => e.into_response(),
    }
}

/// Reads the body within its limit and deadline, charged first for its bytes, then for what
/// its parsed form will hold; gives the request back with the body in memory.
async fn read_charged(
    service: &Arc<Service>,
    limit: Limit,
    req: Request,
) -> Result<(Request, Charge), ApiError> {
    let declared = req.body().size_hint().exact().map(|n| n as usize);
    if declared.is_some_and(|n| n > limit.bytes) {
        return Err(limit.exceeded());
    }
    let budget = &service.memory().requests;
    // A body of unknown length (chunked) is charged for what has come of it, growing as it
    // comes: charged its limit up front, five slow ones held every request's budget.
    let mut charge = budget
        .take(
            declared.unwrap_or(UNDECLARED_FIRST_CHARGE.min(limit.bytes)),
            Some(BUDGET_WAIT),
        )
        .await
        .ok_or_else(busy)?;
    let timeout = Duration::from_secs(service.settings().config.server.request_timeout_s);
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, declared, limit, timeout, (budget, &mut charge)).await?;
    let shape = Shape::of(&bytes);
    if shape.depth > MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "the body nests JSON objects and arrays deeper than {MAX_DEPTH} levels"
        )));
    }
    if shape.containers > MAX_CONTAINERS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooLarge,
            format!(
                "the body holds {} JSON objects and arrays, more than the {} one request may hold (each message is one, each of its parts one): send the messages in several requests",
                thousands(shape.containers),
                thousands(MAX_CONTAINERS)
            ),
        ));
    }
    let cost = bytes.len() * BYTE_COST + shape.containers * CONTAINER_COST;
    let more = cost.saturating_sub(charge.bytes());
    if !budget.extend(&mut charge, more, BUDGET_WAIT).await {
        return Err(busy());
    }
    Ok((Request::from_parts(parts, Body::from(bytes)), charge))
}

fn busy() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Busy,
        "too many large requests in flight; retry shortly",
    )
    .retry_after(1)
}

/// Reads `body`, declared `declared` bytes long (if known), refusing more than the limit;
/// `charge` grows from `budget` with what arrives, doubling, when it holds less.
async fn read_body(
    body: Body,
    declared: Option<usize>,
    limit: Limit,
    timeout: Duration,
    (budget, charge): (&Budget, &mut Charge),
) -> Result<Vec<u8>, ApiError> {
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("cannot read request body: {e}")))?;
            if let Some(data) = frame.data_ref() {
                let read = bytes.len() + data.len();
                if read > limit.bytes {
                    return Err(limit.exceeded());
                }
                if read > charge.bytes() {
                    let more = read.max(charge.bytes() * 2).min(limit.bytes) - charge.bytes();
                    if !budget.extend(charge, more, BUDGET_WAIT).await {
                        return Err(busy());
                    }
                }
                bytes.extend_from_slice(data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::Timeout,
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs()
                ),
            ));
        }
    }
    Ok(bytes)
}

/// How many JSON objects and arrays a body holds and how deep they nest, read without
/// parsing it (brackets inside strings do not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Shape {
    containers: usize,
    depth: usize,
}

impl Shape {
    /// Every request body passes here, a proxied conversation of 10,000 messages (megabytes,
    /// mostly strings) with every call: a string's inside is skipped to its next quote or
    /// backslash with `memchr`, not looked at byte by byte (that loop took 8% of the daemon's
    /// time on such a call).
    fn of(bytes: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let mut depth = 0usize;
        let mut at = 0;
        while let Some(&b) = bytes.get(at) {
            at += 1;
            match b {
                b'"' => at = past_string(bytes, at),
                _ => shape.count(&mut depth, b),
            }
        }
        shape
    }

    /// Counts `b`, a byte outside strings, if it opens or closes a container; `depth` is how
    /// deep the containers open before it nest.
    fn count(&mut self, depth: &mut usize, b: u8) {
        match b {
            b'{' | b'[' => {
                self.containers += 1;
                *depth += 1;
                self.depth = self.depth.max(*depth);
            }
            b'}' | b']' => *depth = depth.saturating_sub(1),
            _ => {}
        }
    }
}

/// Where the string whose inside starts at `at` ends (just past its closing quote; past the
/// end if it never closes): an escaped byte, a quote too, never closes it.
fn past_string(bytes: &[u8], mut at: usize) -> usize {
    while let Some(rest) = bytes.get(at..) {
        match memchr::memchr2(b'"', b'\\', rest) {
            Some(found) if rest[found] == b'"' => return at + found + 1,
            Some(found) => at += found + 2,
            None => break,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_counts_containers_outside_strings() {
        let body = br#"{"messages": [{"role": "user", "content": "a {[\"]} b"}, {"x": [1, [2]]}]}"#;
        assert_eq!(
            Shape::of(body),
            Shape {
                containers: 6,
                depth: 5
            }
        );
        let deep = "[".repeat(5_000);
        assert_eq!(Shape::of(deep.as_bytes()).depth, 5_000);
    }

    /// The shape as it was first read, a byte at a time (strings entered and left byte by byte).
    fn shape_byte_by_byte(bytes: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &b in bytes {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                _ => shape.count(&mut depth, b),
            }
        }
        shape
    }

    proptest::proptest! {
        /// Skipping strings finds what reading every byte finds, in any bytes: escapes at the
        /// end, unclosed strings, brackets and quotes inside strings, stray closers.
        #[test]
        fn skipping_strings_reads_the_same_shape(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(b"\"".to_vec()),
                    proptest::strategy::Just(b"\\".to_vec()),
                    proptest::strategy::Just(b"\\\"".to_vec()),
                    proptest::strategy::Just(b"{[".to_vec()),
                    proptest::strategy::Just(b"]}".to_vec()),
                    proptest::collection::vec(proptest::num::u8::ANY, 0..40),
                ],
                0..40,
            )
        ) {
            let body = pieces.concat();
            proptest::prop_assert_eq!(Shape::of(&body), shape_byte_by_byte(&body));
        }
    }
}
