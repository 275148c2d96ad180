//! Conversations the proxy records: which session a client's call continues, and where in
//! its tree of messages the call stands.
//!
//! A client that cannot be changed sends its whole conversation with every call. The call's
//! messages are matched against the session's tree by their longest shared prefix (each
//! message by a fingerprint of what the client sends); only what follows is stored, as a
//! branch from where they part. A resend stores nothing; an edit in the middle starts a branch
//! there, sharing everything before it; the session's counters then describe that branch
//! ([`super::counters::switch_to`]), and a compaction of the shared part serves it too. A
//! call's messages are stored over several writes of the writer thread when there are many;
//! each goes on from where the previous one left off only if nothing moved since, and matches
//! the call again otherwise, so two calls of one conversation arriving at once store its new
//! messages once.
//!
//! Which session: the one the client names, or the one its conversation header names
//! (Claude Code's, Codex's, opencode's; unless the call leaves that conversation right after
//! the client's preamble with a task of its own, see [`Fork`]), or else the one of the caller's that the call
//! continues: whose first message it shares and whose prefix it shares past the client's own
//! preamble, or whose task it carries (a client restoring its history into a freshly built
//! request). A one-off call (instructions and one user message, continuing nothing) goes to the
//! caller's side session for those instructions; anything else starts a new conversation.

use super::counters::switch_to;
use super::messages::{AppendRules, NewMessage, append_to};
use super::path::Branch;
use super::rows::{ContextVersion, SessionKind, SessionRow};
use super::sessions::{NewSession, get_live, insert};
use super::{Result, Store, StoreError};
use crate::compaction::LazyEstimator;
use crate::message::{Message, Role};
use crate::protocol::SessionId;
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::Arc;

/// One proxied call, as the store needs it.
#[derive(Debug, Clone)]
pub struct ProxyCall {
    /// Who calls: the hash of the client's key.
    pub owner: String,
    /// The session the client named (already in the caller's namespace), if it did.
    pub named: Option<String>,
    /// A hash of the conversation header the client sent, if it did.
    pub conversation: Option<String>,
    /// A fingerprint of the call's own instructions (system, instructions) and first message.
    pub root_hash: i64,
    /// The call's messages, as the client sent them (shared with the caller: a client resends
    /// its whole conversation, and only what is new of it is encoded to be stored).
    pub messages: Arc<[Message]>,
    /// Each message's fingerprints, in the same order.
    pub fingerprints: Vec<Fingerprints>,
    /// How a message that is stored has its tokens estimated.
    pub estimator: LazyEstimator,
    pub has_tools: bool,
    pub overhead_tokens: usize,
    /// The completion the call asks room for beside its prompt.
    pub completion_tokens: usize,
    /// How a new session would be made.
    pub new_session: NewSession,
    /// `Err(seconds)`: the caller may not make a session now (it may continue one).
    pub may_create: std::result::Result<(), u64>,
}

/// What a proxied message is recognised by (see `service::fingerprint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprints {
    /// Of what the client sends.
    pub hash: i64,
    /// Of its opening (first paragraph), for a user message: a conversation's task is one,
    /// and nothing else is ever compared with it.
    pub opening: Option<i64>,
}

impl ProxyCall {
    fn hashes(&self) -> Vec<i64> {
        self.fingerprints.iter().map(|f| f.hash).collect()
    }

    /// The call's messages from `from` on that one write stores, as an append stores them: at
    /// most [`STORE_STEP`] of them and [`STORE_STEP_TOKENS`] (past the first).
    fn to_store(&self, from: usize) -> Vec<NewMessage> {
        let (mut step, mut tokens) = (Vec::new(), 0);
        for (message, f) in self.messages[from..].iter().zip(&self.fingerprints[from..]) {
            if step.len() == STORE_STEP || tokens >= STORE_STEP_TOKENS {
                break;
            }
            let estimate = self.estimator.message(message);
            tokens += estimate;
            step.push(NewMessage::new(message, estimate).with_hash(f.hash, f.opening));
        }
        step
    }
}

/// Where a call landed.
#[derive(Debug, Clone)]
pub struct Placed {
    pub session: SessionRow,
    /// The call's messages already stored (the rest were appended).
    pub matched: usize,
    pub created: bool,
}

/// How many of the caller's conversations sharing a first message are compared with a call.
const CANDIDATES: usize = 32;

