//! One JSON POST to a model API, with the fault handling every HTTP summarizer shares:
//! a total timeout per attempt, bounded retries with exponential backoff and jitter on
//! connection errors, timeouts, 5xx and 429 (honouring Retry-After), no retry on other 4xx,
//! and an unparsable answer as an error. Error texts never carry the API key.

use super::SummarizeError;
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// The one HTTP client all summarizers share (connection pool, TLS setup).
static HTTP: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("compactd/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
});

/// First backoff; doubles per retry.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// No wait between attempts is longer than this, whatever Retry-After says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// How to call an endpoint.
#[derive(Debug, Clone)]
pub struct CallPolicy {
    /// Total time one attempt may take, connect included.
    pub timeout: Duration,
    pub max_retries: u32,
    /// The API key, so it can be scrubbed from any error text.
    pub secret: Option<String>,
}

/// POSTs `body` as JSON to `url` with `headers`; returns the answer's JSON.
pub async fn post_json(
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    policy: &CallPolicy,
) -> Result<Value, SummarizeError> {
    let mut attempt = 0;
    loop {
        let outcome = attempt_once(url, headers, body, policy).await;
        let retry_after = match &outcome {
            Err(Failure::Retryable { retry_after, .. }) => *retry_after,
            _ => None,
        };
        match outcome {
            Ok(value) => return Ok(value),
            Err(Failure::Final(error)) => return Err(redact(error, policy)),
            Err(Failure::Retryable { error, .. }) if attempt >= policy.max_retries => {
                return Err(redact(error, policy));
            }
            Err(Failure::Retryable { error, .. }) => {
                let wait = retry_after
                    .unwrap_or_else(|| backoff(attempt))
                    .min(MAX_WAIT);
                tracing::info!(attempt = attempt + 1, wait_ms = wait.as_millis() as u64, error = %redact(error, policy), "summarizer call failed; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

enum Failure {
    Retryable {
        error: SummarizeError,
        retry_after: Option<Duration>,
    },
    Final(SummarizeError),
}

async fn attempt_once(
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    policy: &CallPolicy,
) -> Result<Value, Failure> {
    let mut request = HTTP.post(url).timeout(policy.timeout).json(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.map_err(|e| {
        let error = if e.is_timeout() {
            SummarizeError::Timeout(policy.timeout.as_secs())
        } else {
            SummarizeError::Unavailable(describe(&e))
        };
        Failure::Retryable {
            error,
            retry_after: None,
        }
    })?;
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let text = response.text().await.map_err(|e| Failure::Retryable {
        error: if e.is_timeout() {
            SummarizeError::Timeout(policy.timeout.as_secs())
        } else {
            SummarizeError::Unavailable(describe(&e))
        },
        retry_after: None,
    })?;
    if status.is_success() {
        return serde_json::from_str(&text).map_err(|e| {
            Failure::Final(SummarizeError::BadResponse(format!(
                "not JSON ({e}): {}",
                crate::compaction::truncate::truncate_chars(&text, 200)
            )))
        });
    }
    let error = SummarizeError::Http {
        status: status.as_u16(),
        message: error_message(&text),
    };
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        Err(Failure::Retryable { error, retry_after })
    } else {
        Err(Failure::Final(error))
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare from model APIs and is ignored).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Exponential backoff with up to 50% jitter, so many sessions do not retry in lockstep.
fn backoff(attempt: u32) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let base = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(attempt));
    let jitter = RandomState::new().hash_one(attempt) % 1000;
    base + base.mul_f64(jitter as f64 / 2000.0)
}

/// The API's own error message when it sent one (`{"error": {"message": ...}}`), else the body.
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .or_else(|| v["error"].as_str())
                .or_else(|| v["message"].as_str())
        })
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string());
    crate::compaction::truncate::truncate_chars(message.trim(), 300).into_owned()
}

/// A transport error without the URL (which could carry credentials in its query).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), url.host_str().unwrap_or("the server"));
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Scrubs the API key (and the fragments APIs quote back, such as its first and last
/// characters) from an error.
pub fn redact(error: SummarizeError, policy: &CallPolicy) -> SummarizeError {
    let Some(secret) = policy.secret.as_deref().filter(|s| !s.is_empty()) else {
        return error;
    };
    let scrub = |text: String| scrub_secret(&text, secret);
    match error {
        SummarizeError::Unavailable(t) => SummarizeError::Unavailable(scrub(t)),
        SummarizeError::Http { status, message } => SummarizeError::Http {
            status,
            message: scrub(message),
        },
        SummarizeError::BadResponse(t) => SummarizeError::BadResponse(scrub(t)),
        SummarizeError::Command(t) => SummarizeError::Command(scrub(t)),
        SummarizeError::Config(t) => SummarizeError::Config(scrub(t)),
        other => other,
    }
}

fn scrub_secret(text: &str, secret: &str) -> String {
    let mut text = text.replace(secret, "[redacted]");
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() >= 16 {
        let head: String = chars[..8].iter().collect();
        let tail: String = chars[chars.len() - 4..].iter().collect();
        text = text
            .replace(&head, "[redacted]")
            .replace(&tail, "[redacted]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_their_quoted_fragments_are_scrubbed() {
        let key = "sk-test-1234567890abcdefWXYZ";
        let text = format!("Incorrect API key provided: {key}. Also sk-test-***WXYZ");
        let scrubbed = scrub_secret(&text, key);
        assert!(!scrubbed.contains(key));
        assert!(!scrubbed.contains("sk-test-"));
        assert!(!scrubbed.contains("WXYZ"));
    }

    #[test]
    fn backoff_grows_and_stays_jittered_within_half() {
        for attempt in 0..5 {
            let base = BACKOFF_BASE * 2u32.pow(attempt);
            let b = backoff(attempt);
            assert!(b >= base && b <= base + base / 2, "{attempt}: {b:?}");
        }
    }

    #[test]
    fn api_error_messages_are_extracted() {
        assert_eq!(
            error_message(r#"{"error": {"message": "rate limited"}}"#),
            "rate limited"
        );
        assert_eq!(error_message("plain failure"), "plain failure");
    }
}
