//! Why a store operation failed, split by what a caller does about it: tell the client its
//! request cannot be served as asked (not found, conflict, ...), ask it to retry later (busy,
//! full), or report a fault of ours (I/O, SQLite, corrupt data, internal). Faults keep their
//! source.

use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("session `{0}` not found")]
    NotFound(String),
    #[error("session `{0}` already exists")]
    Exists(String),
    #[error("session `{0}` was deleted; its history is kept, but it takes no new messages")]
    Deleted(String),
    #[error("tool_result for call_id `{0}`, but this session has no tool_call with that id")]
    UnknownCall(String),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "pinned messages (system messages and the task) would take {pinned} tokens, more than the {max} this session's context can spare for them; shorten the system message, raise context_limit or lower pin_first_user_tokens"
    )]
    PinnedTooLarge { pinned: usize, max: usize },
    /// A proxy caller over the loopback listener made sessions too fast; retry after so many
    /// seconds.
    #[error(
        "this API key (or all keys over the loopback listener together) made new sessions faster than compactd lets one make them; retry in {0} s, or continue a conversation (x-compactd-session names one)"
    )]
    TooManySessions(u64),
    /// The full-text index refused a search's query.
    #[error("{0}")]
    BadQuery(String),
    #[error("idempotency key `{0}` was used before for a different request")]
    IdempotencyMismatch(String),
    /// Another process (a `sqlite3` user, say) holds the database's write lock.
    #[error("the database is locked by another process; retry shortly")]
    Busy,
    /// The disk (or the file system's quota) is full.
    #[error("the disk holding the database is full")]
    Full,
    /// The database file was removed or replaced under the running daemon; writing on would
    /// lose every acknowledged append at exit.
    #[error("the database file {0} was removed or replaced while compactd ran; restart it")]
    Gone(PathBuf),
    /// The database's WAL or its shared-memory index was removed (or replaced) under the
    /// running daemon: what a removed WAL held was folded into the database file, and no
    /// write is taken until a restart gives SQLite files that are on disk again.
    #[error(
        "{} was removed or replaced while compactd ran; every acknowledged write is kept, and no more are taken until compactd is restarted", path.display()
    )]
    SideFileGone { path: PathBuf, wal: bool },
    /// The database file or its WAL shrank under the running daemon, or the file was found
    /// holding an older state than before: something wrote it outside SQLite (a copy over
    /// the database, the WAL emptied), so the two no longer fit together. Nothing is read or
    /// written (a context read from the mix could be unsound), and the WAL is set aside, not
    /// folded into the database file, when the daemon stops (see [`super::file::DatabaseFile`]).
    #[error(
        "{} was written outside SQLite while compactd ran ({how}): the database and its WAL no longer fit together, so nothing more is read or written. Restart compactd: stopping, it sets the WAL aside (as {}-wal.overwritten-<time>) and the database file opens as it is", path.display(), database.display()
    )]
    Overwritten {
        path: PathBuf,
        database: PathBuf,
        /// What was found: which file shrank and how, or the file's older mark.
        how: String,
    },
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: Arc<std::io::Error>,
    },
    #[error("stored data unreadable: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Sqlite(#[source] Arc<rusqlite::Error>),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// Every write is refused for now (a full disk; a file removed, replaced or overwritten
    /// under the daemon), whatever it is.
    pub fn refuses_writes(&self) -> bool {
        matches!(
            self,
            StoreError::Full
                | StoreError::Gone(_)
                | StoreError::SideFileGone { .. }
                | StoreError::Overwritten { .. }
        )
    }

    /// A proxied call can go on without being recorded: every write is refused for now, or
    /// another process holds the database's write lock past the bounded wait (a person's
    /// transaction, open since before the daemon took the lock). An agent
    /// sends its whole conversation with every call, so its next call stores what this one
    /// could not; the agent never stops for compactd's database.
    pub fn leaves_a_call_unrecorded(&self) -> bool {
        self.refuses_writes() || matches!(self, StoreError::Busy)
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            error: Arc::new(source),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::*;
        match e.sqlite_error_code() {
            Some(DatabaseBusy | DatabaseLocked) => StoreError::Busy,
            Some(DiskFull) => StoreError::Full,
            Some(DatabaseCorrupt | NotADatabase) => StoreError::Corrupt(e.to_string()),
            _ => StoreError::Sqlite(Arc::new(e)),
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(format!("stored JSON: {e}"))
    }
}
