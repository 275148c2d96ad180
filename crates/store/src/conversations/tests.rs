//! The proxy's conversations in the store, placed and read as the proxy does.

use super::walk::{CHILD_BY_HASH, HASHES_ALONG};
use super::*;
use crate::message::{Part, Role};
use crate::overflows::LIMIT_FROM_REFUSAL;
use crate::sessions::NewSession;

use super::super::migrate::query_plan as plan;

/// A first call of 1,202 messages whose task has no opening (so only its stored prefix
/// can tell its retry apart), written in full or cut off after its first write, as a
/// daemon killed between the two would leave it.
fn long_first_call() -> ProxyCall {
    let mut messages = vec![
        Message::text(Role::System, "You are a test agent."),
        Message::text(Role::User, "Do the task."),
    ];
    for i in 0..600 {
        messages.push(Message::text(Role::Assistant, format!("step {i}")));
        messages.push(Message::text(Role::User, format!("go on {i}")));
    }
    let fingerprints = (0..messages.len() as i64)
        .map(|i| Fingerprints {
            hash: 1_000 + i,
            opening: None,
        })
        .collect();
    ProxyCall {
        owner: "owner".into(),
        named: None,
        conversation: None,
        root_hash: 42,
        messages: messages.into(),
        fingerprints,
        media: Vec::new(),
        estimator: LazyEstimator::default(),
        has_tools: false,
        overhead_tokens: 0,
        completion_tokens: 0,
        new_session: NewSession {
            id: SessionId::unchecked(format!("proxy-{}", next_suffix())),
            model: None,
            context_limit: 10_000_000,
            overrides: serde_json::json!({}),
            owner: Some("owner".into()),
            limit_source: None,
        },
        may_create: Ok(()),
        windows_taught_since: std::time::SystemTime::UNIX_EPOCH,
    }
}

fn next_suffix() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn rules(_: &SessionRow) -> AppendRules {
    AppendRules::AS_SENT
}

#[tokio::test]
async fn a_first_call_cut_off_between_its_writes_is_completed_by_its_retry() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("t.db");
    let store = Store::open(&path, crate::Synchronous::Normal).unwrap();
    let cut = Arc::new(long_first_call());
    let hashes: Arc<[i64]> = cut.hashes().into();
    let (first, left_off) = store
        .write(move |conn| place(conn, &cut, &hashes, &rules, None))
        .await
        .unwrap();
    assert!(left_off.is_some(), "the call took one write");
    assert_eq!(first.session.message_count, STORE_STEP as u64);

    // Meanwhile a call that shares only the first 300 messages: another conversation.
    let mut other = long_first_call();
    let mut messages = other.messages.to_vec();
    messages.truncate(300);
    messages.push(Message::text(Role::User, "Another task."));
    other.messages = messages.into();
    other.fingerprints.truncate(300);
    other.fingerprints.push(Fingerprints {
        hash: 7,
        opening: None,
    });
    let other = store.place_call(other, rules).await.unwrap();
    assert_ne!(other.session.id, first.session.id, "a call of another task");

    let retry = store.place_call(long_first_call(), rules).await.unwrap();
    assert_eq!(retry.session.id, first.session.id, "a second session");
    assert_eq!(retry.matched, STORE_STEP);
    assert_eq!(retry.session.message_count, 1_202);
    store.close();

    let db = Connection::open(&path).unwrap();
    let counts: (i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM messages)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(counts, (2, 1_202 + 301));
}

/// A call under conversation header `c` whose task is `task` (fingerprints `base + i`,
/// the system prompt's shared): `steps` assistant/user rounds after it.
fn headed_call(task: &str, base: i64, steps: usize) -> ProxyCall {
    let mut call = long_first_call();
    let mut messages = vec![
        Message::text(Role::System, "You are a test agent."),
        Message::text(Role::User, task),
    ];
    for i in 0..steps {
        messages.push(Message::text(Role::Assistant, format!("{task}: step {i}")));
        messages.push(Message::text(Role::User, format!("{task}: output {i}")));
    }
    call.fingerprints = (0..messages.len() as i64)
        .map(|i| Fingerprints {
            hash: if i == 0 { 1 } else { base + i },
            opening: None,
        })
        .collect();
    call.messages = messages.into();
    call.conversation = Some("c".into());
    call.has_tools = true;
    call.new_session.id = SessionId::unchecked("proxy-headed".to_string());
    call
}

