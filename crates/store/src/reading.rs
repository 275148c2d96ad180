//! Reading a session: its context (pinned messages, latest summary, active messages) in one
//! snapshot, pages of its history, and the file lists the next compaction extends.

use super::path::Branch;
use super::rows::{ContextSnapshot, LatestSummary, SessionRow};
use super::sessions::get_live;
use super::{Result, Store};
use crate::compaction::FileLists;
use compactd_core::SessionId;
use compactd_core::StoredMessage;
use rusqlite::{Connection, OptionalExtension, params};

impl Store {
    /// Messages with seq greater than `after`, at most `limit` of them and at most
    /// `max_bytes` of parts (always at least one), and the session.
    pub async fn history(
        &self,
        session_id: &SessionId,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(SessionRow, Vec<StoredMessage>)> {
        let session_id = session_id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &session_id)?;
            let page = messages_page(conn, &session_id, after.saturating_add(1), limit, max_bytes)?;
            Ok((session, page))
        })
        .await
    }

    /// The files the compaction `session`'s context starts from lists.
    pub async fn prior_files(&self, session: &SessionRow) -> Result<FileLists> {
        let session = session.clone();
        self.read(move |conn| latest_files(conn, &session)).await
    }

    /// The session, its pinned messages, its latest summary and its uncompacted messages, in
    /// one snapshot, as the context shows them (old outputs masked).
    pub async fn context(&self, session_id: &SessionId) -> Result<ContextSnapshot> {
        self.snapshot(session_id, true).await
    }

    /// [`context`](Self::context) of the branch ending at `head`. When another branch is the
    /// current one (a proxied call of the same conversation on another branch placed itself
    /// since), `head`'s branch is made current again first, in the same write, so the snapshot
    /// is of that branch whatever other calls do meanwhile.
    pub async fn context_on(&self, session_id: &SessionId, head: u64) -> Result<ContextSnapshot> {
        let snapshot = self.context(session_id).await?;
        if snapshot.session.head_seq == head {
            return Ok(snapshot);
        }
        let session_id = session_id.to_string();
        self.write(move |conn| {
            let session = get_live(conn, &session_id)?;
            let session = super::counters::switch_to(conn, &session, head)?;
            snapshot_of(conn, session, true)
        })
        .await
    }

    /// What a compaction of the branch `head` lies on summarizes (of the current branch
    /// without `head`): the snapshot with every message whole, its tokens as the context
    /// counts them, and the file lists its summary extends. See [`Store::session_on`] for
    /// which branch that is.
    pub async fn compaction_input(
        &self,
        session_id: &SessionId,
        head: Option<u64>,
    ) -> Result<(ContextSnapshot, FileLists)> {
        self.on_branch(session_id, head, |conn, session| {
            let files = latest_files(conn, &session)?;
            Ok((snapshot_of(conn, session, false)?, files))
        })
        .await
    }

    /// The session with the branch `head` lies on current: as it stands when its current
    /// branch holds `head` (the branch a caller saw, or that branch grown since), else moved
    /// back to the branch ending at `head` (another branch's call moved the session since).
    /// A compaction started for one branch's call compacts that branch, whatever the other
    /// branch's calls do meanwhile; before, it compacted whichever branch was current when it
    /// read the session, and the call it was for went out uncompacted.
    /// Without `head`, the session as it stands.
    pub async fn session_on(
        &self,
        session_id: &SessionId,
        head: Option<u64>,
    ) -> Result<SessionRow> {
        self.on_branch(session_id, head, |_, session| Ok(session))
            .await
    }

    /// `then` of the session with `head`'s branch current (see [`Store::session_on`]): read,
    /// or, when the session must move back to that branch, in the write that moves it.
    async fn on_branch<T: Send + 'static>(
        &self,
        session_id: &SessionId,
        head: Option<u64>,
        then: impl Fn(&Connection, SessionRow) -> Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        let then = std::sync::Arc::new(then);
        let (id, read) = (session_id.to_string(), then.clone());
        let found = self
            .read(move |conn| {
                let session = get_live(conn, &id)?;
                match holds(conn, &session, head)? {
                    true => read(conn, session).map(Some),
                    false => Ok(None),
                }
            })
            .await?;
        if let Some(found) = found {
            return Ok(found);
        }
        let id = session_id.to_string();
        self.write(move |conn| {
            let session = branch_of(conn, get_live(conn, &id)?, head)?;
            then(conn, session)
        })
        .await
    }

    async fn snapshot(&self, session_id: &SessionId, masked: bool) -> Result<ContextSnapshot> {
        let session_id = session_id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &session_id)?;
            snapshot_of(conn, session, masked)
        })
        .await
    }
}

