//! Operating compactd: the CLI against a real daemon (and without one), config hot reload,
//! systemd socket activation and readiness, the unit files, and the peer-uid guard.

use crate::common::{BIN, TestDaemon, edit_config, have, user, wait_for_event};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Runs the CLI against `socket`; returns (exit code, stdout, stderr).
fn cli(socket: &std::path::Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ok(socket: &std::path::Path, args: &[&str]) -> String {
    let (code, out, err) = cli(socket, args, None);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
fn every_cli_command_against_a_real_daemon() {
    let daemon = TestDaemon::start("");
    let s = daemon.socket();

    let status = ok(&s, &["status"]);
    assert!(
        status.contains("running on") && status.contains("summarizer: extractive"),
        "{status}"
    );
    // Where the data is, and whether the config file exists.
    assert!(status.contains(daemon.db().to_str().unwrap()), "{status}");
    assert!(status.contains("config.toml (in force)"), "{status}");
    // What requests and compactions may hold, and hold now (this status request's own body
    // is empty: nothing).
    assert!(
        status.contains("memory:     requests 0.0 of 128.0 MiB, compactions 0.0 of 64.0 MiB\nsummaries:  0 running (at most 4), 0 waiting"),
        "{status}"
    );
    // What the database takes on its disk, and what is left there.
    assert!(
        status.contains(" MiB free on its disk)\n") || status.contains(" GiB free on its disk)\n"),
        "{status}"
    );
    let status: Value = serde_json::from_str(&ok(&s, &["--json", "status"])).unwrap();
    assert_eq!(status["status"], "ok");
    assert_eq!(status["memory"]["request_budget_bytes"], 128 << 20);
    let on_disk: u64 = ["", "-wal"]
        .iter()
        .map(|suffix| {
            std::fs::metadata(format!("{}{suffix}", daemon.db().display())).map_or(0, |m| m.len())
        })
        .sum();
    assert_eq!(status["disk"]["database_bytes"], on_disk, "{status}");
    assert!(
        status["disk"]["free_bytes"].as_u64().unwrap() > 0,
        "{status}"
    );

    assert!(
        ok(
            &s,
            &[
                "session",
                "create",
                "--id",
                "cli",
                "--context-limit",
                "8000",
                "--model",
                "m"
            ]
        )
        .contains("created session cli")
    );
    // Follow events from now on: the CLI says so on stderr once subscribed.
    let mut events = Command::new(BIN)
        .arg("--socket")
        .arg(&s)
        .args(["--json", "events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut event_err = BufReader::new(events.stderr.take().unwrap());
    let mut event_out = BufReader::new(events.stdout.take().unwrap());
    let _events = crate::common::ChildGuard(events);
    let mut line = String::new();
    event_err.read_line(&mut line).unwrap();
    assert!(line.contains("following events"), "{line}");

    for i in 0..8 {
        let out = ok(
            &s,
            &[
                "append",
                "cli",
                "--role",
                "user",
                "--text",
                &format!("instruction {i}: {}", "word ".repeat(300)),
            ],
        );
        assert!(
            out.contains(&format!("appended seq {}..{}", i + 1, i + 1)),
            "{out}"
        );
    }
    let stdin = json!({"role": "assistant", "parts": [
        {"type": "tool_call", "id": "k1", "name": "bash", "args": {"command": "cat notes.md"}}]});
    let (code, out, err) = cli(&s, &["append", "cli"], Some(&stdin.to_string()));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("appended seq 9..9"), "{out}");
    let (code, _, err) = cli(&s, &["append", "cli"], Some("{not json"));
    assert_ne!(code, 0);
    assert!(err.contains("not valid JSON"), "{err}");

    let list = ok(&s, &["session", "list"]);
    assert!(list.starts_with("ID") && list.contains("cli"), "{list}");
    let show = ok(&s, &["session", "show", "cli"]);
    assert!(show.contains("messages:     9 total"), "{show}");

    let compacted = ok(&s, &["compact", "cli", "--focus", "the instructions"]);
    assert!(compacted.contains("compaction #1 of cli"), "{compacted}");
    let history = ok(&s, &["history", "cli"]);
    assert!(
        history.starts_with("NUM") && history.contains("manual"),
        "{history}"
    );
    let context = ok(&s, &["context", "cli"]);
    assert!(context.contains("[summary] user:"), "{context}");
    assert!(context.contains("[#9] assistant: → bash"), "{context}");
    let context: Value = serde_json::from_str(&ok(&s, &["--json", "context", "cli"])).unwrap();
    assert_eq!(context["compaction_num"], 1);
    // Whole messages, and ready to send.
    let whole = ok(&s, &["context", "cli", "--full"]);
    assert!(
        whole.contains(&format!(
            "instruction 7: {}",
            "word ".repeat(299).trim_end()
        )),
        "{whole}"
    );
    assert!(whole.contains("## 9. Optional Next Step"), "{whole}");
    let openai: Value =
        serde_json::from_str(&ok(&s, &["context", "cli", "--format", "openai"])).unwrap();
    assert_eq!(openai["format"], "openai");
    assert_eq!(
        openai["messages"].as_array().unwrap().last().unwrap()["tool_calls"][0]["function"]["name"],
        "bash"
    );
    let anthropic: Value =
        serde_json::from_str(&ok(&s, &["context", "cli", "--format", "anthropic"])).unwrap();
    assert_eq!(anthropic["messages"][0]["role"], "user");
    // The latest summary whole, the stored messages whole, the newest compactions.
    let summary = ok(&s, &["summary", "cli"]);
    assert!(
        summary.starts_with("compaction #1 of cli") && summary.contains("## 6. All user messages"),
        "{summary}"
    );
    let messages = ok(&s, &["messages", "cli", "--limit", "2"]);
    assert!(messages.starts_with("── #1 user (pinned)"), "{messages}");
    assert!(messages.contains("── #2 user (compacted)"), "{messages}");
    assert!(messages.contains("instruction 1: word"), "{messages}");
    assert!(messages.contains("(more: --after 2)"), "{messages}");
    let past = ok(&s, &["messages", "cli", "--after", "9"]);
    assert_eq!(past, "(no messages after #9: the last is #9)\n");
    // By seq: the range asked whole, and a seq the session lacks said so, not printed empty.
    let shown = ok(&s, &["show", "cli", "8..9"]);
    assert!(shown.starts_with("── #8 user"), "{shown}");
    assert!(
        shown.contains("── #9 assistant") && shown.contains("cat notes.md"),
        "{shown}"
    );
    assert!(!shown.contains("#7") && !shown.contains("more:"), "{shown}");
    let (code, out, err) = cli(&s, &["show", "cli", "40"], None);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("no message #40: its messages are #1 to #9"),
        "{err}"
    );
    let (code, _, err) = cli(&s, &["show", "cli", "10..12"], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no messages #10 to #12"), "{err}");
    assert!(ok(&s, &["history", "cli", "--limit", "1"]).contains("manual"));
    // PATCH: a new model and a lower limit.
    let updated = ok(
        &s,
        &[
            "session",
            "update",
            "cli",
            "--model",
            "m2",
            "--context-limit",
            "6000",
        ],
    );
    assert!(
        updated.contains("model:        m2") && updated.contains("/ 6000 tokens"),
        "{updated}"
    );
    let (code, _, err) = cli(&s, &["session", "update", "cli"], None);
    assert_eq!(code, 1);
    assert!(err.contains("nothing to change"), "{err}");
    let (code, _, err) = cli(&s, &["session", "update", "cli", "--config", "{max"], None);
    assert_eq!(code, 1);
    assert!(err.contains("--config is not valid JSON"), "{err}");
    // A bad id never reaches the daemon (`prod?x` would have meant `prod` in a URL).
    let (code, _, err) = cli(&s, &["session", "delete", "prod?x"], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid session id"), "{err}");
    // Reading into a pipe that closes early ends quietly.
    let piped = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{BIN} --socket {} messages cli --limit 9 | head -1",
            s.display()
        ))
        .output()
        .unwrap();
    assert!(piped.status.success());
    assert_eq!(String::from_utf8_lossy(&piped.stdout).lines().count(), 1);
    assert!(
        !String::from_utf8_lossy(&piped.stderr).contains("panicked"),
        "{piped:?}"
    );

    // The compaction reached the event follower.
    let mut names = Vec::new();
    while !names.iter().any(|n| n == "compaction_finished") {
        let mut line = String::new();
        assert!(
            event_out.read_line(&mut line).unwrap() > 0,
            "events ended early"
        );
        let event: Value = serde_json::from_str(&line).unwrap();
        names.push(event["event"].as_str().unwrap().to_string());
    }
    assert_eq!(names, ["compaction_started", "compaction_finished"]);

    assert!(ok(&s, &["session", "delete", "cli"]).contains("deleted session cli"));
    let (code, _, err) = cli(&s, &["session", "show", "cli"], None);
    assert_ne!(code, 0);
    assert!(
        err.contains("not found") || err.contains("deleted"),
        "{err}"
    );
}

#[test]
fn without_a_daemon_every_command_fails_with_a_one_line_hint() {
    let dir = tempfile::TempDir::new().unwrap();
    let socket = dir.path().join("nobody-home.sock");
    for args in [
        vec!["status"],
        vec!["session", "list"],
        vec!["session", "show", "x"],
        vec!["session", "create"],
        vec!["session", "delete", "x"],
        vec!["append", "x", "--role", "user", "--text", "hi"],
        vec!["context", "x"],
        vec!["compact", "x"],
        vec!["history", "x"],
        vec!["summary", "x"],
        vec!["messages", "x"],
        vec!["events"],
    ] {
        let (code, out, err) = cli(&socket, &args, None);
        assert_eq!(code, 3, "{args:?}: not running has its own exit code");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(socket.to_str().unwrap()) && err.contains("compactd serve"),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn config_edits_apply_without_restart_and_bad_edits_keep_the_old_config() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 80\n");
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let eleven: Vec<Value> = (0..11)
        .map(|i| user(&format!("m{i} {}", "w ".repeat(200))))
        .collect();
    let answer = client
        .post("/session/hot/message", &json!({"messages": eleven}))
        .await
        .unwrap();
    assert!(answer["compaction"].is_null());

    edit_config(&daemon, "[compaction]\nmax_messages = 10\n");
    let reloaded = wait_for_event(&mut events, "config_reloaded").await;
    assert_eq!(reloaded["path"], daemon.config_path().to_str().unwrap());
    // In force at once: the session is over the new limit and compacts.
    let compacted = wait_for_event(&mut events, "compaction_finished").await;
    assert_eq!(compacted["session_id"], "hot");
    assert_eq!(compacted["trigger"], "messages");

    // An invalid edit: the daemon stays up, reports it, and keeps max_messages = 10.
    edit_config(&daemon, "[compaction]\nmax_messages = \"lots\"\n");
    let rejected = wait_for_event(&mut events, "config_rejected").await;
    assert!(
        rejected["error"].as_str().unwrap().contains("max_messages"),
        "{rejected}"
    );
    let health = client.get("/health").await.unwrap();
    assert!(
        health["config"]["error"]
            .as_str()
            .unwrap()
            .contains("max_messages")
    );
    let status = ok(&daemon.socket(), &["status"]);
    assert!(status.contains("REJECTED EDIT"), "{status}");
    let session = client.get("/session/hot").await.unwrap();
    assert_eq!(session["max_messages"], 10, "the old config stays in force");

    // A FIFO in the config's place (a reload that read it would wait for a writer forever):
    // rejected at once, and the daemon goes on serving.
    let fifo = daemon.dir.path().join("config.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    std::fs::rename(&fifo, daemon.config_path()).unwrap();
    let rejected = wait_for_event(&mut events, "config_rejected").await;
    assert!(
        rejected["error"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{rejected}"
    );
    assert_eq!(
        client.get("/session/hot").await.unwrap()["max_messages"],
        10
    );

    // Fixing the file clears the error.
    edit_config(&daemon, "[compaction]\nmax_messages = 20\n");
    wait_for_event(&mut events, "config_reloaded").await;
    let health = client.get("/health").await.unwrap();
    assert!(health["config"]["error"].is_null());
    assert_eq!(
        client.get("/session/hot").await.unwrap()["max_messages"],
        20
    );
}

/// An edit that lowers the trigger under sessions nobody is writing to compacts them at the
/// reload, not at their agent's next step: the agent comes back to a context already
/// compacted instead of waiting for it. Sessions still under the new trigger are left alone.
#[tokio::test]
async fn a_config_edit_compacts_the_idle_sessions_it_puts_over_their_trigger() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 80\n");
    let client = daemon.client();
    let twelve: Vec<Value> = (0..12)
        .map(|i| user(&format!("idle m{i} {}", "w ".repeat(200))))
        .collect();
    client
        .post("/session/idle/message", &json!({"messages": twelve}))
        .await
        .unwrap();
    client
        .post(
            "/session/small/message",
            &json!({"messages": [user("a"), user("b")]}),
        )
        .await
        .unwrap();
    let mut events = client.events().await.unwrap();

    edit_config(&daemon, "[compaction]\nmax_messages = 10\n");
    wait_for_event(&mut events, "config_reloaded").await;
    // Nothing is appended or read: the reload alone starts the compaction.
    let finished = wait_for_event(&mut events, "compaction_finished").await;
    assert_eq!(finished["session_id"], "idle");
    assert_eq!(finished["trigger"], "messages");

    let session = client.get("/session/idle").await.unwrap();
    assert_eq!(session["compaction_count"], 1, "{session}");
    let context = client.get("/session/idle/context").await.unwrap();
    assert_eq!(context["compaction_num"], 1, "{context}");
    let summarized = context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["summary"] == true);
    assert!(summarized, "the next context holds the summary: {context}");
    let small = client.get("/session/small").await.unwrap();
    assert_eq!(small["compaction_count"], 0, "{small}");
}

#[tokio::test]
async fn a_config_written_after_a_first_start_applies_without_restart() {
    // A fresh machine: the config's directory does not exist when the daemon starts.
    let home = tempfile::TempDir::new().unwrap();
    let config = home
        .path()
        .join("fresh")
        .join("compactd")
        .join("config.toml");
    let daemon = TestDaemon::builder().config_path(&config).start();
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    std::fs::write(&config, "[compaction]\nmax_messages = 7\n").unwrap();
    wait_for_event(&mut events, "config_reloaded").await;
    client
        .post("/session/x/message", &user("hi"))
        .await
        .unwrap();
    assert_eq!(client.get("/session/x").await.unwrap()["max_messages"], 7);
}

#[test]
fn systemd_socket_activation_starts_the_daemon_on_the_first_connection() {
    if !have("systemd-socket-activate") {
        eprintln!("SKIP: systemd-socket-activate is not installed");
        return;
    }
    let dir = tempfile::TempDir::new().unwrap();
    let socket = dir.path().join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(BIN)
        .args(["serve", "--db"])
        .arg(dir.path().join("c.db"))
        .arg("--config")
        .arg(dir.path().join("none.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // systemd-socket-activate announces the socket once it listens.
    let mut stderr = BufReader::new(activator.stderr.take().unwrap());
    let activator = crate::common::ChildGuard(activator);
    let mut line = String::new();
    while !line.contains("Listening on") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "systemd-socket-activate ended early"
        );
    }
    // The first connection starts compactd, which serves it on the inherited socket.
    let status: Value = serde_json::from_str(&ok(&socket, &["--json", "status"])).unwrap();
    assert_eq!(status["status"], "ok");
    // Without --accept, systemd-socket-activate execs compactd in its own process.
    assert_eq!(status["pid"].as_u64().unwrap(), activator.0.id() as u64);
    ok(
        &socket,
        &["append", "act", "--role", "user", "--text", "hello"],
    );
    assert!(ok(&socket, &["context", "act"]).contains("hello"));
    let mut daemon_log = String::new();
    while !daemon_log.contains("compactd serving") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0);
        daemon_log.push_str(&line);
    }
    assert!(daemon_log.contains("(from systemd)"), "{daemon_log}");
}

#[test]
fn readiness_watchdog_reload_and_stopping_are_reported_to_systemd() {
    let mut daemon = TestDaemon::start("");
    // The harness already waited for READY=1; now a reload and a stop.
    let notify =
        std::os::unix::net::UnixDatagram::bind(daemon.dir.path().join("notify2.sock")).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    daemon.kill9();
    daemon.child = Some(
        daemon
            .command()
            .env("NOTIFY_SOCKET", daemon.dir.path().join("notify2.sock"))
            // systemd's WatchdogSec=, shortened: pings are due every 0.5 s.
            .env("WATCHDOG_USEC", "1000000")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The next notification; `states` skips watchdog pings to reach a state change.
    let next = |states: bool| loop {
        let mut buf = [0u8; 512];
        // A signal to the test process (another test's child ending) interrupts the wait.
        let n = match notify.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            n => n.expect("a notification within 30 s"),
        };
        let message = String::from_utf8_lossy(&buf[..n]).to_string();
        if !(states && message.trim() == "WATCHDOG=1") {
            return message;
        }
    };
    let recv = || next(true);
    assert!(recv().contains("READY=1"));
    // Watchdog pings arrive while the daemon is healthy.
    let mut pings = 0;
    while pings < 2 {
        pings += usize::from(next(false).contains("WATCHDOG=1"));
    }
    std::fs::write(daemon.config_path(), "[compaction]\nmax_messages = 50\n").unwrap();
    let reloading = recv();
    assert!(
        reloading.contains("RELOADING=1") && reloading.contains("MONOTONIC_USEC="),
        "{reloading}"
    );
    assert!(recv().contains("READY=1"));
    let pid = daemon.child.as_ref().unwrap().id();
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(recv().contains("STOPPING=1"));
    assert!(daemon.child.take().unwrap().wait().unwrap().success());
}

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    if !have("systemd-analyze") {
        eprintln!("SKIP: systemd-analyze is not installed");
        return;
    }
    let units = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("{units}/compactd.socket"))
        .arg(format!("{units}/compactd.service"))
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // The one finding allowed is about this machine, not the files: the binary's install
    // path (%h/.cargo/bin/compactd) does not exist here.
    let about_content: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("is not executable"))
        .collect();
    assert!(about_content.is_empty(), "systemd-analyze verify: {report}");
    let socket = std::fs::read_to_string(format!("{units}/compactd.socket")).unwrap();
    assert!(
        socket.contains("ListenStream=%t/compactd/compactd.sock")
            && socket.contains("SocketMode=0600")
    );
    let service = std::fs::read_to_string(format!("{units}/compactd.service")).unwrap();
    assert!(service.contains("Type=notify") && service.contains("WatchdogSec="));
}