/// A store holding task A's conversation under header `c` (see [`headed_call`]).
async fn with_branch_a() -> (tempfile::TempDir, Store, Placed) {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), crate::Synchronous::Normal).unwrap();
    let a = store
        .place_call(headed_call("task A", 100, 3), rules)
        .await
        .unwrap();
    (dir, store, a)
}

/// Two branches of one conversation under its header (a client that rewrote its history,
/// after its first call's preamble of seven messages): a call's context is read for its
/// own branch, made current again if the other's call moved it meanwhile.
#[tokio::test]
async fn a_calls_context_is_of_its_own_branch_whatever_the_other_branch_did_since() {
    let (_dir, store, a) = with_branch_a().await;
    let b = store
        .place_call(headed_call("task B", 200, 2), rules)
        .await
        .unwrap();
    assert_eq!(a.session.id, b.session.id, "one session, two branches");
    let texts = |snapshot: &crate::ContextSnapshot| -> Vec<String> {
        snapshot
            .tail
            .iter()
            .map(|m| m.parts.get().to_string())
            .collect()
    };
    let id = a.session.id.clone();
    let current = store.context(&id).await.unwrap();
    assert!(
        texts(&current).iter().all(|t| !t.contains("task A")),
        "B's is current"
    );
    let of_a = store.context_on(&id, a.session.head_seq).await.unwrap();
    assert_eq!(of_a.session.head_seq, a.session.head_seq);
    let seen = texts(&of_a);
    assert!(
        seen.iter().any(|t| t.contains("task A: output 2")),
        "{seen:?}"
    );
    assert!(seen.iter().all(|t| !t.contains("task B")), "{seen:?}");
    // A's branch is the current one now, for every reader.
    let again = store.context(&id).await.unwrap();
    assert_eq!(texts(&again), seen);
    let of_b = store.context_on(&id, b.session.head_seq).await.unwrap();
    assert!(texts(&of_b).iter().all(|t| !t.contains("task A")));
}

/// A refusal for length of one branch's call counts for that branch, even when the other
/// branch's call moved the session since: the refused call's retry is compacted to it.
#[tokio::test]
async fn a_refusal_counts_for_the_refused_calls_branch() {
    use crate::SentContext;
    use compactd_core::Overflow;
    let (_dir, store, a) = with_branch_a().await;
    let id = a.session.id.clone();
    let sent = store
        .context_on(&id, a.session.head_seq)
        .await
        .unwrap()
        .session
        .context_version();
    store
        .place_call(headed_call("task B", 200, 2), rules)
        .await
        .unwrap();
    let overflow = Overflow {
        tokens: Some(9_000),
        limit: None,
        completion: None,
    };
    let noted = store
        .note_overflow(
            &id,
            SentContext::Proxied(sent, a.session.head_seq),
            overflow,
            |_| true,
            |_| usize::MAX,
        )
        .await
        .unwrap()
        .expect("noted");
    assert_eq!(noted.head_seq, a.session.head_seq, "on A's branch");
    assert_eq!(noted.reported_tokens, Some(9_000));
    let of_a = store.context_on(&id, a.session.head_seq).await.unwrap();
    assert_eq!(
        of_a.session.reported_tokens,
        Some(9_000),
        "kept for A's retry"
    );
}

