//! The daemon as its clients see it: a real `compactd serve` on a temp socket and database,
//! driven over HTTP.

use crate::common::{TestDaemon, api_error, bash_round, have, next_event, user};
use compactd_api::client::{Client, ClientError};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

/// Appends messages one request at a time, returning the last answer.
async fn append_all(client: &Client, session: &str, messages: &[Value]) -> Value {
    let mut last = Value::Null;
    for m in messages {
        last = client
            .post(&format!("/session/{session}/message"), m)
            .await
            .unwrap();
    }
    last
}

/// A realistic session: a user request, then rounds of bash calls with their outputs.
fn work(rounds: usize, tag: &str) -> Vec<Value> {
    let mut messages = vec![user(&format!(
        "{tag}: please fix the failing tests in src/"
    ))];
    for i in 0..rounds {
        messages.extend(bash_round(
            &format!("{tag}-c{i}"),
            &format!("cat src/mod_{i}.py && sed -i 's/a/b/' src/mod_{i}.py"),
            &"line of output\n".repeat(20),
        ));
        if i % 10 == 9 {
            messages.push(user(&format!("{tag}: instruction {i}, keep going")));
        }
    }
    messages
}

#[tokio::test]
async fn lifecycle_auto_compaction_context_manual_summarize_history_restart() {
    let mut daemon = TestDaemon::start("");
    let client = daemon.client();
    let created = client
        .post(
            "/session",
            &json!({"id": "demo", "model": "test-model", "context_limit": 32000}),
        )
        .await
        .unwrap();
    assert_eq!(created["id"], "demo");
    assert_eq!(created["token_threshold"], 25_600);

    // 1 + 2*45 + 4 = 95 messages: crossing 80 triggers an automatic compaction.
    let messages = work(45, "demo");
    let (head, rest) = messages.split_at(80);
    append_all(&client, "demo", head).await;
    let session = client.get("/session/demo").await.unwrap();
    assert_eq!(session["compaction_count"], 0, "80 messages do not trigger");
    let answer = client
        .post(
            "/session/demo/message",
            &json!({"messages": [rest[0]], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["trigger"], "messages");
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");
    append_all(&client, "demo", &rest[1..]).await;

    // The context starts with the session's task, pinned verbatim, then the summary, as a
    // user message, then the verbatim tail.
    let context = client.get("/session/demo/context").await.unwrap();
    let task = &context["messages"][0];
    assert_eq!(task["seq"], 1);
    assert_eq!(task["pinned"], true);
    assert_eq!(
        task["parts"][0]["text"],
        "demo: please fix the failing tests in src/"
    );
    let first = &context["messages"][1];
    assert_eq!(first["role"], "user");
    assert_eq!(first["summary"], true);
    let summary = first["parts"][0]["text"].as_str().unwrap();
    assert!(summary.contains("## 6. All user messages"));
    assert!(summary.contains("Original request: demo: please fix the failing tests in src/"));
    assert!(summary.contains("demo: instruction 9, keep going"));
    assert_eq!(context["compaction_num"], 1);
    let tail_seqs: Vec<u64> = context["messages"].as_array().unwrap()[2..]
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        *tail_seqs.last().unwrap(),
        messages.len() as u64,
        "the tail ends with the newest message"
    );
    assert!(
        tail_seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "the tail is contiguous"
    );
    // No orphaned result at the start of the tail.
    assert_ne!(context["messages"][2]["role"], "tool");
    assert!(context["tokens"].as_u64().unwrap() < 25_600);

    // Manual compaction with focus.
    let manual = client
        .post(
            "/session/demo/summarize",
            &json!({"focus": "the test fixes"}),
        )
        .await
        .unwrap();
    assert_eq!(manual["compacted"], true, "{manual}");
    assert_eq!(manual["compaction_num"], 2);
    for key in [
        "summary",
        "read_files",
        "modified_files",
        "pre_tokens",
        "post_tokens",
    ] {
        assert!(manual.get(key).is_some(), "missing {key}");
    }
    assert!(
        manual["summary"]
            .as_str()
            .unwrap()
            .contains("Focus requested for this compaction: the test fixes")
    );
    // The first summary's user messages were carried into the second.
    assert!(
        manual["summary"]
            .as_str()
            .unwrap()
            .contains("demo: instruction 9, keep going")
    );
    assert!(
        manual["modified_files"]
            .as_array()
            .unwrap()
            .contains(&json!("src/mod_0.py"))
    );

    // History: both compactions with the spec's fields, oldest first.
    let history = client.get("/session/demo/compaction").await.unwrap();
    let compactions = history["compactions"].as_array().unwrap();
    assert_eq!(compactions.len(), 2);
    assert_eq!(compactions[0]["trigger"], "messages");
    assert_eq!(compactions[1]["trigger"], "manual");
    assert_eq!(compactions[1]["focus"], "the test fixes");
    assert!(compactions[0]["post_tokens"].as_u64() < compactions[0]["pre_tokens"].as_u64());

    // The full history is still there, paged, with compacted flags.
    let page = client.get("/session/demo/message?limit=50").await.unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 50);
    // The pinned task is never compacted; what followed it was.
    assert_eq!(page["messages"][0]["compacted"], false);
    assert_eq!(page["messages"][1]["compacted"], true);
    assert_eq!(page["next_after"], 50);
    let page2 = client
        .get("/session/demo/message?after=50&limit=100")
        .await
        .unwrap();
    assert_eq!(
        page2["messages"].as_array().unwrap().len(),
        messages.len() - 50
    );
    assert!(page2.get("next_after").is_none());
    assert_eq!(
        page2["messages"].as_array().unwrap().last().unwrap()["compacted"],
        false
    );

    // A restart keeps everything: the same context, byte for byte.
    let before = client.get("/session/demo/context").await.unwrap();
    daemon.restart();
    let client = daemon.client();
    let after = client.get("/session/demo/context").await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after["compaction_num"], 2);
    assert_eq!(
        client.get("/session/demo").await.unwrap()["message_count"],
        messages.len()
    );
    assert_eq!(
        client.get("/session/demo/compaction").await.unwrap()["compactions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn sessions_are_created_listed_updated_and_deleted() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let generated = client.post("/session", &json!({})).await.unwrap();
    let id = generated["id"].as_str().unwrap().to_string();
    assert_eq!(generated["context_limit"], 128_000);
    client
        .post(
            "/session",
            &json!({"id": "small", "context_limit": 8000, "config": {"max_messages": 10}}),
        )
        .await
        .unwrap();
    let list = client.get("/session").await.unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 2);
    let err = client
        .post("/session", &json!({"id": "small"}))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Api { status: 409, .. }), "{err}");

    let patched = client
        .patch(
            "/session/small",
            &json!({"context_limit": 16000, "model": "m2"}),
        )
        .await
        .unwrap();
    assert_eq!(patched["context_limit"], 16000);
    assert_eq!(patched["model"], "m2");
    assert_eq!(patched["max_messages"], 10);

    // Per-session override: 11 messages trigger a compaction.
    let many: Vec<Value> = (0..11).map(|i| user(&format!("message {i}"))).collect();
    let answer = client
        .post(
            "/session/small/message",
            &json!({"messages": many, "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");

    // Appending to an unknown session creates it with defaults.
    let answer = client
        .post("/session/fresh/message", &user("hi"))
        .await
        .unwrap();
    assert_eq!(answer["created"], true);

    client.delete(&format!("/session/{id}")).await.unwrap();
    let err = client.get(&format!("/session/{id}")).await.unwrap_err();
    assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err}");
    let err = client
        .post(&format!("/session/{id}/message"), &user("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Api { status: 404, .. }),
        "a deleted session takes no messages: {err}"
    );
    assert_eq!(
        client.get("/session").await.unwrap()["sessions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Every bad input gets a JSON error with the right status and changes nothing stored.
#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let daemon = TestDaemon::start("[server]\nmax_body_bytes = 65536\n");
    let client = daemon.client();
    client.post("/session", &json!({"id": "s1"})).await.unwrap();
    client
        .post("/session", &json!({"id": "small", "context_limit": 16000}))
        .await
        .unwrap();
    let [call, result] = bash_round("c1", "ls", "a.txt");
    append_all(&client, "s1", &[user("start"), call, result]).await;
    let before = client.get("/session/s1/message?limit=1000").await.unwrap();

    // (what, method, path, body, expected status, expected words in the error message)
    type Case = (
        &'static str,
        Method,
        String,
        Vec<u8>,
        StatusCode,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            Method::POST,
            "/session/s1/message".into(),
            b"{\"role\": \"user\",".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid JSON",
        ),
        (
            "unknown role",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"role":"robot","content":"x"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "robot",
        ),
        (
            "unknown part type",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"role":"user","parts":[{"type":"video","url":"x"}]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "video",
        ),
        (
            "unknown call_id",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"role":"tool","parts":[{"type":"tool_result","call_id":"nope","output":"x"}]}"#
                .to_vec(),
            StatusCode::BAD_REQUEST,
            "nope",
        ),
        (
            "bad message in a batch",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"messages":[{"role":"user","content":"ok"},{"role":"user","parts":[]}]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "message 1",
        ),
        (
            "call from a user",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"role":"user","parts":[{"type":"tool_call","id":"x","name":"bash"}]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "tool_call",
        ),
        (
            "non-UTF-8",
            Method::POST,
            "/session/s1/message".into(),
            b"{\"role\":\"user\",\"content\":\"\xff\xfe\"}".to_vec(),
            StatusCode::BAD_REQUEST,
            "UTF-8",
        ),
        (
            "too large",
            Method::POST,
            "/session/s1/message".into(),
            json!({"role": "user", "content": "x".repeat(70_000)})
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "65536",
        ),
        (
            "odd session id",
            Method::POST,
            "/session/a%20b/message".into(),
            br#"{"role":"user","content":"x"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid session id",
        ),
        (
            "slash in session id",
            Method::POST,
            "/session/..%2Fetc/message".into(),
            br#"{"role":"user","content":"x"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid session id",
        ),
        (
            "long session id",
            Method::POST,
            format!("/session/{}/message", "x".repeat(129)),
            br#"{"role":"user","content":"x"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid session id",
        ),
        (
            "system message larger than the context can pin",
            Method::POST,
            "/session/small/message".into(),
            json!({"role": "system", "content": "r".repeat(60_000)})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "pinned messages",
        ),
        (
            "empty batch",
            Method::POST,
            "/session/s1/message".into(),
            br#"{"messages":[]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "no messages",
        ),
        (
            "unknown field",
            Method::POST,
            "/session".into(),
            br#"{"id":"s2","colour":"red"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "colour",
        ),
        (
            "bad override",
            Method::POST,
            "/session".into(),
            br#"{"id":"s2","config":{"max_messages":0}}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "max_messages",
        ),
        (
            "bad limit",
            Method::POST,
            "/session".into(),
            br#"{"id":"s2","context_limit":5}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "context_limit",
        ),
        (
            "bad query",
            Method::GET,
            "/session/s1/message?limit=abc".into(),
            vec![],
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            "unknown session",
            Method::GET,
            "/session/ghost/context".into(),
            vec![],
            StatusCode::NOT_FOUND,
            "ghost",
        ),
        (
            "unknown endpoint",
            Method::GET,
            "/sessions".into(),
            vec![],
            StatusCode::NOT_FOUND,
            "no such endpoint",
        ),
        (
            "wrong method",
            Method::PUT,
            "/session/s1".into(),
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
        ),
    ];
    for (name, method, path, body, status, needle) in cases {
        let answer = client.raw(method, &path, body).await.unwrap();
        assert_eq!(
            answer.status,
            status,
            "{name}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let json = answer.json();
        let message = json["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no JSON error body"));
        assert!(json["error"]["code"].is_string(), "{name}");
        assert!(message.contains(needle), "{name}: {message}");
    }
    let after = client.get("/session/s1/message?limit=1000").await.unwrap();
    assert_eq!(before, after, "a refused request changed stored messages");
    assert_eq!(
        client.get("/session/small").await.unwrap()["message_count"],
        0
    );
    assert!(
        client.get("/session/s2").await.is_err(),
        "a refused create stored a session"
    );
    // Still serving.
    assert_eq!(client.get("/health").await.unwrap()["status"], "ok");
}

#[tokio::test]
async fn system_messages_and_the_task_stay_first_in_every_context() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "pin", "context_limit": 32000}))
        .await
        .unwrap();
    let system =
        json!({"role": "system", "content": "You are a careful agent. Never push to main."});
    let mut messages = vec![system.clone()];
    messages.extend(work(40, "pin"));
    let later_rule = json!({"role": "system", "content": "From now on, answer in French."});
    messages.insert(20, later_rule.clone());
    append_all(&client, "pin", &messages).await;

    // The context waits for the compaction the 81st message started.
    let context = client.get("/session/pin/context").await.unwrap();
    assert_eq!(context["compaction_num"], 1);
    let shown = context["messages"].as_array().unwrap();
    // Both system messages and the task, verbatim, in their order, marked pinned; then the
    // summary; then the tail.
    assert_eq!(shown[0]["parts"][0]["text"], system["content"]);
    assert_eq!(
        shown[1]["parts"][0]["text"],
        "pin: please fix the failing tests in src/"
    );
    assert_eq!(shown[2]["parts"][0]["text"], later_rule["content"]);
    for m in &shown[..3] {
        assert_eq!(m["pinned"], true, "{m}");
    }
    assert_eq!(shown[3]["summary"], true);
    let summary = shown[3]["parts"][0]["text"].as_str().unwrap();
    assert!(!summary.contains("Never push to main") && !summary.contains("answer in French"));
    assert!(shown[4..].iter().all(|m| m.get("summary").is_none()));
    // The session's token figure is the context's.
    let session = client.get("/session/pin").await.unwrap();
    assert_eq!(session["tokens"], context["tokens"]);
}

