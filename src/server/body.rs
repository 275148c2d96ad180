//! Reading request bodies within bounds, whatever the client does.
//!
//! A body is read into one buffer sized by its `Content-Length` (never more than
//! `[server] max_body_bytes`), within `[server] request_timeout_s`, after taking its size from a budget
//! that all bodies in flight share ([`BodyBudget`], 4 × max_body_bytes): a client that
//! trickles a body one byte at a time, or many clients sending large ones at once, cannot
//! grow the daemon's memory beyond that budget and the parsing it bounds.

use super::error::ApiError;
use crate::protocol::ErrorCode;
use axum::body::Body;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a request waits for room in the budget before it is told to retry.
const BUDGET_WAIT: Duration = Duration::from_secs(5);
/// Bodies in flight may take this many times `max_body_bytes`, in all.
pub const BUDGET_BODIES: usize = 4;

/// The bytes all bodies in flight may hold together, in KiB permits.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    kib: usize,
    /// How long a whole body may take to arrive.
    timeout: Duration,
}

impl BodyBudget {
    pub fn new(bytes: usize, timeout: Duration) -> BodyBudget {
        let kib = bytes.div_ceil(1024).min(Semaphore::MAX_PERMITS);
        BodyBudget {
            permits: Arc::new(Semaphore::new(kib)),
            kib,
            timeout,
        }
    }

    async fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let kib = bytes.div_ceil(1024).clamp(1, self.kib) as u32;
        let wait = self.permits.clone().acquire_many_owned(kib);
        match tokio::time::timeout(BUDGET_WAIT, wait).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Busy,
                "too many large requests in flight; retry shortly",
            )
            .retry_after(1)),
        }
    }
}

/// A body read whole, holding its share of the budget until dropped.
pub struct BoundedBody {
    pub bytes: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

/// Reads `body`, declared `declared` bytes long (if known), refusing more than `limit`.
pub async fn read_body(
    body: Body,
    declared: Option<usize>,
    limit: usize,
    budget: &BodyBudget,
) -> Result<BoundedBody, ApiError> {
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let expected = declared.unwrap_or(limit);
    let permit = budget.take(expected).await?;
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("cannot read request body: {e}")))?;
            if let Some(data) = frame.data_ref() {
                if bytes.len() + data.len() > limit {
                    return Err(ApiError::too_large(limit));
                }
                bytes.extend_from_slice(data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(budget.timeout, read).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::Timeout,
                format!(
                    "the request body did not arrive within {} s",
                    budget.timeout.as_secs()
                ),
            ));
        }
    }
    Ok(BoundedBody {
        bytes,
        _permit: permit,
    })
}
