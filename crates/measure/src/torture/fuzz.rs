//! Hostile requests against a running daemon: every one is invalid by construction, so every
//! one must be refused with a JSON error and change nothing stored; then memory under slow
//! clients and large bodies, and `/health` while large pages are read.

use super::http::{Exchange, exchange, request};
use crate::daemon_process::DaemonProcess;
use anyhow::Result;
use compactd_api::client::Client;
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// The daemon's request timeout during the run: slow clients are cut off after this.
const TIMEOUT_S: u64 = 2;
/// Bodies at most this large (and the shared body budget is 4 times it).
const MAX_BODY: usize = 8 * 1024 * 1024;
/// Peak resident memory the daemon must stay under through the run.
pub(super) const RSS_BOUND_MB: f64 = 400.0;

#[derive(Debug, Clone, Default, Serialize)]
pub struct FuzzFigures {
    pub requests: usize,
    pub refused_with_json: usize,
    pub refused_without_json: usize,
    pub invalid_accepted: usize,
    /// Examples of what went wrong, for the report.
    pub examples: Vec<String>,
    pub stored_changed: bool,
    pub daemon_up: bool,
    pub slow_clients: usize,
    pub large_bodies: usize,
    pub large_body_mb: f64,
    /// Bodies of tens of thousands of tiny messages, half on the socket API, half on the
    /// proxy's routes: each costs far more parsed than its bytes.
    pub many_message_bodies: usize,
    /// Of those, how many were served (the rest waited for the memory budget, then got 503).
    pub many_message_served: usize,
    pub peak_rss_mb: f64,
    pub rss_bound_mb: f64,
    pub readers: usize,
    pub page_mb: f64,
    pub health_p50_ms: f64,
    pub health_max_ms: f64,
    /// Two searches at once of a 2,000-byte query over those 1 MB messages: the longest
    /// took, and the slowest `/health` meanwhile (it froze for most of a minute once).
    pub search_seconds: f64,
    pub health_during_search_max_ms: f64,
    pub searches_failed: usize,
}

impl FuzzFigures {
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.refused_without_json > 0 {
            out.push(format!(
                "{} refusals without the JSON error shape, e.g. {:?}",
                self.refused_without_json, self.examples
            ));
        }
        if self.invalid_accepted > 0 {
            out.push(format!(
                "{} invalid requests accepted, e.g. {:?}",
                self.invalid_accepted, self.examples
            ));
        }
        if self.stored_changed {
            out.push("a refused request changed stored data".into());
        }
        if !self.daemon_up {
            out.push("the daemon went down".into());
        }
        if self.health_during_search_max_ms > 1_000.0 || self.searches_failed > 0 {
            out.push(format!(
                "/health took {:.0} ms during two long searches ({} failed)",
                self.health_during_search_max_ms, self.searches_failed
            ));
        }
        if self.peak_rss_mb > self.rss_bound_mb {
            out.push(format!(
                "peak RSS {:.0} MB over the bound of {:.0} MB",
                self.peak_rss_mb, self.rss_bound_mb
            ));
        }
        out
    }
}

pub async fn run(duration: Duration) -> Result<FuzzFigures> {
    let dir = tempfile::TempDir::new()?;
    // The proxy's upstream is a closed local port: nothing leaves the machine.
    let config = format!(
        "[server]\nrequest_timeout_s = {TIMEOUT_S}\nmax_body_bytes = {MAX_BODY}\n[proxy]\nopenai_upstream = \"http://127.0.0.1:9/v1\"\n"
    );
    let mut daemon = DaemonProcess::start(dir.path(), &config)?;
    let socket = daemon.socket();
    let client = Client::new(&socket);
    // The session hostile requests aim at, and what it holds before them.
    client
        .post("/session", &json!({"id": "target", "context_limit": 32000}))
        .await?;
    client
        .post(
            "/session/target/message",
            &json!({"messages": [
                {"role": "user", "content": "keep me"},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "t1", "name": "bash", "args": {"command": "ls"}}]},
                {"role": "tool", "parts": [{"type": "tool_result", "call_id": "t1", "output": "a.txt"}]}
            ]}),
        )
        .await?;
    let before = snapshot(&client).await?;
    let mut figures = FuzzFigures {
        rss_bound_mb: RSS_BOUND_MB,
        ..Default::default()
    };

    let started = Instant::now();
    let mut round = 0usize;
    while started.elapsed() < duration.mul_f64(0.6) {
        let cases = hostile_requests(round);
        let exchanges = futures_util::future::join_all(
            cases
                .iter()
                .map(|(_, bytes)| exchange(&socket, bytes, Duration::from_secs(TIMEOUT_S * 3))),
        )
        .await;
        for ((what, _), answer) in cases.iter().zip(exchanges) {
            judge(&mut figures, what, &answer);
        }
        round += 1;
    }
    slow_clients(&socket, &mut figures).await;
    large_bodies(&socket, &mut figures).await;
    many_message_bodies(&socket, &mut figures).await;
    large_reads(&client, &socket, &mut figures).await?;
    long_searches(&client, &socket, &mut figures).await?;

    figures.daemon_up = daemon.alive() && client.get("/health").await.is_ok();
    figures.stored_changed = snapshot(&client).await? != before;
    figures.peak_rss_mb = daemon.peak_rss_mb().unwrap_or(f64::MAX);
    daemon.stop()?;
    Ok(figures)
}