#[tokio::test]
async fn acknowledged_appends_survive_kill_9() {
    let mut daemon = TestDaemon::start("");
    let client = daemon.client();
    for i in 0..60 {
        client
            .post("/session/durable/message", &user(&format!("message {i}")))
            .await
            .unwrap();
    }
    daemon.kill9();
    daemon.spawn();
    let client = daemon.client();
    let page = client
        .get("/session/durable/message?limit=1000")
        .await
        .unwrap();
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..60).map(|i| format!("message {i}")).collect();
    assert_eq!(texts, expected);
}

#[tokio::test]
async fn concurrent_appends_from_many_clients_keep_every_message_in_order() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 100000\n");
    let client = daemon.client();
    client
        .post(
            "/session",
            &json!({"id": "busy", "context_limit": 10000000}),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for c in 0..16 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                client
                    .post(
                        "/session/busy/message",
                        &user(&format!("client {c} message {i}")),
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = crate::common::all_messages(&client, "busy").await;
    assert_eq!(all.len(), 16 * 40);
    let seqs: Vec<u64> = all.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=640).collect::<Vec<u64>>());
    for c in 0..16 {
        let mine: Vec<u64> = all
            .iter()
            .filter_map(|m| {
                let text = m["parts"][0]["text"].as_str().unwrap();
                text.strip_prefix(&format!("client {c} message "))?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(
            mine,
            (0..40).collect::<Vec<u64>>(),
            "client {c}'s messages out of order or missing"
        );
    }
}

#[tokio::test]
async fn sqlite3_reads_the_history_while_the_daemon_runs() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 10\n");
    let client = daemon.client();
    let messages: Vec<Value> = (0..11).map(|i| user(&format!("m{i}"))).collect();
    client
        .post(
            "/session/readable/message",
            &json!({"messages": messages, "wait": true}),
        )
        .await
        .unwrap();
    let out = std::process::Command::new("sqlite3")
        .arg(daemon.db())
        .arg("select session_id, num, trigger from compaction_history; select id, message_count from session_overview; select count(*) from message_text where compacted;")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("readable|1|messages"), "{stdout}");
    assert!(stdout.contains("readable|11"), "{stdout}");
    // The daemon keeps serving after the outside read.
    assert_eq!(
        client.get("/session/readable").await.unwrap()["compaction_count"],
        1
    );
}

