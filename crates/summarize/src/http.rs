//! One JSON POST to a model API, with the fault handling every HTTP summarizer shares:
//! a total timeout per attempt, bounded retries with exponential backoff and jitter on
//! connection errors, timeouts, 5xx and 429 (honouring Retry-After), no retry on other 4xx,
//! and an unparsable answer as an error. Error texts never carry the API key.

use super::SummarizeError;
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// The one HTTP client all summarizers (and the proxy) share: connection pool, TLS setup.
pub static HTTP: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("compactd/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
});

/// Sent with every call this daemon makes to a model API (the proxy's and the summarizer's),
/// carrying this process's [`MARK`]: a call that comes back to the daemon's own proxy (an
/// upstream or a summarizer `base_url` set to its loopback listener) is refused at once
/// (`proxy_loop`), where it would otherwise go round until the connections ran out, storing
/// a copy of the conversation at every turn.
pub const VIA_HEADER: &str = "x-compactd-via";

/// This process's mark: random, made once.
pub static MARK: LazyLock<String> = LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{random:016x}")
});

/// First backoff; doubles per retry.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// No wait between attempts is longer than this, whatever Retry-After says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The most of an answer read from a model API (or a summarizer command): a summary of
/// `max_output_tokens` is tens of KB of JSON, an error page a few. A server that answers more
/// (a wrong endpoint streaming a download, one that never stops) is cut off here instead of
/// filling the daemon's memory until the timeout.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

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
    with_retries(policy, || attempt_once(url, headers, body, policy)).await
}

/// The answer's body as text, read chunk by chunk up to [`MAX_ANSWER_BYTES`]: past it the
/// call fails for good (the same server would answer the same way again).
async fn read_bounded(
    mut response: reqwest::Response,
    policy: &CallPolicy,
) -> Result<String, Failure> {
    let mut body = Vec::new();
    loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|e| transport_failure(&e, policy))?;
        let Some(chunk) = chunk else {
            return Ok(String::from_utf8_lossy(&body).into_owned());
        };
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(Failure::Final(SummarizeError::BadResponse(format!(
                "the answer is larger than {} MiB; is the URL a model API?",
                MAX_ANSWER_BYTES >> 20
            ))));
        }
        body.extend_from_slice(&chunk);
    }
}

/// A request or its answer lost on the way (a timeout, a refused or dropped connection):
/// worth another attempt.
fn transport_failure(e: &reqwest::Error, policy: &CallPolicy) -> Failure {
    let error = if e.is_timeout() {
        SummarizeError::Timeout(policy.timeout.as_secs())
    } else {
        SummarizeError::Unavailable(describe(e))
    };
    Failure::Retryable {
        error,
        retry_after: None,
    }
}

