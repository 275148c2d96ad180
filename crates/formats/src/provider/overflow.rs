//! A model API's refusal of a request whose prompt is longer than the model's window, read
//! from its error answer, with the counts it gives: the upstream's own tokenizer is the truth
//! compactd's estimate (four characters a token) only approximates. On the shared coding
//! transcripts the real counts run 1.2 to 2.0 times the estimate (docs/EVALUATION.md), so a
//! long conversation's first call, before any usage report anchors the count, can reach the
//! model over its window although compactd's estimate is under the trigger.
//!
//! The refusals are the documented ones: Anthropic's `400 invalid_request_error` "prompt is
//! too long: N tokens > M maximum", OpenAI's `400` with code `context_length_exceeded` ("This
//! model's maximum context length is M tokens. However, your messages resulted in N
//! tokens."; the Responses API gives no figures), the same sentence from OpenAI-compatible
//! servers (vLLM: "... you requested N tokens (P in the messages, C in the completion)", its
//! error object nested under `error` or, before, at the answer's root; OpenRouter: "... you
//! requested about N tokens (P of text input, C in the output)"), llama.cpp's
//! `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`, Anthropic's "input length
//! and `max_tokens` exceed context limit: N + R > M" (the prompt left the completion asked
//! for no room), Gemini's "The input token count (N) exceeds the maximum number of tokens
//! allowed (M)." (its answer sometimes a list of one error), and Mistral's `400` "Prompt
//! contains N tokens, too large for model with M maximum context length". A refusal that
//! names the completion the client asked room for says so too: it is kept free from then on.
//!
//! Pure: no I/O.

use crate::compaction::config::completion_share;
use compactd_core::{Overflow, reported_tokens};
use regex::Regex;
use serde_json::{Value, json};
use std::sync::LazyLock;

/// The most of an error answer read to recognize it: refusals are a few hundred bytes.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// Whether an upstream's answer (`status`, `body`) refuses the prompt as too long, and what it
/// counted.
pub fn overflow(status: u16, body: &[u8]) -> Option<Overflow> {
    if status != 400 && status != 413 {
        return None;
    }
    let error = error_object(serde_json::from_slice(body).ok()?);
    if error["type"] == "exceed_context_size_error" {
        return Some(Overflow {
            tokens: count(&error["n_prompt_tokens"]),
            limit: count(&error["n_ctx"]),
            completion: None,
        });
    }
    let lowered = error["message"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    stated_overflow(&lowered)
        .or_else(|| reserved_overflow(&lowered))
        .or_else(|| openai_overflow(&lowered, error["code"] == "context_length_exceeded"))
}

/// The error object of an answer: under `error` (OpenAI, Anthropic, llama.cpp, vLLM now), or
/// the answer itself (vLLM before, and the OpenAI SDKs' `body`), or only a message under
/// `error`; Gemini may answer a list of one error.
fn error_object(answer: Value) -> Value {
    let answer = match answer {
        Value::Array(mut list) if !list.is_empty() => list.swap_remove(0),
        answer => answer,
    };
    match &answer["error"] {
        Value::Object(_) => answer["error"].clone(),
        Value::String(message) => json!({ "message": message }),
        _ => answer,
    }
}

/// A refusal that states both figures in one sentence: Anthropic's, Gemini's and Mistral's
/// (whose platform counts speculative-decoding drafts in some versions).
fn stated_overflow(lowered: &str) -> Option<Overflow> {
    static ANTHROPIC: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"prompt is too long: (\d+) tokens > (\d+) maximum").expect("a valid regex")
    });
    static GEMINI: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)",
        )
        .expect("a valid regex")
    });
    static MISTRAL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"prompt contains (\d+) tokens(?: and \d+ draft tokens)?, too large for model with (\d+) maximum context length")
            .expect("a valid regex")
    });
    let c = ANTHROPIC
        .captures(lowered)
        .or_else(|| GEMINI.captures(lowered))
        .or_else(|| MISTRAL.captures(lowered))?;
    Some(Overflow {
        tokens: figure(&c[1]),
        limit: figure(&c[2]),
        completion: None,
    })
}

