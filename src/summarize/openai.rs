//! Any OpenAI-compatible chat completions endpoint: OpenAI, Ollama, llama.cpp, vLLM.

use super::http::{CallPolicy, post_json};
use super::{SYSTEM_PROMPT, SummarizeError, Summarizer, SummaryRequest};
use async_trait::async_trait;
use serde_json::{Value, json};

pub struct OpenAi {
    /// `{base_url}/chat/completions`
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub max_output_tokens: usize,
    pub context_window: Option<usize>,
    pub policy: CallPolicy,
}

#[async_trait]
impl Summarizer for OpenAi {
    fn name(&self) -> String {
        format!("openai:{}", self.model)
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
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": request.prompt},
            ],
            "max_tokens": self.max_output_tokens,
            "temperature": 0,
        });
        let mut headers = Vec::new();
        if let Some(key) = &self.api_key {
            headers.push(("authorization", format!("Bearer {key}")));
        }
        let answer = post_json(&self.url, &headers, &body, &self.policy).await?;
        completion_text(&answer)
    }
}

/// The text of `choices[0].message.content`.
fn completion_text(answer: &Value) -> Result<String, SummarizeError> {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            SummarizeError::BadResponse("no choices[0].message.content in the answer".into())
        })
}