/// The socket file removed under a running daemon (a cleaner of /tmp, an `rm` by hand): within
/// seconds the daemon binds it again (0600) and serves it; nothing stored is lost, and a
/// SIGTERM still ends it cleanly.
#[tokio::test]
async fn a_socket_removed_under_the_daemon_is_bound_again() {
    use std::os::unix::fs::PermissionsExt;
    let mut daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session/s/message", &user("before"))
        .await
        .unwrap();
    std::fs::remove_file(daemon.socket()).unwrap();
    let socket = daemon.socket();
    let back = crate::common::eventually(std::time::Duration::from_secs(20), || {
        let socket = socket.clone();
        async move { Client::new(socket).get("/health").await.ok() }
    })
    .await;
    assert!(back.is_some(), "never bound again: {}", daemon.log());
    let mode = std::fs::metadata(daemon.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let fresh = Client::new(daemon.socket());
    fresh
        .post("/session/s/message", &user("after"))
        .await
        .unwrap();
    let texts: Vec<Value> = crate::common::all_messages(&fresh, "s")
        .await
        .iter()
        .map(|m| m["parts"][0]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("before"), json!("after")]);
    assert!(daemon.log().contains("bound it again"), "{}", daemon.log());
    assert!(daemon.terminate().success());
    assert!(!daemon.socket().exists());
}

