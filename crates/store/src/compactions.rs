//! Compactions: commit a successful one, record a failed one, read the history.

use super::rows::{CompactionRow, FailureRow, SessionRow};
use super::sessions::{NOW, get_live};
use super::{Result, Store, StoreError};
use crate::compaction::{CompactionResult, Trigger};
use compactd_core::SessionId;
use compactd_core::TokenSource;
use rusqlite::{Connection, params};

/// A successful compaction to store.
#[derive(Debug, Clone)]
pub struct NewCompaction {
    pub session_id: SessionId,
    pub trigger: Trigger,
    pub focus: Option<String>,
    pub result: CompactionResult,
    /// The session's boundary when the compaction started (its first summarized message).
    pub first_seq: u64,
    /// The new boundary: first message kept verbatim.
    pub boundary_seq: u64,
    /// The last message of the branch compacted, as read: a proxied conversation's other
    /// branch may be current by the time the compaction lands, and the session moves back
    /// to this one for it (see [`Store::session_on`]).
    pub head_seq: u64,
    pub summary_tokens: usize,
    pub summarizer: String,
    pub chunks: usize,
    pub fallback_reason: Option<String>,
    pub duration_ms: u64,
    /// Mask the old tool outputs of the kept tail in the same transaction, keeping the newest
    /// this many: a context read between the compaction and a masking of its own would be
    /// replaced by a different one at once, and the byte-stable prefix would break.
    pub mask_tail: Option<usize>,
}

/// A committed compaction: its row, the session after it, and the masking of its tail if one
/// was made.
pub(crate) type Committed = (
    CompactionRow,
    SessionRow,
    Option<super::maskings::MaskingRow>,
);

/// A failed attempt to record.
#[derive(Debug, Clone)]
pub struct NewFailure {
    pub session_id: SessionId,
    pub trigger: Trigger,
    pub focus: Option<String>,
    pub summarizer: String,
    pub reason: String,
    pub duration_ms: u64,
}

/// `started_at` for something that took `duration_ms` and finished now.
fn started(duration_ms_param: &str) -> String {
    format!(
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ({duration_ms_param} / 1000.0) || ' seconds')"
    )
}

/// Inserts compaction `c`'s row; its id.
fn insert_compaction(conn: &Connection, c: &NewCompaction) -> Result<i64> {
    conn.prepare_cached(&format!(
        "INSERT INTO compactions (session_id, num, trigger, focus, summary, read_files,
             modified_files, pre_tokens, post_tokens, first_seq, boundary_seq, summarizer,
             chunks, fallback_reason, started_at, finished_at, duration_ms, created_files,
             deleted_files, summary_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, {}, {NOW}, ?15, ?16, ?17, ?18)",
        started("?15")
    ))?
    .execute(params![
        c.session_id.as_str(),
        c.result.compaction_num,
        c.trigger.as_str(),
        c.focus,
        c.result.summary,
        serde_json::to_string(&c.result.read_files)?,
        serde_json::to_string(&c.result.modified_files)?,
        c.result.pre_tokens,
        c.result.post_tokens,
        c.first_seq,
        c.boundary_seq,
        c.summarizer,
        c.chunks,
        c.fallback_reason,
        c.duration_ms,
        serde_json::to_string(&c.result.created_files)?,
        serde_json::to_string(&c.result.deleted_files)?,
        c.summary_tokens,
    ])?;
    Ok(conn.last_insert_rowid())
}

