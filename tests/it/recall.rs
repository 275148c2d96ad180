//! Recall (issue 26): what compaction took out of the context is found again by full-text
//! search and read back whole, through the API, the CLI and the MCP server, on the shared
//! real transcripts imported at a 16k context.

use crate::common::{BIN, TestDaemon, all_messages, api_error, shared_transcripts, user};
use compactd_api::client::Client;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

fn outputs(message: &Value) -> Vec<String> {
    message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["output"].as_str().map(str::to_string))
        .collect()
}

/// A probe: a line of a tool output that left the context, found in no other message.
struct Probe {
    seq: u64,
    line: String,
}

/// Up to `per_session` probes of the session: from outputs the context no longer shows whole
/// (summarized or masked), the longest line of each that is distinctive (30 to 200 characters,
/// three words or more, in exactly one message of the history).
fn probes(history: &[Value], whole_in_context: &HashSet<u64>, per_session: usize) -> Vec<Probe> {
    let texts: Vec<String> = history.iter().map(|m| m["parts"].to_string()).collect();
    let mut found = Vec::new();
    for m in history {
        let seq = m["seq"].as_u64().unwrap();
        if whole_in_context.contains(&seq) {
            continue;
        }
        let mut lines: Vec<&str> = Vec::new();
        let outs = outputs(m);
        for out in &outs {
            lines.extend(out.lines().map(str::trim).filter(|l| {
                let words = l
                    .split_whitespace()
                    .filter(|w| w.chars().any(char::is_alphanumeric));
                (30..=200).contains(&l.len()) && words.count() >= 3
            }));
        }
        lines.sort_by_key(|l| std::cmp::Reverse(l.len()));
        let distinctive = lines.into_iter().find(|line| {
            let quoted = serde_json::to_string(line).unwrap();
            let quoted = &quoted[1..quoted.len() - 1];
            texts.iter().filter(|t| t.contains(quoted)).count() == 1
        });
        if let Some(line) = distinctive {
            found.push(Probe {
                seq,
                line: line.to_string(),
            });
        }
    }
    // Evenly over the session.
    let step = (found.len() / per_session.max(1)).max(1);
    found.into_iter().step_by(step).take(per_session).collect()
}