/// A compaction of one branch leaves another branch's refusal standing: before, the refusal
/// was taken for one of a context no longer served, changed nothing, and the refused call
/// went again as it was (two interleaving branches through the proxy: its second refusal
/// reached the client). A compaction of the refused branch itself does make it stale.
#[tokio::test]
async fn a_refusal_stands_when_only_another_branch_was_compacted_since() {
    use crate::SentContext;
    use compactd_core::Overflow;
    let (_dir, store, a) = with_branch_a().await;
    let id = a.session.id.clone();
    let sent_by = |head: u64| {
        let (store, id) = (store.clone(), id.clone());
        async move {
            store
                .context_on(&id, head)
                .await
                .unwrap()
                .session
                .context_version()
        }
    };
    let refusal = Overflow {
        tokens: Some(9_000),
        limit: None,
        completion: None,
    };
    let sent_a = sent_by(a.session.head_seq).await;
    // B's call (its own messages after A's) moves the session, and B's branch is compacted.
    let b = store
        .place_call(headed_call("task B", 200, 2), rules)
        .await
        .unwrap();
    assert_eq!(b.session.id, id, "one session, two branches");
    let sent_b = sent_by(b.session.head_seq).await;
    let (_, compacted, _) = store
        .commit_compaction(compaction_of(&b.session, b.session.head_seq - 1))
        .await
        .unwrap();
    assert_eq!(compacted.compaction_count, 1);
    let noted = store
        .note_overflow(
            &id,
            SentContext::Proxied(sent_a, a.session.head_seq),
            refusal,
            |_| true,
            |_| usize::MAX,
        )
        .await
        .unwrap()
        .expect("A's refusal stands: only B's branch was compacted");
    assert_eq!(noted.head_seq, a.session.head_seq);
    assert_eq!(noted.reported_tokens, Some(9_000));

    // A refusal of B's context from before B's compaction changes nothing.
    let stale = store
        .note_overflow(
            &id,
            SentContext::Proxied(sent_b, b.session.head_seq),
            refusal,
            |_| true,
            |_| usize::MAX,
        )
        .await
        .unwrap();
    assert!(stale.is_none(), "B's refused context was compacted since");
}

/// A compaction of `session`'s current branch as it stands, keeping from `boundary_seq`.
fn compaction_of(session: &SessionRow, boundary_seq: u64) -> crate::NewCompaction {
    use crate::compaction::{CompactionResult, Trigger};
    crate::NewCompaction {
        session_id: session.id.clone(),
        trigger: Trigger::Manual,
        focus: None,
        result: CompactionResult {
            summary: "## 1. Primary Request and Intent\nsummary".into(),
            read_files: vec![],
            modified_files: vec![],
            created_files: vec![],
            deleted_files: vec![],
            pre_tokens: 100,
            post_tokens: 50,
            compaction_num: session.compaction_count + 1,
        },
        first_seq: session.active_from_seq,
        boundary_seq,
        head_seq: session.head_seq,
        summary_tokens: 10,
        summarizer: "extractive".into(),
        chunks: 1,
        fallback_reason: None,
        duration_ms: 1,
        mask_tail: None,
    }
}

/// A compaction read from one branch lands on that branch though the other branch's call
/// moved the session meanwhile: the session moves back to the compacted branch for it.
/// Before, it was refused as "compacted by someone else", the summarizer's work was thrown
/// away, and the call it was for went out uncompacted (two interleaving branches through the
/// proxy: a refused call refused again). A compaction's input, too, is of the branch asked.
#[tokio::test]
async fn a_compaction_of_one_branch_lands_though_the_other_branchs_call_moved_the_session() {
    let (_dir, store, a) = with_branch_a().await;
    let id = a.session.id.clone();
    let texts = |snapshot: &crate::ContextSnapshot| -> String {
        snapshot.tail.iter().map(|m| m.parts.get()).collect()
    };
    let (input, _) = store
        .compaction_input(&id, Some(a.session.head_seq))
        .await
        .unwrap();
    let b_call = || store.place_call(headed_call("task B", 200, 2), rules);
    let b = b_call().await.unwrap();
    let (of_a, _) = store
        .compaction_input(&id, Some(a.session.head_seq))
        .await
        .unwrap();
    assert!(texts(&of_a).contains("task A") && !texts(&of_a).contains("task B"));
    assert_eq!(texts(&of_a), texts(&input));
    // B's call again: its branch is current when A's compaction lands.
    b_call().await.unwrap();
    let current = store.session(&id).await.unwrap();
    assert_eq!(current.head_seq, b.session.head_seq);

    let boundary = input.tail[input.tail.len() - 2].seq;
    let (row, after, _) = store
        .commit_compaction(compaction_of(&input.session, boundary))
        .await
        .expect("A's compaction lands");
    assert_eq!(row.result.compaction_num, 1);
    assert_eq!(
        (after.head_seq, after.active_from_seq, after.summary_num),
        (a.session.head_seq, boundary, 1)
    );
    let a_now = store.context_on(&id, a.session.head_seq).await.unwrap();
    assert_eq!(a_now.latest.map(|l| l.compaction_num), Some(1));
    assert_eq!(
        a_now.tail.len(),
        2,
        "A's context: its summary and the tail kept"
    );
    let b_now = store.context_on(&id, b.session.head_seq).await.unwrap();
    assert!(
        b_now.latest.is_none(),
        "B's context holds nothing of A's summary"
    );
    assert!(texts(&b_now).contains("task B") && !texts(&b_now).contains("task A"));
}

