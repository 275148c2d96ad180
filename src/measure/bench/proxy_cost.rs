//! What the proxy adds to one model call: the same Chat Completions request sent straight to
//! a local model server and through compactd's proxy (on its socket), with 10, 1,000 and
//! 10,000 messages of history. The agent resends its whole conversation with every call, as
//! agents do, and keeps each answer; the first call of each conversation (which stores its
//! whole history and compacts it) is not counted.

use super::mock_model::MockModel;
use super::percentile;
use crate::client::Client;
use crate::measure::daemon_process::DaemonProcess;
use anyhow::{Result, bail};
use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProxyFigures {
    pub calls_per_size: usize,
    /// p50 of (through the proxy) - p50 of (straight to the model), in ms.
    pub added_ms_10: f64,
    pub added_ms_1k: f64,
    pub added_ms_10k: f64,
    /// p50 of a straight call at 10,000 messages, for scale.
    pub direct_ms_10k: f64,
}

const KEY: &str = "Bearer sk-bench-0123456789abcdef";

/// A conversation of `n` messages: a system prompt, the task, then turns of ~400 characters.
fn conversation(n: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are a coding agent (history of {n}).")}),
        json!({"role": "user", "content": "Work through the backlog, one module at a time."}),
    ];
    for i in 2..n {
        let role = if i % 2 == 0 { "assistant" } else { "user" };
        messages.push(json!({"role": role, "content": format!("turn {i}: {}", "progress on the module and what comes next; ".repeat(9))}));
    }
    messages
}

pub(super) async fn run(quick: bool) -> Result<ProxyFigures> {
    let calls = if quick { 5 } else { 20 };
    let model = MockModel::start(Duration::ZERO).await?;
    let dir = tempfile::TempDir::new()?;
    let config = format!("[proxy]\nopenai_upstream = \"{}\"\n", model.base);
    let mut daemon = DaemonProcess::start(dir.path(), &config)?;
    let client = Client::new(daemon.socket());
    let direct = reqwest::Client::new();
    let mut added = Vec::new();
    let mut direct_10k = 0.0;
    for size in [10, 1_000, 10_000] {
        let mut messages = conversation(size);
        let (mut through, mut straight) = (Vec::new(), Vec::new());
        let mut conn = client.keep_alive().await?;
        for call in 0..=calls {
            let body = json!({"model": "bench-agent", "messages": messages}).to_string();
            let start = Instant::now();
            let answer = direct
                .post(format!("{}/chat/completions", model.base))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await?;
            answer.bytes().await?;
            let direct_ms = start.elapsed().as_secs_f64() * 1e3;
            let start = Instant::now();
            let answer = conn
                .raw_with(
                    Method::POST,
                    "/v1/chat/completions",
                    &[("authorization", KEY)],
                    body,
                )
                .await?;
            let proxied_ms = start.elapsed().as_secs_f64() * 1e3;
            if !answer.status.is_success() {
                bail!(
                    "proxy at {size} messages: {} {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
            }
            if call > 0 {
                through.push(proxied_ms);
                straight.push(direct_ms);
            }
            messages.push(answer.json()["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": format!("next, call {call}")}));
        }
        through.sort_by(f64::total_cmp);
        straight.sort_by(f64::total_cmp);
        added.push(percentile(&through, 0.5) - percentile(&straight, 0.5));
        direct_10k = percentile(&straight, 0.5);
    }
    daemon.stop()?;
    Ok(ProxyFigures {
        calls_per_size: calls,
        added_ms_10: added[0],
        added_ms_1k: added[1],
        added_ms_10k: added[2],
        direct_ms_10k: direct_10k,
    })
}