#[tokio::test]
async fn a_live_daemon_keeps_its_socket_and_a_stale_one_is_replaced() {
    let mut daemon = TestDaemon::start("");
    // A second daemon on the same socket (with a database of its own: one on the same
    // database is refused before it gets to the socket) refuses to start.
    let other = TestDaemon::builder().socket(daemon.socket()).build();
    let second = other.command().output().unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already listening"), "{stderr}");
    assert_eq!(
        daemon.client().get("/health").await.unwrap()["status"],
        "ok"
    );

    // kill -9 leaves the socket file behind; the next daemon replaces it.
    daemon.kill9();
    assert!(daemon.socket().exists());
    daemon.spawn();
    assert_eq!(
        daemon.client().get("/health").await.unwrap()["status"],
        "ok"
    );

    // SIGTERM: clean exit, socket removed.
    let status = daemon.terminate();
    assert!(status.success(), "{status}");
    assert!(!daemon.socket().exists());
    let err = Client::new(daemon.socket())
        .get("/health")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotRunning { .. }));
}

#[tokio::test]
async fn socket_and_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let mut daemon = TestDaemon::start("");
    assert_eq!(mode(&daemon.socket()), 0o600);
    assert_eq!(mode(&daemon.db()), 0o600);
    // Directories the daemon creates for its socket and database are private too.
    daemon.kill9();
    let nested = daemon.dir.path().join("run");
    std::fs::write(
        daemon.config_path(),
        format!(
            "[server]\nsocket = {:?}\n[store]\npath = {:?}\n",
            nested.join("compactd.sock"),
            nested.join("data").join("c.db")
        ),
    )
    .unwrap();
    let notify = std::os::unix::net::UnixDatagram::bind(daemon.dir.path().join("n.sock")).unwrap();
    // The harness owns the process: killed even if an assertion fails.
    daemon.child = Some(
        std::process::Command::new(crate::common::BIN)
            .arg("serve")
            .arg("--config")
            .arg(daemon.config_path())
            .env("NOTIFY_SOCKET", daemon.dir.path().join("n.sock"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 256];
    // A signal to the test process (another test's child ending) may interrupt the wait.
    let n = loop {
        match notify.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            n => break n.expect("READY=1"),
        }
    };
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));
    assert_eq!(mode(&nested), 0o700);
    assert_eq!(mode(&nested.join("data")), 0o700);
    assert_eq!(mode(&nested.join("compactd.sock")), 0o600);
    assert_eq!(mode(&nested.join("data").join("c.db")), 0o600);
}