fn judge(figures: &mut FuzzFigures, what: &str, answer: &Exchange) {
    figures.requests += 1;
    let keep = |figures: &mut FuzzFigures, example: String| {
        if figures.examples.len() < 5 {
            figures.examples.push(example);
        }
    };
    match answer.status {
        Some(status) if status >= 400 && answer.is_json_error() => figures.refused_with_json += 1,
        Some(status) if status >= 400 => {
            figures.refused_without_json += 1;
            keep(
                figures,
                format!("{what}: {status} {}", String::from_utf8_lossy(&answer.body)),
            );
        }
        Some(status) => {
            figures.invalid_accepted += 1;
            keep(figures, format!("{what}: accepted with {status}"));
        }
        None => {
            figures.refused_without_json += 1;
            keep(figures, format!("{what}: no answer"));
        }
    }
}

/// What must not change: the target session's history and figures.
async fn snapshot(client: &Client) -> Result<String> {
    let session = client.get("/session/target").await?;
    let history = client.get("/session/target/message?limit=1000").await?;
    let sessions = client.get("/session").await?;
    let ids: Vec<&str> = sessions["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["id"].as_str())
        .filter(|id| *id == "target" || id.starts_with("fz"))
        .collect();
    Ok(format!(
        "{} {} {} {} {} {:?}",
        session["message_count"],
        session["compaction_count"],
        session["context_limit"],
        session["token_source"],
        history,
        ids
    ))
}

/// A varied batch of requests that must all be refused.
fn hostile_requests(round: usize) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |what: &str, bytes: Vec<u8>| out.push((what.to_string(), bytes));
    malformed_http(round, &mut add);
    bad_messages(&mut add);
    bad_refusals(&mut add);
    hostile_ids_and_numbers(round, &mut add);
    out
}

/// Requests that are not HTTP, or not HTTP this daemon takes.
fn malformed_http(round: usize, add: &mut impl FnMut(&str, Vec<u8>)) {
    // Junk that starts with a byte other than whitespace: whitespace alone is no request, and
    // a client that sends only that and leaves gets no answer.
    let mut junk = vec![b'#'];
    junk.extend(pseudo_random_bytes(round, round % 1500));
    add("garbage", junk);
    add("bad request line", b"GET\r\n\r\n".to_vec());
    add("bad version", b"GET /health HTTP/4.2\r\n\r\n".to_vec());
    add(
        "nul in path",
        b"GET /session/target\x00/context HTTP/1.1\r\n\r\n".to_vec(),
    );
    add(
        "header flood",
        format!(
            "GET /health HTTP/1.1\r\n{}\r\n",
            (0..300)
                .map(|i| format!("X-{i}: y\r\n"))
                .collect::<String>()
        )
        .into_bytes(),
    );
    add(
        "huge header",
        format!(
            "GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n",
            "z".repeat(100_000)
        )
        .into_bytes(),
    );
    add(
        "huge path",
        format!(
            "GET /session/{}/context HTTP/1.1\r\n\r\n",
            "p".repeat(70_000)
        )
        .into_bytes(),
    );
    add(
        "bad content-length",
        b"POST /session/target/message HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}".to_vec(),
    );
}

