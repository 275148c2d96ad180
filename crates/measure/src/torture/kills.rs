//! kill -9 cycles under concurrent appends, with compactions running.
//!
//! Eight clients append to their own sessions (text messages, and tool calls with their
//! results in one batch), half of the appends with an Idempotency-Key. At a random moment the
//! daemon is killed; appends that were in flight are retried with their key after the restart
//! (those without a key are left alone: they may or may not have been stored, but at most
//! once). Meanwhile short-lived `sqlite3` processes read the database (every other one
//! checkpointing its WAL), others try to write it until just before the kill (`.restore` of
//! an older copy, DDL under `.timeout`), and one long-lived `sqlite3` session stays open
//! throughout; after every kill the system `sqlite3` checks the file. Then every session is read back and
//! checked against what the clients were told.

use super::readers;
use crate::daemon_process::DaemonProcess;
use anyhow::{Context, Result};
use compactd_api::client::{Client, Connection};
use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;
const CONTEXT_LIMIT: u64 = 16_000;

#[derive(Debug, Clone, Default, Serialize)]
pub struct KillFigures {
    pub cycles: usize,
    pub kills_during_compaction: usize,
    pub acknowledged_appends: usize,
    pub retried_by_key: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub out_of_order: usize,
    pub retried_twice: usize,
    pub contexts_over_limit: usize,
    pub orphaned_results: usize,
    /// Short-lived `sqlite3` processes that read the database during the cycles.
    pub outside_reads: usize,
    /// Outside `.restore`s and hand-written transactions tried during the cycles, and how
    /// many got the write lock (each would have rewritten the live database).
    pub outside_writes_tried: usize,
    pub outside_writes_taken: usize,
    /// Answers of the long-lived `sqlite3` session.
    pub long_reader_answers: usize,
    /// `integrity_check`s by the system `sqlite3` after a kill, and how many did not say ok.
    pub integrity_checks: usize,
    pub integrity_failures: usize,
}

impl KillFigures {
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (count, what) in [
            (self.lost, "acknowledged messages lost"),
            (self.duplicated, "messages stored twice"),
            (self.out_of_order, "messages out of order"),
            (self.retried_twice, "keyed retries applied twice"),
            (self.contexts_over_limit, "contexts over the limit"),
            (self.orphaned_results, "orphaned tool results in contexts"),
            (
                self.outside_writes_taken,
                "outside writes took the write lock from the running daemon",
            ),
            (
                self.integrity_failures,
                "integrity checks failed after a kill",
            ),
        ] {
            if count > 0 {
                out.push(format!("{count} {what}"));
            }
        }
        if self.cycles == 0 {
            out.push("no kill cycle ran".into());
        }
        out
    }
}

/// One client's view: what it was told, and what it still has to retry.
#[derive(Default)]
struct ClientLog {
    next: usize,
    /// Tags of acknowledged messages, in the order they were acknowledged.
    acknowledged: Vec<String>,
    /// Tags of appends sent with a key and retried after a kill until acknowledged.
    retried: HashSet<String>,
    /// Tags of appends without a key whose answer was lost: stored at most once.
    unknown: HashSet<String>,
    /// An append with a key that has not been acknowledged yet: (key, body, tags).
    pending: Option<(String, Value, Vec<String>)>,
}