#[test]
fn other_users_are_refused_by_the_peer_uid_guard() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: switching uid needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let daemon = TestDaemon::start("");
    // Open the way so only the guard stands between another user and the daemon.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    // A copy of the binary the other user can run wherever the checkout lives.
    let binary = daemon.dir.path().join("compactd-for-others");
    std::fs::copy(BIN, &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = Command::new(&binary)
        .arg("--socket")
        .arg(daemon.socket())
        .arg("status")
        .uid(65534)
        .gid(65534)
        .output();
    let out = match run {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIP: uid 65534 cannot run a program here: {e}");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied") {
        eprintln!("SKIP: uid 65534 cannot reach the test directory here: {err}");
        return;
    }
    // The CLI will not talk to another user's daemon at all...
    assert!(!out.status.success());
    assert!(
        err.contains("runs as uid 0, not as you (uid 65534)"),
        "{err}"
    );
    // ...and a client that does not check is refused by the daemon.
    let raw = Command::new("python3")
        .arg("-c")
        .arg(
            "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); \
             s.sendall(b'GET /health HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'); print(s.recv(4096).decode())",
        )
        .arg(daemon.socket())
        .uid(65534)
        .gid(65534)
        .output();
    if let Some(raw) = raw.ok().filter(|o| o.status.success()) {
        let answer = String::from_utf8_lossy(&raw.stdout);
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains("serves uid 0 only"),
            "{answer}"
        );
    } else {
        eprintln!("SKIP (raw part): python3 cannot run as uid 65534 here");
    }
    // The owner is still served.
    assert!(ok(&daemon.socket(), &["status"]).contains("running on"));
}

