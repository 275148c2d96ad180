//! What a proxied conversation keeps verbatim in every call: its system prompt, then the
//! user's request, then as much of the rest of its preamble as a quarter of the usable
//! context holds. The preamble here is SWE-agent's as its real transcript has it: its system
//! prompt, a demonstration of a whole solved issue (about 4,800 tokens), then the issue to
//! solve.

use crate::common::mock_model::{MockModel, Reply};
use crate::proxy::{KEY, call, counted_answer, no_orphans};
use serde_json::{Value, json};

/// SWE-agent's first call in the shared GPT-4 run: system prompt, demonstration, issue.
fn swe_agent_first_call() -> Option<Vec<Value>> {
    let files = crate::common::shared_transcripts()?;
    let file = files
        .iter()
        .find(|f| f.ends_with("swe-agent/test_data_gpt4__pydicom__pydicom-1458.traj"))?;
    let run: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let first: Vec<Value> = run["history"].as_array().unwrap()[..3]
        .iter()
        .map(|m| json!({"role": m["role"], "content": m["content"]}))
        .collect();
    assert_eq!(
        first.iter().map(|m| m["role"].as_str()).collect::<Vec<_>>(),
        [Some("system"), Some("user"), Some("user")]
    );
    Some(first)
}

/// At a 32,000-token window a quarter of the usable context (6,400 tokens) holds the system
/// prompt and the demonstration (about 6,000 together) or the system prompt and the issue,
/// not all three. The issue is the user's request: it stays a message of its own in every
/// call the model gets, after compactions as before them, and the demonstration is what goes
/// to the summary (before, the demonstration took the room and the issue was summarized).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_request_is_pinned_before_a_long_demonstration() {
    let Some(first) = swe_agent_first_call() else {
        return;
    };
    let (system, demonstration, issue) = (&first[0], &first[1], &first[2]);
    let answers = (0..40)
        .map(|i| counted_answer(i, 7_500 + 720 * i))
        .collect();
    let mock = MockModel::start(answers, Reply::OpenAi("noted".into()));
    let daemon = crate::common::TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = 32000\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    ));
    let client = daemon.client();
    let mut messages = first.clone();
    let mut session = String::new();
    for i in 0..40 {
        // A model the daemon has no window for: the configured default, 32,000 (GPT-4's own
        // 8,192 would not hold the first call's 7,200 tokens).
        let body = json!({"model": "local-model", "messages": messages});
        let (status, head, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        messages.push(crate::proxy::assistant(i));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("module {i}: {}", "def f(): pass\n".repeat(200))}));
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(
        state["compaction_count"].as_u64().unwrap() >= 2,
        "the conversation compacted: {state}"
    );
    let sent = mock.requests();
    assert_eq!(sent.len(), 40);
    let mut demonstration_summarized = false;
    for (n, request) in sent.iter().enumerate() {
        let got = request.body["messages"].as_array().unwrap();
        no_orphans(got);
        assert_eq!(&got[0], system, "call {n}: the system prompt first");
        assert!(
            got.contains(issue),
            "call {n}: the issue, whole, a message of its own"
        );
        demonstration_summarized |= !got.contains(demonstration);
    }
    assert!(
        demonstration_summarized,
        "the demonstration went to the summary at some point"
    );
    // The file says the same to anyone reading it: the system prompt and the issue pinned,
    // the demonstration not.
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let pinned: Vec<(u64, bool)> = conn
        .prepare("SELECT seq, pinned FROM messages WHERE session_id = ?1 AND seq <= 3 ORDER BY seq")
        .unwrap()
        .query_map([&session], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(pinned, [(1, true), (2, false), (3, true)]);
}