pub async fn run(duration: Duration) -> Result<KillFigures> {
    let dir = tempfile::TempDir::new()?;
    let config = "[compaction]\nmax_messages = 16\n";
    let mut daemon = DaemonProcess::start(dir.path(), config)?;
    let client = Client::new(daemon.socket());
    for c in 0..CLIENTS {
        let session = json!({"id": format!("k{c}"), "context_limit": CONTEXT_LIMIT});
        client.post("/session", &session).await?;
    }
    let logs: Vec<Arc<Mutex<ClientLog>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let mut figures = KillFigures::default();
    let outside = readers::available();
    let mut long_reader = match outside {
        true => Some(readers::LongLived::open(&daemon.db())?),
        false => None,
    };
    let older = match outside {
        true => readers::older_copy(&daemon.db()).await,
        false => None,
    };
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < duration {
        round += 1;
        let tasks: Vec<_> = logs
            .iter()
            .enumerate()
            .map(|(c, log)| tokio::spawn(append_until_error(client.clone(), c, log.clone())))
            .collect();
        let stop_readers = tokio_util::sync::CancellationToken::new();
        let short_readers =
            outside.then(|| tokio::spawn(readers::short_lived(daemon.db(), stop_readers.clone())));
        let stop_writers = tokio_util::sync::CancellationToken::new();
        let writers = older.clone().map(|older| {
            tokio::spawn(readers::careless_writes(
                daemon.db(),
                older,
                stop_writers.clone(),
            ))
        });
        // Kill at a varied moment: 100 to 400 ms into the cycle.
        let wait = 100 + (round * 7919 % 300);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if let Some(reader) = long_reader.as_mut()
            && reader.count().await.is_some()
        {
            figures.long_reader_answers += 1;
        }
        stop_writers.cancel();
        if let Some(writers) = writers {
            let writes = writers.await.unwrap_or_default();
            figures.outside_writes_tried += writes.tried;
            figures.outside_writes_taken += writes.taken;
        }
        if compacting(&client).await {
            figures.kills_during_compaction += 1;
        }
        daemon.kill9();
        stop_readers.cancel();
        for task in tasks {
            let _ = task.await;
        }
        if let Some(readers) = short_readers {
            figures.outside_reads += readers.await.unwrap_or(0);
            check_integrity(&daemon, &mut figures).await;
        }
        daemon.spawn()?;
        figures.cycles += 1;
    }
    read_back(&client, logs, &mut figures).await?;
    daemon.stop()?;
    Ok(figures)
}

/// Finishes the clients' retries, then reads every session back against its client's log.
async fn read_back(
    client: &Client,
    logs: Vec<Arc<Mutex<ClientLog>>>,
    figures: &mut KillFigures,
) -> Result<()> {
    for (c, log) in logs.iter().enumerate() {
        retry_pending(client, c, log).await?;
    }
    for (c, log) in logs.into_iter().enumerate() {
        let log = Arc::try_unwrap(log)
            .ok()
            .and_then(|m| m.into_inner().ok())
            .context("a client task still holds its log")?;
        check_session(client, c, &log, figures).await?;
    }
    Ok(())
}

/// Runs SQLite's `integrity_check` on the database after a kill, counting a failure.
async fn check_integrity(daemon: &DaemonProcess, figures: &mut KillFigures) {
    figures.integrity_checks += 1;
    if let Err(e) = readers::integrity_check(&daemon.db()).await {
        tracing::error!(cycle = figures.cycles, error = %e, "integrity_check failed after a kill");
        figures.integrity_failures += 1;
    }
}

/// Whether any session is compacting right now.
async fn compacting(client: &Client) -> bool {
    for c in 0..CLIENTS {
        if let Ok(session) = client.get(&format!("/session/k{c}")).await
            && session["compacting"] == true
        {
            return true;
        }
    }
    false
}

/// The next append of client `c`: a user message, or a tool call and its result.
fn next_batch(c: usize, n: usize) -> (Value, Vec<String>) {
    let tag = format!("k{c}-{n}");
    if n.is_multiple_of(3) {
        (
            json!({"messages": [{"role": "user", "content": tag}]}),
            vec![tag],
        )
    } else {
        let output = "output line\n".repeat(20 + n % 40);
        (
            json!({"messages": [
                {"role": "assistant", "parts": [{"type": "tool_call", "id": tag, "name": "bash", "args": {"command": format!("ls {n}")}}]},
                {"role": "tool", "parts": [{"type": "tool_result", "call_id": tag, "output": output}]}
            ]}),
            vec![tag],
        )
    }
}

