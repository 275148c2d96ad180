//! The disk fills up under the daemon, or under a backup: a real small file system (a tmpfs
//! mounted for the test, so only where the test runs as root) holds the database or the copy.
//! Ground truth is what the system's `sqlite3` finds in the file.

use crate::common::mock_model::{MockModel, Reply};
use crate::common::{
    SmallDisk, TestDaemon, api_error, have, post_with_headers, raw_http, sqlite3, user,
};
use crate::proxy::{KEY, call};
use compactd_api::client::Client;
use serde_json::json;
use std::process::Command;

/// A 3 MiB disk, where the system `sqlite3` is there to check the file after; `None`, saying
/// why, where either is not.
fn small_disk_and_sqlite3() -> Option<SmallDisk> {
    if !have("sqlite3") {
        eprintln!("skipped: no sqlite3 on PATH");
        return None;
    }
    let disk = SmallDisk::mount("3m");
    if disk.is_none() {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
    }
    disk
}

/// A message of about 1 KB: the disk fills after a few hundred.
fn message(i: usize) -> serde_json::Value {
    user(&format!(
        "step {i}: {}",
        "the build log again, line by line; ".repeat(28)
    ))
}

/// Appends are refused with 507 `storage_full` and a Retry-After once the disk is full, and a
/// refused one leaves nothing behind; reads go on; the daemon restarts after kill -9 on the
/// full disk; once space is freed, appends go on from the next seq. Every acknowledged
/// message is in the file (the system `sqlite3` counts them), in order, none twice.
#[tokio::test]
async fn a_full_disk_refuses_appends_loses_nothing_acknowledged_and_recovers() {
    let Some(disk) = small_disk_and_sqlite3() else {
        return;
    };
    let db = disk.mount.join("compactd.db");
    let mut daemon = TestDaemon::builder().db(&db).start();
    let client = daemon.client();

    let (acknowledged, refusal) = fill(&client, "s").await;
    assert_eq!(refusal.0, 507, "{refusal:?}");
    assert!(refusal.1.contains("disk"), "{refusal:?}");
    // `/health` (and so `compactd status`) says why writes are refused, and for how long.
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["status"], "storage_full", "{health}");
    let why = health["writes_refused"].as_str().unwrap();
    assert!(
        why.contains("disk holding the database is full") && why.contains("once there is room"),
        "{why}"
    );
    // What the database takes, and the little left beside it (under a tenth of 3 MiB).
    assert!(
        health["disk"]["database_bytes"].as_u64().unwrap() > 1 << 20,
        "{health}"
    );
    assert!(
        health["disk"]["free_bytes"].as_u64().unwrap() < 300 << 10,
        "{health}"
    );
    // Past the session's 80 messages: it compacted on the way (or tried to, and said why).
    assert!(
        acknowledged > 80,
        "only {acknowledged} messages filled 3 MiB"
    );

    // Still full: the same refusal, with when to try again; nothing stored.
    let body = message(acknowledged).to_string();
    let answer = raw_http(
        &daemon.socket(),
        &post_with_headers("/v1/session/s/message", &body, &[]),
    );
    assert!(answer.starts_with("HTTP/1.1 507"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: "),
        "{answer}"
    );
    assert!(answer.contains("\"storage_full\""), "{answer}");
    let context = client.get("/session/s/context").await.unwrap();
    assert!(
        context["messages"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(
        sqlite3(
            &db,
            "select count(*), max(seq) from messages where session_id = 's'"
        )
        .unwrap(),
        format!("{acknowledged}|{acknowledged}")
    );

    // kill -9 on the full disk, then start again: the file opens and holds every message.
    daemon.restart();
    let (status, _) = api_error(
        client
            .post("/session/s/message", &message(acknowledged))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 507);

    disk.grow("32m");
    let answer = client
        .post("/session/s/message", &message(acknowledged))
        .await
        .unwrap();
    assert_eq!(answer["last_seq"], acknowledged + 1, "{answer}");
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    assert!(health.get("writes_refused").is_none(), "{health}");
    let stored = sqlite3(
        &db,
        "select count(*), count(distinct seq), min(seq), max(seq) from messages where session_id = 's'",
    )
    .unwrap();
    let n = acknowledged + 1;
    assert_eq!(stored, format!("{n}|{n}|1|{n}"));
    // The texts are the ones sent, in order.
    let texts = sqlite3(
        &db,
        "select group_concat(substr(json_extract(parts, '$[0].text'), 1, instr(json_extract(parts, '$[0].text'), ':') - 1), ',') from (select parts from messages where session_id = 's' order by seq)",
    )
    .unwrap();
    let sent: Vec<String> = (0..n).map(|i| format!("step {i}")).collect();
    assert_eq!(texts, sent.join(","));
    // Said once when the disk filled (before and after the restart), not once per refusal.
    let log = daemon.log();
    assert_eq!(
        log.matches("the disk holding the database is full: writes are refused")
            .count(),
        2,
        "{log}"
    );
    assert!(!log.contains("store error"), "{log}");
}

/// Appends to session `id` until the disk is full: how many were acknowledged, and the
/// refusal (status, message).
async fn fill(client: &Client, id: &str) -> (usize, (u16, String)) {
    let mut acknowledged = 0;
    loop {
        assert!(acknowledged < 10_000, "the disk never filled");
        match client
            .post(&format!("/session/{id}/message"), &message(acknowledged))
            .await
        {
            Ok(answer) => {
                acknowledged += 1;
                assert_eq!(answer["last_seq"], acknowledged, "{answer}");
            }
            Err(e) => return (acknowledged, api_error(e)),
        }
    }
}

/// An agent through the proxy while the disk is full goes on: each call reaches the model with
/// the session's stored context (its summary and tail) and the messages the store could not
/// take, and its answer comes back, marked `x-compactd-unrecorded: storage_full`. Once there
/// is room, the agent's next call (which carries its whole conversation, as every call does)
/// stores everything: the system `sqlite3` finds every message of the conversation, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_never_stops_a_proxied_agent_and_room_again_stores_all_it_said() {
    let Some(disk) = small_disk_and_sqlite3() else {
        return;
    };
    let mock = MockModel::roomy();
    let db = disk.mount.join("compactd.db");
    let daemon = TestDaemon::builder()
        .db(&db)
        .config(&format!(
            "[compaction]\nmax_messages = 12\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
            mock.base
        ))
        .start();
    let client = daemon.client();
    let mut history = vec![
        json!({"role": "system", "content": "You are a careful agent."}),
        user("Fix the build, step by step."),
    ];
    // One step of the agent: its whole conversation to the model, the answer kept.
    async fn step(
        client: &Client,
        history: &mut Vec<serde_json::Value>,
        i: usize,
    ) -> hyper::HeaderMap {
        history.push(message(i));
        let body = json!({"model": "gpt-test", "messages": history});
        let (status, headers, answer) = call(client, KEY, Some("agent"), &body).await;
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(status, 200, "step {i}: {answer}");
        history.push(answer["choices"][0]["message"].clone());
        headers
    }
    for i in 0..20 {
        let headers = step(&client, &mut history, i).await;
        assert!(headers.get("x-compactd-unrecorded").is_none(), "step {i}");
    }
    let (_, refusal) = fill(&client, "filler").await;
    assert_eq!(refusal.0, 507, "{refusal:?}");

    for i in 20..26 {
        let headers = step(&client, &mut history, i).await;
        assert_eq!(headers["x-compactd-unrecorded"], "storage_full", "step {i}");
        assert_eq!(headers["x-compactd-session"], "agent", "step {i}");
        // What the model got: the session's summary and tail, then every step since the
        // disk filled, the newest last.
        let sent = mock.requests().last().unwrap().body["messages"].clone();
        let sent = sent.as_array().unwrap();
        assert!(
            sent.len() < history.len() - 1,
            "step {i}: {} messages, not compacted",
            sent.len()
        );
        let texts: Vec<&str> = sent.iter().filter_map(|m| m["content"].as_str()).collect();
        assert!(
            texts.iter().any(|t| t.contains("## 1. Primary Request")),
            "step {i}: no summary"
        );
        for since in 20..=i {
            let said = format!("step {since}:");
            assert!(
                texts.iter().any(|t| t.starts_with(&said)),
                "step {i}: {said} not sent"
            );
        }
        assert!(texts[texts.len() - 1].starts_with(&format!("step {i}:")));
    }
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["status"], "storage_full", "{health}");

    disk.grow("32m");
    let headers = step(&client, &mut history, 26).await;
    assert!(headers.get("x-compactd-unrecorded").is_none());
    // Every message of the conversation is stored once, in order, and the last answer after it.
    crate::common::assert_stored_whole(&db, "agent", &history);
    assert_eq!(client.get("/health").await.unwrap()["status"], "ok");
}