impl Store {
    /// The session's current branch.
    pub async fn branch(&self, id: &SessionId) -> Result<Branch> {
        let id = id.to_string();
        self.read(move |conn| Branch::current(conn, &get_live(conn, &id)?))
            .await
    }

    /// Where a call would land, without storing anything: its session and how many of its
    /// messages the session's current branch already holds, when the call extends that branch
    /// (a call that branches elsewhere, or starts a session, gets `None`).
    pub async fn preview_call(&self, call: ProxyCall) -> Result<Option<(SessionRow, usize)>> {
        self.read(move |conn| {
            let hashes = call.hashes();
            let Lands::In(session) = find(conn, &call, &hashes)? else {
                return Ok(None);
            };
            let session = *session;
            let (matched, node) = walk(conn, &session, &hashes)?;
            Ok((node.unwrap_or(0) == session.head_seq).then_some((session, matched)))
        })
        .await
    }

    /// Records a proxied call's answer after `after_seq`, the call's last message. When that is
    /// still the head of the session's current branch, the answer extends it (with the usage
    /// the upstream reported, when it measured the context as it still is: `sent`) and the
    /// session after it is returned; when another call moved the branch on meanwhile, the
    /// answer is kept as a leaf of its own call's branch and the current one is left as it is.
    pub async fn append_reply(
        &self,
        id: &SessionId,
        after_seq: u64,
        reply: NewMessage,
        context_tokens: Option<usize>,
        sent: ContextVersion,
        rules: impl Fn(&SessionRow) -> AppendRules + Send + 'static,
    ) -> Result<Option<SessionRow>> {
        let id = id.to_string();
        self.write(move |conn| {
            let session = get_live(conn, &id)?;
            // A compaction (or a masking) landed while the call was with the model: its usage
            // counts the context before it, and would make the session look as full as then.
            let context_tokens = context_tokens.filter(|_| session.context_version() == sent);
            let (matched, _) = walk_from(conn, &id, Some(after_seq), &[reply.hash().unwrap_or(0)])?;
            if matched == 1 {
                // The client sent this answer back already (a retried call): nothing new.
                return Ok(None);
            }
            if session.head_seq == after_seq {
                let rules = rules(&session);
                return Ok(Some(
                    append_to(conn, &session, &[reply], context_tokens, rules)?.session,
                ));
            }
            super::messages::append_leaf(conn, &session, after_seq, &reply)?;
            Ok(None)
        })
        .await
    }

    /// Finds (or makes) the call's session, places the call in its tree, appends what is new
    /// and makes the call's branch the current one.
    ///
    /// What is new is stored a step per write (at most [`STORE_STEP`] messages and
    /// [`STORE_STEP_TOKENS`]): a first call that carries a long history (a resumed session of
    /// 10,000 messages) held the writer for its whole store, about 20 µs a message, and every
    /// other client's append waited behind it (up to 190 ms in `compactd bench`). The first
    /// write settles the session; each later one goes on where the previous one left off if
    /// nothing moved since, and matches the call again otherwise, so a call of the same
    /// conversation storing meanwhile leaves nothing stored twice.
    pub async fn place_call(
        &self,
        call: ProxyCall,
        rules: impl Fn(&SessionRow) -> AppendRules + Send + Sync + 'static,
    ) -> Result<Placed> {
        let hashes: Arc<[i64]> = call.hashes().into();
        let (call, rules) = (Arc::new(call), Arc::new(rules));
        let write = |resume: Option<Resume>| {
            let (call, hashes, rules) = (call.clone(), hashes.clone(), rules.clone());
            self.write(move |conn| place(conn, &call, &hashes, &*rules, resume))
        };
        let (mut placed, mut left_off) = write(None).await?;
        while let Some(resume) = left_off {
            let (later, next) = write(Some(resume)).await?;
            // What the call found stored and whether it made the session are the first
            // write's; the session is as the last one left it.
            placed.session = later.session;
            left_off = next;
        }
        Ok(placed)
    }
}

/// Messages of a call stored per write (see [`Store::place_call`]): about 10 ms of the
/// writer's time.
const STORE_STEP: usize = 500;
/// Estimated tokens of a call stored per write (about 1 MiB of text): 500 tool outputs of
/// 60 KB would take 30 MB, and the writer, for most of a second.
const STORE_STEP_TOKENS: usize = 256 * 1024;