#[tokio::test]
async fn events_stream_compactions() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 4\n");
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let mut messages = vec![user("summarize the logs")];
    for i in 0..2 {
        messages.extend(bash_round(
            &format!("e{i}"),
            "cat log.txt",
            &"log line\n".repeat(300),
        ));
    }
    client
        .post(
            "/session/ev/message",
            &json!({"messages": messages, "wait": true}),
        )
        .await
        .unwrap();
    let (name, data) = next_event(&mut events).await;
    assert_eq!(
        (name.as_str(), data["trigger"].as_str()),
        ("compaction_started", Some("messages"))
    );
    let (name, data) = next_event(&mut events).await;
    assert_eq!(name, "compaction_finished");
    assert_eq!(data["session_id"], "ev");
    assert_eq!(data["compaction_num"], 1);
    assert!(data["post_tokens"].as_u64() < data["pre_tokens"].as_u64());
}

/// Session `id` (context limit 10,000) with a question and nine 400-token answers: 4,000
/// estimated tokens. Returns the append's answer.
async fn four_thousand_tokens(client: &Client, id: &str) -> Value {
    client
        .post("/session", &json!({"id": id, "context_limit": 10000}))
        .await
        .unwrap();
    let mut history = vec![user(&format!("q{}", "x".repeat(1599)))];
    history.extend(
        (1..10).map(
            |i| json!({"role": "assistant", "content": format!("{:>4}{}", char::from(b'a' + i), "x".repeat(1596))}),
        ),
    );
    client
        .post(
            &format!("/session/{id}/message"),
            &json!({"messages": history}),
        )
        .await
        .unwrap()
}

/// A client's model call can outlast a compaction (in the background, or asked for
/// meanwhile): its usage then counts the context before it. With `usage.compaction_num` (the
/// context's, as `GET /context` gave it) such a report is not counted; a report of the
/// current context is.
#[tokio::test]
async fn usage_of_a_context_compacted_since_is_not_counted() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    four_thousand_tokens(&client, "late").await;
    let sent = client.get("/session/late/context").await.unwrap();
    assert_eq!(sent["compaction_num"], 0);
    // The agent's model call is out; a compaction lands meanwhile.
    let compacted = client
        .post("/session/late/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true, "{compacted}");
    let after = client.get("/session/late").await.unwrap()["tokens"]
        .as_u64()
        .unwrap();
    let answer = client
        .post(
            "/session/late/message",
            &json!({"messages": [{"role": "assistant", "content": "done"}],
                    "usage": {"input_tokens": 6000, "compaction_num": 0}}),
        )
        .await
        .unwrap();
    assert_eq!(answer["token_source"], "estimated", "{answer}");
    assert_eq!(answer["tokens"], after + 1, "{answer}");
    // A report of the context as it is now counts.
    let answer = client
        .post(
            "/session/late/message",
            &json!({"messages": [{"role": "assistant", "content": "next"}],
                    "usage": {"input_tokens": 2500, "compaction_num": 1}}),
        )
        .await
        .unwrap();
    assert_eq!(answer["token_source"], "reported", "{answer}");
    assert_eq!(answer["tokens"], 2501, "{answer}");
    // A compaction_num that is not one is refused, and nothing is stored.
    for bad in [json!(-1), json!("1"), json!(1.5), json!(5_000_000_000u64)] {
        let refused = client
            .post(
                "/session/late/message",
                &json!({"messages": [user("x")], "usage": {"input_tokens": 10, "compaction_num": bad}}),
            )
            .await
            .unwrap_err();
        let (status, message) = api_error(refused);
        assert_eq!(status, 400);
        assert!(message.contains("usage.compaction_num"), "{message}");
    }
    assert_eq!(
        client.get("/session/late").await.unwrap()["message_count"],
        12
    );
}

