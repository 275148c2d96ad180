//! Append latency by session size: one client appending to sessions that already hold 100,
//! 10,000 and 100,000 active messages (nothing compacts them), so a cost that grows with the
//! session's length shows as a ratio above 1. The sizes take turns, in rounds.

use super::rounds::ROUNDS;
use super::{bench_message, latencies, percentile};
use anyhow::Result;
use compactd_api::client::Client;
use hyper::Method;
use serde::Serialize;
use serde_json::json;

#[derive(Debug, Clone, Serialize)]
pub struct BySize {
    pub p50_us_100: f64,
    pub p50_us_10k: f64,
    pub p50_us_100k: f64,
    /// p50 at 100,000 messages / p50 at 100.
    pub ratio: f64,
}

pub async fn run(client: &Client, appends: usize) -> Result<BySize> {
    const SIZES: [usize; 3] = [100, 10_000, 100_000];
    let mut sessions = Vec::new();
    for size in SIZES {
        let id = format!("size-{size}");
        client
            .post("/session", &super::unbounded_session(&id))
            .await?;
        let mut sent = 0;
        while sent < size {
            let batch: Vec<_> = (sent..size.min(sent + 1_000)).map(bench_message).collect();
            sent += batch.len();
            client
                .post(
                    &format!("/session/{id}/message"),
                    &json!({"messages": batch}),
                )
                .await?;
        }
    }
    // Connected once every session is filled: a connection idle through a fill of 100,000
    // messages can outlast the daemon's idle timeout (`request_timeout_s`).
    for size in SIZES {
        let path = format!("/session/size-{size}/message");
        sessions.push((path, size, client.keep_alive().await?, Vec::new()));
    }
    // In rounds across the sizes (see `rounds`), so a disk that slows down midway does not
    // read as a cost of the session's length.
    let each = appends / ROUNDS;
    for round in 0..ROUNDS {
        for (path, size, conn, measured) in &mut sessions {
            let from = *size + round * each;
            let body = |i| bench_message(from + i).to_string();
            measured
                .extend(latencies(conn, each, |i| (Method::POST, path.clone(), body(i))).await?);
        }
    }
    let p50: Vec<f64> = sessions
        .iter_mut()
        .map(|(_, _, _, measured)| {
            measured.sort_by(f64::total_cmp);
            percentile(measured, 0.5)
        })
        .collect();
    Ok(BySize {
        p50_us_100: p50[0],
        p50_us_10k: p50[1],
        p50_us_100k: p50[2],
        ratio: p50[2] / p50[0],
    })
}
