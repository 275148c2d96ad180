//! The figures that are ratios to a reference measured beside them: the daemon's appends
//! (one client, 16 clients) against raw SQLite's single-row transactions, and an append's
//! latency against the echo's. They are measured in alternating rounds (echo, one client, 16
//! clients, raw SQLite; again), not one after the other: on a shared machine the disk's fsync
//! time moved 4x within minutes, and a reference measured a minute away from what it is
//! compared with says more about the neighbours than about compactd.

use super::{Sizes, bench_message, latencies, unbounded_session};
use anyhow::Result;
use compactd_api::client::{Client, Connection};
use compactd_core::compaction::LazyEstimator;
use compactd_core::message::Message;
use compactd_store::Synchronous;
use hyper::Method;
use std::path::Path;
use std::time::{Duration, Instant};

/// How many rounds each figure is split into.
pub(super) const ROUNDS: usize = 5;

/// Every round's latencies (µs, sorted) and times, together.
pub(super) struct Rounds {
    pub echo: Vec<f64>,
    pub one: Vec<f64>,
    pub one_elapsed: Duration,
    pub sixteen: Vec<f64>,
    pub sixteen_elapsed: Duration,
    /// Raw SQLite's rows per second, without and with the full-text index.
    pub raw: f64,
    /// Raw SQLite's p50 per row (µs, without the index): what an append's commit alone costs.
    pub raw_p50: f64,
    pub raw_indexed: f64,
}

pub async fn run(
    client: &Client,
    sizes: &Sizes,
    dir: &Path,
    synchronous: Synchronous,
) -> Result<Rounds> {
    client
        .post("/session", &unbounded_session("append-1"))
        .await?;
    let mut clients = Vec::new();
    for c in 0..16 {
        let id = format!("append-16-{c}");
        client.post("/session", &unbounded_session(&id)).await?;
        clients.push((format!("/session/{id}/message"), client.keep_alive().await?));
    }
    let conn = &mut client.keep_alive().await?;
    let mut raw = RawSqlite::open(&dir.join("raw.db"), synchronous, false)?;
    let mut raw_indexed = RawSqlite::open(&dir.join("raw-fts.db"), synchronous, true)?;
    let (echo_n, one_n, each_n) = (
        sizes.echo / ROUNDS,
        sizes.append_1 / ROUNDS,
        sizes.append_16_each / ROUNDS,
    );
    let mut rounds = Rounds {
        echo: Vec::new(),
        one: Vec::new(),
        one_elapsed: Duration::ZERO,
        sixteen: Vec::new(),
        sixteen_elapsed: Duration::ZERO,
        raw: 0.0,
        raw_p50: 0.0,
        raw_indexed: 0.0,
    };
    for round in 0..ROUNDS {
        let health = |_| (Method::GET, "/health".to_string(), String::new());
        rounds.echo.extend(latencies(conn, echo_n, health).await?);
        let start = Instant::now();
        let one = latencies(conn, one_n, |i| {
            let body = bench_message(round * one_n + i).to_string();
            (Method::POST, "/session/append-1/message".into(), body)
        })
        .await?;
        rounds.one_elapsed += start.elapsed();
        rounds.one.extend(one);
        let start = Instant::now();
        let (back, sixteen) = sixteen_clients(clients, round * each_n, each_n).await?;
        rounds.sixteen_elapsed += start.elapsed();
        clients = back;
        rounds.sixteen.extend(sixteen);
        raw.write(one_n)?;
        raw_indexed.write(one_n)?;
    }
    for latencies in [&mut rounds.echo, &mut rounds.one, &mut rounds.sixteen] {
        latencies.sort_by(f64::total_cmp);
    }
    rounds.raw = raw.rate();
    rounds.raw_p50 = raw.p50();
    rounds.raw_indexed = raw_indexed.rate();
    Ok(rounds)
}

/// One round of 16 clients appending at once, each on its own connection and session, `n`
/// messages apiece from message `from`; the connections come back for the next round.
async fn sixteen_clients(
    clients: Vec<(String, Connection)>,
    from: usize,
    n: usize,
) -> Result<(Vec<(String, Connection)>, Vec<f64>)> {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(path, mut conn)| {
            tokio::spawn(async move {
                let measured = latencies(&mut conn, n, |i| {
                    let body = bench_message(from + i).to_string();
                    (Method::POST, path.clone(), body)
                })
                .await;
                measured.map(|m| ((path, conn), m))
            })
        })
        .collect();
    let (mut back, mut all) = (Vec::new(), Vec::new());
    for task in tasks {
        let (client, measured) = task.await??;
        back.push(client);
        all.extend(measured);
    }
    Ok((back, all))
}

/// rusqlite inserting the bench's rows into compactd's own schema, one transaction each,
/// with the daemon's durability, on the same disk: the best a writer could do here.
pub(super) struct RawSqlite {
    conn: rusqlite::Connection,
    indexed: bool,
    written: usize,
    took: Duration,
    /// Each row's time, µs.
    each: Vec<f64>,
}

impl RawSqlite {
    pub(super) fn open(path: &Path, synchronous: Synchronous, indexed: bool) -> Result<RawSqlite> {
        let conn = rusqlite::Connection::open(path)?;
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {}; PRAGMA foreign_keys = ON;",
            synchronous.pragma()
        ))?;
        // Writing as compactd's writer does: the schema's triggers refuse any other connection.
        compactd_store::declare_writer(&conn)?;
        conn.execute_batch(compactd_store::SCHEMA)?;
        conn.execute(
            "INSERT INTO sessions (id, context_limit, created_at, updated_at) VALUES ('raw', 1000000, 'now', 'now')",
            [],
        )?;
        Ok(RawSqlite {
            conn,
            indexed,
            written: 0,
            took: Duration::ZERO,
            each: Vec::new(),
        })
    }

    /// Inserts `rows` more rows, one transaction each.
    pub(super) fn write(&mut self, rows: usize) -> Result<()> {
        let estimator = LazyEstimator::default();
        let start = Instant::now();
        for i in self.written..self.written + rows {
            let message: Message = serde_json::from_value(bench_message(i))?;
            let parts = serde_json::to_string(&message.parts)?;
            let row = Instant::now();
            self.conn.execute_batch("BEGIN")?;
            self.conn.execute(
                "INSERT INTO messages (session_id, seq, role, parts, tokens, created_at) VALUES ('raw', ?1, 'user', ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                rusqlite::params![i as i64 + 1, parts, estimator.message(&message) as i64],
            )?;
            if self.indexed {
                self.conn.execute(
                    "INSERT INTO messages_fts (rowid, session, text) VALUES (last_insert_rowid(), 'sraw', ?1)",
                    [compactd_store::searchable_text(&message.parts)],
                )?;
            }
            self.conn.execute_batch("COMMIT")?;
            self.each.push(row.elapsed().as_secs_f64() * 1e6);
        }
        self.took += start.elapsed();
        self.written += rows;
        Ok(())
    }

    /// The median row's time, µs.
    pub(super) fn p50(&self) -> f64 {
        let mut sorted = self.each.clone();
        sorted.sort_by(f64::total_cmp);
        super::percentile(&sorted, 0.5)
    }

    /// Rows per second over everything written.
    pub(super) fn rate(&self) -> f64 {
        self.written as f64 / self.took.as_secs_f64()
    }
}