/// [`headed_call`] whose rounds are tool calls each answered by an output of 2,000 characters
/// (`{task} output {i}` and x's).
fn headed_call_with_outputs(task: &str, base: i64, steps: usize) -> ProxyCall {
    let mut call = headed_call(task, base, steps);
    let mut messages = call.messages[..2].to_vec();
    for i in 0..steps {
        let id = format!("{base}_{i}");
        messages.push(Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.clone(),
                name: "bash".into(),
                args: serde_json::json!({"command": format!("step {i}")}),
            }],
        });
        messages.push(Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id,
                name: None,
                output: format!("{task} output {i} {}", "x".repeat(2_000)),
                is_error: false,
            }],
        });
    }
    call.messages = messages.into();
    call
}

/// One session, two branches: A's task and six steps with outputs; A's task, then B's six
/// (a client that rewrote its history after the task). The session is left on B's.
async fn two_branches_of_six_outputs(store: &Store) -> (super::Placed, super::Placed) {
    let a = store
        .place_call(headed_call_with_outputs("task A", 100, 6), rules)
        .await
        .unwrap();
    let task_a = headed_call_with_outputs("task A", 100, 0);
    let mut b = headed_call_with_outputs("task B", 200, 6);
    let mut messages = b.messages.to_vec();
    messages[1] = task_a.messages[1].clone();
    b.messages = messages.into();
    b.fingerprints[1] = task_a.fingerprints[1];
    let b = store.place_call(b, rules).await.unwrap();
    assert_eq!(b.session.id, a.session.id, "one session, two branches");
    (a, b)
}

/// How many of `task`'s outputs a context holds whole (not masked).
fn whole_outputs(snapshot: &crate::ContextSnapshot, task: &str) -> usize {
    snapshot
        .tail
        .iter()
        .map(|m| m.parts.get().to_string())
        .filter(|t| t.contains(&format!("{task} output")) && t.contains(&"x".repeat(2_000)))
        .count()
}

/// A masking of one branch masks that branch's outputs only: the other branch's newest stay
/// whole in its context. Before, a session's mask was one seq for all its branches, and a
/// masking of the branch written last hid every output of the other (their seqs all below).
#[tokio::test]
async fn a_masking_of_one_branch_leaves_the_others_outputs_whole() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), crate::Synchronous::Normal).unwrap();
    let (a, b) = two_branches_of_six_outputs(&store).await;
    let id = a.session.id.clone();
    let (masking, masked) = store
        .mask_outputs(&id, b.session.head_seq, 2, 1)
        .await
        .unwrap();
    assert!(
        masking.is_some_and(|m| m.outputs == 4),
        "B's four oldest outputs"
    );
    assert!(masked.masked_through_seq > a.session.head_seq);

    let of_a = store.context_on(&id, a.session.head_seq).await.unwrap();
    assert_eq!(whole_outputs(&of_a, "task A"), 6, "A's outputs are whole");
    assert_eq!(of_a.session.masked_through_seq, 0);
    let of_b = store.context_on(&id, b.session.head_seq).await.unwrap();
    assert_eq!(whole_outputs(&of_b, "task B"), 2, "B's newest two only");
    assert_eq!(of_b.session.masked_through_seq, masked.masked_through_seq);
}

