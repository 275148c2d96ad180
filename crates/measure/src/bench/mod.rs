//! `compactd bench`: what compactd costs an agent, measured beside what this machine can do
//! at best, in one run (absolute times on shared machines drift; ratios within a run hold).
//!
//! A real daemon process is started on a temp dir, by default with default durability
//! (`synchronous = FULL`, one fsync per commit batch). Clients keep their connection open, as
//! agents and plugins do, each phase on connections of its own opened when it starts: one
//! left idle through another phase's fill can outlast the daemon's idle timeout
//! (`request_timeout_s`, 30 s) and fail the run.

mod agent_loop;
mod host;
mod mock_model;
mod proxy_cost;
mod render;
mod rounds;
mod search;
mod session_size;

pub use render::render;

use crate::daemon_process::DaemonProcess;
use crate::synthetic::synthetic_session;
use anyhow::{Result, bail};
use compactd_api::client::{Client, Connection};
use compactd_core::compaction::{
    CompactionConfig, CompactionPlan, LazyEstimator, PlanInput, estimate_each,
};
use compactd_store::Synchronous;
use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub append: AppendFigures,
    pub echo: Echo,
    /// append p50 / echo p50: the cost of the work over the cost of merely talking.
    pub append_vs_echo_p50: f64,
    /// raw SQLite's p50 per row / echo p50: the floor of the ratio above on this disk (an
    /// append that cost nothing but its commit, and no HTTP at all).
    pub raw_commit_vs_echo_p50: f64,
    pub context: ContextFigures,
    pub search: search::SearchFigures,
    pub engine: EngineFigures,
    pub rss_mb: Rss,
    pub agent_loop: agent_loop::AgentLoopFigures,
    pub proxy: proxy_cost::ProxyFigures,
    /// The machine, and how busy it was as the run began and ended.
    pub host: host::Host,
}

#[derive(Debug, Clone, Serialize)]
pub struct AppendFigures {
    pub clients_1: Throughput,
    pub clients_16: Throughput,
    /// One client's append p50 on sessions of 100, 10,000 and 100,000 messages.
    pub by_session_size: session_size::BySize,
    /// rusqlite inserting the same rows, one transaction each, same settings and disk.
    pub raw_sqlite_txn_per_s: f64,
    /// Its p50 per row.
    pub raw_sqlite_p50_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub msgs_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Echo {
    pub p50_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContextFigures {
    pub p50_us_100: f64,
    pub p50_us_100k: f64,
    /// p50 at 100,000 messages of history / p50 at 100.
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EngineFigures {
    pub plan_ms_80: f64,
    pub plan_ms_1000: f64,
    pub plan_ms_10000: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rss {
    pub idle: f64,
    pub sessions_1000: f64,
}

/// How much to measure.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    echo: usize,
    append_1: usize,
    append_16_each: usize,
    context_requests: usize,
    plan_runs: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                echo: 1_000,
                append_1: 600,
                append_16_each: 60,
                context_requests: 300,
                plan_runs: 5,
            }
        } else {
            Sizes {
                echo: 5_000,
                append_1: 3_000,
                append_16_each: 300,
                context_requests: 2_000,
                plan_runs: 20,
            }
        }
    }
}

/// A message like an agent's: about 400 characters of text.
fn bench_message(i: usize) -> Value {
    json!({"role": "user", "content": format!("message {i}: {}", "the agent reports progress on the task; ".repeat(10))})
}