/// Anthropic's refusal of a prompt that leaves the completion the client asked for
/// (`max_tokens`) no room.
fn reserved_overflow(lowered: &str) -> Option<Overflow> {
    static RESERVED: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"input length and `?max_tokens`? exceed context limit: (\d+) \+ (\d+) > (\d+)")
            .expect("a valid regex")
    });
    let c = RESERVED.captures(lowered)?;
    curable(Overflow {
        tokens: figure(&c[1]),
        limit: figure(&c[3]),
        completion: Some(figure(&c[2])?),
    })
}

/// OpenAI's refusal (`context_length_exceeded`) and those worded like it (vLLM, OpenRouter,
/// "prompt is too long" without figures).
fn openai_overflow(lowered: &str, openai_code: bool) -> Option<Overflow> {
    if !openai_code
        && !lowered.contains("maximum context length")
        && !lowered.contains("prompt is too long")
    {
        return None;
    }
    static LIMIT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"maximum context length is (\d+) tokens").expect("a valid regex")
    });
    // The prompt's share when the figure counts the completion too: vLLM's "in the messages",
    // OpenAI's older "in your prompt", OpenRouter's "of text input" (its "requested about N"
    // may be mostly the completion a client reserved, which no compaction shrinks), and the
    // completion's: "in the completion", "for the completion", "in the output".
    static TOKENS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?:resulted in|requested)(?: about)? (\d+) tokens(?: \((\d+) (?:in the messages|in your prompt|of text input)(?:[,;] (\d+) (?:in|for) the (?:completion|output))?)?",
        )
        .expect("a valid regex")
    });
    let counts = TOKENS.captures(lowered);
    let figure_at = |i: usize| counts.as_ref()?.get(i).and_then(|m| figure(m.as_str()));
    curable(Overflow {
        // Of a figure that counts the completion too, the messages' share.
        tokens: figure_at(2).or_else(|| figure_at(1)),
        limit: LIMIT.captures(lowered).and_then(|c| figure(&c[1])),
        completion: figure_at(3),
    })
}

/// The refusal, unless the completion it says the client asked for takes so much of the
/// window that no compaction makes room beside it ([`completion_share`]): that one reaches the
/// client as it came.
fn curable(overflow: Overflow) -> Option<Overflow> {
    match (overflow.limit, overflow.completion) {
        (Some(limit), Some(completion)) if completion_share(limit, completion).is_none() => None,
        _ => Some(overflow),
    }
}

/// A figure a model could have counted (at most [`compactd_core::MAX_REPORTED_TOKENS`]).
fn count(value: &Value) -> Option<usize> {
    reported_tokens([value.as_u64()?])
}

