//! Maskings of old tool outputs (microcompaction): move a session's mask forward, read the
//! history of maskings.

use super::rows::SessionRow;
use super::sessions::{NOW, get_live};
use super::{Result, Store};
use compactd_core::SessionId;
use rusqlite::{Connection, params};

/// One masking, as stored.
#[derive(Debug, Clone)]
pub struct MaskingRow {
    pub id: u64,
    /// Tool outputs of messages below this seq read as placeholders from then on.
    pub through_seq: u64,
    /// Outputs this masking hid.
    pub outputs: u64,
    pub pre_tokens: usize,
    pub post_tokens: usize,
    pub created_at: String,
}

impl MaskingRow {
    const COLUMNS: &'static str = "id, through_seq, outputs, pre_tokens, post_tokens, created_at";

    fn from_row(row: &rusqlite::Row) -> rusqlite::Result<MaskingRow> {
        Ok(MaskingRow {
            id: row.get(0)?,
            through_seq: row.get(1)?,
            outputs: row.get(2)?,
            pre_tokens: row.get(3)?,
            post_tokens: row.get(4)?,
            created_at: row.get(5)?,
        })
    }
}

/// Where a masking keeping the newest `keep_recent` outputs would put the mask, and what it
/// would save: (through seq, outputs hidden, tokens saved). The current step (the newest
/// assistant message and what follows it) is never masked, however many results it has.
fn masking_point(
    conn: &Connection,
    session: &SessionRow,
    keep_recent: usize,
) -> Result<Option<(u64, u64, usize)>> {
    let branch = super::path::Branch::current(conn, session)?;
    let filter = branch.filter();
    let unmasked_from = session.active_from_seq.max(session.masked_through_seq);
    // Most appends find nothing to mask: at most `keep_recent` outputs not masked yet. The
    // index of messages with results says so without reading every message of the session.
    let unmasked: usize = conn
        .prepare_cached(&format!(
            "SELECT coalesce(sum(tool_results), 0) FROM messages INDEXED BY messages_with_results
             WHERE session_id = ?1 AND seq >= ?2 AND tool_results > 0 AND {filter}"
        ))?
        .query_row(params![session.id.as_str(), unmasked_from], |r| r.get(0))?;
    if unmasked <= keep_recent {
        return Ok(None);
    }
    // Newest first: the message holding the oldest of the newest `keep_recent` outputs is
    // where the mask ends, unless the current step starts before it. Only the newest rows
    // are read, up to that point.
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT seq, tool_results, role = 'assistant'
         FROM messages WHERE session_id = ?1 AND seq >= ?2 AND {filter} ORDER BY seq DESC"
    ))?;
    let mut rows = stmt.query(params![session.id.as_str(), session.active_from_seq])?;
    let mut kept = 0;
    let mut step_start: Option<u64> = None;
    let mut through: Option<u64> = None;
    while let Some(row) = rows.next()? {
        let (seq, results, assistant): (u64, usize, bool) = (row.get(0)?, row.get(1)?, row.get(2)?);
        kept += results;
        if assistant && step_start.is_none() {
            step_start = Some(seq);
        }
        // Within the step nothing is masked: the mask may end at its start at the latest, or
        // at an older message holding the oldest output kept.
        let past_step = step_start.is_some() && (results > 0 || assistant);
        if past_step && kept >= keep_recent {
            through = Some(seq);
            break;
        }
    }
    drop(rows);
    let Some(through) = through.filter(|&t| t > session.masked_through_seq) else {
        return Ok(None);
    };
    // What masking the unpinned messages before it, not masked yet, would hide and save.
    let (outputs, saving): (u64, i64) = conn
        .prepare_cached(&format!(
            "SELECT coalesce(sum(tool_results), 0),
                    coalesce(sum(max(coalesce(shortened_tokens, tokens) - coalesce(masked_tokens, tokens), 0)), 0)
             FROM messages WHERE session_id = ?1 AND seq >= ?2 AND seq < ?3 AND NOT pinned AND {filter}"
        ))?
        .query_row(params![session.id.as_str(), unmasked_from, through], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok((outputs > 0).then_some((through, outputs, saving.max(0) as usize)))
}

