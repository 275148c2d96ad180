//! A local model server for the bench: an OpenAI-compatible `/v1/chat/completions` that
//! answers after a fixed delay. As a summarizer it writes a nine-section summary; as the
//! proxy's upstream it answers a short assistant message. Loopback only, in this process.

use anyhow::Result;
use axum::{Json, Router, extract::State, routing::post};
use compactd_core::compaction::sections::{SUMMARY_SECTIONS, heading};
use serde_json::{Value, json};
use std::time::Duration;

/// The model name the bench's summarizer asks for (anything else is an agent's call).
pub(super) const SUMMARIZER_MODEL: &str = "bench-summarizer";

pub(super) struct MockModel {
    /// `http://127.0.0.1:PORT/v1`, the base URL a summarizer or the proxy takes.
    pub base: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl MockModel {
    /// Serves on a free loopback port; every answer comes `delay` after its request.
    pub(super) async fn start(delay: Duration) -> Result<MockModel> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}/v1", listener.local_addr()?);
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            // A conversation of 10,000 messages is several megabytes.
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(delay);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(MockModel { base, server })
    }
}

async fn answer(State(delay): State<Duration>, Json(request): Json<Value>) -> Json<Value> {
    tokio::time::sleep(delay).await;
    let content = if request["model"] == SUMMARIZER_MODEL {
        SUMMARY_SECTIONS
            .iter()
            .map(|s| format!("{}\n- bench summary, section {}", heading(s), s.number))
            .collect::<Vec<_>>()
            .join("\n\n")
    } else {
        "Done; the next module is next.".to_string()
    };
    Json(json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
    }))
}
