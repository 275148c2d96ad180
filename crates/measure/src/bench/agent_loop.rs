//! The agent loop as the agent sees it, with a model summarizer that takes seconds: before
//! every step the agent asks for its context, "thinks" (the model's time, simulated), then
//! appends its tool call and the output. Run twice in one bench, compactions waited for (the
//! behaviour before background compaction: `background_at = 1.0`, no bound) and in the
//! background (the default with a model summarizer), so the two compare on one machine.

use super::mock_model::{MockModel, SUMMARIZER_MODEL};
use super::percentile;
use crate::daemon_process::DaemonProcess;
use anyhow::{Result, bail};
use compactd_api::client::Client;
use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct AgentLoopFigures {
    pub steps: usize,
    pub summarizer_ms: u64,
    /// The agent's own time per step (its model call), simulated.
    pub step_ms: u64,
    pub context_limit: usize,
    /// Contexts wait for every compaction (`background_at = 1.0`, `max_wait_s = 3600`).
    pub waiting: LoopRun,
    /// Compactions in the background (defaults).
    pub background: LoopRun,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoopRun {
    pub context_p50_ms: f64,
    pub context_p99_ms: f64,
    pub context_max_ms: f64,
    /// Contexts that waited for a compaction to land: served with a compaction the context
    /// before had not, and slower than [`WAITED_MS`]. (Counted as "slower than a quarter of
    /// the summarizer's time" until the forty-fifth session, which missed the ~60 ms waits of
    /// `--quick`: contexts that reached the trigger 60 ms before the summary landed.)
    pub waits: usize,
    pub compactions: u64,
    /// Compactions the extractive summarizer finished because a context waited `max_wait_s`.
    pub hurried: usize,
    /// Contexts served over the trigger (`context_limit - reserve`) and over the limit itself.
    pub over_trigger: usize,
    pub over_limit: usize,
}

/// A context slower than this that was served with a new compaction waited for it: one
/// that did not takes about a millisecond, and a compaction it waits for lands at most a
/// summary's time after it started.
const WAITED_MS: f64 = 10.0;

/// How long the loop runs.
struct Shape {
    steps: usize,
    summarizer: Duration,
    step: Duration,
    context_limit: usize,
}

pub async fn run(quick: bool) -> Result<AgentLoopFigures> {
    let shape = if quick {
        Shape {
            steps: 60,
            // The summary lands within the room the background line leaves (about seven
            // steps at 16k), as the full run's 2 s does within its 32k's; at 500 ms each
            // compaction's context reached the trigger ~60 ms before its summary landed, and
            // waited (`--quick` p99 55-60 ms in CI).
            summarizer: Duration::from_millis(250),
            step: Duration::from_millis(60),
            context_limit: 16_000,
        }
    } else {
        Shape {
            steps: 300,
            summarizer: Duration::from_secs(2),
            step: Duration::from_millis(250),
            context_limit: 32_000,
        }
    };
    let model = MockModel::start(shape.summarizer).await?;
    let waiting = one_loop(&model, &shape, "background_at = 1.0\nmax_wait_s = 3600\n").await?;
    let background = one_loop(&model, &shape, "").await?;
    Ok(AgentLoopFigures {
        steps: shape.steps,
        summarizer_ms: shape.summarizer.as_millis() as u64,
        step_ms: shape.step.as_millis() as u64,
        context_limit: shape.context_limit,
        waiting,
        background,
    })
}

/// One step's messages: a call and its output of about 1,200 characters (~330 tokens).
fn step_messages(i: usize) -> Value {
    let call = format!("call-{i}");
    json!({"messages": [
        {"role": "assistant", "parts": [
            {"type": "text", "text": format!("Reading module {i}.")},
            {"type": "tool_call", "id": call, "name": "bash", "args": {"command": format!("cat src/m{i}.rs")}}]},
        {"role": "tool", "parts": [
            {"type": "tool_result", "call_id": call, "output": format!("// module {i}\n{}", "fn item() -> u32 { 42 }\n".repeat(48))}]}
    ]})
}

async fn one_loop(model: &MockModel, shape: &Shape, compaction: &str) -> Result<LoopRun> {
    let dir = tempfile::TempDir::new()?;
    let config = format!(
        "[compaction]\n{compaction}[summarizer]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{SUMMARIZER_MODEL}\"\ntimeout_s = 120\n",
        model.base
    );
    let mut daemon = DaemonProcess::start(dir.path(), &config)?;
    let client = Client::new(daemon.socket());
    // Token-triggered compactions only (no masking, no message trigger): those are the ones
    // a context can need.
    client
        .post(
            "/session",
            &json!({"id": "loop", "context_limit": shape.context_limit,
                    "config": {"microcompact": false, "max_messages": 100_000}}),
        )
        .await?;
    client
        .post(
            "/session/loop/message",
            &json!({"role": "user", "content": "Read every module and report what each does."}),
        )
        .await?;
    let threshold = client.get("/session/loop").await?["token_threshold"]
        .as_u64()
        .unwrap_or(0) as usize;
    let mut conn = client.keep_alive().await?;
    let (mut latencies, mut over_trigger, mut over_limit) = (Vec::new(), 0, 0);
    let (mut waits, mut last_num) = (0, 0);
    for i in 0..shape.steps {
        let start = Instant::now();
        let answer = conn.raw(Method::GET, "/session/loop/context", "").await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        latencies.push(ms);
        if !answer.status.is_success() {
            bail!("context: {}", answer.status);
        }
        let context = answer.json();
        let num = context["compaction_num"].as_u64().unwrap_or(0);
        waits += usize::from(num > last_num && ms >= WAITED_MS);
        last_num = num;
        let tokens = context["tokens"].as_u64().unwrap_or(0) as usize;
        over_trigger += usize::from(tokens >= threshold);
        over_limit += usize::from(tokens > shape.context_limit);
        tokio::time::sleep(shape.step).await;
        let body = step_messages(i).to_string();
        let answer = conn
            .raw(Method::POST, "/session/loop/message", body)
            .await?;
        if !answer.status.is_success() {
            bail!("append: {}", answer.status);
        }
    }
    let compactions = client.get("/session/loop").await?["compaction_count"]
        .as_u64()
        .unwrap_or(0);
    let history = client.get("/session/loop/compaction?limit=100").await?;
    let hurried = history["compactions"].as_array().map_or(0, |c| {
        c.iter().filter(|c| !c["fallback_reason"].is_null()).count()
    });
    daemon.stop()?;
    latencies.sort_by(f64::total_cmp);
    Ok(LoopRun {
        context_p50_ms: percentile(&latencies, 0.5),
        context_p99_ms: percentile(&latencies, 0.99),
        context_max_ms: latencies.last().copied().unwrap_or(0.0),
        waits,
        compactions,
        hurried,
        over_trigger,
        over_limit,
    })
}
