//! Any OpenAI-compatible chat completions endpoint: OpenAI, Ollama, llama.cpp, vLLM.

use super::SYSTEM_PROMPT;
use super::SummarizeError;
use super::model::ModelApi;
use serde_json::{Value, json};

/// `POST {base_url}/chat/completions`, Bearer key, the text in `choices[0].message.content`.
pub struct OpenAi;

impl ModelApi for OpenAi {
    const KIND: &'static str = "openai";

    fn headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)> {
        api_key
            .map(|key| ("authorization", format!("Bearer {key}")))
            .into_iter()
            .collect()
    }

    fn body(&self, model: &str, max_output_tokens: usize, prompt: &str) -> Value {
        json!({
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": max_output_tokens,
            "temperature": 0,
        })
    }

    fn text(&self, answer: &Value) -> Result<String, SummarizeError> {
        answer["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                SummarizeError::BadResponse("no choices[0].message.content in the answer".into())
            })
    }
}