/// Where a write of [`Store::place_call`] left off, the call not stored whole yet.
struct Resume {
    session: String,
    /// How many of the call's messages stand stored, the last of them at `node`.
    matched: usize,
    node: u64,
}

/// One write of [`Store::place_call`]: places the call (its messages' fingerprints are
/// `hashes`) in the session where the previous write left off, or the one it finds or makes,
/// and stores a step of its new messages (see
/// [`ProxyCall::to_store`]); says where it left off unless the call is now stored whole.
fn place(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
    rules: &dyn Fn(&SessionRow) -> AppendRules,
    resume: Option<Resume>,
) -> Result<(Placed, Option<Resume>)> {
    let (session, created) = match &resume {
        Some(resume) => (get_live(conn, &resume.session)?, false),
        None => match find(conn, call, hashes)? {
            Lands::In(session) => (*session, false),
            Lands::New(fork) => (create(conn, call, hashes, fork)?, true),
        },
    };
    let (matched, node) = match resume {
        // Nothing moved since: the walk would end where the last write did. Walking again
        // from the first message at every write would make a call of n messages cost n²/500
        // steps of the walk.
        Some(resume) if untouched(conn, &session, resume.node)? => {
            (resume.matched, Some(resume.node))
        }
        _ => walk(conn, &session, hashes)?,
    };
    let mut session = switch_to(conn, &session, node.unwrap_or(0))?;
    let new = call.to_store(matched);
    let through = matched + new.len();
    if !new.is_empty() {
        session = append_to(conn, &session, &new, None, rules(&session))?.session;
        if session.kind == SessionKind::Side && call.conversation.is_none() && !one_off(call) {
            // A headerless side session's call that goes on from an earlier one is a
            // conversation.
            conn.prepare_cached("UPDATE sessions SET kind = 'proxy' WHERE id = ?1")?
                .execute([&session.id])?;
        }
    }
    // A call that names no completion leaves the one a refusal taught (a server's default
    // reservation, as OpenRouter's) in place.
    conn.prepare_cached(
        "UPDATE sessions SET overhead_tokens = ?2,
             completion_tokens = CASE WHEN ?3 > 0 THEN ?3 ELSE completion_tokens END
         WHERE id = ?1",
    )?
    .execute(params![
        session.id,
        call.overhead_tokens,
        call.completion_tokens
    ])?;
    let session = get_live(conn, session.id.as_str())?;
    let left_off = (through < call.messages.len()).then(|| Resume {
        session: session.id.to_string(),
        matched: through,
        node: session.head_seq,
    });
    Ok((
        Placed {
            session,
            matched,
            created,
        },
        left_off,
    ))
}

/// Whether the session's current branch still ends at `node` and nothing was stored after
/// it on any branch: then the tree holds the call through `node` and nothing of what follows.
fn untouched(conn: &Connection, session: &SessionRow, node: u64) -> Result<bool> {
    if session.head_seq != node {
        return Ok(false);
    }
    let child: Option<u64> = conn
        .prepare_cached(
            "SELECT seq FROM messages INDEXED BY messages_by_parent
             WHERE session_id = ?1 AND parent_seq = ?2 AND hash IS NOT NULL LIMIT 1",
        )?
        .query_row(params![session.id, node], |r| r.get(0))
        .optional()?;
    Ok(child.is_none())
}

/// The newest child of a node with a given fingerprint. The index by parent is named: left to
/// itself the planner walks the whole session backwards by seq for the ORDER BY, and a
/// 50,000-message resend took minutes of the writer's time.
const CHILD_BY_HASH: &str = "SELECT seq FROM messages INDEXED BY messages_by_parent
     WHERE session_id = ?1 AND parent_seq IS ?2 AND hash = ?3 ORDER BY seq DESC LIMIT 1";

/// The fingerprints of a run of a branch, read from the index alone.
const HASHES_ALONG: &str = "SELECT seq, hash FROM messages INDEXED BY messages_hash_by_seq
     WHERE session_id = ?1 AND hash IS NOT NULL AND seq BETWEEN ?2 AND ?3 ORDER BY seq";

