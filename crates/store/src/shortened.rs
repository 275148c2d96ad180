//! The forms the current step shows its messages in when they are too large for their room
//! (long outputs and texts keep their head and tail; see [`crate::compaction::step`]): what
//! room a message gets, and the step shortened again for a new limit. The stored message
//! always stays whole.

use super::Result;
use super::path::Branch;
use super::rows::SessionRow;
use super::sessions::get_live;
use crate::compaction::media::Media;
use crate::compaction::step::{self, StepRoom};
use crate::compaction::{LazyEstimator, Origin};
use crate::message::{Message, Part, Role};
use compactd_core::SessionKind;
use rusqlite::{Connection, OptionalExtension, params};

/// Where message `seq` of `session` is stored, as its masked or shortened forms say.
pub(super) fn origin(session: &SessionRow, seq: u64) -> Origin<'_> {
    Origin {
        session: session.id.as_str(),
        seq,
    }
}

/// `message` (of `tokens` estimated tokens, its `media` among them) as the current step shows
/// it in `room` (see [`step::message_budget`]): its parts as stored JSON and their tokens, or
/// `None` when it is shown whole.
pub(super) fn shortened(
    message: &Message,
    tokens: usize,
    media: &Media,
    at: Origin,
    room: StepRoom,
) -> Result<(Option<String>, Option<usize>)> {
    let shown = step::shown_in_step(message, tokens, media.outside, at, room);
    encoded(shown, &message.parts, media)
}

/// The seq of the session's newest assistant message (0 if it has none): the agent's turn,
/// where the current step starts. A session of the socket API is one line of messages.
fn newest_turn(conn: &Connection, session: &SessionRow) -> Result<u64> {
    Ok(conn
        .prepare_cached(
            "SELECT seq FROM messages WHERE session_id = ?1 AND role = 'assistant'
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([session.id.as_str()], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Tokens the results stored after the session's newest assistant message take of the
/// step's `room` (those a compaction took are in no context: a person who wrote on after the
/// turn moved the step past them): each as the context shows it, and no more than its share
/// of the room (one shown whole under the trigger takes its share, as when the step is
/// squeezed: see `store::messages`).
pub(super) fn results_since_turn(
    conn: &Connection,
    session: &SessionRow,
    room: StepRoom,
) -> Result<usize> {
    let turn = newest_turn(conn, session)?;
    let from = turn.max(session.active_from_seq.saturating_sub(1));
    conn.prepare_cached(
        "SELECT coalesce(shortened_tokens, tokens), tool_results FROM messages
         WHERE session_id = ?1 AND seq > ?2 AND tool_results > 0",
    )?
    .query_map(params![session.id.as_str(), from], |r| {
        Ok(r.get::<_, usize>(0)?.min(room.result_share(r.get(1)?)))
    })?
    .sum::<rusqlite::Result<usize>>()
    .map_err(Into::into)
}

/// Shortens the session's active messages again for a new step budget (its limit or config
/// changed, or a model's refusal taught a smaller window), every one the context may show
/// otherwise (a long answer too, as an append shortens it), and recounts what its context
/// holds. A usage report stands (a refusal's count must, until a compaction); the caller drops
/// one that no longer measures the context. Returns the session after it.
pub(super) fn reshorten_active(
    conn: &Connection,
    session: &SessionRow,
    step_budget: usize,
) -> Result<SessionRow> {
    reshorten(conn, session, step_budget, false)
}

/// Gives the current step's messages (from the newest assistant message on) the forms its
/// budget allows, once an append has put the context past the trigger: the step's earlier
/// messages were stored whole while the context with them stayed under it (see
/// `store::messages`), and a step whole beside a later result or message could pass the
/// limit itself, with nothing older left to compact. Returns the session after it.
pub(super) fn shorten_step(
    conn: &Connection,
    session: &SessionRow,
    step_budget: usize,
) -> Result<SessionRow> {
    reshorten(conn, session, step_budget, true)
}

/// The active messages (with `step_only`, those of the current step) shown again in the forms
/// `step_budget` allows, and the session recounted.
fn reshorten(
    conn: &Connection,
    session: &SessionRow,
    step_budget: usize,
    step_only: bool,
) -> Result<SessionRow> {
    let branch = Branch::current(conn, session)?;
    let from = match step_only {
        true => step_start(conn, session, &branch)?,
        false => session.active_from_seq,
    };
    let rows: Vec<(u64, String, String, usize, Option<String>)> = conn
        .prepare_cached(&format!(
            "SELECT seq, role, parts, tokens, media FROM messages
             WHERE session_id = ?1 AND seq >= ?2 AND pinned = 0 AND role <> 'system' AND {}
             ORDER BY seq",
            branch.filter()
        ))?
        .query_map(params![session.id.as_str(), from], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut update = conn.prepare_cached(
        "UPDATE messages SET shortened_parts = ?3, shortened_tokens = ?4 WHERE session_id = ?1 AND seq = ?2",
    )?;
    // The current step's results share its room again, in the order they came (a proxied
    // conversation's take their shares, as when they were appended).
    let turn = match session.kind {
        SessionKind::Api => newest_turn(conn, session)?,
        _ => u64::MAX,
    };
    let mut results_shown = 0;
    for (seq, role, parts, tokens, media) in rows {
        let message = Message {
            role: Role::parse(&role).unwrap_or(Role::User),
            parts: serde_json::from_str(&parts)?,
        };
        let media: Media = media
            .map(|m| serde_json::from_str(&m))
            .transpose()?
            .unwrap_or_default();
        let in_step = seq > turn && message.tool_result_ids().next().is_some();
        let room = StepRoom {
            budget: step_budget,
            calls: session.step_calls,
            results_shown: if in_step { results_shown } else { 0 },
        };
        let (json, shown) = shortened(&message, tokens, &media, origin(session, seq), room)?;
        if in_step {
            results_shown += shown.unwrap_or(tokens);
        }
        update.execute(params![session.id.as_str(), seq, json, shown])?;
    }
    super::counters::recount_active(conn, &get_live(conn, session.id.as_str())?)
}

/// Where the current step starts among the active messages `reshorten` may show otherwise:
/// the newest assistant message on `branch`, else (no turn yet) the newest such message alone.
/// Read by seq so that only the step's messages are loaded, not the whole active context.
fn step_start(conn: &Connection, session: &SessionRow, branch: &Branch) -> Result<u64> {
    let start: Option<u64> = conn
        .prepare_cached(&format!(
            "SELECT coalesce(max(CASE WHEN role = 'assistant' THEN seq END), max(seq))
             FROM messages
             WHERE session_id = ?1 AND seq >= ?2 AND pinned = 0 AND role <> 'system' AND {}",
            branch.filter()
        ))?
        .query_row(params![session.id.as_str(), session.active_from_seq], |r| {
            r.get(0)
        })?;
    Ok(start.unwrap_or(session.active_from_seq))
}

/// Parts shown in place of `original` as stored JSON, with their tokens: their estimate and
/// what of the message's `media` goes upstream with them.
pub(super) fn encoded(
    parts: Option<Vec<Part>>,
    original: &[Part],
    media: &Media,
) -> Result<(Option<String>, Option<usize>)> {
    let tokens = parts.as_ref().map(|parts| {
        let text = LazyEstimator::default().message(&Message {
            role: Role::Tool,
            parts: parts.clone(),
        });
        text + media.kept(original, parts)
    });
    let json = parts
        .map(|parts| serde_json::to_string(&parts))
        .transpose()?;
    Ok((json, tokens))
}