/// A compaction whose summary the model wrote while the disk filled cannot be stored: it ends
/// in `compaction_failed` saying so (an IDE plugin shows its start and its end), nothing of
/// it is in the file, and once there is room the session compacts on its next append. Before,
/// a compaction that failed as it was stored ended in no event at all: its start stood
/// unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_the_full_disk_cannot_store_ends_in_compaction_failed() {
    compaction_held_while_the_disk_fills(Reply::After(std::time::Duration::ZERO), |reason| {
        reason.contains("could not be stored") && reason.contains("full")
    })
    .await;
}

/// The model fails while the disk is full: the failure is announced whether or not the file
/// takes its record (before, a failure the store did not take was not announced either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_failure_on_a_full_disk_still_ends_in_compaction_failed() {
    compaction_held_while_the_disk_fills(
        Reply::status(500, "{\"error\": \"overloaded\"}"),
        |reason| reason.contains("500"),
    )
    .await;
}

/// Session `c` starts a compaction whose model call is held until another session has filled
/// a real small disk, then answered `reply`: the compaction ends in `compaction_failed` with a
/// reason `said` takes, leaves nothing in the file, and once there is room the session's next
/// append compacts it.
async fn compaction_held_while_the_disk_fills(reply: Reply, said: impl Fn(&str) -> bool) {
    let Some(disk) = small_disk_and_sqlite3() else {
        return;
    };
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let summarizer = MockModel::start(
        vec![Reply::Gated(gate.clone(), Box::new(reply))],
        Reply::After(std::time::Duration::ZERO),
    );
    let db = disk.mount.join("compactd.db");
    let daemon = TestDaemon::builder()
        .db(&db)
        .config(&format!(
            "[compaction]\nmax_messages = 12\n[summarizer]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\nmax_retries = 0\n",
            summarizer.base
        ))
        .start();
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    for i in 0..13 {
        client
            .post("/session/c/message", &message(i))
            .await
            .unwrap();
    }
    // The model is writing the summary; meanwhile another session fills the disk.
    summarizer.wait_for_requests(1);
    let (_, refusal) = fill(&client, "filler").await;
    assert_eq!(refusal.0, 507, "{refusal:?}");
    gate.add_permits(1);
    let (name, ended) = compaction_of_c_ended(&mut events).await;
    assert_eq!(name, "compaction_failed", "{ended}");
    let reason = ended["reason"].as_str().unwrap();
    assert!(said(reason), "{reason}");
    let in_file = |table: &str| {
        sqlite3(
            &db,
            &format!("select count(*) from {table} where session_id = 'c'"),
        )
        .unwrap()
    };
    assert_eq!(in_file("compactions"), "0");

    disk.grow("32m");
    client
        .post("/session/c/message", &message(13))
        .await
        .unwrap();
    let (name, compacted) = compaction_of_c_ended(&mut events).await;
    assert_eq!(name, "compaction_finished", "{compacted}");
    assert_eq!(in_file("compactions"), "1");
}