/// Runs the whole benchmark with the daemon (and the raw SQLite baseline) at `synchronous`;
/// `progress` hears what is being measured.
pub async fn run(
    quick: bool,
    synchronous: Synchronous,
    progress: impl Fn(&str),
) -> Result<BenchReport> {
    let sizes = Sizes::new(quick);
    let host = host::Host::now();
    let dir = tempfile::TempDir::new()?;
    let config = toml::to_string(&compactd_daemon::Config {
        store: compactd_daemon::config::StoreConfig {
            path: None,
            synchronous,
        },
        ..Default::default()
    })?;
    let mut daemon = DaemonProcess::start(dir.path(), &config)?;
    let client = Client::new(dir.path().join("compactd.sock"));
    client.raw(Method::GET, "/health", "").await?;
    let rss_idle = daemon.rss_mb()?;

    let (append, echo, raw_indexed) =
        append_figures(&client, &sizes, dir.path(), synchronous, &progress).await?;
    let raw_sqlite_txn_per_s = append.raw_sqlite_txn_per_s;

    progress("context at 100 and 100,000 messages");
    let context = context_figures(&client, sizes.context_requests).await?;

    progress("search on 100,000 messages");
    let searched = search::latencies_100k(
        &mut client.keep_alive().await?,
        "ctx-100k",
        sizes.context_requests / 2,
    )
    .await?;
    let search = search::figures(&searched, raw_sqlite_txn_per_s, raw_indexed);

    progress("engine: plan at 80, 1,000 and 10,000 messages");
    let engine = EngineFigures {
        plan_ms_80: plan_ms(80, sizes.plan_runs * 10),
        plan_ms_1000: plan_ms(1_000, sizes.plan_runs * 2),
        plan_ms_10000: plan_ms(10_000, sizes.plan_runs),
    };

    progress("memory with 1,000 sessions of 100 messages");
    let rss_sessions = rss_with_sessions(&client, &daemon).await?;
    daemon.stop()?;

    progress("agent loop with a slow model summarizer, waiting and in the background");
    let agent_loop = agent_loop::run(quick).await?;

    progress("proxy: added latency per call at 10, 1,000 and 10,000 messages");
    let proxy = proxy_cost::run(quick).await?;

    Ok(BenchReport {
        append_vs_echo_p50: append.clients_1.p50_us / echo.p50_us,
        raw_commit_vs_echo_p50: append.raw_sqlite_p50_us / echo.p50_us,
        append,
        echo,
        context,
        search,
        engine,
        rss_mb: Rss {
            idle: rss_idle,
            sessions_1000: rss_sessions,
        },
        agent_loop,
        proxy,
        host: host.ended(),
    })
}

/// Appends from one client and from 16 in rounds with the echo and raw SQLite's rate (with
/// and without the full-text index, for the search figure; see [`rounds`]), then by
/// session size.
async fn append_figures(
    client: &Client,
    sizes: &Sizes,
    dir: &Path,
    synchronous: Synchronous,
    progress: &impl Fn(&str),
) -> Result<(AppendFigures, Echo, f64)> {
    progress("echo, append from 1 and 16 clients, raw SQLite: in alternating rounds");
    let rounds = rounds::run(client, sizes, dir, synchronous).await?;

    progress("append by session size: 100, 10,000 and 100,000 messages");
    let by_session_size = session_size::run(client, sizes.append_1 / 3).await?;

    let figures = AppendFigures {
        clients_1: throughput(&rounds.one, rounds.one_elapsed),
        clients_16: throughput(&rounds.sixteen, rounds.sixteen_elapsed),
        by_session_size,
        raw_sqlite_txn_per_s: rounds.raw,
        raw_sqlite_p50_us: rounds.raw_p50,
    };
    let echo = Echo {
        p50_us: percentile(&rounds.echo, 0.5),
    };
    Ok((figures, echo, rounds.raw_indexed))
}

/// A session that never compacts: compaction runs after the acknowledgement and is measured
/// elsewhere, so its appends measure the append path alone.
fn unbounded_session(id: &str) -> serde_json::Value {
    json!({"id": id, "context_limit": 100_000_000, "config": {"max_messages": 100_000_000}})
}

/// The daemon's resident memory once it holds 1,000 sessions of 100 messages.
async fn rss_with_sessions(client: &Client, daemon: &DaemonProcess) -> Result<f64> {
    for s in 0..1_000 {
        fill_session(client, &format!("mem-{s}"), 100).await?;
    }
    client.raw(Method::GET, "/health", "").await?;
    daemon.rss_mb()
}

