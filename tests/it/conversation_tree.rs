//! A proxied conversation is a tree of messages: whatever a client sends (a longer history,
//! the same request again, an edit in the middle, a rewound history, an older request), the
//! context that goes upstream holds that request's own messages, verbatim or compacted, and
//! nothing of another branch. Checked through the service with random request sequences,
//! small enough windows that they compact, and the request itself as ground truth.

use compactd_api::ContextMessage;
use compactd_core::compaction::{Message, Part, Role};
use compactd_daemon::Config;
use compactd_daemon::Service;
use compactd_daemon::{Caller, Identity, fingerprint};
use compactd_formats::provider::wire::Wire;
use compactd_store::Store;
use compactd_store::Synchronous;
use proptest::prelude::*;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
enum Op {
    /// The client gets an answer and says more: two more messages.
    Extend(usize),
    /// The same request again (a retry, a regenerate).
    Resend,
    /// A message in the middle changes (a reminder rewritten, a file block rebuilt).
    Edit(usize),
    /// The history is rewound by some messages.
    Rewind(usize),
    /// An older request comes back.
    Older(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1usize..1_200).prop_map(Op::Extend),
        1 => Just(Op::Resend),
        2 => any::<usize>().prop_map(Op::Edit),
        1 => (1usize..6).prop_map(Op::Rewind),
        1 => any::<usize>().prop_map(Op::Older),
    ]
}

fn chat_body(messages: &[Value]) -> Value {
    json!({"model": "tree-test", "messages": messages})
}

/// What the context sends for `request`: every stored message must stand, at its place on the
/// branch, for the request's own message there.
fn check(
    request: &[Message],
    context: &[ContextMessage],
    branch: &compactd_store::Branch,
) -> Result<(), TestCaseError> {
    let mut last = None;
    for message in context {
        let ContextMessage::Stored(stored) = message else {
            continue;
        };
        let position = branch.position(stored.seq);
        prop_assert!(
            position.is_some(),
            "seq {} is not on the request's branch",
            stored.seq
        );
        let position = position.unwrap();
        prop_assert!(
            position < request.len(),
            "seq {} stands past the request",
            stored.seq
        );
        prop_assert!(
            last.is_none_or(|l| position > l),
            "the context's order is the request's"
        );
        last = Some(position);
        let shown = stored.to_message().unwrap();
        prop_assert_eq!(shown.role, request[position].role);
        if !stored.masked && !stored.shortened {
            prop_assert_eq!(
                fingerprint(&shown, 4 << 20),
                fingerprint(&request[position], 4 << 20),
                "seq {} is another message",
                stored.seq
            );
        }
    }
    Ok(())
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
    let mut config = Config::default();
    config.proxy.models.insert("tree-test".into(), 8_000);
    config.compaction.max_messages = 16;
    let service = Service::new(store.clone(), config).unwrap();
    let caller = Caller::new("Bearer sk-tree", true);
    let mut conversation = vec![
        json!({"role": "system", "content": "You are a test agent."}),
        json!({"role": "user", "content": "Do the task."}),
    ];
    let mut sent: Vec<Vec<Value>> = Vec::new();
    let mut session: Option<String> = None;
    // The conversation's first call is its system prompt and task, as agents start; every
    // later one keeps those two (an edit of the task itself starts another conversation).
    for (n, op) in std::iter::once(Op::Resend).chain(ops).enumerate() {
        match op {
            Op::Extend(size) => {
                conversation.push(json!({"role": "assistant", "content": format!("answer {n}: {}", "a".repeat(size))}));
                conversation.push(json!({"role": "user", "content": format!("more {n}")}));
            }
            Op::Resend => {}
            Op::Edit(at) if conversation.len() > 3 => {
                let at = 2 + at % (conversation.len() - 2);
                let role = conversation[at]["role"].clone();
                conversation[at] = json!({"role": role, "content": format!("edited at {n}")});
            }
            Op::Rewind(k) => {
                let keep = conversation.len().saturating_sub(2 * k).max(2);
                conversation.truncate(keep);
            }
            Op::Older(i) if !sent.is_empty() => conversation = sent[i % sent.len()].clone(),
            _ => {}
        }
        let request = Wire::Chat
            .parse_value(&mut chat_body(&conversation))
            .unwrap();
        let turn = service
            .proxy_turn(&caller, Identity::default(), &request)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Some(id) = &session {
            prop_assert_eq!(&turn.id.to_string(), id, "one conversation");
        }
        session = Some(turn.id.to_string());
        check(&request.messages, &turn.context.messages, &turn.branch)?;
        prop_assert!(
            turn.context.tokens <= 8_000,
            "{} tokens",
            turn.context.tokens
        );
        sent.push(conversation.clone());
    }
    service.shutdown().await;
    store.close();
    check_branch_view(&dir.path().join("t.db"), session.as_deref().unwrap_or(""))
}

/// `branch_messages`, the view a person reads the tree with, lists every branch as the rows
/// themselves make it: each leaf (a message no other has as its parent) and its ancestors.
fn check_branch_view(path: &std::path::Path, session: &str) -> Result<(), TestCaseError> {
    let db = rusqlite::Connection::open(path).unwrap();
    let parents: std::collections::BTreeMap<u64, Option<u64>> = pairs(
        &db,
        "SELECT seq, parent_seq FROM messages WHERE session_id = ?1",
        session,
    );
    let mut expected = Vec::new();
    for &leaf in parents.keys() {
        if parents.values().any(|p| *p == Some(leaf)) {
            continue;
        }
        let mut path = vec![leaf];
        while let Some(Some(parent)) = parents.get(path.last().unwrap()) {
            path.push(*parent);
        }
        path.reverse();
        expected.extend(path.into_iter().map(|seq| (leaf, seq)));
    }
    let listed: Vec<(u64, u64)> = pairs(
        &db,
        "SELECT branch, seq FROM branch_messages WHERE session_id = ?1",
        session,
    );
    prop_assert_eq!(listed, expected);
    Ok(())
}