/// Appends whose JSON or messages are wrong.
fn bad_messages(add: &mut impl FnMut(&str, Vec<u8>)) {
    let append = |body: &[u8]| request("POST", "/session/target/message", &[], body);
    add("truncated JSON", append(br#"{"role": "user", "con"#));
    add(
        "not UTF-8",
        append(b"{\"role\":\"user\",\"content\":\"\xff\xfe\"}"),
    );
    add("unknown role", append(br#"{"role":"robot","content":"x"}"#));
    add(
        "unknown part",
        append(br#"{"role":"user","parts":[{"type":"video"}]}"#),
    );
    add("no parts", append(br#"{"role":"user","parts":[]}"#));
    add(
        "result for an unknown call",
        append(
            br#"{"role":"tool","parts":[{"type":"tool_result","call_id":"ghost","output":"x"}]}"#,
        ),
    );
    add(
        "second message bad",
        append(br#"[{"role":"user","content":"ok"},{"role":"user"}]"#),
    );
    add(
        "huge usage",
        append(br#"{"messages":[{"role":"user","content":"x"}],"usage":{"input_tokens":99999999999999999999}}"#),
    );
    add(
        "negative usage",
        append(br#"{"messages":[{"role":"user","content":"x"}],"usage":{"input_tokens":-5}}"#),
    );
    add(
        "wait not a bool",
        append(br#"{"messages":[{"role":"user","content":"x"}],"wait":"soon"}"#),
    );
    add(
        "unknown field",
        append(br#"{"messages":[{"role":"user","content":"x"}],"colour":1}"#),
    );
    add("a number", append(b"42"));
    add(
        "declared too large",
        format!(
            "POST /session/target/message HTTP/1.1\r\nContent-Length: {}\r\n\r\n{{",
            MAX_BODY + 1
        )
        .into_bytes(),
    );
}

/// Reports of a model's refusal (`POST /session/{id}/overflow`) that are none, or whose
/// figures no model gave: each would shrink the session's context for nothing.
fn bad_refusals(add: &mut impl FnMut(&str, Vec<u8>)) {
    let report = |body: &[u8]| request("POST", "/session/target/overflow", &[], body);
    add(
        "refusal: a rate limit",
        report(br#"{"error":{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}}"#),
    );
    add(
        "refusal: an error that is a number",
        report(br#"{"error":7}"#),
    );
    add("refusal: no tokens", report(br#"{"tokens":0}"#));
    add(
        "refusal: tokens no model counts",
        report(br#"{"tokens":99999999999999999999}"#),
    );
    add(
        "refusal: a window too small",
        report(br#"{"context_limit":5}"#),
    );
    add("refusal: an unknown field", report(br#"{"window":8000}"#));
    add("refusal: not JSON", report(b"prompt is too long"));
}

/// Session ids, query numbers, limits and headers outside what the API takes.
fn hostile_ids_and_numbers(round: usize, add: &mut impl FnMut(&str, Vec<u8>)) {
    for id in ["%2E", "%2E%2E", "a%20b", "%2Fetc", "%C3%A9", "x%00y"] {
        add(
            &format!("session id {id}"),
            request(
                "POST",
                &format!("/session/{id}/message"),
                &[],
                br#"{"role":"user","content":"x"}"#,
            ),
        );
    }
    add(
        "long id",
        request(
            "POST",
            &format!("/session/{}/message", "i".repeat(129)),
            &[],
            br#"{"role":"user","content":"x"}"#,
        ),
    );
    for query in [
        "after=-1",
        "after=18446744073709551616",
        "limit=0",
        "limit=100000000000000000000",
        "limit=-3",
        "bogus=1",
    ] {
        add(
            &format!("history {query}"),
            request("GET", &format!("/session/target/message?{query}"), &[], b""),
        );
    }
    for limit in ["0", "5", "100000000000", "-1", "1e30", "\"big\""] {
        add(
            &format!("context_limit {limit}"),
            request(
                "POST",
                "/session",
                &[],
                format!(r#"{{"id":"fz{round}","context_limit":{limit}}}"#).as_bytes(),
            ),
        );
    }
    add(
        "bad override",
        request(
            "POST",
            "/session",
            &[],
            format!(r#"{{"id":"fz{round}","config":{{"max_messages":0}}}}"#).as_bytes(),
        ),
    );
    add(
        "bad idempotency key",
        request(
            "POST",
            "/session/target/message",
            &[("Idempotency-Key", "has space".into())],
            br#"{"role":"user","content":"x"}"#,
        ),
    );
    add("wrong method", request("PUT", "/session/target", &[], b""));
    add(
        "unknown endpoint",
        request("GET", "/sessions/target", &[], b""),
    );
    add(
        "unknown session",
        request("GET", "/session/fz-ghost/context", &[], b""),
    );
}

/// Deterministic junk: the same run sends the same bytes.
fn pseudo_random_bytes(seed: usize, len: usize) -> Vec<u8> {
    let mut state = (seed as u64)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect()
}

/// Clients that announce a large body and trickle it, or stall inside their head: each is
/// answered (408) or dropped by the timeout, and memory stays bounded meanwhile.
async fn slow_clients(socket: &Path, figures: &mut FuzzFigures) {
    const CLIENTS: usize = 40;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let socket: PathBuf = socket.to_path_buf();
            tokio::spawn(async move {
                let Ok(mut stream) = UnixStream::connect(&socket).await else {
                    return;
                };
                let head = if i % 2 == 0 {
                    format!(
                        "POST /session/target/message HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                        MAX_BODY - 10
                    )
                } else {
                    "GET /session/target/context HTTP/1.1\r\nX-Slow: ".to_string()
                };
                let _ = stream.write_all(head.as_bytes()).await;
                let deadline = Instant::now() + Duration::from_secs(TIMEOUT_S + 2);
                while Instant::now() < deadline {
                    if stream.write_all(b"a").await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    figures.slow_clients += CLIENTS;
}

/// Eight near-limit bodies at once, to a session of their own: the shared body budget keeps
/// memory bounded (some wait their turn or are told to retry).
async fn large_bodies(socket: &Path, figures: &mut FuzzFigures) {
    const BODIES: usize = 8;
    let text = "w".repeat(60_000);
    let messages: Vec<_> = (0..130)
        .map(|i| json!({"role": "user", "content": format!("{i} {text}")}))
        .collect();
    let body = json!({"messages": messages}).to_string().into_bytes();
    let tasks: Vec<_> = (0..BODIES)
        .map(|i| {
            let socket = socket.to_path_buf();
            let bytes = request("POST", &format!("/session/mem{i}/message"), &[], &body);
            tokio::spawn(async move { exchange(&socket, &bytes, Duration::from_secs(60)).await })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    figures.large_bodies = BODIES;
    figures.large_body_mb = body.len() as f64 / (1024.0 * 1024.0);
}

/// 8 bodies of 49,990 one-letter messages (just under the cap per request) on the socket API
/// and 8 on the proxy's route at once: about 1.5 MB each, 40 MB each once parsed.
async fn many_message_bodies(socket: &Path, figures: &mut FuzzFigures) {
    const EACH_DOOR: usize = 8;
    let tiny: Vec<_> = (0..49_990)
        .map(|_| json!({"role": "user", "content": "a"}))
        .collect();
    let appended = json!({"messages": tiny}).to_string().into_bytes();
    let proxied = json!({"model": "m", "messages": tiny})
        .to_string()
        .into_bytes();
    let key = vec![("Authorization", "Bearer sk-torture".to_string())];
    let tasks: Vec<_> = (0..EACH_DOOR)
        .flat_map(|i| {
            [
                request("POST", &format!("/session/tiny{i}/message"), &[], &appended),
                request("POST", "/v1/chat/completions", &key, &proxied),
            ]
        })
        .map(|bytes| {
            let socket = socket.to_path_buf();
            tokio::spawn(async move { exchange(&socket, &bytes, Duration::from_secs(120)).await })
        })
        .collect();
    for task in tasks {
        let Ok(answer) = task.await else { continue };
        figures.many_message_bodies += 1;
        // Served: stored (201/200), or on the proxy's route stored and then refused by the
        // unreachable upstream (502).
        if matches!(answer.status, Some(200 | 201 | 502)) {
            figures.many_message_served += 1;
        }
    }
}

/// `/health` latency while several clients read pages of 1 MB messages.
async fn large_reads(client: &Client, socket: &Path, figures: &mut FuzzFigures) -> Result<()> {
    const READERS: usize = 4;
    let chunk = "r".repeat(1_000_000);
    for i in 0..8 {
        client
            .post(
                "/session/bigread/message",
                &json!({"role": "user", "content": format!("{i} {chunk}")}),
            )
            .await?;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let reader = Client::new(socket);
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let _ = reader.get("/session/bigread/message?limit=1000").await;
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        client.get("/health").await?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    for reader in readers {
        let _ = reader.await;
    }
    latencies.sort_by(f64::total_cmp);
    figures.readers = READERS;
    figures.page_mb = 4.0;
    figures.health_p50_ms = latencies[latencies.len() / 2];
    figures.health_max_ms = *latencies.last().unwrap_or(&0.0);
    Ok(())
}

/// Two searches at once over the 1 MB messages `large_reads` stored, each of a 2,000-byte
/// query of one word they hold and hundreds none does (each word was once looked for through
/// the whole of every hit, on the async workers), with `/health` asked meanwhile.
async fn long_searches(client: &Client, socket: &Path, figures: &mut FuzzFigures) -> Result<()> {
    let absent: String = (0..400).map(|i| format!(" absent{i:04}")).collect();
    let query = format!("0 1 2 3 4 5 6 7{absent}");
    let query = query[..query.len().min(2_000)].to_string();
    let started = Instant::now();
    let searches: Vec<_> = (0..2)
        .map(|_| {
            let (searcher, query) = (Client::new(socket), query.clone());
            tokio::spawn(async move {
                let id = "bigread".parse().map_err(|_| anyhow::anyhow!("bad id"))?;
                searcher.search(&id, &query, 50).await?;
                anyhow::Ok(started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    while searches.iter().any(|s| !s.is_finished()) {
        let asked = Instant::now();
        client.get("/health").await?;
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for search in searches {
        match search.await? {
            Ok(took) => figures.search_seconds = figures.search_seconds.max(took.as_secs_f64()),
            Err(_) => figures.searches_failed += 1,
        }
    }
    figures.health_during_search_max_ms = slowest.as_secs_f64() * 1e3;
    Ok(())
}