/// A masking asked for by one branch's call (after its append) while another branch's call
/// has moved the session since lands on the asking branch: the other's outputs stay whole.
#[tokio::test]
async fn a_masking_lands_on_the_branch_that_asked_though_another_moved_the_session() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), crate::Synchronous::Normal).unwrap();
    let (a, b) = two_branches_of_six_outputs(&store).await;
    let id = a.session.id.clone();

    // A's masking, asked for with A's head, the session being on B's.
    let (masking, masked) = store
        .mask_outputs(&id, a.session.head_seq, 2, 1)
        .await
        .unwrap();
    assert!(
        masking.is_some_and(|m| m.outputs == 4),
        "A's four oldest outputs"
    );
    assert!(masked.masked_through_seq <= a.session.head_seq);
    assert_eq!(masked.head_seq, a.session.head_seq, "on A's branch");

    let of_b = store.context_on(&id, b.session.head_seq).await.unwrap();
    assert_eq!(whole_outputs(&of_b, "task B"), 6, "B's outputs are whole");
    let of_a = store.context_on(&id, a.session.head_seq).await.unwrap();
    assert_eq!(whole_outputs(&of_a, "task A"), 2, "A's newest two only");
}

/// Another conversation under the same header, instructions and preamble (a Codex
/// sub-agent's thread) is a session of its own, from its first call on: its task is its
/// own, its preamble the parent's, it starts from the window a refusal taught the parent,
/// and each conversation's later calls land in their own. A session of other instructions
/// under the header starts from the window its sessions learned.
#[tokio::test]
async fn a_conversation_leaving_another_right_after_its_preamble_is_a_session_of_its_own() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), crate::Synchronous::Normal).unwrap();
    let with_task = |mut call: ProxyCall| {
        call.fingerprints[1].opening = Some(call.fingerprints[1].hash);
        call
    };
    let a = store
        .place_call(with_task(headed_call("task A", 100, 0)), rules)
        .await
        .unwrap();
    assert_eq!(a.session.static_seq, 1, "the system prompt");
    let a = store
        .place_call(with_task(headed_call("task A", 100, 3)), rules)
        .await
        .unwrap();
    assert!(!a.created);

    // The window a refusal taught A, B starts from; not A's rate.
    store
        .write(|conn| {
            conn.execute(
                "UPDATE sessions SET context_limit = 5000, limit_source = 'upstream refusal',
                     token_rate = 2.0, limit_taught_at = '2026-12-04T12:00:00.000Z'",
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let b = store
        .place_call(with_task(headed_call("task B", 200, 0)), rules)
        .await
        .unwrap();
    assert!(b.created, "a session of its own");
    assert_eq!(
        (b.session.context_limit, b.session.limit_source.as_deref()),
        (5000, Some(LIMIT_FROM_REFUSAL))
    );
    assert_eq!(b.session.token_rate, None);
    let mut of_another_model = with_task(headed_call("task C", 300, 0));
    of_another_model.new_session.model = Some("another".into());
    let c = store.place_call(of_another_model, rules).await.unwrap();
    assert!(c.created);
    assert_eq!(
        c.session.context_limit, 10_000_000,
        "another model's window is its own"
    );
    // A sub-agent of other instructions under the header: a session of its own, not a fork,
    // with the window the header's sessions learned.
    let mut other_instructions = with_task(headed_call("task D", 400, 0));
    other_instructions.root_hash = 43;
    other_instructions.new_session.id = SessionId::unchecked("proxy-other".to_string());
    let d = store.place_call(other_instructions, rules).await.unwrap();
    assert!(d.created);
    assert_eq!(
        (d.session.context_limit, d.session.token_rate),
        (5000, None)
    );
    // Under another header (another run of the agent) and without one (another task of a
    // headerless agent), the same: the window is the model's, and the configuration is the
    // one it was taught under. Each keeps the time of the first teaching.
    let mut other_run = with_task(headed_call("task F", 600, 0));
    other_run.conversation = Some("another run".into());
    other_run.new_session.id = SessionId::unchecked("proxy-another-run".to_string());
    let f = store.place_call(other_run, rules).await.unwrap();
    assert!(f.created);
    assert_eq!(f.session.context_limit, 5000);
    let mut headerless = with_task(headed_call("task G", 700, 0));
    headerless.conversation = None;
    headerless.root_hash = 45;
    headerless.new_session.id = SessionId::unchecked("proxy-headerless".to_string());
    let g = store.place_call(headerless, rules).await.unwrap();
    assert!(g.created);
    assert_eq!(g.session.context_limit, 5000);
    let taught: Vec<String> = store
        .read(|conn| {
            Ok(conn
                .prepare("SELECT DISTINCT limit_taught_at FROM sessions WHERE limit_taught_at IS NOT NULL")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?)
        })
        .await
        .unwrap();
    assert_eq!(taught, ["2026-12-04T12:00:00.000Z"]);
    // The configuration reloaded since (a `[proxy.models]` entry corrected, say): the
    // window told stands.
    let mut after_reload = with_task(headed_call("task H", 800, 0));
    after_reload.conversation = Some("a run after the reload".into());
    after_reload.new_session.id = SessionId::unchecked("proxy-after-reload".to_string());
    after_reload.windows_taught_since =
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_400_000); // 2026-12-04T16:00Z
    let h = store.place_call(after_reload, rules).await.unwrap();
    assert!(h.created);
    assert_eq!(
        (h.session.context_limit, h.session.limit_source.as_deref()),
        (10_000_000, None)
    );
    // Side calls under the header (titles: no tools, instructions of their own) each open
    // with a message of their own, and stay branches of one side session.
    let title = |n: i64| {
        let mut call = with_task(headed_call(&format!("title {n}"), 500 + 10 * n, 0));
        (call.has_tools, call.root_hash) = (false, 44);
        call.new_session.id = SessionId::unchecked("proxy-titles".to_string());
        call
    };
    let first = store.place_call(title(1), rules).await.unwrap();
    assert_eq!(first.session.kind, SessionKind::Side);
    let second = store.place_call(title(2), rules).await.unwrap();
    assert!(!second.created, "a session per title");
    assert_eq!(second.session.id, first.session.id);
    // An agent's conversation of those instructions, once the side session holds a title:
    // a conversation of its own, not a branch of the titles'.
    let mut agent = title(3);
    agent.has_tools = true;
    let agent = store.place_call(agent, rules).await.unwrap();
    assert!(agent.created);
    assert_eq!(agent.session.kind, SessionKind::Proxy);
    assert!(agent.session.id.as_str().starts_with("proxy-titles."));
    assert_eq!(
        b.session.id.as_str(),
        format!("{}.{:016x}", a.session.id, 201),
        "named after its parent"
    );
    assert_eq!(b.session.task_hash, Some(201), "its own task");
    assert_eq!(b.session.static_seq, 1, "the parent's preamble");
    assert_eq!(b.session.message_count, 2);

    let b_later = headed_call("task B", 200, 2);
    let (previewed, matched) = store
        .preview_call(with_task(b_later.clone()))
        .await
        .unwrap()
        .expect("extends B");
    assert_eq!((previewed.id.clone(), matched), (b.session.id.clone(), 2));
    let b_later = store.place_call(with_task(b_later), rules).await.unwrap();
    assert_eq!(b_later.session.id, b.session.id);
    assert_eq!(
        (b_later.matched, b_later.session.message_count),
        (2, 6),
        "B's steps, stored in B"
    );
    let a_later = store
        .place_call(with_task(headed_call("task A", 100, 4)), rules)
        .await
        .unwrap();
    assert_eq!(a_later.session.id, a.session.id);
    assert_eq!(
        (a_later.matched, a_later.session.message_count),
        (8, 10),
        "A's steps, stored in A, and no branch of B's there"
    );
    assert_eq!(a_later.session.branch_points, 0);
}

/// A call under header `c` that leaves task A's conversation right after its task with a
/// user message of its own, sub-task E, and `steps` rounds after it.
fn sub_task_call(steps: usize) -> ProxyCall {
    let mut call = headed_call("task A", 100, 0);
    let mut messages = call.messages.to_vec();
    messages.push(Message::text(Role::User, "sub-task E"));
    call.fingerprints.push(Fingerprints {
        hash: 900,
        opening: Some(900),
    });
    for i in 0..steps {
        messages.push(Message::text(Role::Assistant, format!("E: step {i}")));
        messages.push(Message::text(Role::User, format!("E: output {i}")));
        for hash in [901 + 2 * i as i64, 902 + 2 * i as i64] {
            call.fingerprints.push(Fingerprints {
                hash,
                opening: None,
            });
        }
    }
    call.messages = messages.into();
    call
}

/// A conversation that leaves another right after its task with a user message of its own
/// (a Codex sub-agent spawned with `fork_context`) is a session of its own too: the parent's
/// preamble and task are its preamble, its own task is pinned, and its later calls land there.
#[tokio::test]
async fn a_conversation_leaving_another_right_after_its_task_is_a_session_of_its_own() {
    let (_dir, store, a) = with_branch_a().await;
    assert_eq!(a.session.task_seq, Some(2), "task A");
    let e = store.place_call(sub_task_call(0), rules).await.unwrap();
    assert!(e.created, "a session of its own");
    assert_eq!(
        e.session.id.as_str(),
        format!("{}.{:016x}", a.session.id, 900)
    );
    assert_eq!(e.session.task_hash, Some(900), "its own task");
    assert_eq!(
        (e.session.static_seq, e.session.task_seq),
        (2, Some(3)),
        "the parent's preamble and task before its own"
    );
    let later = store.place_call(sub_task_call(2), rules).await.unwrap();
    assert_eq!(later.session.id, e.session.id);
    assert_eq!((later.matched, later.session.message_count), (3, 7));
    let a_again = store
        .place_call(headed_call("task A", 100, 4), rules)
        .await
        .unwrap();
    assert_eq!(a_again.session.id, a.session.id, "A's calls stay in A");
    assert_eq!(a_again.session.branch_points, 0);
}

/// The walk reads indexes only, never a message's row (its parts may fill overflow
/// pages): a step down the tree is one lookup, a run of a branch one range.
#[test]
fn matching_a_call_reads_indexes_only_whatever_the_session_length() {
    let step = plan(CHILD_BY_HASH, params!["s", 5, 7]);
    assert!(
        step[0].contains(
            "USING COVERING INDEX messages_by_parent (session_id=? AND parent_seq=? AND hash=?)"
        ),
        "{step:?}"
    );
    let run = plan(HASHES_ALONG, params!["s", 1, 100]);
    assert!(
        run[0].contains(
            "USING COVERING INDEX messages_hash_by_seq (session_id=? AND seq>? AND seq<?)"
        ),
        "{run:?}"
    );
}

/// A new session looks up the window taught for its model in the index of the sessions a
/// refusal taught, not among every session of its caller (a headerless agent makes one per
/// task, thousands over months).
#[test]
fn the_window_taught_is_found_in_an_index() {
    let found = plan(
        super::landing::TAUGHT_WINDOW,
        params![
            "owner",
            "model",
            "2026-12-04T00:00:00.000Z",
            "upstream refusal"
        ],
    );
    assert!(
        found[0]
            .contains("USING INDEX sessions_taught (owner=? AND model=? AND limit_taught_at>?)"),
        "{found:?}"
    );
}

/// Claude Code's forks (its `Agent` tool with `subagent_type: "fork"`) call under their
/// parent's header with the parent's history, then the fork's own `Agent` call, then one user
/// message holding that call's result and the fork's directive. The first fork (its system
/// prompt is not its parent's) is a session of its own; the second, which leaves the first at
/// its own call, is one too, not a branch of the first. In each, the call and the directive
/// are pinned together: the directive is never summarized away, and the result never stands
/// without its call.
#[tokio::test]
async fn claude_code_forks_are_sessions_of_their_own_with_their_directive_pinned() {
    let (dir, store, parent) = with_branch_a().await;
    let pinning = |_: &SessionRow| AppendRules {
        task_max_tokens: 10_000,
        max_pinned_tokens: 10_000,
        pin_cap: 10_000,
        ..AppendRules::AS_SENT
    };
    let fork = |name: &str, hash: i64, steps: usize| {
        let mut call = headed_call("task A", 100, 3);
        // Its own system prompt, so its own id (the proxy's is of the header and the prompt).
        call.root_hash = 43;
        call.new_session.id = SessionId::unchecked("proxy-headed-forks".to_string());
        let mut messages = call.messages.to_vec();
        let id = format!("toolu_{name}");
        messages.push(Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.clone(),
                name: "Agent".into(),
                args: serde_json::json!({"prompt": name, "subagent_type": "fork"}),
            }],
        });
        messages.push(Message {
            role: Role::User,
            parts: vec![
                Part::ToolResult {
                    call_id: id,
                    name: None,
                    output: "Fork started".into(),
                    is_error: false,
                },
                Part::Text {
                    text: format!("<fork-boilerplate>You are a fork.</fork-boilerplate>\n\nYour directive: {name}"),
                },
            ],
        });
        // The directives open alike (the boilerplate), as Claude Code's do.
        for (hash, opening) in [(hash, None), (hash + 1, Some(777))] {
            call.fingerprints.push(Fingerprints { hash, opening });
        }
        for i in 0..steps {
            messages.push(Message::text(Role::Assistant, format!("{name}: step {i}")));
            messages.push(Message::text(Role::User, format!("{name}: output {i}")));
            for hash in [hash + 2 + 2 * i as i64, hash + 3 + 2 * i as i64] {
                call.fingerprints.push(Fingerprints {
                    hash,
                    opening: None,
                });
            }
        }
        call.messages = messages.into();
        call
    };
    let x = store.place_call(fork("X", 500, 0), pinning).await.unwrap();
    assert!(x.created, "a session of its own");
    assert_ne!(x.session.id, parent.session.id);
    let y = store.place_call(fork("Y", 600, 0), pinning).await.unwrap();
    assert!(y.created, "not a branch of the first fork");
    assert_eq!(
        y.session.id.as_str(),
        format!("{}.{:016x}", x.session.id, 600),
        "named for its parent and the message where it leaves it"
    );
    for (f, name, hash) in [(&x, "X", 500), (&y, "Y", 600)] {
        assert_eq!(
            (f.session.static_seq, f.session.task_seq),
            (8, Some(10)),
            "{name}: the parent's history, then the call and the directive"
        );
        let later = store
            .place_call(fork(name, hash, 2), pinning)
            .await
            .unwrap();
        assert_eq!(
            later.session.id, f.session.id,
            "{name}'s calls stay in {name}"
        );
        assert_eq!(later.session.message_count, 14);
    }
    store.close();
    let db = Connection::open(dir.path().join("t.db")).unwrap();
    for f in [&x, &y] {
        let pinned: Vec<u64> = db
            .prepare("SELECT seq FROM messages WHERE session_id = ?1 AND pinned ORDER BY seq")
            .unwrap()
            .query_map([f.session.id.as_str()], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // The parent's history holds no tool calls here, so all of it is the preamble.
        assert_eq!(pinned, (1..=10).collect::<Vec<u64>>(), "{}", f.session.id);
    }
}

