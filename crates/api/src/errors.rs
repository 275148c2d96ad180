//! [`ErrorCode`]: the `code` of every error answer, one per condition a client may handle.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What went wrong, for a program (the `message` is for a person).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: malformed request or JSON, a bad session id, a number out of range.
    BadRequest,
    /// 400: a message the API cannot accept (its index is named).
    InvalidMessage,
    /// 400: a tool result for a call the session has not seen.
    UnknownCall,
    /// 400 on append, 409 on compaction: pinned messages would leave no room.
    PinnedTooLarge,
    /// 401: a proxied call without an API key (`Authorization` or `x-api-key`).
    Unauthorized,
    /// 403: a connection from another user.
    Forbidden,
    /// 404: an unknown session or endpoint.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 408: a request head or body did not arrive in time.
    Timeout,
    /// 409: a session that exists, a compaction that lost a race.
    Conflict,
    /// 409: an Idempotency-Key reused for a different request.
    IdempotencyMismatch,
    /// 413 or 431: a body or request head over its limit.
    TooLarge,
    /// 503 with Retry-After: a locked database, too many connections or large bodies.
    Busy,
    /// 429: new sessions made too fast over the loopback listener (with `Retry-After`).
    RateLimited,
    /// 503: the summarizer failed (the failure is recorded).
    SummarizerFailed,
    /// 502: the proxy's upstream model API could not be reached.
    UpstreamUnreachable,
    /// 508: the proxy's upstream is this daemon's own proxy (a call came back to it).
    ProxyLoop,
    /// 503: the daemon is stopping.
    ShuttingDown,
    /// 503: the database file was removed or replaced while running.
    StorageGone,
    /// 507 with Retry-After: the disk is full; nothing was acknowledged.
    StorageFull,
    /// 500: a fault of compactd's (logged).
    Internal,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidMessage => "invalid_message",
            ErrorCode::UnknownCall => "unknown_call",
            ErrorCode::PinnedTooLarge => "pinned_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Conflict => "conflict",
            ErrorCode::IdempotencyMismatch => "idempotency_mismatch",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Busy => "busy",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::SummarizerFailed => "summarizer_failed",
            ErrorCode::UpstreamUnreachable => "upstream_unreachable",
            ErrorCode::ProxyLoop => "proxy_loop",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::StorageGone => "storage_gone",
            ErrorCode::StorageFull => "storage_full",
            ErrorCode::Internal => "internal",
        }
    }
}

/// An error answer's `code` as a client reads it: one of [`ErrorCode`], or one this build
/// does not know (a newer daemon's), kept as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiCode {
    Known(ErrorCode),
    Unknown(String),
}

impl ApiCode {
    /// Reads a wire code.
    pub fn parse(code: &str) -> ApiCode {
        serde_json::from_value(serde_json::Value::String(code.to_string()))
            .map_or_else(|_| ApiCode::Unknown(code.to_string()), ApiCode::Known)
    }

    /// Whether the answer says to retry shortly (`busy`, `shutting_down`).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ApiCode::Known(ErrorCode::Busy | ErrorCode::ShuttingDown)
        )
    }
}

impl std::fmt::Display for ApiCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiCode::Known(code) => f.write_str(code.as_str()),
            ApiCode::Unknown(code) => f.write_str(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_reads_known_codes_as_such_and_keeps_unknown_ones() {
        assert_eq!(ApiCode::parse("busy"), ApiCode::Known(ErrorCode::Busy));
        assert!(ApiCode::parse("shutting_down").is_transient());
        let newer = ApiCode::parse("quota_exceeded");
        assert_eq!(newer, ApiCode::Unknown("quota_exceeded".into()));
        assert_eq!(newer.to_string(), "quota_exceeded");
        assert!(!newer.is_transient());
    }

    #[test]
    fn codes_serialize_as_their_names() {
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::IdempotencyMismatch,
            ErrorCode::StorageFull,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }
}
