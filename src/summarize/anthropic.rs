//! Anthropic's Messages API.

use super::http::{CallPolicy, post_json};
use super::{SYSTEM_PROMPT, SummarizeError, Summarizer, SummaryRequest};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The API version compactd speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

pub struct Anthropic {
    /// `{base_url}/v1/messages`
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub max_output_tokens: usize,
    pub context_window: Option<usize>,
    pub policy: CallPolicy,
}

#[async_trait]
impl Summarizer for Anthropic {
    fn name(&self) -> String {
        format!("anthropic:{}", self.model)
    }

    fn context_window(&self) -> Option<usize> {
        self.context_window
    }

    fn max_output_tokens(&self) -> usize {
        self.max_output_tokens
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let body = json!({
            "model": self.model,
            "max_tokens": self.max_output_tokens,
            "system": SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": request.prompt}],
        });
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION.to_string())];
        if let Some(key) = &self.api_key {
            headers.push(("x-api-key", key.clone()));
        }
        let answer = post_json(&self.url, &headers, &body, &self.policy).await?;
        message_text(&answer)
    }
}

/// The text blocks of `content`, joined.
fn message_text(answer: &Value) -> Result<String, SummarizeError> {
    let blocks = answer["content"]
        .as_array()
        .ok_or_else(|| SummarizeError::BadResponse("no content array in the answer".into()))?;
    Ok(blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n"))
}
