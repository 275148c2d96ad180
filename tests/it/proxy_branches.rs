//! Two branches of one proxied conversation (a client rewriting its history, two agents
//! under one conversation header whose histories part at an answer) taking turns against an
//! upstream that refuses a call longer than its window: each call is compacted for its own
//! branch, a refusal counts for the branch it was for, and a compaction started for one
//! branch lands on it though the other called meanwhile.

use crate::common::TestDaemon;
use crate::common::eventually;
use crate::common::mock_model::{MockModel, Reply};
use crate::proxy::{KEY, proxy_to};
use crate::proxy_overflow::{counted, model, results_follow_their_calls};
use serde_json::{Value, json};
use std::time::Duration;

/// The headers of [`branch_step`]'s calls: one conversation, both branches.
const BRANCH_HEADERS: [(&str, &str); 3] = [
    ("x-api-key", KEY),
    ("anthropic-version", "2023-06-01"),
    ("x-claude-code-session-id", "conversation-1"),
];

/// A conversation's first call (its task), then its two branches, each the task and an
/// instruction of its own ("odd" and "even").
async fn two_branches(client: &compactd_api::client::Client) -> (Vec<Value>, Vec<Value>) {
    let mut odd =
        vec![json!({"role": "user", "content": "Read every module and fix the failing test."})];
    assert_eq!(branch_step(client, &mut odd, "trunk", 0, 10).await, 200);
    odd.pop();
    let mut even = odd.clone();
    odd.push(json!({"role": "user", "content": "Take the odd modules."}));
    even.push(json!({"role": "user", "content": "Take the even modules."}));
    (odd, even)
}

/// What a branch's call asks the model to keep for its answer: the window holds it too.
const BRANCH_MAX_TOKENS: usize = 4_000;

/// One step of a branch: the call, the model's answer appended to the branch, then the
/// branch's next user message (`chars` characters of code).
async fn branch_step(
    client: &compactd_api::client::Client,
    branch: &mut Vec<Value>,
    name: &str,
    step: usize,
    chars: usize,
) -> u16 {
    let body = json!({"model": "claude-test", "max_tokens": BRANCH_MAX_TOKENS,
        "system": "You are careful.",
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}}],
        "messages": branch});
    let (status, _, answer) = crate::proxy_wire::send(
        client,
        hyper::Method::POST,
        "/v1/messages",
        &BRANCH_HEADERS,
        Some(&body),
    )
    .await;
    if status == 200 {
        branch.push(json!({"role": "assistant", "content": answer["content"]}));
        let code = format!("def {name}_{step}(x):\n    return x + {step}\n").repeat(chars / 20 + 1);
        branch.push(json!({"role": "user", "content": format!("Module {step} of {name}:\n{}", &code[..chars])}));
    }
    status
}

/// Two branches of one conversation (a client rewriting its history, two agents under one
/// header whose histories part at an answer) take turns, each growing past the window: each
/// call is compacted for its own branch, and the model never gets a call over its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaving_branches_of_one_conversation_never_reach_the_model_over_its_window() {
    let mock = model(16_000, 2);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let (mut a, mut b) = two_branches(&client).await;
    for step in 0..40 {
        let (sa, sb) = tokio::join!(
            branch_step(&client, &mut a, "odd", step, 2_900 + step * 7),
            branch_step(&client, &mut b, "even", step, 3_100 - step * 5)
        );
        assert_eq!((sa, sb), (200, 200), "step {step}");
    }
    let requests = mock.requests();
    let over: Vec<usize> = requests
        .iter()
        .map(|r| counted(&r.body, 2))
        .filter(|&n| n > 16_000)
        .collect();
    // Each call got its own branch's context, nothing of the other's.
    for request in &requests {
        let text = request.body["messages"].to_string();
        let odd = text.contains("Take the odd modules.") || text.contains("odd_");
        let even = text.contains("Take the even modules.") || text.contains("even_");
        assert!(!(odd && even), "a call with both branches: {text}");
        results_follow_their_calls(request.body["messages"].as_array().unwrap());
    }
    let sessions = client.get("/session").await.unwrap();
    let session = &sessions["sessions"][0];
    assert!(
        session["compaction_count"].as_u64().unwrap() >= 4,
        "{session}"
    );
    assert!(
        over.is_empty(),
        "{} of {} calls over the window: {over:?}",
        over.len(),
        requests.len()
    );
}