/// Runs `attempt` until it succeeds, fails for good, or has been retried
/// `policy.max_retries` times; each attempt may take `policy.timeout` in all. Apart from
/// HTTP, so its timing is tested on paused time.
async fn with_retries<F, Fut>(policy: &CallPolicy, mut attempt: F) -> Result<Value, SummarizeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Value, Failure>>,
{
    let mut attempts = 0;
    loop {
        let outcome = tokio::time::timeout(policy.timeout, attempt())
            .await
            .unwrap_or(Err(Failure::Retryable {
                error: SummarizeError::Timeout(policy.timeout.as_secs()),
                retry_after: None,
            }));
        match outcome {
            Ok(value) => return Ok(value),
            Err(Failure::Final(error)) => return Err(redact(error, policy)),
            Err(Failure::Retryable { error, .. }) if attempts >= policy.max_retries => {
                return Err(redact(error, policy));
            }
            Err(Failure::Retryable { error, retry_after }) => {
                let wait = retry_after
                    .unwrap_or_else(|| backoff(attempts))
                    .min(MAX_WAIT);
                tracing::info!(attempt = attempts + 1, wait_ms = wait.as_millis() as u64, error = %redact(error, policy), "summarizer call failed; retrying");
                tokio::time::sleep(wait).await;
                attempts += 1;
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
    let mut request = HTTP.post(url).json(body).header(VIA_HEADER, MARK.as_str());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request
        .send()
        .await
        .map_err(|e| transport_failure(&e, policy))?;
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let text = read_bounded(response, policy).await?;
    // Whatever the server says is scrubbed of the key before anything cuts it short: a cut
    // through the key would leave a fragment no scrubbing recognises.
    let text = scrub_secret(&text, policy.secret.as_deref());
    if status.is_success() {
        return serde_json::from_str(&text).map_err(|e| {
            Failure::Final(SummarizeError::BadResponse(format!(
                "not JSON ({e}): {}",
                crate::compaction::truncate::truncate_chars(&text, 200)
            )))
        });
    }
    let message = error_message(&text);
    if is_context_exceeded(status, &text) {
        return Err(Failure::Final(SummarizeError::ContextExceeded(message)));
    }
    let error = SummarizeError::Http {
        status: status.as_u16(),
        message,
    };
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        Err(Failure::Retryable { error, retry_after })
    } else {
        Err(Failure::Final(error))
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare from model APIs and is ignored),
/// capped at [`MAX_WAIT`]: a server may answer anything (`1e30`, `inf`, `NaN`).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let seconds = value.trim().parse::<f64>().ok().filter(|s| *s >= 0.0)?;
    Some(if seconds < MAX_WAIT.as_secs_f64() {
        Duration::from_secs_f64(seconds)
    } else {
        MAX_WAIT
    })
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

/// Whether an error answer says the prompt was longer than the model's window: a refusal the
/// proxy reads ([`crate::provider::overflow`]), or one of the looser words other servers use
/// (llama.cpp's "exceeds the context size" without its type, "context window", an answer that
/// is not JSON).
fn is_context_exceeded(status: StatusCode, body: &str) -> bool {
    if crate::provider::overflow::overflow(status.as_u16(), body.as_bytes()).is_some() {
        return true;
    }
    const PHRASES: [&str; 7] = [
        "context_length_exceeded",
        "maximum context length",
        "prompt is too long",
        "exceed context limit",
        "exceeds the context",
        "context window",
        "exceeds the maximum number of tokens allowed",
    ];
    let lower = body.to_lowercase();
    (status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE)
        && PHRASES.iter().any(|p| lower.contains(p))
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

/// Scrubs the API key from an error (see [`scrub_secret`]).
pub fn redact(error: SummarizeError, policy: &CallPolicy) -> SummarizeError {
    let scrub = |text: String| scrub_secret(&text, policy.secret.as_deref());
    match error {
        SummarizeError::Unavailable(t) => SummarizeError::Unavailable(scrub(t)),
        SummarizeError::Http { status, message } => SummarizeError::Http {
            status,
            message: scrub(message),
        },
        SummarizeError::BadResponse(t) => SummarizeError::BadResponse(scrub(t)),
        SummarizeError::ContextExceeded(t) => SummarizeError::ContextExceeded(scrub(t)),
        SummarizeError::Command(t) => SummarizeError::Command(scrub(t)),
        SummarizeError::Config(t) => SummarizeError::Config(scrub(t)),
        SummarizeError::Internal(t) => SummarizeError::Internal(scrub(t)),
        other => other,
    }
}

/// Characters of the key a quoted fragment must share to be scrubbed.
const FRAGMENT: usize = 8;
/// The key's last characters, scrubbed where an API quotes them after a mask (`sk-...WXYZ`).
const MASKED_TAIL: usize = 4;

/// `text` without the key: whole, any run of 8 or more of its characters (APIs quote keys in
/// part: a prefix, a suffix, the middle), its last 4 characters after a mask (`***WXYZ`), and
/// base64-encoded (as in a Basic credential), whatever its offset within the encoded text.
pub fn scrub_secret(text: &str, secret: Option<&str>) -> String {
    let Some(secret) = secret.filter(|s| s.chars().count() >= FRAGMENT) else {
        return text.to_string();
    };
    let mut out = text.replace(secret, "[redacted]");
    for encoded in base64_forms(secret.as_bytes()) {
        out = out.replace(&encoded, "[redacted]");
    }
    let out = scrub_runs(&out, secret);
    let tail: String = {
        let chars: Vec<char> = secret.chars().collect();
        chars[chars.len() - MASKED_TAIL..].iter().collect()
    };
    let mut result = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find(&tail) {
        let masked = rest[..at].ends_with(['*', '.', '…']);
        result.push_str(&rest[..at]);
        result.push_str(if masked { "[redacted]" } else { &tail });
        rest = &rest[at + tail.len()..];
    }
    result.push_str(rest);
    result
}

/// Replaces every maximal run of `FRAGMENT` or more characters that also occurs in `secret`.
fn scrub_runs(text: &str, secret: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let secret_chars: Vec<char> = secret.chars().collect();
    let windows: std::collections::HashSet<&[char]> = secret_chars.windows(FRAGMENT).collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if i + FRAGMENT <= chars.len() && windows.contains(&chars[i..i + FRAGMENT]) {
            let mut end = i + FRAGMENT;
            while end < chars.len() && secret.contains(&chars[i..=end].iter().collect::<String>()) {
                end += 1;
            }
            out.push_str("[redacted]");
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The parts of `bytes`' base64 encoding that do not depend on what surrounds it: encoded at
/// each of the three offsets, without the characters mixed with the neighbours.
fn base64_forms(bytes: &[u8]) -> Vec<String> {
    (0..3)
        .filter_map(|offset| {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(bytes);
            let encoded = base64(&padded);
            // Skip the characters that mix in the padding bytes, and the last group.
            let start = (offset * 4).div_ceil(3);
            let end = encoded.trim_end_matches('=').len().saturating_sub(3);
            (end > start + FRAGMENT).then(|| encoded[start..end].to_string())
        })
        .collect()
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    fn policy(timeout_s: u64, max_retries: u32) -> CallPolicy {
        CallPolicy {
            timeout: Duration::from_secs(timeout_s),
            max_retries,
            secret: None,
        }
    }

    fn retryable(retry_after: Option<Duration>) -> Failure {
        Failure::Retryable {
            error: SummarizeError::Http {
                status: 429,
                message: "slow down".into(),
            },
            retry_after,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_waited_out_exactly_and_capped() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let answer = with_retries(&policy(20, 2), || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(retryable(Some(Duration::from_secs(7)))),
                1 => Err(retryable(Some(Duration::from_secs(3600)))),
                _ => Ok(Value::Bool(true)),
            }
        })
        .await;
        assert_eq!(answer.unwrap(), Value::Bool(true));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(started.elapsed(), Duration::from_secs(7) + MAX_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_with_at_most_half_again_of_jitter() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let answer = with_retries(&policy(20, 3), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<Value, _>(retryable(None))
        })
        .await;
        assert!(matches!(
            answer,
            Err(SummarizeError::Http { status: 429, .. })
        ));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "one call and three retries"
        );
        let waited = started.elapsed();
        let base = BACKOFF_BASE * (1 + 2 + 4);
        assert!(waited >= base && waited <= base.mul_f64(1.5), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_call_times_out_after_the_policy_timeout_each_attempt() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let answer = with_retries(&policy(30, 1), || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<Value, Failure>>()
        })
        .await;
        assert_eq!(answer.unwrap_err(), SummarizeError::Timeout(30));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let waited = started.elapsed();
        let least = Duration::from_secs(60) + BACKOFF_BASE;
        assert!(
            waited >= least && waited <= least + BACKOFF_BASE / 2,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn final_failures_are_not_retried_and_lose_the_key() {
        let calls = AtomicU32::new(0);
        let policy = CallPolicy {
            secret: Some("sk-test-1234567890abcdef".into()),
            ..policy(20, 5)
        };
        let answer = with_retries(&policy, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<Value, _>(Failure::Final(SummarizeError::Http {
                status: 401,
                message: "bad key sk-test-1234567890abcdef".into(),
            }))
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let text = answer.unwrap_err().to_string();
        assert!(
            text.contains("401") && !text.contains("1234567890abcdef"),
            "{text}"
        );
    }

    #[test]
    fn the_apis_words_for_a_too_long_prompt_are_recognised() {
        let openai = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#;
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let gemini = r#"[{"error":{"code":400,"message":"The input token count (134123) exceeds the maximum number of tokens allowed (131072).","status":"INVALID_ARGUMENT"}}]"#;
        assert!(is_context_exceeded(StatusCode::BAD_REQUEST, openai));
        assert!(is_context_exceeded(StatusCode::BAD_REQUEST, anthropic));
        assert!(is_context_exceeded(StatusCode::BAD_REQUEST, gemini));
        assert!(!is_context_exceeded(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"model not found"}}"#
        ));
        assert!(
            !is_context_exceeded(StatusCode::INTERNAL_SERVER_ERROR, openai),
            "5xx is retried as it is"
        );
    }

    #[test]
    fn keys_and_their_quoted_fragments_are_scrubbed() {
        let key = "sk-test-1234567890abcdefWXYZ";
        let text = format!(
            "Incorrect API key provided: {key}. Also sk-test-***WXYZ, '{}' and \"{}",
            &key[3..],
            &key[..20]
        );
        let scrubbed = scrub_secret(&text, Some(key));
        assert_eq!(
            scrubbed,
            "Incorrect API key provided: [redacted]. Also [redacted]***[redacted], '[redacted]' and \"[redacted]"
        );
        // The last four characters alone are ordinary text unless they follow a mask.
        assert_eq!(scrub_secret("WXYZ rules", Some(key)), "WXYZ rules");
    }

    #[test]
    fn base64_encoded_keys_are_scrubbed_at_any_offset() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"ab"), "YWI=");
        let key = "local-server-key-0123456789";
        for prefix in ["", "u:", "ab:"] {
            let encoded = base64(format!("{prefix}{key}").as_bytes());
            let scrubbed = scrub_secret(
                &format!("Authorization: Basic {encoded} rejected"),
                Some(key),
            );
            assert!(
                scrubbed.contains("[redacted]") && !scrubbed.contains(&encoded[8..20]),
                "{prefix}: {scrubbed}"
            );
        }
    }

    #[test]
    fn absurd_retry_after_values_are_capped() {
        let mut headers = reqwest::header::HeaderMap::new();
        for value in ["1e30", "inf", "999999999999"] {
            headers.insert(reqwest::header::RETRY_AFTER, value.parse().unwrap());
            assert_eq!(retry_after(&headers), Some(MAX_WAIT), "{value}");
        }
        headers.insert(reqwest::header::RETRY_AFTER, "NaN".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "1.5".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(1500)));
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