/// The longest prefix of `hashes` the session's tree holds, and the node it ends at.
///
/// A node has at most one child of a fingerprint (a call's messages are stored only past the
/// point where it stops matching, an answer only when no child of its parent is like it), so
/// the prefix is one path down the tree. Most calls follow the session's current branch: its
/// fingerprints are read in one pass (a step down the tree is a lookup of its own, and a client
/// resending 10,000 messages held the writer, and every other client's append, 100 ms), and
/// the walk goes on a step at a time only from where the call leaves the branch.
fn walk(conn: &Connection, session: &SessionRow, hashes: &[i64]) -> Result<(usize, Option<u64>)> {
    let id = session.id.as_str();
    let (along, node) = along_branch(conn, id, &Branch::current(conn, session)?, hashes)?;
    let (further, node) = walk_from(conn, id, node, &hashes[along..])?;
    Ok((along + further, node))
}

/// How many of `hashes` the branch's messages start with, and the last of them.
fn along_branch(
    conn: &Connection,
    id: &str,
    branch: &Branch,
    hashes: &[i64],
) -> Result<(usize, Option<u64>)> {
    let mut run = conn.prepare_cached(HASHES_ALONG)?;
    let (mut matched, mut node) = (0, None);
    for &(first, last) in branch.runs() {
        let mut rows = run.query(params![id, first, last])?;
        let mut expected = first;
        while let Some(row) = rows.next()? {
            let (seq, stored): (u64, i64) = (row.get(0)?, row.get(1)?);
            // A message without a fingerprint (not proxied) is not in the index: the branch
            // stops matching there.
            match hashes.get(matched) {
                Some(&hash) if seq == expected && stored == hash => node = Some(seq),
                _ => return Ok((matched, node)),
            }
            matched += 1;
            expected += 1;
        }
        if expected <= last {
            return Ok((matched, node));
        }
    }
    Ok((matched, node))
}

/// The same, from below `start` (`None`: from the roots).
fn walk_from(
    conn: &Connection,
    id: &str,
    start: Option<u64>,
    hashes: &[i64],
) -> Result<(usize, Option<u64>)> {
    let mut child = conn.prepare_cached(CHILD_BY_HASH)?;
    let mut node: Option<u64> = start;
    for (k, hash) in hashes.iter().enumerate() {
        match child
            .query_row(params![id, node, hash], |r| r.get(0))
            .optional()?
        {
            Some(seq) => node = Some(seq),
            None => return Ok((k, node)),
        }
    }
    Ok((hashes.len(), node))
}

/// Where a call lands, as far as the store can tell before storing anything.
enum Lands {
    /// In this session, which it continues.
    In(Box<SessionRow>),
    /// In a new session: the call's own, or with `Some`, another conversation under the
    /// header of one already stored ([`Fork`]).
    New(Option<Fork>),
}

/// Another conversation under a conversation header that names one already: a Codex
/// sub-agent's thread, which calls the model under its parent's `session-id` with the same
/// instructions and preamble, then its own task. It is a session of its own, keyed by the
/// header and its first message past the preamble, as a call without a header that shares only
/// a preamble starts a session of its own: a branch of the parent's session would have its
/// task neither known nor pinned, and the first compaction of it would summarize the task
/// away. Its id is the parent's with that message's fingerprint, so `sqlite3` shows it beside
/// its parent.
#[derive(Debug, Clone)]
struct Fork {
    id: SessionId,
    conversation: String,
}

impl Fork {
    fn of(parent: &SessionRow, conversation: &str, first: i64) -> Fork {
        Fork {
            id: SessionId::unchecked(format!("{}.{:016x}", parent.id, first as u64)),
            conversation: format!("{conversation}.{:016x}", first as u64),
        }
    }
}