/// A client that never says which context its usage measured (curl, a plugin of its own):
/// the context it was last served says it. A report of a call sent before a compaction
/// landed is not counted; one of a context fetched after it is.
#[tokio::test]
async fn usage_without_compaction_num_counts_for_the_context_last_served() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    four_thousand_tokens(&client, "plain").await;
    client.get("/session/plain/context").await.unwrap();
    let compacted = client
        .post("/session/plain/summarize", &json!({}))
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true, "{compacted}");
    let after = client.get("/session/plain").await.unwrap()["tokens"]
        .as_u64()
        .unwrap();
    let usage = |text: &str, tokens: u64| {
        json!({"messages": [{"role": "assistant", "content": text}],
               "usage": {"input_tokens": tokens}})
    };
    let answer = client
        .post("/session/plain/message", &usage("done", 6000))
        .await
        .unwrap();
    assert_eq!(answer["token_source"], "estimated", "{answer}");
    assert_eq!(answer["tokens"], after + 1, "{answer}");
    client.get("/session/plain/context").await.unwrap();
    let answer = client
        .post("/session/plain/message", &usage("next", 2500))
        .await
        .unwrap();
    assert_eq!(answer["token_source"], "reported", "{answer}");
    assert_eq!(answer["tokens"], 2501, "{answer}");
    // A session whose context was never asked for (the client builds its own) counts its
    // reports as they come.
    four_thousand_tokens(&client, "own").await;
    let answer = client
        .post("/session/own/message", &usage("mine", 5000))
        .await
        .unwrap();
    assert_eq!(answer["token_source"], "reported", "{answer}");
}

