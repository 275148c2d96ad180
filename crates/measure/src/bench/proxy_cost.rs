//! What the proxy adds to one model call: the same Chat Completions request sent straight to
//! a local model server and through compactd's proxy (on its socket), with 10, 1,000 and
//! 10,000 messages of history. The agent resends its whole conversation with every call, as
//! agents do, and keeps each answer; the first call of each conversation (which stores its
//! whole history and compacts it) is not counted. Then, what the proxy costs its neighbours:
//! other agents' `/context` and appends on the same socket while the proxy serves two agents
//! resending 10,000-message conversations at once.

use super::mock_model::MockModel;
use super::percentile;
use crate::daemon_process::DaemonProcess;
use anyhow::{Result, bail};
use compactd_api::client::{Client, Connection};
use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct ProxyFigures {
    pub calls_per_size: usize,
    /// p50 of (through the proxy) - p50 of (straight to the model), in ms.
    pub added_ms_10: f64,
    pub added_ms_1k: f64,
    pub added_ms_10k: f64,
    /// p50 of a straight call at 10,000 messages, for scale.
    pub direct_ms_10k: f64,
    /// Another agent's `/context` (a session of 50 messages, under its trigger) while the
    /// proxy serves two agents resending 10,000-message conversations at once: p50, p99 and
    /// max, ms.
    pub neighbour_context_p50_ms: f64,
    pub neighbour_context_p99_ms: f64,
    pub neighbour_context_max_ms: f64,
    /// Another agent's appends beside the same calls (a session that never compacts): p50,
    /// p99 and max, ms.
    pub neighbour_append_p50_ms: f64,
    pub neighbour_append_p99_ms: f64,
    pub neighbour_append_max_ms: f64,
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

pub async fn run(quick: bool) -> Result<ProxyFigures> {
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
                .body(body)
                .send()
                .await?;
            answer.bytes().await?;
            let direct_ms = start.elapsed().as_secs_f64() * 1e3;
            let proxied_ms = proxied_call(&mut conn, &mut messages, call).await?;
            if call > 0 {
                through.push(proxied_ms);
                straight.push(direct_ms);
            }
        }
        through.sort_by(f64::total_cmp);
        straight.sort_by(f64::total_cmp);
        added.push(percentile(&through, 0.5) - percentile(&straight, 0.5));
        direct_10k = percentile(&straight, 0.5);
    }
    let Neighbours { context, append } = beside_the_proxy(&client, calls).await?;
    daemon.stop()?;
    Ok(ProxyFigures {
        calls_per_size: calls,
        added_ms_10: added[0],
        added_ms_1k: added[1],
        added_ms_10k: added[2],
        direct_ms_10k: direct_10k,
        neighbour_context_p50_ms: percentile(&context, 0.5),
        neighbour_context_p99_ms: percentile(&context, 0.99),
        neighbour_context_max_ms: context.last().copied().unwrap_or(0.0),
        neighbour_append_p50_ms: percentile(&append, 0.5),
        neighbour_append_p99_ms: percentile(&append, 0.99),
        neighbour_append_max_ms: append.last().copied().unwrap_or(0.0),
    })
}

/// One call through the proxy with the whole conversation; the answer and the next user
/// message join the conversation. Returns the call's time, ms.
async fn proxied_call(
    conn: &mut Connection,
    messages: &mut Vec<Value>,
    call: usize,
) -> Result<f64> {
    let body = json!({"model": "bench-agent", "messages": messages}).to_string();
    let start = Instant::now();
    let answer = conn
        .raw_with(
            Method::POST,
            "/v1/chat/completions",
            &[("authorization", KEY)],
            body,
        )
        .await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if !answer.status.is_success() {
        bail!(
            "proxy at {} messages: {} {}",
            messages.len(),
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
    }
    messages.push(answer.json()["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": format!("next, call {call}")}));
    Ok(ms)
}

/// What the neighbours saw beside the proxy: latencies (ms, sorted) of their requests that
/// started while a proxied call was in flight.
struct Neighbours {
    context: Vec<f64>,
    append: Vec<f64>,
}

/// Two agents resending conversations of 10,000 messages through the proxy at once, `calls`
/// calls each, while two more work beside them through the API, one request after another:
/// one asks for its context (a session of 50 messages, under its trigger), the other appends
/// (to a session that never compacts, so its appends measure the append path alone). Two
/// proxied agents at once: with one, the runtime's other worker serves the neighbours
/// whatever the proxy does with its own. Each proxied conversation's first call stores its
/// 10,000 messages and the search index takes them in, a bounded step per write: the
/// appending neighbour's commit waits for the step in progress.
async fn beside_the_proxy(client: &Client, calls: usize) -> Result<Neighbours> {
    super::fill_session(client, "neighbour", 50).await?;
    client
        .post("/session", &super::unbounded_session("neighbour-writes"))
        .await?;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = neighbour(client, &in_flight, &done, |_| {
        (
            Method::GET,
            "/session/neighbour/context".into(),
            String::new(),
        )
    })
    .await?;
    let writer = neighbour(client, &in_flight, &done, |i| {
        let body = super::bench_message(i).to_string();
        (
            Method::POST,
            "/session/neighbour-writes/message".into(),
            body,
        )
    })
    .await?;
    let agents: Vec<_> = (0..2)
        .map(|agent| {
            let (client, in_flight) = (client.clone(), in_flight.clone());
            tokio::spawn(async move {
                let mut messages = conversation(10_000);
                messages[0] =
                    json!({"role": "system", "content": format!("You are coding agent {agent}.")});
                let mut conn = client.keep_alive().await?;
                for call in 0..calls {
                    in_flight.fetch_add(1, Ordering::AcqRel);
                    let sent = proxied_call(&mut conn, &mut messages, call).await;
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    sent?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    let mut result = Ok(());
    for agent in agents {
        if let Err(e) = agent.await? {
            result = Err(e);
        }
    }
    done.store(true, Ordering::Release);
    let (context, append) = (reader.await??, writer.await??);
    result.map(|()| Neighbours { context, append })
}

/// A neighbour sending `request(i)` (method, path, body) one after another on a connection of
/// its own until `done`; its task returns the latencies (ms, sorted) of the requests that
/// started while a proxied call was in flight. A request that fails fails the run.
async fn neighbour(
    client: &Client,
    in_flight: &Arc<AtomicUsize>,
    done: &Arc<AtomicBool>,
    request: impl Fn(usize) -> (Method, String, String) + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<Vec<f64>>>> {
    let (in_flight, done) = (in_flight.clone(), done.clone());
    let mut conn = client.keep_alive().await?;
    Ok(tokio::spawn(async move {
        let mut out = Vec::new();
        let mut i = 0;
        while !done.load(Ordering::Acquire) {
            let during = in_flight.load(Ordering::Acquire) > 0;
            let (method, path, body) = request(i);
            i += 1;
            let start = Instant::now();
            let answer = conn.raw(method, &path, body).await?;
            if !answer.status.is_success() {
                bail!("the neighbour's {path}: {}", answer.status);
            }
            if during {
                out.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        out.sort_by(f64::total_cmp);
        Ok(out)
    }))
}
