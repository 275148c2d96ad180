//! What a proxied conversation keeps verbatim in every call: its system prompt, then the
//! user's request (while pinned messages leave room for the smallest summary and tail), then
//! as much of the rest of its preamble as a quarter of the usable context holds. The preamble here is SWE-agent's as its real transcript has it: its system
//! prompt, a demonstration of a whole solved issue (about 4,800 tokens), then the issue to
//! solve.

use crate::common::TestDaemon;
use crate::common::mock_model::{MockModel, Reply};
use crate::proxy::{KEY, call, no_orphans};
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

/// SWE-agent's first call, then `steps` steps, through compactd to a model of `window`
/// tokens (four characters each) that refuses longer requests as OpenAI does and reports
/// its count. Checks what every call the model got must hold: the system prompt first, the
/// issue whole as a message of its own, no result without its call; returns the calls and
/// which of SWE-agent's three first messages are pinned in the file.
async fn swe_agent_through(model: &str, window: usize, steps: usize) -> Option<(usize, [bool; 3])> {
    let first = swe_agent_first_call()?;
    let (system, issue) = (&first[0], &first[2]);
    let mock = MockModel::start(
        vec![],
        Reply::Tokenized {
            window,
            chars_per_token: 4,
        },
    );
    let daemon = TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = 32000\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    ));
    let client = daemon.client();
    let mut messages = first.clone();
    let mut session = String::new();
    for i in 0..steps {
        let body = json!({"model": model, "messages": messages});
        let (status, head, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(
            status,
            200,
            "{model}, step {i}: {}",
            String::from_utf8_lossy(&answer)
        );
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        // As this SWE-agent run does: the model's answer, then the command's output as a
        // user message.
        messages.push(json!({"role": "assistant", "content": "noted"}));
        messages.push(json!({"role": "user",
            "content": format!("module {i}: {}", "def f(): pass\n".repeat(200))}));
    }
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(
        state["compaction_count"].as_u64().unwrap() >= 1,
        "{model}: the conversation compacted: {state}"
    );
    let sent = mock.requests();
    for (n, request) in sent.iter().enumerate() {
        let got = request.body["messages"].as_array().unwrap();
        no_orphans(got);
        assert_eq!(
            &got[0], system,
            "{model}, call {n}: the system prompt first"
        );
        assert!(
            got.contains(issue),
            "{model}, call {n}: the issue, whole, a message of its own"
        );
    }
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let pinned: Vec<bool> = conn
        .prepare("SELECT pinned FROM messages WHERE session_id = ?1 AND seq <= 3 ORDER BY seq")
        .unwrap()
        .query_map([&session], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    Some((sent.len(), pinned.try_into().unwrap()))
}

/// At a 32,000-token window (a model the daemon has no window for: the configured default)
/// a quarter of the usable context (6,400 tokens) holds the system prompt and the
/// demonstration (about 6,000 together) or the system prompt and the issue, not all three.
/// The issue is the user's request: it stays a message of its own in every call the model
/// gets, after compactions as before them, and the demonstration is what goes to the summary
/// (before, the demonstration took the room and the issue was summarized at the first
/// compaction, call 25 of 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_request_is_pinned_before_a_long_demonstration() {
    let Some((calls, pinned)) = swe_agent_through("local-model", 32_000, 40).await else {
        return;
    };
    assert_eq!(calls, 40, "none refused");
    assert_eq!(pinned, [true, false, true], "the demonstration not pinned");
}

/// GPT-4's own 8,192 tokens, the window of the run the transcript comes from: SWE-agent's
/// first call (about 7,200 tokens) is over compactd's trigger from the start, and a quarter
/// of the usable context (1,600 tokens) holds the system prompt alone. The issue is pinned
/// all the same (the system prompt and it take 2,400 tokens, under the 2,550 that leave room
/// for the smallest summary and tail), so every call the model gets still has it whole;
/// before, it went to the summary with the demonstration at the first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_request_is_pinned_even_where_a_quarter_of_the_window_cannot_hold_it() {
    let Some((calls, pinned)) = swe_agent_through("gpt-4", 8_192, 12).await else {
        return;
    };
    assert_eq!(calls, 12, "none refused");
    assert_eq!(pinned, [true, false, true]);
}