#[tokio::test]
async fn reported_usage_replaces_the_estimate_until_the_next_compaction() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let answer = four_thousand_tokens(&client, "u").await;
    assert_eq!(
        (answer["tokens"].as_u64(), answer["token_source"].as_str()),
        (Some(4000), Some("estimated"))
    );
    // The agent's model call used 7,000 tokens where compactd estimated 4,000 (its system
    // prompt, its tools and its tokenizer count too): what comes after counts at that rate.
    let rate = |tokens: u64| (tokens as f64 * 7000.0 / 4000.0).ceil() as u64;
    let answer = client
        .post(
            "/session/u/message",
            &json!({"messages": [{"role": "assistant", "content": "short answer"}], "usage": {"input_tokens": 7000}}),
        )
        .await
        .unwrap();
    let answer_tokens = 3; // "short answer": 12 characters
    assert_eq!(answer["token_source"], "reported");
    assert_eq!(answer["tokens"], 7000 + rate(answer_tokens));
    let session = client.get("/session/u").await.unwrap();
    assert_eq!(session["report_rate"], 1.75, "{session}");
    assert!(
        answer["compaction"].is_null(),
        "7,006 is under the 8,000 threshold"
    );
    // What comes after the report adds its estimate at the report's rate; crossing 8,000
    // triggers by tokens, although the estimate alone (4,903) would not have.
    let answer = client
        .post(
            "/session/u/message",
            &json!({"messages": [user(&"y".repeat(3_600))], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["tokens"], 7000 + rate(answer_tokens + 900));
    assert_eq!(answer["compaction"]["trigger"], "tokens", "{answer}");
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");
    // After compacting, the report no longer describes the context, but what it measured
    // still holds: the new context's estimate counts at the same rate until the next one.
    let session = client.get("/session/u").await.unwrap();
    assert_eq!(session["token_source"], "estimated");
    assert_eq!(session["report_rate"], 1.75, "{session}");
    let post = answer["compaction"]["result"]["post_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(session["tokens"], rate(post), "{answer} {session}");
    assert!(rate(post) < 8000);
    // A person reading the database cold sees the rate too.
    if have("sqlite3") {
        let out = std::process::Command::new("sqlite3")
            .arg(daemon.db())
            .arg("select id, token_rate from session_overview where id = 'u'")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "u|1.75");
    }
    let bad = client
        .post(
            "/session/u/message",
            &json!({"messages": [user("x")], "usage": {"input_tokens": -5}}),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("input_tokens"), "{bad}");
    // A count no model could have read is refused too, and nothing is stored.
    let count = client.get("/session/u").await.unwrap()["message_count"].clone();
    let bad = client
        .post(
            "/session/u/message",
            &json!({"messages": [user("x")], "usage": {"input_tokens": 1_000_000_001u64}}),
        )
        .await
        .unwrap_err();
    let (status, message) = api_error(bad);
    assert_eq!(status, 400);
    assert!(
        message.contains("usage.input_tokens must be at most 1000000000"),
        "{message}"
    );
    assert_eq!(
        client.get("/session/u").await.unwrap()["message_count"],
        count
    );
}

/// Rounds of `cat` with outputs of `chars` characters each.
fn big_rounds(tag: &str, rounds: usize, chars: usize) -> Vec<Value> {
    let mut messages = vec![user(&format!("{tag}: read every module"))];
    for i in 0..rounds {
        let output = format!("{tag}-{i}:{}", "x".repeat(chars));
        messages.extend(bash_round(
            &format!("{tag}{i}"),
            &format!("cat m{i}.py"),
            &output,
        ));
    }
    messages
}

#[tokio::test]
async fn old_outputs_are_masked_in_the_context_announced_recorded_and_retrievable() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    // 12 outputs of ~1,000 tokens: past the 11,000-token masking point of a 128k session,
    // far below its trigger.
    let messages = big_rounds("mc", 12, 4_000);
    let appended = client
        .post("/session/mc/message", &json!({"messages": messages}))
        .await
        .unwrap();
    let (name, event) = next_event(&mut events).await;
    assert_eq!(name, "outputs_masked");
    assert_eq!(event["outputs"], 12 - 5, "all but the newest 5 outputs");
    assert!(event["post_tokens"].as_u64() < event["pre_tokens"].as_u64());
    // The append masked before it answered: its answer counts the masked context.
    assert_eq!(appended["tokens"], event["post_tokens"]);

    let context = client.get("/session/mc/context").await.unwrap();
    let items = context["messages"].as_array().unwrap();
    assert_eq!(items.len(), messages.len(), "masking summarizes nothing");
    let masked: Vec<&Value> = items.iter().filter(|m| m["masked"] == true).collect();
    assert_eq!(masked.len(), 7);
    let first = masked[0];
    let seq = first["seq"].as_u64().unwrap();
    let text = first["parts"][0]["output"].as_str().unwrap();
    assert_eq!(
        text,
        format!(
            "[output of bash masked: 4,005 chars; seq {seq} of session mc, read_messages has it]"
        )
    );
    // The newest five outputs read whole.
    let whole = items
        .iter()
        .filter(|m| m["role"] == "tool" && m["masked"].is_null());
    assert_eq!(whole.count(), 5);
    assert!(context["tokens"].as_u64().unwrap() < 6_000);
    assert_eq!(context["tokens"], appended["tokens"]);

    // The original is one request away, whole.
    let page = client
        .get(&format!("/session/mc/message?after={}&limit=1", seq - 1))
        .await
        .unwrap();
    assert_eq!(
        page["messages"][0]["parts"],
        messages[seq as usize - 1]["parts"]
    );
    assert_eq!(page["messages"][0]["compacted"], false);

    // The history records the masking as its own kind, with its tokens.
    let history = client.get("/session/mc/compaction").await.unwrap();
    assert_eq!(history["compactions"], json!([]));
    let masking = &history["maskings"][0];
    assert_eq!(masking["outputs"], 7);
    assert_eq!(
        masking["through_seq"],
        seq + 2 * 7,
        "below the first of the newest five"
    );
    assert_eq!(masking["pre_tokens"], event["pre_tokens"]);
}

#[tokio::test]
async fn microcompact_false_keeps_every_output_until_a_summary() {
    let daemon = TestDaemon::start("[compaction]\nmicrocompact = false\n");
    let client = daemon.client();
    let messages = big_rounds("lit", 12, 4_000);
    client
        .post(
            "/session/lit/message",
            &json!({"messages": messages, "wait": true}),
        )
        .await
        .unwrap();
    let context = client.get("/session/lit/context").await.unwrap();
    let items = context["messages"].as_array().unwrap();
    assert!(items.iter().all(|m| m["masked"].is_null()));
    for (got, sent) in items
        .iter()
        .zip(&messages)
        .filter(|(_, m)| m["role"] == "tool")
    {
        assert_eq!(got["parts"], sent["parts"]);
    }
    let history = client.get("/session/lit/compaction").await.unwrap();
    assert_eq!(history["maskings"], json!([]));
}

/// systemd may stop a unit right after it reported ready: the SIGTERM must find the handler
/// installed and shut down cleanly (exit 0, socket removed), not kill the process.
#[test]
fn a_sigterm_right_after_ready_shuts_down_cleanly() {
    let mut daemon = TestDaemon::start("");
    for round in 0..10 {
        if round > 0 {
            daemon.spawn();
        }
        let status = daemon.terminate();
        assert!(status.success(), "round {round}: {status}");
        assert!(
            !daemon.socket().exists(),
            "round {round}: socket left behind"
        );
    }
}