/// The two columns `sql` selects for `session`, in the order it gives them.
fn pairs<A, B, C>(db: &rusqlite::Connection, sql: &str, session: &str) -> C
where
    A: rusqlite::types::FromSql,
    B: rusqlite::types::FromSql,
    C: FromIterator<(A, B)>,
{
    db.prepare(sql)
        .unwrap()
        .query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<C>>()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_request_gets_a_context_of_its_own_messages(ops in prop::collection::vec(op(), 1..30)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run(ops))?;
    }
}

#[test]
fn a_message_of_text_and_a_call_is_one_fingerprint_whatever_the_whitespace() {
    let a = Message {
        role: Role::Assistant,
        parts: vec![Part::Text {
            text: " ok \n".into(),
        }],
    };
    assert_eq!(
        fingerprint(&a, 4 << 20),
        fingerprint(&Message::text(Role::Assistant, "ok"), 4 << 20)
    );
}

/// A first call that carries a long history (a resumed session) is stored over several writes
/// of the writer, so other clients' writes go between them. Read back from the file: the
/// session holds each of the calls' messages once, in order, on one branch, whether the first
/// call came twice at once (with a conversation header or without one), the same call again
/// (storing nothing) or a long continuation alone.
#[test]
fn a_long_first_call_is_stored_once_and_in_order_however_many_writes_it_takes() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for conversation_header in [Some("conversation-1"), None] {
            let dir = tempfile::TempDir::new().unwrap();
            let path = dir.path().join("t.db");
            let store = Store::open(&path, Synchronous::Normal).unwrap();
            let mut config = Config::default();
            config.proxy.models.insert("tree-test".into(), 10_000_000);
            let bound = config.proxy.max_recorded_bytes;
            let service = std::sync::Arc::new(Service::new(store.clone(), config).unwrap());
            // 1,503 messages: several writes' worth of small ones, an odd preamble so that a
            // write ends between a tool call and its result, and a run of large outputs (300 KB
            // each) that fills writes by size.
            let mut history = vec![
                json!({"role": "system", "content": "You are a test agent."}),
                json!({"role": "user", "content": "Do the task."}),
                json!({"role": "user", "content": "And keep the tests green."}),
            ];
            for i in 0..750 {
                let output = match i {
                    600..610 => format!("line {i} {}", "x".repeat(300_000)),
                    _ => format!("line {i}"),
                };
                history.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("c{i}"), "type": "function",
                     "function": {"name": "bash", "arguments": format!("{{\"command\": \"cat f{i}\"}}")}}]}));
                history.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": output}));
            }
            let request = Wire::Chat.parse_value(&mut chat_body(&history)).unwrap();
            let identity = || Identity {
                conversation: conversation_header.map(str::to_string),
                ..Identity::default()
            };
            let caller = Caller::new("Bearer sk-tree", true);
            // Two tasks, so that each call's writes queue behind the other's.
            let at_once = [0, 1].map(|_| {
                let (service, caller, request) = (service.clone(), caller.clone(), request.clone());
                let identity = identity();
                tokio::spawn(async move {
                    service
                        .proxy_turn(&caller, identity, &request)
                        .await
                        .map(|turn| (turn.id, turn.context, turn.branch))
                })
            });
            let [a, b] = at_once;
            let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
            assert_eq!(a.0, b.0, "one conversation ({conversation_header:?})");
            check(&request.messages, &a.1.messages, &a.2).unwrap();
            let again = service
                .proxy_turn(&caller, identity(), &request)
                .await
                .unwrap();
            assert_eq!(again.id, a.0);
            // The conversation goes on by 1,200 messages in one call, alone: its writes go on
            // from where the one before left off.
            for i in 750..1_350 {
                history.push(json!({"role": "assistant", "content": format!("step {i}")}));
                history.push(json!({"role": "user", "content": format!("go on {i}")}));
            }
            let request = Wire::Chat.parse_value(&mut chat_body(&history)).unwrap();
            let longer = service
                .proxy_turn(&caller, identity(), &request)
                .await
                .unwrap();
            assert_eq!(longer.id, a.0);
            check(&request.messages, &longer.context.messages, &longer.branch).unwrap();
            service.shutdown().await;
            store.close();

            let db = rusqlite::Connection::open(&path).unwrap();
            let sessions: i64 = db
                .query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
                .unwrap();
            assert_eq!(sessions, 1, "{conversation_header:?}");
            let stored: Vec<(u64, Option<u64>, i64)> = db
                .prepare("SELECT seq, parent_seq, hash FROM messages WHERE session_id = ?1 ORDER BY seq")
                .unwrap()
                .query_map([a.0.to_string()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(stored.len(), request.messages.len(), "{conversation_header:?}");
            for (i, (seq, parent, hash)) in stored.iter().enumerate() {
                assert_eq!(*seq, i as u64 + 1);
                assert_eq!(*parent, (i > 0).then_some(i as u64), "one branch");
                assert_eq!(*hash, fingerprint(&request.messages[i], bound), "message {seq}");
            }
        }
    });
}