/// Context latency at 100 and at 100,000 messages, and their ratio.
async fn context_figures(client: &Client, requests: usize) -> Result<ContextFigures> {
    fill_session(client, "ctx-100", 100).await?;
    fill_session(client, "ctx-100k", 100_000).await?;
    let get = |path: &str| (Method::GET, path.to_string(), String::new());
    let conn = &mut client.keep_alive().await?;
    let small = latencies(conn, requests, |_| get("/session/ctx-100/context")).await?;
    let large = latencies(conn, requests, |_| get("/session/ctx-100k/context")).await?;
    let (p50_us_100, p50_us_100k) = (percentile(&small, 0.5), percentile(&large, 0.5));
    Ok(ContextFigures {
        p50_us_100,
        p50_us_100k,
        ratio: p50_us_100k / p50_us_100,
    })
}

/// Sends `n` requests one after another on `conn`, request `i` being `request(i)` (method,
/// path, body); returns their latencies in µs, sorted. A request that fails fails the run.
async fn latencies(
    conn: &mut Connection,
    n: usize,
    request: impl Fn(usize) -> (Method, String, String),
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (method, path, body) = request(i);
        let start = Instant::now();
        let answer = conn.raw(method, &path, body).await?;
        out.push(start.elapsed().as_secs_f64() * 1e6);
        if !answer.status.is_success() {
            bail!(
                "{path}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
        }
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn throughput(sorted: &[f64], elapsed: Duration) -> Throughput {
    Throughput {
        msgs_per_s: sorted.len() as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(sorted, 0.5),
        p99_us: percentile(sorted, 0.99),
    }
}

/// A session of `n` messages like an agent's (one request, then tool rounds), appended in
/// batches with default compaction, waiting for each compaction.
async fn fill_session(client: &Client, id: &str, n: usize) -> Result<()> {
    client.post("/session", &json!({"id": id})).await?;
    let mut batch =
        vec![json!({"role": "user", "content": "Work through the backlog, one module at a time."})];
    let mut i = 1;
    while i < n {
        let call = format!("{id}-c{i}");
        batch.push(json!({"role": "assistant", "parts": [
            {"type": "text", "text": "Checking the next module."},
            {"type": "tool_call", "id": call, "name": "bash", "args": {"command": format!("cat src/m{}.rs", i % 500)}}]}));
        i += 1;
        if i < n {
            batch.push(json!({"role": "tool", "parts": [
                {"type": "tool_result", "call_id": call, "output": "fn item() {}\n".repeat(30)}]}));
            i += 1;
        }
        if batch.len() >= 1_000 || i >= n {
            client
                .post(
                    &format!("/session/{id}/message"),
                    &json!({"messages": batch, "wait": true}),
                )
                .await?;
            batch = Vec::new();
        }
    }
    Ok(())
}

/// Mean milliseconds of the engine's `plan` (estimates, boundary, files, masked prompt) on a
/// synthetic session of `n` messages (about 1 KB each).
pub(crate) fn plan_ms(n: usize, runs: usize) -> f64 {
    let messages = synthetic_session(n);
    let config = CompactionConfig::default();
    let estimator = LazyEstimator::default();
    let start = Instant::now();
    for _ in 0..runs.max(1) {
        let tokens = estimate_each(&messages, &estimator);
        let input = PlanInput::new(&messages, &tokens, 128_000, &config);
        let plan = CompactionPlan::new(&input);
        std::hint::black_box(plan.prompt(&input));
    }
    start.elapsed().as_secs_f64() * 1e3 / runs.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The baseline writes real rows through the daemon's own schema (its triggers refuse any
    /// connection that does not declare itself compactd's writer, which once made `compactd
    /// bench` fail before printing a figure).
    #[test]
    fn raw_sqlite_baseline_writes_into_the_daemons_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.db");
        // In two rounds, as the bench writes it: the second continues the first.
        let mut raw = rounds::RawSqlite::open(&path, Synchronous::Normal, true).unwrap();
        raw.write(10).unwrap();
        raw.write(15).unwrap();
        assert!(raw.rate() > 0.0);
        // Timed row by row: the median row took less than all 25 together.
        assert!(raw.p50() > 0.0 && raw.p50() < 25.0 * 1e6 / raw.rate());
        drop(raw);
        let conn = rusqlite::Connection::open(&path).unwrap();
        let rows: i64 = conn
            .query_row(
                "SELECT count(*) FROM messages WHERE session_id = 'raw'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 25);
    }
}