/// A step alone over the trigger (a model's reasoning longer than the room left: reasoning
/// goes back as the model wrote it, never shortened) has nothing before it to summarize: the
/// attempt fails once, and asking for the context again
/// does not try again, so the breaker stays shut and the step is compacted as soon as the
/// agent moves on. Before, every `GET /context` was another failed attempt; three opened the
/// breaker, and the context grew unchecked for the rest of the turn.
#[tokio::test]
async fn a_step_with_nothing_before_it_is_tried_once_and_compacted_when_the_agent_moves_on() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "w", "context_limit": 10000}))
        .await
        .unwrap();
    let mut before = vec![user("write the generated table")];
    before.extend(
        (0..3)
            .map(|i| json!({"role": "assistant", "content": format!("{i} {}", "p".repeat(2000))})),
    );
    client
        .post("/session/w/message", &json!({"messages": before}))
        .await
        .unwrap();
    let thought = "w".repeat(34_000); // 8,500 tokens: over the 8,000 trigger by itself
    let call = json!({"role": "assistant", "parts": [{"type": "reasoning", "text": thought},
        {"type": "tool_call", "id": "c1", "name": "write",
         "args": {"path": "table.txt", "content": "the table"}}]});
    // Compacts what came before the step; the step itself stays over the trigger.
    let answer = client
        .post(
            "/session/w/message",
            &json!({"messages": [call], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");
    assert!(answer["tokens"].as_u64().unwrap() > 8000, "{answer}");
    for _ in 0..4 {
        client.get("/session/w/context").await.unwrap();
    }
    let failures = |history: &Value| history["failures"].as_array().unwrap().len();
    let history = client.get("/session/w/compaction").await.unwrap();
    assert_eq!(failures(&history), 1, "{history}");
    // The result is part of the same step: still nothing before it.
    let result = json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": "c1", "output": "written"}]});
    client
        .post(
            "/session/w/message",
            &json!({"messages": [result], "wait": true}),
        )
        .await
        .unwrap();
    let session = client.get("/session/w").await.unwrap();
    assert_eq!(session["breaker"]["open"], false, "{session}");
    // The agent moves on: the written file's step can be summarized now.
    let answer = client
        .post(
            "/session/w/message",
            &json!({"messages": [{"role": "assistant", "content": "Done: table.txt is written."}], "wait": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer["compaction"]["status"], "completed", "{answer}");
    let session = client.get("/session/w").await.unwrap();
    assert!(session["tokens"].as_u64().unwrap() < 8000, "{session}");
}

/// A call takes one result. A second one (a client retrying a result without its
/// Idempotency-Key, or streaming an output as results one by one) is refused with 409 and
/// stores nothing: every model API refuses a conversation answering a call twice, and 40
/// results of one call held a 16,000-token context at 41,800. A call made again with the
/// same id (agents reuse ids) takes its own result, and so does a retried batch that makes
/// its call again.
#[tokio::test]
async fn a_second_result_for_a_call_is_refused_and_changes_nothing() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post("/session", &json!({"id": "once", "context_limit": 16000}))
        .await
        .unwrap();
    let mut messages = vec![user("run the checks")];
    messages.extend(bash_round("a", "make check", "check failed in module x"));
    append_all(&client, "once", &messages).await;
    let result = |id: &str, output: &str| json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": id, "output": output}]});
    let stored = |client: Client| async move {
        client.get("/session/once/message").await.unwrap()["messages"]
            .as_array()
            .unwrap()
            .len()
    };
    let error = client
        .post("/session/once/message", &result("a", "check failed again"))
        .await
        .unwrap_err();
    let (status, message) = api_error(error);
    assert_eq!(status, 409);
    assert!(
        message.contains("call `a` has its result already (seq 3)"),
        "{message}"
    );
    let [call, _] = bash_round("b", "ls", "x");
    let twice = json!({"messages": [call, result("b", "one"), result("b", "two")]});
    let error = client
        .post("/session/once/message", &twice)
        .await
        .unwrap_err();
    let (status, message) = api_error(error);
    assert_eq!(status, 409);
    assert!(
        message.contains("call `b` has its result already in this append"),
        "{message}"
    );
    assert_eq!(
        stored(client.clone()).await,
        3,
        "nothing of either was stored"
    );
    // The call made again with its id, and a batch that makes its call and answers it, twice.
    append_all(&client, "once", &bash_round("a", "make check", "ok")).await;
    let batch = json!({"messages": bash_round("c", "ls", "x")});
    client.post("/session/once/message", &batch).await.unwrap();
    client.post("/session/once/message", &batch).await.unwrap();
    assert_eq!(stored(client.clone()).await, 9);
}