async fn top3(client: &Client, session: &str, line: &str) -> Vec<u64> {
    let found = client
        .search(&session.parse().unwrap(), line, 3)
        .await
        .unwrap();
    found.results.iter().map(|r| r.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_left_the_context_is_found_in_the_top_3_and_read_back_whole() {
    let Some(files) = shared_transcripts() else {
        return;
    };
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let (mut probed, mut top, mut cli_probed, mut cli_top) = (0, 0, 0, 0);
    let mut mcp_plan = None;
    for (i, file) in files.iter().enumerate() {
        let session = format!("recall-{i}");
        let import = Command::new(BIN)
            .args(["--socket", daemon.socket().to_str().unwrap(), "import"])
            .arg(file)
            .args(["--session", &session, "--context-limit", "16000"])
            .output()
            .unwrap();
        assert!(
            import.status.success(),
            "{}",
            String::from_utf8_lossy(&import.stderr)
        );
        let history = all_messages(&client, &session).await;
        let context = client
            .get(&format!("/session/{session}/context"))
            .await
            .unwrap();
        let whole: HashSet<u64> = context["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["masked"] != true && m["shortened"] != true)
            .filter_map(|m| m["seq"].as_u64())
            .collect();
        let session_probes = probes(&history, &whole, 12);
        for probe in &session_probes {
            probed += 1;
            let seqs = top3(&client, &session, &probe.line).await;
            if seqs.contains(&probe.seq) {
                top += 1;
                // Read back whole: the stored output, every byte.
                let page = client
                    .get(&format!(
                        "/session/{session}/message?after={}&limit=1",
                        probe.seq - 1
                    ))
                    .await
                    .unwrap();
                let original = history.iter().find(|m| m["seq"] == probe.seq).unwrap();
                assert_eq!(page["messages"][0]["parts"], original["parts"]);
            }
        }
        // The CLI on a few of them.
        for probe in session_probes.iter().take(2) {
            cli_probed += 1;
            let out = Command::new(BIN)
                .args([
                    "--socket",
                    daemon.socket().to_str().unwrap(),
                    "--json",
                    "search",
                ])
                .args(["--limit", "3", &session, "--"])
                .arg(&probe.line)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
            let seqs: Vec<u64> = answer["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["seq"].as_u64().unwrap())
                .collect();
            cli_top += usize::from(seqs.contains(&probe.seq));
        }
        if mcp_plan.is_none() && session_probes.len() >= 3 {
            mcp_plan = Some((
                session.clone(),
                session_probes
                    .iter()
                    .map(|p| (p.seq, p.line.clone()))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    eprintln!(
        "recall: {top} of {probed} distinctive lines in the top 3 (CLI {cli_top} of {cli_probed})"
    );
    assert!(probed >= 50, "only {probed} probes");
    assert!(top * 10 >= probed * 9, "{top} of {probed} in the top 3");
    assert!(
        cli_top * 10 >= cli_probed * 9,
        "CLI: {cli_top} of {cli_probed}"
    );

    let Some((session, lines)) = mcp_plan else {
        panic!("no session to ask over MCP")
    };
    let Some(seen) = mcp_client(&daemon, &session, &lines) else {
        return;
    };
    assert_eq!(seen["protocol"], "2025-06-18");
    assert_eq!(seen["server"], "compactd");
    for tool in ["search_history", "read_messages"] {
        assert_eq!(
            seen["tools"][tool]["type"], "object",
            "{tool}: {}",
            seen["tools"]
        );
    }
    let found = seen["found"].as_array().unwrap();
    let hits = lines
        .iter()
        .zip(found)
        .filter(|((seq, _), f)| f["seqs"].as_array().unwrap().contains(&json!(seq)))
        .count();
    assert!(
        hits * 10 >= lines.len() * 9,
        "MCP: {hits} of {}",
        lines.len()
    );
    let read = seen["read"]["text"].as_str().unwrap();
    assert_eq!(seen["read"]["error"], false);
    assert!(
        read.contains(&lines[0].1),
        "read_messages gave back {read:.300}"
    );
    assert_eq!(seen["missing"]["error"], true, "{}", seen["missing"]);
    assert!(
        seen["missing"]["text"]
            .as_str()
            .unwrap()
            .contains("not found")
    );
    assert_eq!(seen["hostile"]["error"], false, "{}", seen["hostile"]);
    assert_eq!(seen["bad_args"]["error"], true);
    assert!(
        seen["unknown_tool"].as_str().unwrap().starts_with("error:"),
        "{}",
        seen["unknown_tool"]
    );
    assert_eq!(seen["alive"], true);
}

/// Runs tests/it/mcp/client.py (the official `mcp` SDK, installed by .ci/run into
/// target/mcp-venv); `None`, saying so, where it is not installed.
fn mcp_client(daemon: &TestDaemon, session: &str, lines: &[(u64, String)]) -> Option<Value> {
    let python = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/mcp-venv/bin/python"
    ));
    if !python.exists() {
        eprintln!("SKIP (MCP part): the mcp Python SDK is not installed (see .ci/run)");
        return None;
    }
    let plan = daemon.dir.path().join("plan.json");
    let queries: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    std::fs::write(
        &plan,
        json!({"session": session, "queries": queries, "read": lines[0].0}).to_string(),
    )
    .unwrap();
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/mcp/client.py"
        ))
        .args([
            BIN,
            daemon.socket().to_str().unwrap(),
            plan.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[tokio::test]
async fn no_query_string_gives_a_server_error() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    client
        .post(
            "/session/q/message",
            &json!({"messages": [user("the parser fails on \"quoted\" input (see NEAR)")]}),
        )
        .await
        .unwrap();
    let hostile = [
        "\"",
        "\"\"",
        "(",
        ")",
        "*",
        "-",
        "--",
        "NEAR(",
        "NEAR(a b, 2)",
        "a OR",
        "AND",
        "NOT x",
        "^x",
        "col : x",
        "text : parser",
        "{a b} : c",
        "x*",
        "\u{0}",
        "x\u{0}y",
        "parser\u{0}",
        "\"\u{0}\" parser",
        "'; DROP TABLE messages; --",
        "😀 emoji",
        "ä ö ü",
        "  ",
        "a\"b\"c",
        "+",
        "\\",
        "%",
        "&q=x",
    ];
    for q in hostile {
        match client.search(&"q".parse().unwrap(), q, 5).await {
            Ok(found) => assert_eq!(found.query, q),
            Err(e) => {
                let (status, message) = api_error(e);
                assert_eq!(status, 400, "{q:?}: {message}");
            }
        }
    }
    // What is there is found whatever syntax surrounds it.
    let found = client
        .search(&"q".parse().unwrap(), "\"quoted\" NEAR( parser", 5)
        .await
        .unwrap();
    assert_eq!(found.results.len(), 1);
    assert!(found.results[0].snippet.contains("the parser fails"));
    assert!(found.results[0].in_context);
    // A missing session is a 404, an oversized query a 400.
    let (status, _) = api_error(
        client
            .search(&"absent".parse().unwrap(), "x", 5)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 404);
    let (status, message) = api_error(
        client
            .search(&"q".parse().unwrap(), &"word ".repeat(500), 5)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 400, "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_is_searchable_even_right_after_a_kill_9() {
    let mut daemon = TestDaemon::start("");
    let client = daemon.client();
    let batch: Vec<Value> = (0..600)
        .map(|i| user(&format!("note {i}: marker{i}x")))
        .collect();
    client
        .post("/session/k/message", &json!({"messages": batch}))
        .await
        .unwrap();
    // Killed before it is idle long enough to index what it just stored.
    tokio::task::block_in_place(|| daemon.kill9());
    daemon.spawn();
    let client = daemon.client();
    for i in [0, 299, 599] {
        let found = client
            .search(&"k".parse().unwrap(), &format!("marker{i}x"), 3)
            .await
            .unwrap();
        assert_eq!(found.results.len(), 1, "marker{i}x: {:?}", found.results);
        assert_eq!(found.results[0].seq, i + 1);
    }
}

/// The peak resident memory of a process, in MB (`VmHWM`).
fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024.0
}

/// Two searches at once, each of a 2,000-byte query, over outputs of 1 MB that hold one of
/// its words. Each hit's snippet used to lowercase the whole output and scan it once
/// per word of the query, on the async workers: two such searches froze `/health` and every
/// other session's append for most of a minute. Now the snippet looks through a bounded window
/// once, off the async workers, two searches at a time: the daemon answers meanwhile, and
/// its memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_searches_of_megabyte_outputs_leave_the_daemon_responsive() {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let words: Vec<String> = (0..400).map(|i| format!("w{i:03}")).collect();
    let output = words.join(" ").repeat(1 << 20 >> 11);
    for i in 0..8 {
        let [call, result] = crate::common::bash_round(&format!("c{i}"), "cat big.log", &output);
        client
            .post("/session/big/message", &json!({"messages": [call, result]}))
            .await
            .unwrap();
    }
    // One word every output holds, then words none does: each was looked for through the
    // whole of every hit.
    let absent: String = (0..400).map(|i| format!(" absent{i:03}")).collect();
    let query = format!("w000{absent}");
    let query = &query[..query.len().min(2_000)];
    let search = |client: Client| {
        let query = query.to_string();
        tokio::spawn(async move {
            client
                .search(&"big".parse().unwrap(), &query, 50)
                .await
                .unwrap()
        })
    };
    let searches = [search(daemon.client()), search(daemon.client())];
    let mut slowest = std::time::Duration::ZERO;
    while searches.iter().any(|s| !s.is_finished()) {
        let asked = std::time::Instant::now();
        client.get("/health").await.unwrap();
        client
            .post(
                "/session/other/message",
                &json!({"messages": [user("still here")]}),
            )
            .await
            .unwrap();
        slowest = slowest.max(asked.elapsed());
    }
    for search in searches {
        let found = search.await.unwrap();
        assert_eq!(found.results.len(), 8);
        assert!(found.results.iter().all(|r| r.snippet.contains("w000")));
    }
    assert!(slowest < std::time::Duration::from_secs(1), "{slowest:?}");
    let peak = peak_rss_mb(daemon.child.as_ref().unwrap().id());
    assert!(peak < 400.0, "peak RSS {peak:.0} MB");
}

/// `compactd mcp` spoken to line by line: `read_messages` over 250 messages says where the
/// rest is (it stopped silently at 200), a batch is answered with an array (it was never
/// answered), and an id of 2^70 comes back as written (it came back as a float); NUL inside
/// a query is a tool result, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_server_pages_past_200_answers_batches_and_echoes_ids_exactly() {
    use std::io::{BufRead, Write};
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let messages: Vec<Value> = (1..=250).map(|i| user(&format!("note {i}"))).collect();
    client
        .post("/session/m/message", &json!({"messages": messages}))
        .await
        .unwrap();
    let mut mcp = Command::new(BIN)
        .args(["--socket", daemon.socket().to_str().unwrap(), "mcp"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = mcp.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(mcp.stdout.take().unwrap());
    let mut ask = |line: &str| -> String {
        writeln!(input, "{line}").unwrap();
        let mut answer = String::new();
        output.read_line(&mut answer).unwrap();
        answer
    };
    let call = |id: &str, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": 0, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
        .to_string()
        .replace("\"id\":0", &format!("\"id\":{id}"))
    };
    let read = |answer: &str| -> Value { serde_json::from_str(answer).unwrap() };
    let text = |answer: &Value| {
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };

    let big = "1180591620717411303424";
    let answer = ask(&call(
        big,
        "read_messages",
        json!({"session": "m", "from_seq": 1, "to_seq": 250}),
    ));
    assert!(answer.contains(&format!("\"id\":{big}")), "{answer}");
    let first = text(&read(&answer));
    assert!(
        first.contains("note 200") && !first.contains("note 201"),
        "{first}"
    );
    assert!(
        first.contains("from_seq=201, to_seq=250"),
        "{}",
        &first[first.len() - 200..]
    );
    let rest = text(&read(&ask(&call(
        "2",
        "read_messages",
        json!({"session": "m", "from_seq": 201, "to_seq": 250}),
    ))));
    assert!(
        rest.contains("note 250") && !rest.contains("not read yet"),
        "{rest}"
    );

    let batch = format!(
        "[{}, {{\"jsonrpc\": \"2.0\", \"method\": \"notifications/initialized\"}}, {}]",
        json!({"jsonrpc": "2.0", "id": "a", "method": "ping"}),
        call(
            "\"b\"",
            "search_history",
            json!({"session": "m", "query": "note\u{0}7"})
        )
    );
    let answers = read(&ask(&batch));
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["id"], "a");
    assert_eq!(answers[1]["id"], "b");
    assert_eq!(answers[1]["result"]["isError"], false, "{}", answers[1]);
    let empty = read(&ask("[]"));
    assert_eq!(empty["error"]["code"], -32600);
    assert_eq!(
        read(&ask(
            "{\"jsonrpc\": \"2.0\", \"id\": {}, \"method\": \"ping\"}"
        ))["error"]["code"],
        -32600
    );
    drop(input);
    mcp.wait().unwrap();
}
