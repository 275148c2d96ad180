//! Anthropic's Messages API.

use super::SYSTEM_PROMPT;
use super::SummarizeError;
use super::model::ModelApi;
use serde_json::{Value, json};

/// The API version compactd speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `POST {base_url}/v1/messages`, `x-api-key`, the text in the `content` text blocks.
pub struct Anthropic;

impl ModelApi for Anthropic {
    const KIND: &'static str = "anthropic";

    fn headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)> {
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION.to_string())];
        headers.extend(api_key.map(|key| ("x-api-key", key.to_string())));
        headers
    }

    fn body(&self, model: &str, max_output_tokens: usize, prompt: &str) -> Value {
        json!({
            "model": model,
            "max_tokens": max_output_tokens,
            "system": SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": prompt}],
        })
    }

    fn text(&self, answer: &Value) -> Result<String, SummarizeError> {
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
}