impl Store {
    /// Stores the compaction and moves the session's boundary. Messages appended while it ran
    /// are counted into the new active span. A compaction that shrank the context closes the
    /// breaker, when the context was measured by estimate as the compaction measures it; a
    /// context the model server measured (its usage report) is judged by that server's next
    /// report instead ([`super::AppendRules::token_trigger`]): a server that counts what
    /// compactd cannot see, or answers nonsense, would otherwise have the context compacted
    /// on every call, each time found smaller by the estimate. Fails with a conflict, changing
    /// nothing, if the session moved on (another compaction committed first). Returns the
    /// stored compaction and the session after it (masked as [`NewCompaction::mask_tail`]
    /// asks).
    pub async fn commit_compaction(&self, c: NewCompaction) -> Result<Committed> {
        self.write(move |conn| {
            let session = get_live(conn, c.session_id.as_str())?;
            let session = super::reading::branch_of(conn, session, Some(c.head_seq))?;
            // The branch may have changed meanwhile (a proxied client resent an earlier
            // request): the boundary must still be on the current one.
            let on_branch = super::path::Branch::current(conn, &session)?.contains(c.boundary_seq)
                || c.boundary_seq == session.head_seq + 1;
            if session.active_from_seq != c.first_seq
                || session.compaction_count + 1 != c.result.compaction_num
                || !on_branch
            {
                return Err(StoreError::Conflict(format!(
                    "session `{}` was compacted by someone else meanwhile",
                    c.session_id
                )));
            }
            let id = insert_compaction(conn, &c)?;
            conn.prepare_cached(&format!(
                "UPDATE sessions SET
                     active_from_seq = ?2,
                     summary_tokens = ?3,
                     compaction_count = compaction_count + 1,
                     summary_num = compaction_count + 1,
                     reported_tokens = NULL,
                     tokens_since_report = 0,
                     turn_attempts = CASE WHEN ?4 THEN 0 ELSE turn_attempts END,
                     updated_at = {NOW}
                 WHERE id = ?1"
            ))?
            .execute(params![
                c.session_id.as_str(),
                c.boundary_seq,
                c.summary_tokens,
                // A compaction that made the context smaller closes the breaker (its count
                // of unproductive attempts starts over).
                c.result.post_tokens < c.result.pre_tokens
                    && session.context_tokens().1 == TokenSource::Estimated,
            ])?;
            let session =
                super::counters::recount_active(conn, &get_live(conn, c.session_id.as_str())?)?;
            let sql = format!(
                "SELECT {} FROM compactions WHERE id = ?1",
                CompactionRow::COLUMNS
            );
            let row = conn
                .prepare_cached(&sql)?
                .query_row([id], CompactionRow::from_row)?;
            let masked = match c.mask_tail {
                Some(keep_recent) => super::maskings::mask(conn, &session, keep_recent, 1)?,
                None => None,
            };
            Ok(match masked {
                Some((masking, session)) => (row, session, Some(masking)),
                None => (row, session, None),
            })
        })
        .await
    }

    /// Records a failed attempt; the session itself is untouched.
    pub async fn record_failure(&self, f: NewFailure) -> Result<()> {
        self.write(move |conn| {
            conn.prepare_cached(&format!(
                "INSERT INTO compaction_failures (session_id, trigger, focus, summarizer, reason,
                     started_at, finished_at, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, {}, {NOW}, ?6)",
                started("?6")
            ))?
            .execute(params![
                f.session_id.as_str(),
                f.trigger.as_str(),
                f.focus,
                f.summarizer,
                f.reason,
                f.duration_ms
            ])?;
            Ok(())
        })
        .await
    }

    /// The session's compactions after number `after`, oldest first: at most `limit`, and no
    /// more once `max_bytes` of summaries are taken (the first is always taken).
    pub async fn compactions(
        &self,
        session_id: &SessionId,
        after: u32,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(SessionRow, Vec<CompactionRow>)> {
        let session_id = session_id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &session_id)?;
            let sql = format!(
                "SELECT {} FROM compactions WHERE session_id = ?1 AND num > ?2 ORDER BY num LIMIT ?3",
                CompactionRow::COLUMNS
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut rows = stmt.query(params![session_id, after, limit])?;
            let mut page = Vec::new();
            let mut bytes = 0;
            while let Some(row) = rows.next()? {
                let compaction = CompactionRow::from_row(row)?;
                bytes += compaction.size();
                if bytes > max_bytes && !page.is_empty() {
                    break;
                }
                page.push(compaction);
            }
            Ok((session, page))
        })
        .await
    }

    /// The session's failed attempts with an id above `after`, oldest first, at most `limit`;
    /// and whether more follow.
    pub async fn failures(
        &self,
        session_id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<FailureRow>, bool)> {
        let page = (session_id.as_str(), after, limit);
        let table = "compaction_failures";
        super::rows::rows_after(self, table, FailureRow::COLUMNS, FailureRow::from_row, page).await
    }
}