#[test]
fn completions_and_a_man_page_are_generated() {
    let s = std::path::Path::new("/nonexistent.sock");
    let bash = ok(s, &["completions", "bash"]);
    assert!(
        bash.contains("_compactd()") && bash.contains("summary"),
        "{}",
        &bash[..200]
    );
    for shell in ["zsh", "fish"] {
        assert!(ok(s, &["completions", shell]).contains("compactd"));
    }
    let man = ok(s, &["man"]);
    assert!(
        man.contains(".TH compactd") && man.contains("Exit codes"),
        "{}",
        &man[..300]
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `compactd completions bash | true`: the reader is gone before the script is written.
    for args in [&["completions", "bash"][..], &["man"], &["openapi"]] {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", output.status);
        assert!(
            output.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn events_fail_when_the_daemon_stops() {
    let mut daemon = TestDaemon::start("");
    let mut follower = Command::new(BIN)
        .arg("--socket")
        .arg(daemon.socket())
        .arg("events")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(follower.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("following events"), "{line}");
    daemon.terminate();
    let status = follower.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert_eq!(status.code(), Some(1), "{rest}");
    assert!(rest.contains("closed the event stream"), "{rest}");
}

#[test]
fn an_error_says_its_cause_once() {
    let dir = tempfile::TempDir::new().unwrap();
    let out = Command::new(BIN)
        .args(["--socket", dir.path().join("s.sock").to_str().unwrap()])
        .args(["serve", "--db", "/proc/compactd-absent/a.db"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("/proc/compactd-absent/a.db"), "{err}");
    assert_eq!(
        last.matches("/proc/compactd-absent/a.db").count(),
        1,
        "{last}"
    );
    assert_eq!(last.matches("os error").count(), 1, "{last}");
    let out = Command::new(BIN)
        .args(["import", "/compactd-absent.jsonl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}

/// A second `compactd serve` on the database another daemon serves (through another socket,
/// as a shell without `XDG_RUNTIME_DIR` picks one) refuses to start, names the first's pid,
/// binds nothing and opens nothing; the first goes on serving. Once the first is gone, even
/// by kill -9, the second starts on the same database and finds its messages.
#[tokio::test]
async fn a_second_daemon_on_the_same_database_refuses_to_start() {
    let mut first = TestDaemon::start("");
    let client = first.client();
    client
        .post("/session/s/message", &user("first"))
        .await
        .unwrap();
    let pid = crate::common::daemon_pid(&client).await;

    let mut second = TestDaemon::builder().db(first.db()).build();
    let mut child = second
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the second daemon kept running on a database another one serves");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another compactd (pid {pid}) already serves the database"
        )),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(!second.socket().exists(), "it bound no socket");
    client
        .post("/session/s/message", &user("still served"))
        .await
        .unwrap();

    first.kill9();
    second.spawn();
    let texts: Vec<String> = crate::common::all_messages(&second.client(), "s")
        .await
        .iter()
        .map(|m| {
            m["parts"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(texts, ["first", "still served"]);
}
