//! A session's counters, which describe its current branch: recounted from the messages
//! after a compaction, a masking or a reshortening, and computed afresh when a proxied
//! conversation moves to another branch (its client resent an earlier request, or changed
//! something in the middle of what it sends).

use super::Result;
use super::path::Branch;
use super::rows::{SessionRow, shown_tokens};
use super::sessions::NOW;
use rusqlite::{Connection, OptionalExtension, params};

/// Recounts the active messages and their tokens (as the context shows them) over the
/// session's current branch; returns the session after it.
pub(super) fn recount_active(conn: &Connection, session: &SessionRow) -> Result<SessionRow> {
    let branch = Branch::current(conn, session)?;
    let filter = branch.filter();
    Ok(conn
        .prepare_cached(&format!(
            "UPDATE sessions SET
                 active_messages = (SELECT count(*) FROM messages
                                    WHERE session_id = ?1 AND seq >= sessions.active_from_seq AND {filter}),
                 active_tokens = (SELECT coalesce(sum({shown}), 0) FROM messages
                                  WHERE session_id = ?1 AND seq >= sessions.active_from_seq AND pinned = 0 AND {filter}),
                 updated_at = {NOW}
             WHERE id = ?1 RETURNING {}",
            SessionRow::COLUMNS,
            shown = shown_tokens("sessions.masked_through_seq"),
        ))?
        .query_row([&session.id], SessionRow::from_row)?)
}

/// Makes the branch ending at `head` the session's current one: its latest compaction (the
/// newest whose boundary lies on it), its pinned messages and task, and every counter, as if
/// the session had only ever had this branch. Reported usage is dropped (it measured another
/// branch). Returns the session after it.
pub(super) fn switch_to(conn: &Connection, session: &SessionRow, head: u64) -> Result<SessionRow> {
    if head == session.head_seq {
        return Ok(session.clone());
    }
    let branch = Branch::to(conn, session, head)?;
    let filter = branch.filter();
    // The newest compaction that summarized a prefix of this branch.
    let compactions: Vec<(u32, u64, Option<usize>, usize)> = conn
        .prepare_cached(
            "SELECT num, boundary_seq, summary_tokens, length(summary) FROM compactions
             WHERE session_id = ?1 ORDER BY num DESC",
        )?
        .query_map([&session.id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let (summary_num, active_from, summary_tokens) = compactions
        .into_iter()
        .find(|(_, boundary, _, _)| branch.contains(*boundary))
        .map_or((0, 1, 0), |(num, boundary, tokens, chars)| {
            (num, boundary, tokens.unwrap_or(chars.div_ceil(4) + 16))
        });
    // The task of a proxied conversation: the first pinned user message past the client's
    // preamble (whose own user messages, few-shot examples, are pinned too).
    let task_seq: Option<u64> = match session.task_hash {
        Some(_) => conn
            .prepare_cached(&format!(
                "SELECT seq FROM messages WHERE session_id = ?1 AND pinned = 1 AND role = 'user'
                 AND seq > ?2 AND {filter} ORDER BY seq LIMIT 1"
            ))?
            .query_row(params![session.id, session.static_seq], |r| r.get(0))
            .optional()?,
        None => session.task_seq,
    };
    let step_calls: usize = conn
        .prepare_cached(&format!(
            "SELECT parts FROM messages WHERE session_id = ?1 AND role = 'assistant' AND {filter} ORDER BY seq DESC LIMIT 1"
        ))?
        .query_row([&session.id], |r| r.get::<_, String>(0))
        .optional()?
        .map_or(0, |parts| parts.matches("\"type\":\"tool_call\"").count());
    conn.prepare_cached(&format!(
        "UPDATE sessions SET
             head_seq = ?2,
             active_from_seq = ?3,
             summary_num = ?4,
             summary_tokens = ?5,
             task_seq = ?6,
             step_calls = ?7,
             pinned_tokens = (SELECT coalesce(sum(tokens), 0) FROM messages
                              WHERE session_id = ?1 AND pinned = 1 AND {filter}),
             turn_start_seq = coalesce((SELECT max(seq) FROM messages
                                        WHERE session_id = ?1 AND role = 'user' AND {filter}), 0),
             turn_attempts = 0,
             reported_tokens = NULL,
             tokens_since_report = 0
         WHERE id = ?1"
    ))?
    .execute(params![
        session.id,
        head,
        active_from,
        summary_num,
        summary_tokens,
        task_seq,
        step_calls
    ])?;
    let switched = super::sessions::get_live(conn, session.id.as_str())?;
    recount_active(conn, &switched)
}