/// Masks the tool outputs of `session`'s active messages older than the newest
/// `keep_recent`, if that saves at least `min_saving` tokens: the masking and the session
/// after it, or `None` when it would not be worth it. Its writes are made in a savepoint of
/// their own, so a masking that fails undoes only itself, never the write it is part of (an
/// append); most calls find nothing to mask and open none.
pub(super) fn mask(
    conn: &Connection,
    session: &SessionRow,
    keep_recent: usize,
    min_saving: usize,
) -> Result<Option<(MaskingRow, SessionRow)>> {
    let Some((through, outputs, saving)) = masking_point(conn, session, keep_recent)? else {
        return Ok(None);
    };
    if saving < min_saving {
        return Ok(None);
    }
    super::writer::in_savepoint(conn, |conn| write_masking(conn, session, through, outputs))
        .map(Some)
}

/// Moves the session's mask to `through`, hiding `outputs` outputs, and records it.
fn write_masking(
    conn: &Connection,
    session: &SessionRow,
    through: u64,
    outputs: u64,
) -> Result<(MaskingRow, SessionRow)> {
    let (pre_tokens, _) = session.context_tokens();
    // A reported usage measured the context before the masking: drop it.
    conn.prepare_cached(
        "UPDATE sessions SET masked_through_seq = ?2, reported_tokens = NULL, tokens_since_report = 0
         WHERE id = ?1",
    )?
    .execute(params![session.id.as_str(), through])?;
    let after = super::counters::recount_active(conn, &get_live(conn, session.id.as_str())?)?;
    let (post_tokens, _) = after.context_tokens();
    conn.prepare_cached(&format!(
        "INSERT INTO maskings (session_id, through_seq, outputs, pre_tokens, post_tokens, created_at, head_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, {NOW}, ?6)"
    ))?
    .execute(params![session.id.as_str(), through, outputs, pre_tokens, post_tokens, session.head_seq])?;
    let row = conn
        .prepare_cached(&format!(
            "SELECT {} FROM maskings WHERE id = ?1",
            MaskingRow::COLUMNS
        ))?
        .query_row([conn.last_insert_rowid()], MaskingRow::from_row)?;
    Ok((row, after))
}

impl Store {
    /// [`mask`] in a write of its own, for the branch of `head` as it is then. Returns the
    /// masking, if one was made, and the session after it: a caller holding an older row of
    /// the session sees whether its outputs were masked meanwhile (by another request) even
    /// when this call found nothing left to mask.
    ///
    /// Another branch's call may have moved the session since the caller read it (a proxied
    /// client calling from two branches at once): the session is moved back to the branch
    /// of `head` first, as reading that branch's context does, so a masking due on one
    /// branch never lands on the other. A later call of the same branch (`head` still on
    /// the current branch) leaves it where it is.
    pub async fn mask_outputs(
        &self,
        session_id: &SessionId,
        head: u64,
        keep_recent: usize,
        min_saving: usize,
    ) -> Result<(Option<MaskingRow>, SessionRow)> {
        let session_id = session_id.to_string();
        self.write(move |conn| {
            let live = get_live(conn, &session_id)?;
            let on_branch =
                head == live.head_seq || super::path::Branch::current(conn, &live)?.contains(head);
            let session = match on_branch {
                true => live,
                false => super::counters::switch_to(conn, &live, head)?,
            };
            Ok(match mask(conn, &session, keep_recent, min_saving)? {
                Some((row, after)) => (Some(row), after),
                None => (None, session),
            })
        })
        .await
    }