/// Appends for client `c` until the daemon goes away.
async fn append_until_error(client: Client, c: usize, log: Arc<Mutex<ClientLog>>) {
    if retry_pending(&client, c, &log).await.is_err() {
        return;
    }
    let Ok(mut conn) = client.keep_alive().await else {
        return;
    };
    loop {
        let n = {
            let mut log = log.lock().expect("log");
            log.next += 1;
            log.next
        };
        let (body, tags) = next_batch(c, n);
        let key = n.is_multiple_of(2).then(|| format!("k{c}-key-{n}"));
        if let Some(key) = &key {
            log.lock().expect("log").pending = Some((key.clone(), body.clone(), tags.clone()));
        }
        match send(&mut conn, c, key.as_deref(), &body).await {
            Ok(()) => {
                let mut log = log.lock().expect("log");
                log.pending = None;
                log.acknowledged.extend(tags);
            }
            Err(_) => {
                if key.is_none() {
                    log.lock().expect("log").unknown.extend(tags);
                }
                return;
            }
        }
    }
}

/// Retries client `c`'s pending keyed append until it is acknowledged.
async fn retry_pending(client: &Client, c: usize, log: &Arc<Mutex<ClientLog>>) -> Result<()> {
    let pending = log.lock().expect("log").pending.clone();
    let Some((key, body, tags)) = pending else {
        return Ok(());
    };
    let mut conn = client.keep_alive().await?;
    send(&mut conn, c, Some(&key), &body).await?;
    let mut log = log.lock().expect("log");
    log.pending = None;
    log.retried.extend(tags.iter().cloned());
    log.acknowledged.extend(tags);
    Ok(())
}

async fn send(conn: &mut Connection, c: usize, key: Option<&str>, body: &Value) -> Result<()> {
    let headers: Vec<(&str, &str)> = key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
    let answer = conn
        .raw_with(
            Method::POST,
            &format!("/session/k{c}/message"),
            &headers,
            body.to_string(),
        )
        .await?;
    anyhow::ensure!(
        answer.status.is_success(),
        "append refused: {}",
        answer.status
    );
    Ok(())
}

/// Reads session `c` back and counts every broken promise.
async fn check_session(
    client: &Client,
    c: usize,
    log: &ClientLog,
    figures: &mut KillFigures,
) -> Result<()> {
    let mut stored: Vec<String> = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .get(&format!("/session/k{c}/message?after={after}&limit=1000"))
            .await?;
        for message in page["messages"].as_array().context("messages")? {
            let part = &message["parts"][0];
            match part["type"].as_str() {
                Some("text") => stored.extend(part["text"].as_str().map(str::to_string)),
                Some("tool_call") => stored.extend(part["id"].as_str().map(str::to_string)),
                _ => {}
            }
        }
        match page["next_after"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for tag in &stored {
        *counts.entry(tag).or_default() += 1;
    }
    figures.acknowledged_appends += log.acknowledged.len();
    figures.retried_by_key += log.retried.len();
    for tag in &log.acknowledged {
        match counts.get(tag.as_str()).copied().unwrap_or(0) {
            0 => figures.lost += 1,
            1 => {}
            _ if log.retried.contains(tag) => figures.retried_twice += 1,
            _ => figures.duplicated += 1,
        }
    }
    for tag in &log.unknown {
        if counts.get(tag.as_str()).copied().unwrap_or(0) > 1 {
            figures.duplicated += 1;
        }
    }
    // Acknowledged messages appear in the order they were acknowledged.
    let position: HashMap<&str, usize> = stored
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let order: Vec<usize> = log
        .acknowledged
        .iter()
        .filter_map(|t| position.get(t.as_str()).copied())
        .collect();
    figures.out_of_order += order.windows(2).filter(|w| w[1] < w[0]).count();

    let context = client.get(&format!("/session/k{c}/context")).await?;
    if context["tokens"].as_u64().unwrap_or(0) > CONTEXT_LIMIT {
        figures.contexts_over_limit += 1;
    }
    let mut calls = HashSet::new();
    for message in context["messages"].as_array().context("context")? {
        for part in message["parts"].as_array().into_iter().flatten() {
            match part["type"].as_str() {
                Some("tool_call") => {
                    calls.insert(part["id"].as_str().unwrap_or_default().to_string());
                }
                Some("tool_result")
                    if !calls.contains(part["call_id"].as_str().unwrap_or_default()) =>
                {
                    figures.orphaned_results += 1;
                }
                _ => {}
            }
        }
    }
    Ok(())
}