/// One branch's call is refused as too long while the other branch's call, meanwhile, was
/// compacted: the refusal counts for its own branch, which is compacted before the call goes
/// again. Before, the refusal was taken for one of a context no longer served (the session had
/// a compaction more), changed nothing, and the same call went again: its second refusal
/// reached the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_cured_though_another_branch_was_compacted_while_the_call_was_out() {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let counts = Reply::Tokenized {
        window: 16_000,
        chars_per_token: 2,
    };
    let mock = MockModel::start(
        vec![
            counts.clone(),
            counts.clone(),
            counts.clone(),
            Reply::Gated(gate.clone(), Box::new(counts.clone())),
        ],
        counts,
    );
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let (mut odd, mut even) = two_branches(&client).await;
    assert_eq!(branch_step(&client, &mut odd, "odd", 0, 2_000).await, 200);
    assert_eq!(branch_step(&client, &mut even, "even", 0, 100).await, 200);

    // The even branch's client sends four notes it kept (a rewritten history): text that
    // the model counts at six times compactd's estimate (a control character, a quote and a
    // space: the mock model counts the first two by their JSON escapes, six bytes and two),
    // over the window by the model's count, under the trigger by compactd's.
    even.pop();
    for note in 0..4 {
        even.push(
            json!({"role": "user", "content": format!("Note {note}: {}", "\u{7}\" ".repeat(700))}),
        );
        even.push(json!({"role": "assistant", "content": [{"type": "text", "text": "noted"}]}));
    }
    even.push(json!({"role": "user", "content": "Go on with the even modules."}));
    let even_call = {
        let (client, mut even) = (daemon.client(), even.clone());
        tokio::spawn(async move { branch_step(&client, &mut even, "even", 1, 100).await })
    };
    mock.wait_for_requests(4);
    // Meanwhile the odd branch grows past the trigger and is compacted before its call goes.
    for step in 1..12 {
        assert_eq!(
            branch_step(&client, &mut odd, "odd", step, 3_000).await,
            200
        );
    }
    let session = client.get("/session").await.unwrap()["sessions"][0].clone();
    assert!(
        session["compaction_count"].as_u64().unwrap() >= 1,
        "{session}"
    );
    gate.add_permits(1);
    assert_eq!(
        even_call.await.unwrap(),
        200,
        "the agent never sees the refusal"
    );
    let requests = mock.requests();
    let refused: Vec<usize> = requests
        .iter()
        .map(|r| counted(&r.body, 2))
        .filter(|&n| n + BRANCH_MAX_TOKENS > 16_000)
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "refused once, then compacted: {refused:?}"
    );
    let sent = &requests.last().unwrap().body;
    assert!(counted(sent, 2) + BRANCH_MAX_TOKENS <= 16_000);
    let text = sent["messages"].to_string();
    assert!(text.contains("Go on with the even modules."), "{text}");
    assert!(!text.contains("odd_"), "{text}");
}

/// A compaction a branch's call started with a model summarizer (slow, as models are) lands
/// on that branch though the other branch's call moved the session while it ran: the
/// summarizer's work is kept, and the branch's next call is sent with its summary. Before,
/// the compaction was refused as "compacted by someone else meanwhile" when it landed: the
/// model's summary was thrown away, and the call it was for went out uncompacted, to be
/// summarized again (two branches taking turns: a refused call refused again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_started_for_one_branch_lands_though_the_other_branch_called_meanwhile() {
    let upstream = model(16_000, 2);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let written = Reply::After(std::time::Duration::ZERO);
    let summarizer = MockModel::start(
        vec![Reply::Gated(gate.clone(), Box::new(written.clone()))],
        written,
    );
    let daemon = TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = 16000\n[proxy]\nanthropic_upstream = \"{}\"\n[summarizer]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\nmax_retries = 0\n",
        upstream.base, summarizer.base
    ));
    let client = daemon.client();
    let mut events = client.events().await.unwrap();
    let (mut odd, mut even) = two_branches(&client).await;
    // The odd branch grows until its compaction starts in the background (its calls are
    // served as they are meanwhile); the summarizer holds it. The call that starts it takes
    // the session's compaction before it answers, so the next call is not sent until then
    // (sent first, it would pass the hard trigger and wait for the held summary).
    let mut step = 0;
    let compacting = || async {
        let list = client.get("/session").await.unwrap();
        list["sessions"][0]["compacting"] == true
    };
    while step == 0 || !compacting().await {
        assert!(step < 30, "no compaction started in 30 steps");
        assert_eq!(
            branch_step(&client, &mut odd, "odd", step, 3_000).await,
            200
        );
        step += 1;
    }
    let asked = eventually(Duration::from_secs(30), || async {
        (!summarizer.requests().is_empty()).then_some(())
    });
    assert!(asked.await.is_some(), "the summarizer was never asked");
    let session = client.get("/session").await.unwrap()["sessions"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The even branch's call moves the session to its branch while the summary is written.
    assert_eq!(branch_step(&client, &mut even, "even", 0, 100).await, 200);
    gate.add_permits(1);
    let landed = loop {
        let (name, data) = crate::common::next_event(&mut events).await;
        if name == "compaction_finished" || name == "compaction_failed" {
            break (name, data);
        }
    };
    assert_eq!(landed.0, "compaction_finished", "{}", landed.1);
    assert_eq!(landed.1["session_id"], session.as_str());
    let path = format!("/session/{session}/compaction");
    let first = client.get(&path).await.unwrap();
    assert_eq!(first["failures"], json!([]), "{first}");
    assert_eq!(first["compactions"].as_array().unwrap().len(), 1);

    // Each branch's next call: the odd one with a summary, the even one without any.
    let sent = upstream.requests().len();
    assert_eq!(branch_step(&client, &mut odd, "odd", step, 100).await, 200);
    assert_eq!(branch_step(&client, &mut even, "even", 1, 100).await, 200);
    let requests = upstream.requests();
    let odd_sent = requests[sent].body["messages"].to_string();
    let even_sent = requests[sent + 1].body["messages"].to_string();
    assert!(odd_sent.contains("summary written by call"), "{odd_sent}");
    assert!(!even_sent.contains("summary written"), "{even_sent}");
    assert!(!even_sent.contains("odd_"), "{even_sent}");
    // Every summary the model wrote landed.
    let last = client.get(&path).await.unwrap();
    assert_eq!(last["failures"], json!([]), "{last}");
    assert_eq!(
        last["compactions"].as_array().unwrap().len(),
        summarizer.requests().len()
    );
}