/// Whether the session's current branch holds `head` (any head, when there is none).
fn holds(conn: &Connection, session: &SessionRow, head: Option<u64>) -> Result<bool> {
    Ok(match head {
        Some(head) if head > 0 && head != session.head_seq => {
            Branch::current(conn, session)?.contains(head)
        }
        _ => true,
    })
}

/// `session` with the branch `head` lies on current: see [`Store::session_on`].
pub(super) fn branch_of(
    conn: &Connection,
    session: SessionRow,
    head: Option<u64>,
) -> Result<SessionRow> {
    match (holds(conn, &session, head)?, head) {
        (false, Some(head)) => super::counters::switch_to(conn, &session, head),
        _ => Ok(session),
    }
}

/// The session's context as it stands: see [`Store::context`].
fn snapshot_of(conn: &Connection, session: SessionRow, masked: bool) -> Result<ContextSnapshot> {
    let branch = Branch::current(conn, &session)?;
    let pinned = pinned_before(conn, &session, &branch)?;
    let latest = latest_summary(conn, &session)?;
    let tail = active_messages(conn, &session, &branch, masked)?;
    Ok(ContextSnapshot {
        session,
        pinned,
        latest,
        tail,
        branch,
    })
}

/// The session's active messages, oldest first, with the tokens the context counts (masked
/// and shortened ones at their size in the context); their parts as the context shows them
/// when `masked`, else whole.
fn active_messages(
    conn: &Connection,
    session: &SessionRow,
    branch: &Branch,
    masked: bool,
) -> Result<Vec<StoredMessage>> {
    let columns = super::rows::message_context_columns(masked);
    let sql = format!(
        "SELECT {columns} FROM messages WHERE session_id = ?1 AND seq >= ?3 AND {} ORDER BY seq",
        branch.filter()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        params![
            session.id.as_str(),
            session.masked_through_seq,
            session.active_from_seq
        ],
        super::rows::message_from_row,
    )?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The compaction the session's current branch starts from: its number and summary (not
/// its file lists, which grow with the session and which a context does not need).
fn latest_summary(conn: &Connection, session: &SessionRow) -> Result<Option<LatestSummary>> {
    if session.summary_num == 0 {
        return Ok(None);
    }
    Ok(conn
        .prepare_cached("SELECT num, summary FROM compactions WHERE session_id = ?1 AND num = ?2")?
        .query_row(params![session.id.as_str(), session.summary_num], |row| {
            Ok(LatestSummary {
                compaction_num: row.get(0)?,
                summary: row.get(1)?,
            })
        })
        .optional()?)
}

/// The file lists of the compaction the current branch starts from, which the next one
/// extends.
fn latest_files(conn: &Connection, session: &SessionRow) -> Result<FileLists> {
    let lists = conn
        .prepare_cached(
            "SELECT read_files, modified_files, created_files, deleted_files FROM compactions
             WHERE session_id = ?1 AND num = ?2",
        )?
        .query_row(params![session.id.as_str(), session.summary_num], |row| {
            Ok([
                row.get::<_, String>(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
            ])
        })
        .optional()?;
    Ok(match lists {
        Some([read, modified, created, deleted]) => FileLists {
            read: serde_json::from_str(&read)?,
            modified: serde_json::from_str(&modified)?,
            created: serde_json::from_str(&created)?,
            deleted: serde_json::from_str(&deleted)?,
        },
        None => FileLists::default(),
    })
}

/// The pinned messages of the current branch before its active messages: they stand in
/// front of the summary.
fn pinned_before(
    conn: &Connection,
    session: &SessionRow,
    branch: &Branch,
) -> Result<Vec<StoredMessage>> {
    let sql = format!(
        "SELECT {} FROM messages WHERE session_id = ?1 AND pinned = 1 AND seq < ?2 AND {} ORDER BY seq",
        super::rows::MESSAGE_COLUMNS,
        branch.filter()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        params![session.id.as_str(), session.active_from_seq],
        super::rows::message_from_row,
    )?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Messages from `from_seq` on, in order: at most `limit`, and no more once `max_bytes` of
/// parts are taken (the first is always taken, so a page is never empty while messages remain).
fn messages_page(
    conn: &Connection,
    session_id: &str,
    from_seq: u64,
    limit: usize,
    max_bytes: usize,
) -> Result<Vec<StoredMessage>> {
    let sql = format!(
        "SELECT {} FROM messages WHERE session_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        super::rows::MESSAGE_COLUMNS
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let from_seq = i64::try_from(from_seq).unwrap_or(i64::MAX);
    let mut rows = stmt.query(params![session_id, from_seq, limit])?;
    let mut page = Vec::new();
    let mut bytes = 0;
    while let Some(row) = rows.next()? {
        let message = super::rows::message_from_row(row)?;
        bytes += message.parts.get().len();
        if bytes > max_bytes && !page.is_empty() {
            break;
        }
        page.push(message);
    }
    Ok(page)
}
