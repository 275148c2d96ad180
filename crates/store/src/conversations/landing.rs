//! Which session a proxied call lands in: the one it names or its conversation header names,
//! another conversation under that header ([`Fork`]), the caller's conversation it continues,
//! the caller's side session, or a new one.

use super::super::overflows::LIMIT_FROM_REFUSAL;
use super::super::rows::SessionRow;
use super::super::sessions::{get_live, insert};
use super::super::{Result, StoreError};
use super::ProxyCall;
use super::walk::{Walked, walk};
use crate::message::{Message, Role};
use compactd_core::SessionId;
use compactd_core::SessionKind;
use rusqlite::{Connection, OptionalExtension, params};

/// How many of the caller's conversations sharing a first message are compared with a call.
const CANDIDATES: usize = 32;

/// Where a call lands, as far as the store can tell before storing anything.
pub(super) enum Lands {
    /// In this session, which it continues; with where the call stands in its tree when
    /// finding the session walked it already (nothing is written before the call is placed,
    /// so a second walk would end in the same place).
    In(Box<SessionRow>, Option<Walked>),
    /// In a new session: the call's own, or with `Some`, another conversation under the
    /// header of one already stored ([`Fork`]).
    New(Option<Fork>),
}

/// Another conversation under a conversation header that names one already, of a client that
/// does not name its sub-agents (as Claude Code's `x-claude-code-agent-id` and Codex's
/// `thread-id` do: keyed by those, a sub-agent has a conversation of its own from its first
/// call): a sub-agent's thread, which calls the model under its parent's header with the same
/// instructions and preamble (or the parent's task too), then its own task.
/// It is a session of its own, keyed by the header and the message where it leaves the
/// parent's conversation, as a call without a header that shares only a preamble starts a
/// session of its own: a branch of the parent's session would have its task neither known
/// nor pinned, and the first compaction of it would summarize the task away. Its id is the
/// parent's with that message's fingerprint, so `sqlite3` shows it beside its parent.
///
/// It starts from the window a refusal taught the caller's sessions of the model
/// ([`taught_window`]), not from its parent's rate of tokens: the rate would shrink the room
/// for pins as the fork is made, and Codex's 4,245-token instructions, pinned in the parent
/// (made before any rate was known), went unpinned in its sub-agent's session and would have
/// been summarized away.
#[derive(Debug, Clone)]
pub(super) struct Fork {
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
pub(super) fn find(conn: &Connection, call: &ProxyCall, hashes: &[i64]) -> Result<Lands> {
    if let Some(named) = &call.named {
        return match get_live(conn, named) {
            Ok(session) if session.owner.as_deref() == Some(call.owner.as_str()) => {
                Ok(Lands::In(Box::new(session), None))
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
        Some(continued_by(conn, call, hashes)?.unwrap_or((side, None)))
    } else {
        continued_by(conn, call, hashes)?
    };
    Ok(found.map_or(Lands::New(None), |(s, walked)| {
        Lands::In(Box::new(s), walked)
    }))
}

/// Where a call under a conversation header lands whose session is `session`: there, unless
/// it is an agent's call (with tools) that leaves the session's conversation with a user
/// message of its own right after the client's preamble, or right after the session's task
/// (a Codex sub-agent spawned with `fork_context`, whose history is the parent's preamble and
/// task, then its own), and so is another conversation ([`Fork`]).
fn under_header(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
    conversation: &str,
    session: SessionRow,
) -> Result<Lands> {
    // Side calls (a title, a check, without tools) each open with a message of their own,
    // and stay branches of their side session: a session per title would be a row forever
    // and count against the caller's rate of new sessions. An agent's call opening another
    // conversation forks from any session, a side one too (whose task is a title's).
    if !call.has_tools {
        return Ok(Lands::In(Box::new(session), None));
    }
    // Where another conversation may leave this one: a depth the session holds messages
    // past, where the call's own task begins (a user message, or the call of a Claude Code
    // fork's parent that the fork's directive answers).
    let begins_task = |at: usize| match call.messages.get(at) {
        Some(m) if m.role == Role::User => true,
        Some(_) => {
            at + 1 < call.messages.len() && Message::task_start(&call.messages, at + 1) == at
        }
        None => false,
    };
    let points: Vec<usize> = [Some(session.static_seq), session.task_seq]
        .into_iter()
        .flatten()
        .filter(|&depth| session.message_count > depth)
        .map(|depth| depth as usize)
        .filter(|&at| begins_task(at))
        .collect();
    for &at in &points {
        let fork = Fork::of(&session, conversation, hashes[at]);
        match get_live(conn, fork.id.as_str()) {
            Ok(other) if other.owner == session.owner => {
                return Ok(Lands::In(Box::new(other), None));
            }
            // A session of the socket API's by that id: not this caller's to continue, and
            // the fork cannot be made under it.
            Ok(_) => return Err(StoreError::Exists(fork.id.to_string())),
            Err(StoreError::NotFound(_)) => {}
            // Deleted: the fork made again in its place, if it was, goes on there.
            Err(StoreError::Deleted(_)) => {
                if let Some(other) = live_fork(conn, &fork, &call.owner)? {
                    return Ok(Lands::In(Box::new(other), None));
                }
            }
            Err(e) => return Err(e),
        }
    }
    if points.is_empty() {
        return Ok(Lands::In(Box::new(session), None));
    }
    let walked = walk(conn, &session, hashes)?;
    Ok(match points.contains(&walked.0) {
        true => Lands::New(Some(Fork::of(&session, conversation, hashes[walked.0]))),
        false => Lands::In(Box::new(session), Some(walked)),
    })
}

/// The live session of `fork`'s conversation, made in place of a deleted one (whose id it
/// could not take).
fn live_fork(conn: &Connection, fork: &Fork, owner: &str) -> Result<Option<SessionRow>> {
    let id: Option<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE conversation = ?1 AND owner = ?2
             AND deleted_at IS NULL ORDER BY created_at DESC LIMIT 1",
        )?
        .query_row(params![fork.conversation, owner], |r| r.get(0))
        .optional()?;
    id.map(|id| get_live(conn, &id)).transpose()
}

/// `id`, or where a session (a deleted one) holds it, the first of `id-2`, `id-3`, ... that
/// none does: a deleted session keeps its id and rows.
fn free_id(conn: &Connection, id: SessionId) -> Result<SessionId> {
    let taken = |id: &str| -> Result<bool> {
        Ok(conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1)")?
            .query_row([id], |r| r.get(0))?)
    };
    let mut candidate = id.to_string();
    let mut n = 1;
    while taken(&candidate)? {
        n += 1;
        candidate = format!("{id}-{n}");
    }
    Ok(SessionId::unchecked(candidate))
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

/// The caller's conversation the call continues, and where the call stands in it: it shares
/// the conversation's first message and either its prefix past the client's preamble, or its
/// task, or all of a first call that was cut off between its writes.
fn continued_by(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
) -> Result<Option<(SessionRow, Option<Walked>)>> {
    let candidates: Vec<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE owner = ?1 AND root_hash = ?2 AND conversation IS NULL
             AND deleted_at IS NULL ORDER BY updated_at DESC LIMIT ?3",
        )?
        .query_map(params![call.owner, call.root_hash, CANDIDATES], |r| {
            r.get(0)
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut best: Option<(Walked, SessionRow)> = None;
    for id in candidates {
        let session = get_live(conn, &id)?;
        if session.kind == SessionKind::Side {
            continue;
        }
        let walked = walk(conn, &session, hashes)?;
        let matched = walked.0;
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
            && best.as_ref().is_none_or(|((m, _), _)| matched > *m)
        {
            best = Some((walked, session));
        }
    }
    Ok(best.map(|(walked, session)| (session, Some(walked))))
}

/// A one-off call: instructions (system messages) and one user message.
pub(super) fn one_off(call: &ProxyCall) -> bool {
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
pub(super) fn create(
    conn: &Connection,
    call: &ProxyCall,
    hashes: &[i64],
    fork: Option<Fork>,
) -> Result<SessionRow> {
    let task = call.messages.iter().rposition(|m| m.role == Role::User);
    let preamble = shared_preamble(conn, call, hashes)?
        .unwrap_or(usize::MAX)
        .min(task.map_or(0, |t| Message::task_start(&call.messages, t)));
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
    let mut new = call.new_session.clone();
    let taught = taught_window(conn, call)?.filter(|(l, _)| *l < new.context_limit);
    if let Some((limit, _)) = &taught {
        new.context_limit = *limit;
        new.limit_source = Some(LIMIT_FROM_REFUSAL.to_string());
    }
    let conversation = match fork {
        Some(fork) => {
            new.id = free_id(conn, fork.id)?;
            Some(fork.conversation)
        }
        None => call.conversation.clone(),
    };
    let session = insert(conn, &new)?;
    conn.prepare_cached(
        "UPDATE sessions SET kind = ?2, conversation = ?3, root_hash = ?4, task_hash = ?5, static_seq = ?6,
             limit_taught_at = ?7
         WHERE id = ?1",
    )?
    .execute(params![
        session.id.as_str(),
        kind.as_str(),
        conversation,
        call.root_hash,
        task.and_then(|t| call.fingerprints[t].opening),
        preamble as u64,
        taught.map(|(_, at)| at)
    ])?;
    get_live(conn, session.id.as_str())
}

/// The newest window taught the caller (?1) for the model (?2) since ?3: one lookup in the
/// index of taught sessions, however many sessions the caller has.
pub(super) const TAUGHT_WINDOW: &str = "SELECT context_limit, limit_taught_at FROM sessions
     WHERE owner = ?1 AND model IS ?2 AND limit_taught_at >= ?3
         AND limit_source = ?4 AND deleted_at IS NULL
     ORDER BY limit_taught_at DESC LIMIT 1";

/// The window a model's refusal taught another of the caller's sessions of the same model
/// since `windows_taught_since` (the configuration's load, a day ago at most), and when: a
/// session starting without it would have its first long call refused too, one refusal per
/// sub-agent, per task of a headerless agent (aider, mini-swe-agent), per run of Claude Code.
/// A window taught before the configuration last loaded is not shared: the operator may have
/// corrected `[proxy.models]` since. The time is the first teaching's, kept by the sessions
/// that start from it, so a window is shared for as long as that configuration holds and not
/// renewed by its own use.
fn taught_window(conn: &Connection, call: &ProxyCall) -> Result<Option<(usize, String)>> {
    Ok(conn
        .prepare_cached(TAUGHT_WINDOW)?
        .query_row(
            params![
                call.owner,
                call.new_session.model,
                super::super::clock::stored(call.windows_taught_since),
                LIMIT_FROM_REFUSAL,
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

/// How many leading messages the call shares with another conversation of the caller's that
/// begins the same way (`None` when there is none): the client's own preamble.
fn shared_preamble(conn: &Connection, call: &ProxyCall, hashes: &[i64]) -> Result<Option<usize>> {
    let ids: Vec<String> = conn
        .prepare_cached(
            "SELECT id FROM sessions WHERE owner = ?1 AND root_hash = ?2 AND deleted_at IS NULL
             ORDER BY updated_at DESC LIMIT ?3",
        )?
        .query_map(params![call.owner, call.root_hash, CANDIDATES], |r| {
            r.get(0)
        })?
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
