//! Search on a session of 100,000 messages (the context figures' session): a rare phrase, a
//! word in half the messages, and a word in none, in turn; and what indexing would cost an
//! append inside its transaction (the raw SQLite baseline run with and without the index
//! insert), which is why the writer indexes between appends instead.

use super::{latencies, percentile};
use anyhow::Result;
use compactd_api::client::Connection;
use hyper::Method;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct SearchFigures {
    pub p50_ms_100k: f64,
    pub p99_ms_100k: f64,
    /// Raw SQLite rows/s with the index insert beside those without, same run.
    pub raw_txn_per_s_indexed: f64,
    /// µs indexing adds to a transaction of one row (the raw difference): what an append
    /// would pay if it indexed in its own transaction; the writer pays it between appends.
    pub index_us_inline: f64,
}

/// Queries against session `id` (filled by the context figures).
pub(super) async fn latencies_100k(
    conn: &mut Connection,
    id: &str,
    requests: usize,
) -> Result<Vec<f64>> {
    let queries = ["cat src/m123.rs", "item", "nowhere-to-be-found"];
    let mut ms = latencies(conn, requests, |i| {
        let q = queries[i % queries.len()].replace(' ', "%20");
        (
            Method::GET,
            format!("/session/{id}/search?q={q}&limit=10"),
            String::new(),
        )
    })
    .await?;
    ms.iter_mut().for_each(|us| *us /= 1e3);
    Ok(ms)
}

pub(super) fn figures(ms: &[f64], raw: f64, raw_indexed: f64) -> SearchFigures {
    SearchFigures {
        p50_ms_100k: percentile(ms, 0.5),
        p99_ms_100k: percentile(ms, 0.99),
        raw_txn_per_s_indexed: raw_indexed,
        index_us_inline: (1e6 / raw_indexed - 1e6 / raw).max(0.0),
    }
}
