//! The daemon run in-process, on listeners the test made (as an embedder or a systemd-like
//! supervisor hands them over): it serves the API on the socket and the proxy on the port,
//! and at shutdown a proxied call in flight finishes before the store closes.

use crate::common::mock_model::{MockModel, Reply};
use compactd_api::client::Client;
use compactd_daemon::{DaemonOptions, Listeners};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_on_given_listeners_finishes_a_proxied_call_in_flight_before_its_store_closes() {
    // The upstream takes 1.5 s to answer: the shutdown comes while it does.
    let upstream = MockModel::start(vec![], Reply::After(Duration::from_millis(1500)));
    let dir = tempfile::TempDir::new().unwrap();
    let (socket_path, db, config) = (
        dir.path().join("s.sock"),
        dir.path().join("c.db"),
        dir.path().join("config.toml"),
    );
    std::fs::write(
        &config,
        format!("[proxy]\nopenai_upstream = \"{}/v1\"\n", upstream.base),
    )
    .unwrap();
    let socket = tokio::net::UnixListener::bind(&socket_path).unwrap();
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = port.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = DaemonOptions {
        db: Some(db.clone()),
        config: Some(config),
        listeners: Some(Listeners {
            socket,
            proxy: Some(port),
        }),
        ..Default::default()
    };
    let daemon = tokio::spawn(compactd_daemon::run(options, async {
        let _ = stopped.await;
    }));

    // The API answers on the socket it was given.
    let client = Client::new(&socket_path);
    let appended = client
        .post(
            "/session/notes/message",
            &json!({"role": "user", "content": "remember the port"}),
        )
        .await
        .unwrap();
    assert_eq!(appended["last_seq"], 1, "{appended}");

    // A proxied call over the port it was given, still waiting for its upstream...
    let call = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{address}/v1/chat/completions"))
            .bearer_auth("sk-in-process")
            .json(&json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
    });
    let seen = tokio::task::spawn_blocking(move || {
        let requests = upstream.wait_for_requests(1);
        (requests.len(), upstream)
    })
    .await
    .unwrap();
    assert_eq!(seen.0, 1, "the call reached the upstream");
    // ...when the daemon is told to stop.
    let asked = Instant::now();
    stop.send(()).unwrap();

    let answer = call.await.unwrap().expect("the call in flight is answered");
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|c| c.contains("summary written by call 1")),
        "{body}"
    );
    daemon.await.unwrap().expect("the daemon stops cleanly");
    assert!(
        asked.elapsed() < compactd_daemon::SHUTDOWN_GRACE,
        "it stopped within the grace: {:?}",
        asked.elapsed()
    );

    // The call was recorded, then the store closed: the system's view of the file has it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let proxied: i64 = conn
        .query_row(
            "SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.owner IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(proxied, 2, "the question and the answer are stored");
    // Its own socket file is the caller's: the daemon removes only a socket it bound.
    assert!(socket_path.exists());
    drop(seen);
}
