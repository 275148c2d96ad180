//! What the HTTP summarizers share: an endpoint, a model, a key, limits and a call policy.
//! Each API ([`super::openai`], [`super::anthropic`]) only says how to shape the request and
//! where the text is in the answer.

use super::http::{CallPolicy, post_json};
use super::{SummarizeError, Summarizer, SummaryRequest};
use async_trait::async_trait;
use serde_json::Value;

/// One model API's request and answer shapes.
pub trait ModelApi: Send + Sync {
    /// Names the summarizer in records: `openai:<model>`.
    const KIND: &'static str;
    /// Headers for a call (the key goes here).
    fn headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)>;
    /// The JSON body asking `model` to follow `prompt`.
    fn body(&self, model: &str, max_output_tokens: usize, prompt: &str) -> Value;
    /// The summary in the answer.
    fn text(&self, answer: &Value) -> Result<String, SummarizeError>;
}

/// A summarizer calling a model over HTTP.
pub struct ModelSummarizer<A> {
    pub api: A,
    /// The full endpoint URL.
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub max_output_tokens: usize,
    pub context_window: Option<usize>,
    pub policy: CallPolicy,
}

#[async_trait]
impl<A: ModelApi> Summarizer for ModelSummarizer<A> {
    fn name(&self) -> String {
        format!("{}:{}", A::KIND, self.model)
    }

    fn context_window(&self) -> Option<usize> {
        self.context_window
    }

    fn max_output_tokens(&self) -> usize {
        self.max_output_tokens
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let body = self
            .api
            .body(&self.model, self.max_output_tokens, &request.prompt);
        let headers = self.api.headers(self.api_key.as_deref());
        let answer = post_json(&self.url, &headers, &body, &self.policy).await?;
        // A model that echoes the key (from a prompt, a log it saw) must not store it.
        let text = self.api.text(&answer)?;
        Ok(super::http::scrub_secret(&text, self.api_key.as_deref()))
    }
}
