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
//! Which session ([`landing`]): the one the client names, or the one its conversation header
//! names (Claude Code's, Codex's, opencode's, with the sub-agent the call names if it names
//! one; unless the call leaves that conversation right after the client's preamble with a task
//! of its own: [`landing::Fork`]), or else the one of
//! the caller's that the call continues: whose first message it shares and whose prefix it
//! shares past the client's own preamble, or whose task it carries (a client restoring its
//! history into a freshly built request). A one-off call (instructions and one user message,
//! continuing nothing) goes to the caller's side session for those instructions; anything else
//! starts a new conversation.

mod landing;
#[cfg(test)]
mod tests;
mod walk;

use super::counters::switch_to;
use super::messages::{AppendRules, NewMessage, append_to};
use super::path::Branch;
use super::rows::{ContextVersion, SessionRow};
use super::sessions::{NewSession, get_live};
use super::{Result, Store};
use crate::compaction::LazyEstimator;
use crate::compaction::media::Media;
use crate::message::Message;
use compactd_core::SessionId;
use compactd_core::SessionKind;
use landing::{Lands, create, find, one_off};
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::Arc;
use walk::{walk, walk_from};

/// One proxied call, as the store needs it.
#[derive(Debug, Clone)]
pub struct ProxyCall {
    /// Who calls: the hash of the client's key.
    pub owner: String,
    /// The session the client named (already in the caller's namespace), if it did.
    pub named: Option<String>,
    /// A hash of the conversation header the client sent, if it did (then `.` and 16 hex
    /// digits of the sub-agent's id when the call names one).
    pub conversation: Option<String>,
    /// A fingerprint of the call's own instructions (system, instructions) and first message.
    pub root_hash: i64,
    /// The call's messages, as the client sent them (shared with the caller: a client resends
    /// its whole conversation, and only what is new of it is encoded to be stored).
    pub messages: Arc<[Message]>,
    /// Each message's fingerprints, in the same order.
    pub fingerprints: Vec<Fingerprints>,
    /// What each message's images and documents cost the model beside its estimate (see
    /// `provider::media`), in the same order; a message past its end has none.
    pub media: Vec<Media>,
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
    /// A window a model's refusal taught the caller's other sessions of the model is where a
    /// new session starts when it was taught since this time (the configuration's load, a
    /// day ago at most: `Settings::windows_taught_since`).
    pub windows_taught_since: std::time::SystemTime,
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
        let messages = self.messages[from..].iter().zip(&self.fingerprints[from..]);
        for (at, (message, f)) in (from..).zip(messages) {
            if step.len() == STORE_STEP || tokens >= STORE_STEP_TOKENS {
                break;
            }
            let media = self.media.get(at).cloned().unwrap_or_default();
            let estimate = self.estimator.message(message) + media.total();
            tokens += estimate;
            let new = NewMessage::new(message, estimate).with_hash(f.hash, f.opening);
            step.push(new.with_media(media));
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
    /// Tokens of the call's system messages stored unpinned (see
    /// [`super::AppendOutcome::unpinned_system_tokens`]).
    pub unpinned_system_tokens: usize,
}

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
            let Lands::In(session, walked) = find(conn, &call, &hashes)? else {
                return Ok(None);
            };
            let session = *session;
            let (matched, node) = match walked {
                Some(walked) => walked,
                None => walk(conn, &session, &hashes)?,
            };
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
            placed.unpinned_system_tokens += later.unpinned_system_tokens;
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
    let (session, created, walked) = match &resume {
        Some(resume) => (get_live(conn, &resume.session)?, false, None),
        None => match find(conn, call, hashes)? {
            Lands::In(session, walked) => (*session, false, walked),
            Lands::New(fork) => (create(conn, call, hashes, fork)?, true, None),
        },
    };
    let (matched, node) = match (resume, walked) {
        // Nothing moved since: the walk would end where the last write did. Walking again
        // from the first message at every write would make a call of n messages cost n²/500
        // steps of the walk.
        (Some(resume), _) if untouched(conn, &session, resume.node)? => {
            (resume.matched, Some(resume.node))
        }
        // Finding the session walked it, in this transaction.
        (_, Some(walked)) => walked,
        _ => walk(conn, &session, hashes)?,
    };
    let mut session = switch_to(conn, &session, node.unwrap_or(0))?;
    let new = call.to_store(matched);
    let through = matched + new.len();
    let mut unpinned_system_tokens = 0;
    if !new.is_empty() {
        let appended = append_to(conn, &session, &new, None, rules(&session))?;
        unpinned_system_tokens = appended.unpinned_system_tokens;
        session = appended.session;
        if session.kind == SessionKind::Side && call.conversation.is_none() && !one_off(call) {
            // A headerless side session's call that goes on from an earlier one is a
            // conversation.
            conn.prepare_cached("UPDATE sessions SET kind = 'proxy' WHERE id = ?1")?
                .execute([session.id.as_str()])?;
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
        session.id.as_str(),
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
            unpinned_system_tokens,
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
        .query_row(params![session.id.as_str(), node], |r| r.get(0))
        .optional()?;
    Ok(child.is_none())
}