/// A figure of a refusal's message, as [`count`].
fn figure(text: &str) -> Option<usize> {
    reported_tokens([text.parse().ok()?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(status: u16, body: Value) -> Option<Overflow> {
        overflow(status, body.to_string().as_bytes())
    }

    fn refused(
        tokens: Option<usize>,
        limit: Option<usize>,
        completion: Option<usize>,
    ) -> Option<Overflow> {
        Some(Overflow {
            tokens,
            limit,
            completion,
        })
    }

    #[test]
    fn anthropic_says_how_long_the_prompt_was_and_the_window() {
        let body = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 219898 tokens > 200000 maximum"}, "request_id": "req_1"});
        assert_eq!(read(400, body), refused(Some(219_898), Some(200_000), None));
    }

    #[test]
    fn mistral_says_how_long_the_prompt_was_and_the_window() {
        let message =
            "Prompt contains 66385 tokens, too large for model with 32768 maximum context length";
        let error = json!({"object": "error", "message": message,
            "type": "invalid_request_error", "param": null, "code": null});
        for body in [error.clone(), json!({"error": error})] {
            assert_eq!(read(400, body), refused(Some(66_385), Some(32_768), None));
        }
        let drafts = json!({"object": "error", "type": "invalid_request_error",
            "message": "Prompt contains 40024 tokens and 0 draft tokens, too large for model with 32768 maximum context length"});
        assert_eq!(read(400, drafts), refused(Some(40_024), Some(32_768), None));
        let other = json!({"object": "error", "type": "invalid_request_error",
            "message": "Prompt contains 12 tokens, but the model is not available"});
        assert_eq!(read(400, other), None, "not a refusal as too long");
    }

    #[test]
    fn openai_and_compatible_servers_say_it_in_one_sentence() {
        let chat = json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(read(400, chat), refused(Some(130_532), Some(128_000), None));
        // vLLM counts the completion in: the messages' share is what compaction can shrink,
        // the completion's what the client keeps asking room for.
        let vllm = json!({"object": "error", "message": "This model's maximum context length is 32768 tokens. However, you requested 33000 tokens (31000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError", "code": 400});
        // Nested under `error` (vLLM now) or at the answer's root (vLLM before).
        for vllm in [json!({"error": vllm.clone()}), vllm] {
            assert_eq!(
                read(400, vllm),
                refused(Some(31_000), Some(32_768), Some(2_000))
            );
        }
        // OpenRouter: the prompt's share counts; a completion asked for that fills the window
        // alone is no refusal a compaction cures.
        let openrouter = |input: usize, output: usize| {
            json!({"error": {"code": 400, "metadata": {"provider_name": "Chutes"},
            "message": format!("This endpoint's maximum context length is 131072 tokens. However, you requested about {} tokens ({input} of text input, {output} in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.", input + output)}})
        };
        assert_eq!(
            read(400, openrouter(120_535, 16_384)),
            refused(Some(120_535), Some(131_072), Some(16_384))
        );
        assert_eq!(read(400, openrouter(10_535, 131_072)), None);
        let older = json!({"error": {"type": "invalid_request_error", "param": null, "code": null,
            "message": "This model's maximum context length is 8192 tokens, however you requested 8977 tokens (8900 in your prompt; 77 for the completion). Please reduce your prompt; or completion length."}});
        assert_eq!(
            read(400, older),
            refused(Some(8_900), Some(8_192), Some(77))
        );
        // Anthropic, when the prompt leaves no room for the completion the client asked for.
        let reserved = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 178959 + 64000 > 200000, decrease input length or `max_tokens` and try again"}});
        assert_eq!(
            read(400, reserved),
            refused(Some(178_959), Some(200_000), Some(64_000))
        );
        // A completion that alone fills the window, or all but a quarter of it: no compaction
        // makes room beside it.
        let hopeless = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 23339 + 128000 > 48000, decrease input length or `max_tokens` and try again"}});
        assert_eq!(read(400, hopeless), None);
        let most = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 23339 + 40000 > 48000, decrease input length or `max_tokens` and try again"}});
        assert_eq!(read(400, most), None);
        // Gemini, alone or in a list of one.
        let gemini = json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
            "message": "The input token count (134123) exceeds the maximum number of tokens allowed (131072)."}});
        for gemini in [gemini.clone(), json!([gemini])] {
            assert_eq!(
                read(400, gemini),
                refused(Some(134_123), Some(131_072), None)
            );
        }
        // The Responses API names the code and nothing else.
        let responses = json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}});
        assert_eq!(read(400, responses), refused(None, None, None));
        let llama = json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 40000, "n_ctx": 32768}});
        assert_eq!(read(400, llama), refused(Some(40_000), Some(32_768), None));
    }

    #[test]
    fn other_refusals_are_not_overflows() {
        let rate = json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
        assert_eq!(read(429, rate.clone()), None);
        assert_eq!(read(400, rate), None);
        let bad = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "messages.1.content.0.tool_result: unexpected tool_use_id"}});
        assert_eq!(read(400, bad), None);
        assert_eq!(overflow(400, b"prompt is too long"), None, "not JSON");
        assert_eq!(overflow(400, b""), None);
        let text = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 219898 tokens > 200000 maximum"}});
        assert_eq!(read(500, text), None, "a server error is not a refusal");
        // Figures no model could have counted are no figures.
        let absurd = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 99999999999999999999999 tokens > 2000000000 maximum"}});
        assert_eq!(read(400, absurd), refused(None, None, None));
    }
}