/// The call's session, if it continues one.
fn find(conn: &Connection, call: &ProxyCall, hashes: &[i64]) -> Result<Lands> {
    if let Some(named) = &call.named {
        return match get_live(conn, named) {
            Ok(session) if session.owner.as_deref() == Some(call.owner.as_str()) => {
                Ok(Lands::In(Box::new(session)))
            }
            // Another key's, or the socket API's: neither is this caller's to continue.
            Ok(_) => Err(StoreError::NotFound(named.clone())),
            Err(StoreError::NotFound(_)) => Ok(Lands::New(None)),
            Err(e) => Err(e),
        };
    }
    if let Some(conversation) = &call.conversation {
        let id: Option<String> = conn
            .prepare_cached(
                "SELECT id FROM sessions WHERE conversation = ?1 AND owner = ?2 AND root_hash = ?3
                 AND deleted_at IS NULL",
            )?
            .query_row(params![conversation, call.owner, call.root_hash], |r| {
                r.get(0)
            })
            .optional()?;
        return match id {
            Some(id) => under_header(conn, call, hashes, conversation, get_live(conn, &id)?),
            None => Ok(Lands::New(None)),
        };
    }
    let found = if one_off(call)
        && let Some(side) = side_session(conn, call)?
    {
        // A one-off call that a conversation of the caller's does not continue (checked
        // below) goes to the caller's side session.
        Some(continued_by(conn, call, hashes)?.unwrap_or(side))
    } else {
        continued_by(conn, call, hashes)?
    };
    Ok(found.map_or(Lands::New(None), |s| Lands::In(Box::new(s))))
}

