//! Sessions: create, read, update, mark deleted, and the circuit breaker's counter.

use super::rows::SessionRow;
use super::{Result, Store, StoreError};
use compactd_core::SessionId;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use std::sync::LazyLock;

/// The current time as stored: UTC ISO 8601 with milliseconds.
pub(super) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// Sessions a walk over all of them reads at a time (see [`Store::next_sessions`]).
const SESSION_SCAN_PAGE: usize = 500;

/// A session to create.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: SessionId,
    pub model: Option<String>,
    pub context_limit: usize,
    /// Validated `[compaction]` overrides, a JSON object.
    pub overrides: Value,
    /// For sessions the proxy makes: a hash of the client's API key.
    pub owner: Option<String>,
    /// Why `context_limit` is what it is (the model table, a header, the default).
    pub limit_source: Option<String>,
}

/// Changes to a session; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SessionUpdate {
    pub model: Option<String>,
    pub context_limit: Option<usize>,
    pub overrides: Option<Value>,
}

/// The statement [`get_live`] runs: made once (every append runs it).
static GET_LIVE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, deleted_at IS NOT NULL FROM sessions WHERE id = ?1",
        SessionRow::COLUMNS
    )
});

/// The session `id`, unless it is missing or deleted.
pub(super) fn get_live(conn: &Connection, id: &str) -> Result<SessionRow> {
    let found = conn
        .prepare_cached(&GET_LIVE)?
        .query_row([id], |row| {
            Ok((
                SessionRow::from_row(row)?,
                row.get::<_, bool>(SessionRow::COUNT)?,
            ))
        })
        .optional()?;
    match found {
        Some((session, false)) => Ok(session),
        Some((_, true)) => Err(StoreError::Deleted(id.to_string())),
        None => Err(StoreError::NotFound(id.to_string())),
    }
}

pub(super) fn insert(conn: &Connection, new: &NewSession) -> Result<SessionRow> {
    let exists: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1)")?
        .query_row([new.id.as_str()], |r| r.get(0))?;
    if exists {
        return Err(StoreError::Exists(new.id.to_string()));
    }
    conn.prepare_cached(&format!(
        "INSERT INTO sessions (id, model, context_limit, overrides, created_at, updated_at, owner,
             limit_source, kind)
         VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW}, ?5, ?6, CASE WHEN ?5 IS NULL THEN 'api' ELSE 'proxy' END)"
    ))?
    .execute(params![
        new.id.as_str(),
        new.model,
        new.context_limit,
        new.overrides.to_string(),
        new.owner,
        new.limit_source
    ])?;
    get_live(conn, new.id.as_str())
}

impl Store {
    pub async fn create_session(&self, new: NewSession) -> Result<SessionRow> {
        self.write(move |conn| insert(conn, &new)).await
    }

    pub async fn session(&self, id: &SessionId) -> Result<SessionRow> {
        let id = id.to_string();
        self.read(move |conn| get_live(conn, &id)).await
    }

    /// The session, and the tokens of its system messages stored unpinned (see
    /// `AppendOutcome::unpinned_system_tokens`): read for its view, never per call.
    pub async fn session_with_unpinned_system(
        &self,
        id: &SessionId,
    ) -> Result<(SessionRow, usize)> {
        let id = id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &id)?;
            let unpinned: usize = conn
                .prepare_cached(
                    "SELECT coalesce(sum(tokens), 0) FROM messages
                     WHERE session_id = ?1 AND role = 'system' AND pinned = 0",
                )?
                .query_row([&id], |r| r.get(0))?;
            Ok((session, unpinned))
        })
        .await
    }

    /// A page of the live sessions in id order: those after `after`, at most `limit`.
    pub async fn sessions_page(&self, after: String, limit: usize) -> Result<Vec<SessionRow>> {
        self.read(move |conn| {
            let sql = format!(
                "SELECT {} FROM sessions WHERE deleted_at IS NULL AND id > ?1 ORDER BY id LIMIT ?2",
                SessionRow::COLUMNS
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows =
                stmt.query_map(rusqlite::params![after, limit as i64], SessionRow::from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// How many live sessions there are.
    pub async fn session_count(&self) -> Result<u64> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached("SELECT count(*) FROM sessions WHERE deleted_at IS NULL")?
                .query_row([], |r| r.get(0))?)
        })
        .await
    }

    /// The next page of live sessions in id order, those after `cursor`, which moves past
    /// them; an empty page is the end. What walks every session (a config check, the
    /// compactions due after a start or a reload) holds one page at a time, however many
    /// sessions the database has.
    pub async fn next_sessions(&self, cursor: &mut String) -> Result<Vec<SessionRow>> {
        let page = self
            .sessions_page(cursor.clone(), SESSION_SCAN_PAGE)
            .await?;
        if let Some(last) = page.last() {
            *cursor = last.id.to_string();
        }
        Ok(page)
    }

    /// Changes the session; when its limit or overrides change, its messages are shortened
    /// again for the step budget `rules` gives the changed session.
    pub async fn update_session(
        &self,
        id: &SessionId,
        update: SessionUpdate,
        rules: impl Fn(&SessionRow) -> super::AppendRules + Send + 'static,
    ) -> Result<SessionRow> {
        let id = id.to_string();
        self.write(move |conn| {
            get_live(conn, &id)?;
            let reshape = update.context_limit.is_some() || update.overrides.is_some();
            conn.prepare_cached(&format!(
                "UPDATE sessions SET model = coalesce(?2, model),
                     context_limit = coalesce(?3, context_limit),
                     overrides = coalesce(?4, overrides),
                     updated_at = {NOW}
                 WHERE id = ?1"
            ))?
            .execute(params![
                id,
                update.model,
                update.context_limit,
                update.overrides.map(|o| o.to_string())
            ])?;
            let session = get_live(conn, &id)?;
            if reshape {
                // The model's last report measured the context as it was shown before.
                conn.prepare_cached(
                    "UPDATE sessions SET reported_tokens = NULL, tokens_since_report = 0 WHERE id = ?1",
                )?
                .execute([&id])?;
                let budget = rules(&session).step_budget;
                return super::shortened::reshorten_active(conn, &get_live(conn, &id)?, budget);
            }
            Ok(session)
        })
        .await
    }

    /// Marks the session deleted. Its rows stay for `sqlite3`; the API no longer shows it.
    pub async fn delete_session(&self, id: &SessionId) -> Result<()> {
        let id = id.to_string();
        self.write(move |conn| {
            get_live(conn, &id)?;
            conn.prepare_cached(&format!(
                "UPDATE sessions SET deleted_at = {NOW} WHERE id = ?1"
            ))?
            .execute([&id])?;
            Ok(())
        })
        .await
    }

    /// Counts an automatic compaction attempt in the current turn; returns the new count, or
    /// `None` if the turn has moved on (a user message arrived) since `turn_start_seq`.
    pub async fn record_attempt(&self, id: &SessionId, turn_start_seq: u64) -> Result<Option<u32>> {
        let id = id.to_string();
        self.write(move |conn| {
            Ok(conn
                .prepare_cached(
                    "UPDATE sessions SET turn_attempts = turn_attempts + 1
                     WHERE id = ?1 AND turn_start_seq = ?2 RETURNING turn_attempts",
                )?
                .query_row(params![id, turn_start_seq], |r| r.get(0))
                .optional()?)
        })
        .await
    }
}
