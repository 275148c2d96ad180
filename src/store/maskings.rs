//! Maskings of old tool outputs (microcompaction): move a session's mask forward, read the
//! history of maskings.

use super::rows::SessionRow;
use super::sessions::{NOW, get_live};
use super::{Result, Store};
use rusqlite::{Connection, params};
use serde::Serialize;

/// One masking, as stored.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
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
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT seq, tool_results, coalesce(shortened_tokens, tokens) - coalesce(masked_tokens, tokens),
                pinned, role = 'assistant'
         FROM messages WHERE session_id = ?1 AND seq >= ?2 AND {} ORDER BY seq DESC",
        branch.filter()
    ))?;
    let rows = stmt
        .query_map(params![session.id, session.active_from_seq], |r| {
            Ok((
                r.get::<_, u64>(0)?,
                r.get::<_, usize>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, bool>(3)?,
                r.get::<_, bool>(4)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    // Newest first: the message holding the oldest of the newest `keep_recent` outputs is
    // where the mask ends, unless the current step starts before it; what comes before the
    // end and is not masked yet would be.
    let mut kept = 0;
    let mut step_start: Option<u64> = None;
    let mut through: Option<u64> = None;
    let (mut outputs, mut saving) = (0u64, 0usize);
    for (seq, results, saved, pinned, assistant) in rows {
        match through {
            None => {
                kept += results;
                if assistant && step_start.is_none() {
                    step_start = Some(seq);
                }
                // Within the step nothing is masked: the mask may end at its start at the
                // latest, or at an older message holding the oldest output kept.
                let past_step = step_start.is_some() && (results > 0 || assistant);
                if past_step && kept >= keep_recent {
                    through = Some(seq);
                }
            }
            Some(_) if seq >= session.masked_through_seq && !pinned => {
                outputs += results as u64;
                saving += saved.max(0) as usize;
            }
            Some(_) => {}
        }
    }
    Ok(through
        .filter(|&t| t > session.masked_through_seq && outputs > 0)
        .map(|t| (t, outputs, saving)))
}

impl Store {
    /// Masks the tool outputs of `session_id`'s active messages older than the newest
    /// `keep_recent`, if that saves at least `min_saving` tokens. Returns the masking and the
    /// session after it, or `None` when it would not be worth it.
    pub async fn mask_outputs(
        &self,
        session_id: &str,
        keep_recent: usize,
        min_saving: usize,
    ) -> Result<Option<(MaskingRow, SessionRow)>> {
        let session_id = session_id.to_string();
        self.write(move |conn| {
            let session = get_live(conn, &session_id)?;
            let Some((through, outputs, saving)) = masking_point(conn, &session, keep_recent)?
            else {
                return Ok(None);
            };
            if saving < min_saving {
                return Ok(None);
            }
            let (pre_tokens, _) = session.context_tokens();
            // A reported usage measured the context before the masking: drop it.
            conn.prepare_cached(
                "UPDATE sessions SET masked_through_seq = ?2, reported_tokens = NULL, tokens_since_report = 0
                 WHERE id = ?1",
            )?
            .execute(params![session_id, through])?;
            let after = super::counters::recount_active(conn, &get_live(conn, &session_id)?)?;
            let (post_tokens, _) = after.context_tokens();
            conn.prepare_cached(&format!(
                "INSERT INTO maskings (session_id, through_seq, outputs, pre_tokens, post_tokens, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, {NOW})"
            ))?
            .execute(params![session_id, through, outputs, pre_tokens, post_tokens])?;
            let row = conn
                .prepare_cached(&format!(
                    "SELECT {} FROM maskings WHERE id = ?1",
                    MaskingRow::COLUMNS
                ))?
                .query_row([conn.last_insert_rowid()], MaskingRow::from_row)?;
            Ok(Some((row, after)))
        })
        .await
    }

    /// The session's maskings with an id above `after`, oldest first, at most `limit`; and
    /// whether more follow.
    pub async fn maskings(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<MaskingRow>, bool)> {
        let page = (session_id, after, limit);
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