/// Where a call under a conversation header lands whose session is `session`: there, unless
/// it leaves the session's conversation right after the client's preamble with a user message
/// of its own, and so is another conversation ([`Fork`]).
fn under_header(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
    conversation: &str,
    session: SessionRow,
) -> Result<Lands> {
    let preamble = session.static_seq as usize;
    let opens_another = session.message_count > session.static_seq
        && call
            .messages
            .get(preamble)
            .is_some_and(|m| m.role == Role::User);
    if !opens_another {
        return Ok(Lands::In(Box::new(session)));
    }
    let fork = Fork::of(&session, conversation, hashes[preamble]);
    match get_live(conn, fork.id.as_str()) {
        Ok(other) => return Ok(Lands::In(Box::new(other))),
        Err(StoreError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let (matched, _) = walk(conn, &session, hashes)?;
    Ok(match matched == preamble {
        true => Lands::New(Some(fork)),
        false => Lands::In(Box::new(session)),
    })
}

/// The caller's side session, if it has one.
fn side_session(conn: &Connection, call: &ProxyCall) -> Result<Option<SessionRow>> {
    let id: Option<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE owner = ?1 AND kind = 'side' AND conversation IS NULL
             AND deleted_at IS NULL ORDER BY updated_at DESC LIMIT 1",
        )?
        .query_row([&call.owner], |r| r.get(0))
        .optional()?;
    id.map(|id| get_live(conn, &id)).transpose()
}

/// The caller's conversation the call continues: it shares the conversation's first message
/// and either its prefix past the client's preamble, or its task, or all of a first call that
/// was cut off between its writes.
fn continued_by(conn: &Connection, call: &ProxyCall, hashes: &[i64]) -> Result<Option<SessionRow>> {
    let candidates: Vec<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE owner = ?1 AND root_hash = ?2 AND conversation IS NULL
             AND deleted_at IS NULL ORDER BY updated_at DESC LIMIT ?3",
        )?
        .query_map(params![call.owner, call.root_hash, CANDIDATES], |r| {
            r.get(0)
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut best: Option<(usize, SessionRow)> = None;
    for id in candidates {
        let session = get_live(conn, &id)?;
        if session.kind == SessionKind::Side {
            continue;
        }
        let (matched, _) = walk(conn, &session, hashes)?;
        let past_preamble = matched > session.static_seq as usize;
        let carries_task = session
            .task_hash
            .is_some_and(|task| call.fingerprints.iter().any(|f| f.opening == Some(task)));
        // A whole first call is stored past its preamble (its task follows it), so a session
        // that ends inside its own is one cut off between its writes (the daemon killed, a
        // write failed): a call holding all of it is its retry, whose task may have no
        // opening to be known by (a user message of tool results only).
        let cut_off =
            session.message_count <= session.static_seq && matched as u64 == session.message_count;
        if (past_preamble || carries_task || cut_off)
            && best.as_ref().is_none_or(|(m, _)| matched > *m)
        {
            best = Some((matched, session));
        }
    }
    Ok(best.map(|(_, session)| session))
}

/// A one-off call: instructions (system messages) and one user message.
fn one_off(call: &ProxyCall) -> bool {
    let (last, before) = match call.messages.split_last() {
        Some(split) => split,
        None => return false,
    };
    last.role == Role::User && before.iter().all(|m| m.role == Role::System)
}

/// A new session for the call. Its task is the last user message of this first call; the
/// client's preamble (its system prompt, few-shot examples, the files it shows) is what comes
/// before, or only what the call shares with the caller's other conversations of the same
/// beginning when there are any. The preamble is pinned, but never a tool call or result, and
/// only as far as the pin cap allows (a first call that carries a long restored history pins
/// no more than that).
fn create(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
    fork: Option<Fork>,
) -> Result<SessionRow> {
    let task = call.messages.iter().rposition(|m| m.role == Role::User);
    let preamble = shared_preamble(conn, call, hashes)?
        .unwrap_or(usize::MAX)
        .min(task.unwrap_or(0));
    // Side calls: under a conversation header, those without tools (a title); without one,
    // one-off calls of a caller who has a conversation going.
    let side = match &call.conversation {
        Some(_) => !call.has_tools,
        None => one_off(call) && others(conn, &call.owner)?,
    };
    let kind = if side {
        SessionKind::Side
    } else {
        SessionKind::Proxy
    };
    if let Err(wait) = call.may_create {
        return Err(StoreError::TooManySessions(wait));
    }
    let (session, conversation) = match fork {
        Some(fork) => {
            let new = NewSession {
                id: fork.id,
                ..call.new_session.clone()
            };
            (insert(conn, &new)?, Some(fork.conversation))
        }
        None => (insert(conn, &call.new_session)?, call.conversation.clone()),
    };
    conn.prepare_cached(
        "UPDATE sessions SET kind = ?2, conversation = ?3, root_hash = ?4, task_hash = ?5, static_seq = ?6
         WHERE id = ?1",
    )?
    .execute(params![
        session.id,
        kind.as_str(),
        conversation,
        call.root_hash,
        task.and_then(|t| call.fingerprints[t].opening),
        preamble as u64
    ])?;
    get_live(conn, session.id.as_str())
}

/// How many leading messages the call shares with another conversation of the caller's that
/// begins the same way (`None` when there is none): the client's own preamble.
fn shared_preamble(conn: &Connection, call: &ProxyCall, hashes: &[i64]) -> Result<Option<usize>> {
    let ids: Vec<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE owner = ?1 AND root_hash = ?2 ORDER BY updated_at DESC LIMIT ?3",
        )?
        .query_map(params![call.owner, call.root_hash, CANDIDATES], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut longest = None;
    for id in ids {
        let (matched, _) = walk(conn, &get_live(conn, &id)?, hashes)?;
        if matched > 0 && longest.is_none_or(|l| matched > l) {
            longest = Some(matched);
        }
    }
    Ok(longest)
}

/// Whether the caller has any conversation yet.
fn others(conn: &Connection, owner: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE owner = ?1 AND kind = 'proxy')",
        )?
        .query_row([owner], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(query: &str, params: impl rusqlite::Params) -> Vec<String> {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::migrate::SCHEMA).unwrap();
        conn.prepare(&format!("EXPLAIN QUERY PLAN {query}"))
            .unwrap()
            .query_map(params, |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

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
        let store = Store::open(&path, crate::store::Synchronous::Normal).unwrap();
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
        call.new_session.id = SessionId::unchecked("proxy-headed".to_string());
        call
    }

    /// A store holding task A's conversation under header `c` (see [`headed_call`]).
    async fn with_branch_a() -> (tempfile::TempDir, Store, Placed) {
        let dir = tempfile::TempDir::new().unwrap();
        let store =
            Store::open(&dir.path().join("t.db"), crate::store::Synchronous::Normal).unwrap();
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
        let texts = |snapshot: &crate::store::ContextSnapshot| -> Vec<String> {
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
        use crate::provider::overflow::Overflow;
        use crate::store::SentContext;
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

    /// Another conversation under the same header, instructions and preamble (a Codex
    /// sub-agent's thread) is a session of its own, from its first call on: its task is its
    /// own, its preamble the parent's, and each conversation's later calls land in their own.
    #[tokio::test]
    async fn a_conversation_leaving_another_right_after_its_preamble_is_a_session_of_its_own() {
        let dir = tempfile::TempDir::new().unwrap();
        let store =
            Store::open(&dir.path().join("t.db"), crate::store::Synchronous::Normal).unwrap();
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

        let b = store
            .place_call(with_task(headed_call("task B", 200, 0)), rules)
            .await
            .unwrap();
        assert!(b.created, "a session of its own");
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
}