/// The next event that ends a compaction of session `c`: its name and data.
async fn compaction_of_c_ended(
    events: &mut compactd_api::client::EventStream,
) -> (String, serde_json::Value) {
    loop {
        let (name, data) = crate::common::next_event(events).await;
        if data["session_id"] == "c"
            && (name == "compaction_finished" || name == "compaction_failed")
        {
            return (name, data);
        }
    }
}

/// A backup onto a disk that fills: `compactd backup` fails, names the copy's disk (not the
/// database's) and leaves no file behind, so the same path takes the next backup once there is
/// room; that one is whole.
#[tokio::test]
async fn a_backup_onto_a_full_disk_fails_and_leaves_nothing() {
    let Some(disk) = SmallDisk::mount("256k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let batch: Vec<_> = (0..600).map(message).collect();
    client
        .post(
            "/session/b/message",
            &serde_json::json!({"messages": batch}),
        )
        .await
        .unwrap();
    let copy = disk.mount.join("copy.db");
    let backup = || {
        Command::new(crate::common::BIN)
            .args(["--socket", daemon.socket().to_str().unwrap(), "backup"])
            .arg(&copy)
            .output()
            .unwrap()
    };
    let refused = backup();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("the disk holding the copy is full"), "{said}");
    let left: Vec<_> = std::fs::read_dir(&disk.mount).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    disk.grow("16m");
    let made = backup();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert_eq!(
        sqlite3(&copy, "select count(*) from messages").unwrap(),
        "600"
    );
}