    /// The session's maskings with an id above `after`, oldest first, at most `limit`; and
    /// whether more follow.
    pub async fn maskings(
        &self,
        session_id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<MaskingRow>, bool)> {
        let page = (session_id.as_str(), after, limit);
        super::rows::rows_after(
            self,
            "maskings",
            MaskingRow::COLUMNS,
            MaskingRow::from_row,
            page,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::compaction::media::Media;
    use crate::message::{Message, Part, Role};
    use crate::{Append, AppendRules, NewMessage, NewSession, Store, Synchronous};
    use compactd_core::SessionId;

    /// A task, then `rounds` tool calls each answered by an output of 2,000 characters.
    fn session_with_outputs(id: &SessionId, rounds: usize) -> Append {
        let mut messages = vec![NewMessage::owned(Message::text(Role::User, "fix it"), 3)];
        for i in 0..rounds {
            let call = Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall {
                    id: format!("c{i}"),
                    name: "bash".into(),
                    args: serde_json::json!({"command": "cargo test"}),
                }],
            };
            let result = Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: format!("c{i}"),
                    name: None,
                    output: "x".repeat(2_000),
                    is_error: false,
                }],
            };
            messages.push(NewMessage::owned(call, 10));
            messages.push(NewMessage::owned(result, 500));
        }
        Append {
            session: id.clone(),
            create: Some(NewSession {
                id: id.clone(),
                model: None,
                context_limit: 128_000,
                overrides: serde_json::json!({}),
                owner: None,
                limit_source: None,
            }),
            messages,
            reported_tokens: None,
            reported_of: None,
            idempotency: None,
        }
    }

    /// A proxied result message holding a screenshot inside its result and a person's pasted
    /// image beside it: masked, it goes upstream without the result's screenshot but with the
    /// pasted image, and its masked form counts that image (counting the masked text alone,
    /// the context looked 1,000 tokens smaller than it went upstream, per message).
    #[tokio::test]
    async fn a_masked_form_counts_the_media_it_keeps() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let id = SessionId::unchecked("s".into());
        let mut append = session_with_outputs(&id, 20);
        for (i, message) in append.messages.iter_mut().skip(2).step_by(2).enumerate() {
            let media = Media {
                outside: 1_000,
                results: vec![(format!("c{i}"), 600)],
            };
            let estimate = message.tokens() + media.total();
            let content = message.content().unwrap().clone();
            *message = NewMessage::owned(content, estimate).with_media(media);
        }
        let appended = store
            .append(append, |_| AppendRules::AS_SENT)
            .await
            .unwrap();
        let before = appended.session.context_tokens().0;
        let (masking, after) = store
            .mask_outputs(&id, appended.session.head_seq, 3, 1)
            .await
            .unwrap();
        let outputs = masking.unwrap().outputs as usize;
        assert!(outputs >= 17, "{outputs}");
        let saved = before - after.context_tokens().0;
        // Each masked message drops its output (500) and the screenshot in it (600), less the
        // placeholder's few tokens; the pasted image (1,000) stays counted.
        assert!(
            saved > outputs * 1_000 && saved < outputs * 1_100,
            "{saved} saved by masking {outputs} outputs"
        );
        let conn = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
        let stored: String = conn
            .query_row("SELECT media FROM messages WHERE seq = 3", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, r#"{"outside":1000,"results":[["c0",600]]}"#);
    }

    /// Whoever asks second (a context that read the session before another request masked
    /// it) finds nothing left to mask, and is told where the session's masking stands now,
    /// so it can tell its own read is stale.
    #[tokio::test]
    async fn a_masking_found_made_already_reports_the_session_as_it_stands() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let id = SessionId::unchecked("s".into());
        let appended = store
            .append(session_with_outputs(&id, 20), |_| AppendRules::AS_SENT)
            .await
            .unwrap();
        let before = appended.session.masked_through_seq;
        let head = appended.session.head_seq;

        let (first, after) = store.mask_outputs(&id, head, 3, 1).await.unwrap();
        assert!(
            first.is_some_and(|m| m.outputs >= 17),
            "the old outputs are masked"
        );
        assert!(after.masked_through_seq > before);

        let (second, now) = store.mask_outputs(&id, head, 3, 1).await.unwrap();
        assert!(second.is_none(), "nothing is left to mask");
        assert_eq!(now.masked_through_seq, after.masked_through_seq);
        assert_eq!(now.context_tokens(), after.context_tokens());
    }
}
