//! SQLite storage. All of compactd's SQL lives in this crate.
//!
//! One writer thread owns the only write connection and applies writes in batches: it takes
//! every write that queued while the previous commit was syncing and commits them in one
//! transaction (group commit), each inside its own savepoint so one bad request never undoes
//! another. A write is acknowledged only after its batch commits, and never to a database file
//! that was removed or replaced under the daemon. When idle, the writer folds the WAL back
//! into the database, so the WAL shrinks again once long readers let go. Around a commit the
//! writer and a lone caller poll for each other briefly instead of sleeping (`waiting`): on a
//! VM, waking a sleeping thread cost one client's append more than its SQL.
//!
//! Reads use a small pool of their own connections on blocking threads (never on the async
//! workers that serve requests), at most [`MAX_READERS`] at a time; in WAL mode they never
//! wait for the writer, and `sqlite3` can read the database while the daemon runs, never
//! write it: the writer keeps the write lock between its writes (see `kept_lock`).

mod backup;
pub mod blocking;
mod clock;
mod compactions;
mod conversations;
mod counters;
mod error;
mod file;
mod full_disk;
mod kept_lock;
mod mark;
mod maskings;
mod messages;
mod migrate;
mod outside_lock;
mod overflows;
mod path;
pub mod private_dir;
mod reading;
mod rows;
mod search;
mod sessions;
mod shortened;
mod stat;
mod waiting;
mod writer;

use compactd_core::{compaction, message};

pub use backup::backup;
pub use compactions::{NewCompaction, NewFailure};
pub use conversations::{Fingerprints, ProxyCall};
pub use error::StoreError;
pub use maskings::MaskingRow;
pub use messages::{Append, AppendOutcome, AppendRules, Idempotency, NewMessage};
pub use migrate::{SCHEMA, declare_writer};
pub use overflows::SentContext;
pub use path::Branch;
pub use rows::{CompactionRow, FailureRow};
pub use rows::{
    ContextSnapshot, ContextVersion, IMPLAUSIBLE_REPORT_DIVISOR, LatestSummary, SessionRow,
};
pub use search::{SearchHit, query_words, searchable_text};
pub use sessions::{NewSession, SessionUpdate};

use file::{DatabaseFile, NO_SYMLINK};
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use writer::Writer;

/// Reads running at once; more wait their turn (each holds a connection and its results).
pub(crate) const MAX_READERS: usize = 8;
/// How long a write waits for a lock another process holds before answering "busy".
pub const BUSY_WAIT: Duration = Duration::from_secs(2);
/// The writer's page cache, in KiB: the pages of the sessions it appends to stay in memory.
const WRITER_CACHE_KIB: u32 = 16 * 1024;
/// Why every write is refused now.
#[derive(Debug, Clone)]
pub struct WritesRefused {
    pub why: String,
    /// Refused until compactd is restarted (a file removed, replaced or overwritten under
    /// it); otherwise until there is room on the disk again, when writes go on by themselves.
    pub until_restart: bool,
}

/// After a checkpoint, SQLite truncates the WAL file to at most this size.
pub(crate) const WAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The database: a writer thread and a pool of read connections. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: Arc<Writer>,
    readers: Arc<ReadPool>,
    /// Turns for searches (see `search`).
    searches: Arc<Semaphore>,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies migrations.
    pub fn open(path: &Path, synchronous: Synchronous) -> Result<Store> {
        // Checked by name before SQLite opens it: a descriptor of ours, once closed, would
        // drop SQLite's locks (see `file`).
        let file = DatabaseFile::prepare(path)?;
        let vfs = kept_lock::name().map_err(StoreError::Internal)?;
        let conn =
            Connection::open_with_flags_and_vfs(path, OpenFlags::default() | NO_SYMLINK, vfs)?;
        file.confirm_opened()?;
        configure(&conn)?;
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}; PRAGMA journal_size_limit = {WAL_SIZE_LIMIT};
             PRAGMA cache_size = -{WRITER_CACHE_KIB};",
            synchronous.pragma()
        ))?;
        migrate::declare_writer(&conn)?;
        migrate::migrate(&conn)?;
        // The WAL and shared-memory files take the database's mode when SQLite creates them;
        // ones left by an earlier run keep theirs, so they are made private too.
        for suffix in file::SIDE_FILES {
            file::make_private(&file.side_file(suffix))?;
        }
        file.note_side_files();
        Ok(Store {
            writer: Arc::new(Writer::start(conn, file)?),
            readers: Arc::new(ReadPool {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
                permits: Semaphore::new(MAX_READERS),
            }),
            searches: Arc::new(Semaphore::new(search::MAX_SEARCHES)),
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

    /// Runs `f` on a read connection inside one read transaction (a consistent snapshot), on
    /// a blocking thread, once one of the [`MAX_READERS`] permits is free. Refused once the
    /// database file was seen overwritten ([`StoreError::Overwritten`]).
    pub async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.writer.unless_overwritten()?;
        let readers = self.readers.clone();
        let _permit = readers
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Closed)?;
        let pool = readers.clone();
        tokio::task::spawn_blocking(move || {
            pool.with(|conn| {
                conn.execute_batch("BEGIN")?;
                let result = f(conn);
                let _ = conn.execute_batch("COMMIT");
                result
            })
        })
        .await
        .map_err(|e| StoreError::Internal(format!("a read stopped: {e}")))?
    }

    /// The same read, on this thread: for tools that run no async runtime.
    pub fn read_now<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.writer.unless_overwritten()?;
        self.readers.with(|conn| {
            conn.execute_batch("BEGIN")?;
            let result = f(conn);
            let _ = conn.execute_batch("COMMIT");
            result
        })
    }

    /// Why writes are refused now, if they are: the database file, its WAL or its index
    /// removed, replaced or overwritten under the daemon, or the disk full.
    pub fn writes_refused(&self) -> Option<WritesRefused> {
        self.writer.refused_because()
    }

    /// Whether another process held the database's write lock at the writer's last try (each
    /// write, each idle second): writes wait for it and fail `busy` meanwhile.
    pub fn write_lock_held_elsewhere(&self) -> bool {
        self.writer.write_lock_held_elsewhere()
    }

    /// The database file and its WAL (bytes), and the space free on their file system (for
    /// the daemon's user), if it says.
    pub fn disk_usage(&self) -> (u64, Option<u64>) {
        self.writer.disk_usage()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.readers.path
    }

    /// Stops the writer after the queued writes and closes the database.
    pub fn close(&self) {
        self.writer.close();
        self.readers.permits.close();
        let overwritten = self.writer.file_overwritten();
        if let Ok(mut idle) = self.readers.idle.lock() {
            for conn in idle.drain(..) {
                // The last connection to close would fold the WAL into an overwritten file.
                if overwritten {
                    writer::keep_wal_at_close(&conn);
                }
            }
        }
        self.writer.set_aside_stale_wal();
    }
}

/// Idle read connections, opened on demand.
struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
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
                    OpenFlags::SQLITE_OPEN_READ_WRITE
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX
                        | NO_SYMLINK,
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
    conn.busy_timeout(BUSY_WAIT)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA foreign_keys = ON;",
    )?;
    Ok(())
}

/// SQLite's `synchronous` setting. `full` (default) makes every acknowledged append survive
/// power loss; `normal` survives a crash of compactd but may lose the last appends on power loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    #[default]
    Full,
    Normal,
}

impl Synchronous {
    pub fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}
