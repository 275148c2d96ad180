//! SQLite storage. All SQL lives in this module.
//!
//! One writer thread owns the only write connection and applies writes in batches: it takes
//! every write that queued while the previous commit was syncing and commits them in one
//! transaction (group commit), each inside its own savepoint so one bad request never undoes
//! another. A write is acknowledged only after its batch commits. Reads use a small pool of
//! their own connections; in WAL mode they never wait for the writer, and `sqlite3` can read
//! the database while the daemon runs.

mod compactions;
mod messages;
mod migrate;
mod rows;
mod sessions;
mod writer;

pub use compactions::{NewCompaction, NewFailure};
pub use messages::{AppendOutcome, NewMessage, PinRules};
pub use rows::{
    CompactionRow, ContextSnapshot, FailureRow, SessionRow, StoredMessage, TokenSource,
};
pub use sessions::{NewSession, SessionUpdate};

use crate::config::Synchronous;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use writer::Writer;

/// Why a store operation failed.
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
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("the store is closed")]
    Closed,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Sqlite(format!("stored JSON unreadable: {e}"))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The database: a writer thread and a pool of read connections. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: Arc<Writer>,
    readers: Arc<ReadPool>,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies migrations.
    pub fn open(path: &Path, synchronous: Synchronous) -> Result<Store> {
        create_private_file(path)?;
        let conn = Connection::open(path)?;
        configure(&conn)?;
        conn.execute_batch(&format!("PRAGMA synchronous = {};", synchronous.pragma()))?;
        migrate::migrate(&conn)?;
        Ok(Store {
            writer: Arc::new(Writer::start(conn)?),
            readers: Arc::new(ReadPool {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Runs `f` on the writer thread inside its own savepoint, and returns once its batch has
    /// committed. An `Err` from `f` rolls back `f`'s changes only.
    pub async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.writer.submit(f).await
    }

    /// Runs `f` on a read connection inside one read transaction (a consistent snapshot).
    /// Reads are short, bounded queries, so they run on the caller's thread.
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.readers.with(|conn| {
            conn.execute_batch("BEGIN")?;
            let result = f(conn);
            let _ = conn.execute_batch("COMMIT");
            result
        })
    }

    /// Stops the writer after the queued writes and closes the database.
    pub fn close(&self) {
        self.writer.close();
        self.readers.idle.lock().map(|mut v| v.clear()).ok();
    }
}

/// Idle read connections, opened on demand.
struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

/// Idle read connections kept open; more are opened under load and closed after.
const MAX_IDLE_READERS: usize = 4;

impl ReadPool {
    fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&conn)?;
                conn.execute_batch("PRAGMA query_only = ON;")?;
                conn
            }
        };
        let result = f(&conn);
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE_READERS
        {
            idle.push(conn);
        }
        result
    }
}

fn configure(conn: &Connection) -> Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA foreign_keys = ON;",
    )?;
    Ok(())
}

/// Creates the database file (and its directory) readable by its owner only: it holds
/// whole conversations. SQLite gives the -wal and -shm files the same permissions.
fn create_private_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| StoreError::Sqlite(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        crate::paths::create_private_dir(dir).map_err(io)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    Ok(())
}