/// A deleted conversation's opening starts a new conversation: the same system prompt and
/// first message, without a header and under one, and a deleted sub-agent's (a fork's) next
/// call. Each was a 404 for that key forever: the deleted session was still read as a
/// candidate for the client's preamble, or as the fork's session.
#[tokio::test]
async fn a_deleted_conversations_opening_starts_a_new_one() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Store::open(&dir.path().join("t.db"), crate::Synchronous::Normal).unwrap();
    let small = || {
        let mut call = long_first_call();
        call.messages = call.messages[..4].to_vec().into();
        call.fingerprints.truncate(4);
        call
    };
    for call in [small, || headed_call("task A", 100, 1)] {
        let first = store.place_call(call(), rules).await.unwrap();
        store.delete_session(&first.session.id).await.unwrap();
        for _ in 0..2 {
            let mut again = call();
            again.new_session.id = SessionId::unchecked(format!("proxy-{}", next_suffix()));
            let placed = store.place_call(again, rules).await.unwrap();
            assert_ne!(placed.session.id, first.session.id);
            assert_eq!(placed.session.message_count, 4);
        }
    }
    let (_dir, store, a) = with_branch_a().await;
    let e = store.place_call(sub_task_call(0), rules).await.unwrap();
    assert!(e.created && e.session.id != a.session.id);
    store.delete_session(&e.session.id).await.unwrap();
    let again = store.place_call(sub_task_call(0), rules).await.unwrap();
    assert!(again.created, "a new sub-agent session");
    assert_ne!(again.session.id, e.session.id);
    let later = store.place_call(sub_task_call(0), rules).await.unwrap();
    assert_eq!(
        later.session.id, again.session.id,
        "its calls land there after"
    );
}
