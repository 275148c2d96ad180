//! The write connection: a write alone commits on its caller's thread, writes that come
//! together on the writer thread in one transaction (group commit); a guard against writing
//! to a database file that is gone; WAL upkeep and search indexing while idle.
//!
//! From the first time it takes the database's write lock the connection keeps it, between
//! its transactions too, until it closes (see [`super::kept_lock`]). `schema.sql`'s triggers
//! refuse a person's INSERT, UPDATE and DELETE, but not what writes pages without them:
//! `sqlite3 DB ".restore old.db"` on the live database would replace it with the copy, and
//! every write acknowledged since the copy would be gone. Kept, the lock makes any other
//! process's write wait for its busy timeout and fail (`database is locked`), under load as
//! when idle, while readers (`sqlite3` queries, `.dump`, `.backup`, `compactd backup`) go on
//! as before: in WAL mode a writer never blocks them.

use super::file::DatabaseFile;
use super::full_disk::FullDisk;
use super::mark::FileMark;
use super::waiting::{self, InFlight};
use super::{Result, StoreError};
use rusqlite::Connection;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Called with the batch's commit outcome; sends the job's result to its caller.
type Completion = Box<dyn FnOnce(Result<()>) + Send>;
/// A write: runs in a savepoint (or, given no connection, does not run at all) and returns how
/// to complete once the batch's outcome is known.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;
/// A job sent to the writer thread, with when its caller stops waiting for another
/// process's lock ([`super::BUSY_WAIT`] after it was submitted).
type Queued = (Instant, Job);

/// Writes queued behind one commit are applied together, up to this many.
const MAX_BATCH: usize = 256;
/// After this long without writes, the writer checkpoints the WAL.
const IDLE: Duration = Duration::from_secs(1);
/// After this long without writes, the writer indexes new messages for search: an agent's
/// next append comes seconds later, a tight loop's within this.
const INDEX_AFTER: Duration = Duration::from_millis(20);
/// A busy writer asks how many messages wait for the search index once per this many
/// batches: the question is a statement of its own, 5-10% of a one-append batch's work.
const INDEX_CHECK_EVERY: u32 = 32;
/// A WAL smaller than this is left alone when idle: twice what the checkpoint after a
/// commit lets it reach (1,000 pages of 4 KiB, plus the batch that passed them and the one
/// after, which raises the file's mark first: see [`super::mark`]). After
/// each checkpoint SQLite writes the WAL over again from its start, and a commit over bytes
/// the file already has costs an fsync of its data only, where one that grows the file syncs
/// its size as well (Python's `sqlite3`, 400 single-row transactions here: p50 213-238 µs
/// over a written WAL, 324-465 µs onto one growing from empty). Truncating the usual WAL at
/// every idle second put an agent's appends, which come seconds apart, always on a growing one.
const WAL_WORTH_TRUNCATING: u64 = 8 * 1024 * 1024;

pub(super) struct Writer {
    jobs: Mutex<Option<Sender<Queued>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    in_flight: InFlight,
    shared: Arc<Shared>,
    full_disk: FullDisk,
}

/// What the writer thread shares with a caller that writes on its own thread (see
/// [`Writer::submit`]).
struct Shared {
    /// The write connection; the writer thread takes it out when it stops, so a caller that
    /// comes later finds none and hears [`StoreError::Closed`].
    conn: Mutex<Option<Connection>>,
    database: DatabaseFile,
    /// The database file's mark, raised and checked around commits (see [`super::mark`]).
    mark: Arc<FileMark>,
    /// Batches committed, by the thread and by callers: every [`INDEX_CHECK_EVERY`]th checks
    /// the search index's lag.
    batches: AtomicU32,
    /// Set by a caller's commit: the thread, timing its idle work, was not told of it.
    wrote: AtomicBool,
    /// Why writes are refused was said (and what a removed WAL held folded into the
    /// database, once being enough: no write commits after): see [`Removed`].
    refusal_said: [AtomicBool; 4],
}

/// The file whose removal under the daemon makes the writer refuse every write, each said
/// once in the log, not once per refused write: a client retrying a refused append every
/// second would fill the journal.
#[derive(Clone, Copy)]
enum Removed {
    Wal = 0,
    Index = 1,
    /// The database file, moved or removed: said again if it comes back and goes once more.
    Database = 2,
    /// The database file or its WAL, written outside SQLite (see [`StoreError::Overwritten`]).
    Overwritten = 3,
}

impl Removed {
    fn of(why: &StoreError) -> Option<Removed> {
        match why {
            StoreError::SideFileGone { wal: true, .. } => Some(Removed::Wal),
            StoreError::SideFileGone { wal: false, .. } => Some(Removed::Index),
            StoreError::Gone(_) => Some(Removed::Database),
            StoreError::Overwritten { .. } => Some(Removed::Overwritten),
            _ => None,
        }
    }
}

impl Shared {
    /// Commits `batch` (see [`commit_batch`]) on the connection, if it is still open, waiting
    /// for another process's lock until `deadline` at most.
    fn commit(&self, conn: &Option<Connection>, batch: Vec<Job>, deadline: Instant) {
        let batches = self.batches.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        match conn {
            Some(conn) => {
                let committed = commit_batch(
                    conn,
                    &self.database,
                    &self.mark,
                    batch,
                    deadline,
                    batches.is_multiple_of(INDEX_CHECK_EVERY),
                    |why| self.refuse(conn, why),
                );
                if committed {
                    self.back();
                }
            }
            None => {
                for job in batch {
                    job(None)(Err(StoreError::Closed));
                }
            }
        }
    }

    /// Says why writes are refused ([`refuse_writes`]), once for each [`Removed`] file.
    fn refuse(&self, conn: &Connection, why: &StoreError) {
        let Some(removed) = Removed::of(why) else {
            return;
        };
        if !self.refusal_said[removed as usize].swap(true, Ordering::AcqRel) {
            refuse_writes(conn, why);
        }
    }

    /// The database file is where it was (a write committed, or the idle look found it):
    /// a refusal for its removal is over, and said again should it go once more.
    fn back(&self) {
        let gone = &self.refusal_said[Removed::Database as usize];
        if gone.load(Ordering::Relaxed) {
            gone.store(false, Ordering::Relaxed);
        }
    }
}

impl Writer {
    /// Whether the database file was seen overwritten (see [`StoreError::Overwritten`]).
    pub(super) fn file_overwritten(&self) -> bool {
        self.shared.database.overwritten()
    }

    /// [`StoreError::Overwritten`] once the database file was seen overwritten: reads stop too.
    pub(super) fn unless_overwritten(&self) -> Result<()> {
        self.shared.database.unless_overwritten()
    }

    /// Why writes are refused now, if they are: a file removed, replaced or overwritten under
    /// the daemon (until a restart), or a full disk (until there is room).
    pub(super) fn refused_because(&self) -> Option<super::WritesRefused> {
        let database = &self.shared.database;
        let gone = self.shared.refusal_said[Removed::Database as usize].load(Ordering::Relaxed);
        let why = database.refused_for_good();
        let until_restart =
            why.or_else(|| gone.then(|| database.gone()))
                .map(|why| super::WritesRefused {
                    why: why.to_string(),
                    until_restart: true,
                });
        until_restart.or_else(|| {
            self.full_disk.refusing().map(|why| super::WritesRefused {
                why,
                until_restart: false,
            })
        })
    }

    /// See [`super::outside_lock`].
    pub(super) fn write_lock_held_elsewhere(&self) -> bool {
        self.shared.database.outside_lock.held()
    }

    /// The database file and its WAL (bytes), and the space free on their file system.
    pub(super) fn disk_usage(&self) -> (u64, Option<u64>) {
        let database = &self.shared.database;
        let used = super::stat::look(database.path())
            .map_or(0, |seen| seen.size)
            .saturating_add(database.wal_size());
        let free = super::full_disk::free_space(self.full_disk.dir()).map(|(free, _)| free);
        (used, free)
    }

    /// Once every connection is closed: sets an overwritten database's WAL aside, saying so.
    pub(super) fn set_aside_stale_wal(&self) {
        self.shared.database.set_aside_side_files();
    }

    pub(super) fn start(mut conn: Connection, database: DatabaseFile) -> Result<Writer> {
        let mark = FileMark::new(&conn);
        // In place of SQLite's own checkpoint after a commit: the mark is raised before it.
        conn.wal_hook(Some({
            let mark = mark.clone();
            move |wal: &mut rusqlite::hooks::Wal, pages| {
                mark.after_commit(wal, pages);
                Ok(())
            }
        }))?;
        take_write_lock(&conn, &database);
        let full_disk = FullDisk::new(database.path());
        let (tx, rx) = channel::<Queued>();
        let shared = Arc::new(Shared {
            conn: Mutex::new(Some(conn)),
            database,
            mark,
            batches: AtomicU32::new(0),
            wrote: AtomicBool::new(false),
            refusal_said: Default::default(),
        });
        let thread = std::thread::Builder::new()
            .name("compactd-writer".into())
            .spawn({
                let shared = shared.clone();
                move || run(&shared, rx)
            })
            .map_err(|e| StoreError::Internal(format!("cannot start the writer thread: {e}")))?;
        Ok(Writer {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            in_flight: InFlight::default(),
            shared,
            full_disk,
        })
    }

    /// Runs `f` in a savepoint of a batch and returns once the batch committed. A write with
    /// none other in flight commits on the caller's own thread when the connection is free
    /// (tokio's `block_in_place`): handing it to the writer thread and back costs two thread
    /// wake-ups, on a VM more than its SQL. Writes that come together go to the writer
    /// thread, which commits them as one batch.
    pub(super) async fn submit<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Some(conn) => in_savepoint(conn, f),
                None => Err(StoreError::Closed),
            };
            Box::new(move |commit: Result<()>| {
                let _ = reply.send(commit.and(result));
            })
        });
        let entered = self.in_flight.enter();
        let sender = self.jobs.lock().ok().and_then(|s| s.clone());
        let sender = sender.ok_or(StoreError::Closed)?;
        let deadline = Instant::now() + super::BUSY_WAIT;
        if let Some(job) = self.commit_here(job, entered.alone, deadline) {
            sender
                .send((deadline, job))
                .map_err(|_| StoreError::Closed)?;
        }
        let outcome = answer.await.map_err(|_| StoreError::Closed)?;
        self.full_disk.note(&outcome);
        outcome
    }

    /// Commits `job` on this thread if it is `alone`, the runtime lets a task block, and the
    /// connection is free; gives it back otherwise.
    fn commit_here(&self, job: Job, alone: bool, deadline: Instant) -> Option<Job> {
        if !alone || !crate::blocking::may_block_in_place() {
            return Some(job);
        }
        let conn = match self.shared.conn.try_lock() {
            Ok(conn) => conn,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(job),
        };
        crate::blocking::off_the_worker(|| self.shared.commit(&conn, vec![job], deadline));
        self.shared.wrote.store(true, Ordering::Release);
        None
    }

    /// Lets queued writes finish, then stops the thread (closing the connection).
    pub(super) fn close(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, jobs: Receiver<Queued>) {
    let lock = || shared.conn.lock().unwrap_or_else(PoisonError::into_inner);
    // Whether messages may wait for the search index (see `search`): checked after writes.
    let mut index_pending = true;
    let mut just_committed = false;
    let mut backoff = waiting::Backoff::default();
    loop {
        let wait = if index_pending { INDEX_AFTER } else { IDLE };
        let (deadline, first) = match waiting::next_job(&jobs, just_committed, wait, &mut backoff) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => {
                just_committed = false;
                // A caller wrote in the meantime: not idle yet.
                if shared.wrote.swap(false, Ordering::AcqRel) {
                    index_pending = true;
                    continue;
                }
                let conn = lock();
                let Some(conn) = conn.as_ref() else { break };
                // A WAL removed while no write came: its frames are folded at once, not at
                // the next write (a kill -9 meanwhile would lose them). An overwritten file
                // gets no upkeep: a checkpoint would write the WAL's pages into the copy.
                let there = unchanged(conn, &shared.database, &shared.mark);
                match &there {
                    Ok(()) => shared.back(),
                    Err(why) => shared.refuse(conn, why),
                }
                if let Err(StoreError::SideFileGone { .. } | StoreError::Overwritten { .. }) =
                    &there
                {
                    continue;
                }
                if index_pending {
                    index_pending = index_when_idle(conn, &shared.database, &shared.mark);
                } else {
                    checkpoint_when_idle(conn, &shared.database, &shared.mark);
                }
                if there.is_ok() {
                    take_write_lock(conn, &shared.database);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        index_pending = true;
        just_committed = true;
        let conn = lock();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok((_, job)) => batch.push(job),
                Err(_) => break,
            }
        }
        shared.commit(&conn, batch, deadline);
    }
    // Channel closed: fold the WAL back into the database, then close the connection; but
    // never into a file overwritten under the daemon, whose pages the WAL's no longer fit.
    if let Some(conn) = lock().take() {
        let _ = unchanged(&conn, &shared.database, &shared.mark);
        if shared.database.overwritten() {
            keep_wal_at_close(&conn);
        } else {
            let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
        }
    }
}

/// Leaves the WAL as it is when `conn` closes (SQLite folds it into the database file when
/// the last connection closes, unless told not to): for a database file overwritten under the
/// daemon, whose copy stays as copied, and the WAL beside it for whoever wants its frames.
pub(super) fn keep_wal_at_close(conn: &Connection) {
    let _ = conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    );
}

/// Runs every job of the batch in one transaction and tells each caller the outcome; with
/// `check_index`, also indexes for search if many messages wait. A commit refused because a
/// file was removed under the daemon goes to `refused` before any caller hears of it. Returns
/// whether the batch committed.
fn commit_batch(
    conn: &Connection,
    database: &DatabaseFile,
    mark: &FileMark,
    batch: Vec<Job>,
    deadline: Instant,
    check_index: bool,
    refused: impl FnOnce(&StoreError),
) -> bool {
    // Nothing runs on a file known overwritten (its reads are of a mix of pages), nor without
    // a transaction: every caller hears why.
    let begun = database
        .unless_overwritten()
        .and_then(|()| begin(conn, database, deadline));
    if let Err(e) = begun {
        refused(&e);
        for job in batch {
            job(None)(Err(e.clone()));
        }
        return false;
    }
    let completions: Vec<Completion> = batch.into_iter().map(|job| job(Some(conn))).collect();
    // A client that never pauses still gets its messages indexed, a step at a time.
    if check_index && super::search::unindexed(conn).is_ok_and(|n| n >= super::search::INDEX_LAG) {
        index_in_savepoint(conn);
    }
    // Never acknowledge a write to a file nobody will find again.
    let commit = commit_if_unchanged(conn, database, mark);
    if let Err(e) = &commit {
        refused(e);
    }
    let committed = commit.is_ok();
    for complete in completions {
        complete(commit.clone());
    }
    if committed {
        database.note_size();
    }
    committed
}

/// Indexes a step of the messages waiting for the search index in a transaction of its own;
/// returns whether to try again at the next idle moment (more wait). A failure leaves them
/// for the next write or search (nothing is lost: the messages are stored; only their index
/// entries wait).
fn index_when_idle(conn: &Connection, database: &DatabaseFile, mark: &FileMark) -> bool {
    if super::search::unindexed(conn).is_ok_and(|n| n == 0) {
        return false;
    }
    // Never wait for another process's lock here (a `sqlite3` user's): the next write or
    // search indexes them instead.
    if begin(conn, database, Instant::now()).is_err() {
        return false;
    }
    let indexed = in_savepoint(conn, |c| {
        super::search::index_pending(c, super::search::INDEX_STEP)
    });
    if commit_if_unchanged(conn, database, mark).is_err() {
        return false;
    }
    database.note_size();
    indexed.is_ok_and(|step| step.more)
}

/// Indexes pending messages inside the open batch transaction, alone in a savepoint.
fn index_in_savepoint(conn: &Connection) {
    if let Err(e) = in_savepoint(conn, |c| {
        super::search::index_pending(c, super::search::INDEX_STEP)
    }) {
        tracing::warn!(error = %e, "cannot index new messages for search; trying again later");
    }
}

/// Says why writes are refused when the database file or a side file was removed under the
/// daemon, folding what a removed WAL holds into the database file first.
fn refuse_writes(conn: &Connection, why: &StoreError) {
    match why {
        StoreError::SideFileGone { wal: true, .. } => rescue_unlinked_wal(conn, why),
        _ => tracing::error!(error = %why, "refusing writes"),
    }
}

/// Folds what a WAL removed from under the daemon holds into the database file, which is still
/// there: SQLite still has the removed WAL open, and every acknowledged write since the last
/// checkpoint is in it alone. Writes are refused from then on ([`StoreError::SideFileGone`]).
fn rescue_unlinked_wal(conn: &Connection, gone: &StoreError) {
    let folded: rusqlite::Result<(i64, i64, i64)> =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        });
    match folded {
        Ok((0, log, done)) if log == done => {
            tracing::error!(error = %gone, "refusing writes; the removed WAL's frames are in the database file")
        }
        other => {
            tracing::error!(error = %gone, result = ?other, "refusing writes; the removed WAL could not be folded into the database whole: stop compactd (SIGTERM) so SQLite folds it as it closes, never kill -9")
        }
    }
}

/// Folds a large WAL back into the database and truncates it, without waiting: if a reader
/// (a `sqlite3` user holding a snapshot, say) still needs the WAL, it tries again later. The
/// WAL grows while such a reader holds on, and shrinks within [`IDLE`] of it letting go.
fn checkpoint_when_idle(conn: &Connection, database: &DatabaseFile, mark: &FileMark) {
    if database.wal_size() < WAL_WORTH_TRUNCATING {
        return;
    }
    // The mark raised first, so the file holds it once checkpointed (in its own transaction:
    // a checkpoint cannot run inside one).
    let raised = mark.raise_alone(conn);
    let folded: rusqlite::Result<(i64, i64, i64)> = without_waiting(conn, || {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
    });
    match folded {
        Ok((0, log, done)) if log == done && raised => mark.checkpointed(),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "WAL checkpoint deferred: a reader still uses it"),
    }
    database.note_size();
    database.wal_rebaseline();
}

/// The database file is where it was, no smaller than seen, and holds no older state than
/// seen (its mark: see [`super::mark`]); [`StoreError::Overwritten`] or why not otherwise.
fn unchanged(conn: &Connection, database: &DatabaseFile, mark: &FileMark) -> Result<()> {
    database.still_there()?;
    if let Err(older) = mark.check(conn) {
        database.found_older(older);
    }
    database.unless_overwritten()
}

/// Commits the open write transaction if the database file is [`unchanged`], raising its
/// mark in it when due; rolls it back otherwise.
fn commit_if_unchanged(conn: &Connection, database: &DatabaseFile, mark: &FileMark) -> Result<()> {
    let commit = unchanged(conn, database, mark).and_then(|()| {
        mark.raise_if_due(conn);
        run_statement(conn, "COMMIT")
    });
    mark.committed(commit.is_ok());
    if commit.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    commit
}

/// Runs `f` with the connection's busy timeout at zero: what the writer does on its own
/// account (idle upkeep, taking the lock it holds) never waits for another process's lock;
/// the next write, which a caller waits for, waits its [`super::BUSY_WAIT`] instead.
fn without_waiting<T>(conn: &Connection, f: impl FnOnce() -> T) -> T {
    let _ = conn.busy_timeout(Duration::ZERO);
    let result = f();
    let _ = conn.busy_timeout(super::BUSY_WAIT);
    result
}

/// Begins a write transaction. Where the connection did not keep the write lock (another
/// process had it at the last try), it waits for it until `deadline` at most, not a whole
/// [`super::BUSY_WAIT`] per batch: writes queued behind one that waited have waited too.
/// That process may also have checkpointed the WAL to nothing: its size is taken afresh.
fn begin(conn: &Connection, database: &DatabaseFile, deadline: Instant) -> Result<()> {
    let begun = match super::kept_lock::kept(conn) {
        true => run_statement(conn, "BEGIN IMMEDIATE"),
        false => {
            database.wal_rebaseline();
            let _ = conn.busy_timeout(deadline.saturating_duration_since(Instant::now()));
            let begun = run_statement(conn, "BEGIN IMMEDIATE");
            let _ = conn.busy_timeout(super::BUSY_WAIT);
            begun
        }
    };
    database
        .outside_lock
        .tried(matches!(begun, Err(StoreError::Busy)));
    begun
}

/// Takes the database's write lock if the connection does not keep it yet, which it then
/// does until it closes (see the module). Never waits: if a person's transaction holds the
/// lock now (taken before the daemon started), the next write waits for it instead, and
/// takes it for good once the person lets go.
fn take_write_lock(conn: &Connection, database: &DatabaseFile) {
    if super::kept_lock::kept(conn) {
        return;
    }
    let taken = without_waiting(conn, || {
        run_statement(conn, "BEGIN IMMEDIATE")?;
        run_statement(conn, "COMMIT").inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })
    });
    database
        .outside_lock
        .tried(matches!(taken, Err(StoreError::Busy)));
    if taken.is_err() {
        database.wal_rebaseline();
    }
}

/// Runs one transaction-control statement, prepared once per connection: these run several
/// times per write, and parsing them each time shows in the append latency.
fn run_statement(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Runs `f` in a savepoint: its changes stay on success and vanish on error or panic. A
/// savepoint inside another (a job's own part) works the same: SQLite's `RELEASE` and
/// `ROLLBACK TO` name the innermost savepoint of that name.
pub(super) fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    run_statement(conn, "SAVEPOINT job")?;
    let result = catch_unwind(AssertUnwindSafe(|| f(conn)))
        .unwrap_or_else(|_| Err(StoreError::Internal("a write panicked".into())));
    match &result {
        Ok(_) => run_statement(conn, "RELEASE job")?,
        Err(_) => {
            run_statement(conn, "ROLLBACK TO job")?;
            run_statement(conn, "RELEASE job")?;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use crate::{Store, StoreError, Synchronous};

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or("").to_string()
    }

    /// A write alone commits on its caller's thread, where the runtime lets a task block;
    /// on a runtime that cannot (one thread), on the writer thread. Once closed, the store
    /// refuses writes on either path, and the WAL has been folded back into the database.
    #[test]
    fn a_lone_write_commits_where_its_caller_runs_and_none_after_close() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("t.db");
        let store = Store::open(&path, Synchronous::Full).unwrap();
        let write_here = |store: &Store| {
            let store = store.clone();
            async move {
                store
                    .write(|c| {
                        c.execute_batch("CREATE TABLE IF NOT EXISTS t (x INTEGER)")?;
                        c.execute("INSERT INTO t VALUES (1)", [])?;
                        Ok(thread_name())
                    })
                    .await
            }
        };
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("caller")
            .build()
            .unwrap();
        let on_a_worker = multi.spawn(write_here(&store));
        assert_eq!(multi.block_on(on_a_worker).unwrap().unwrap(), "caller");
        let single = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(
            single.block_on(write_here(&store)).unwrap(),
            "compactd-writer"
        );
        let rows: i64 = store
            .read_now(|c| Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(rows, 2);

        store.close();
        for runtime in [&multi, &single] {
            let refused = runtime.block_on(write_here(&store));
            assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");
        }
        let wal = std::fs::metadata(dir.path().join("t.db-wal")).map_or(0, |m| m.len());
        assert_eq!(wal, 0, "the WAL is checkpointed and truncated at close");
        let rows: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2, "what was acknowledged is in the file");
    }

    /// A file overwritten by a copy of itself from before a checkpoint that ran inside a
    /// commit (the WAL past its 1,000 pages) is noticed, and no write commits after: a copy
    /// that truncates the file by the size the checkpoint gave it (noted after that commit,
    /// or at the writer's next idle look if it comes first); one written over it in place
    /// (`dd conv=notrunc`, or a copy as large as the file), whose size never changes, by its
    /// mark (see `store::mark`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_from_before_a_checkpoint_in_a_commit_is_noticed() {
        for in_place in [false, true] {
            let dir = tempfile::TempDir::new().unwrap();
            let path = dir.path().join("t.db");
            let store = Store::open(&path, Synchronous::Full).unwrap();
            store
                .write(|c| Ok(c.execute_batch("CREATE TABLE t (x BLOB)")?))
                .await
                .unwrap();
            store.close();
            let copy = std::fs::read(&path).unwrap();

            let store = Store::open(&path, Synchronous::Full).unwrap();
            let insert = |bytes: usize| {
                store.write(move |c| Ok(c.execute("INSERT INTO t VALUES (zeroblob(?1))", [bytes])?))
            };
            insert(6 << 20).await.unwrap();
            insert(1).await.unwrap();
            let size = std::fs::metadata(&path).unwrap().len();
            assert!(size > 6 << 20, "checkpointed");
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .truncate(!in_place)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut file, &copy).unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().len() == size, in_place);
            let refused = insert(1).await;
            let Err(StoreError::Overwritten { how, .. }) = refused else {
                panic!("{refused:?}");
            };
            let told = if in_place { "older state" } else { "shrank" };
            assert!(how.contains(told), "{how}");
            store.close();
        }
    }

    /// A database of table `t` in `dir`, opened by a store while a person's transaction
    /// (`BEGIN IMMEDIATE` in `sqlite3`, the connection returned) holds its write lock.
    async fn opened_while_a_person_writes(dir: &std::path::Path) -> (Store, rusqlite::Connection) {
        let path = dir.join("t.db");
        let store = Store::open(&path, Synchronous::Full).unwrap();
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x INTEGER)")?))
            .await
            .unwrap();
        store.close();
        let person = rusqlite::Connection::open(&path).unwrap();
        person.execute_batch("BEGIN IMMEDIATE").unwrap();
        (Store::open(&path, Synchronous::Full).unwrap(), person)
    }

    /// While the daemon serves, no other process takes the write lock: the connection keeps
    /// it between its transactions, from the first write on. A person who took it before the
    /// daemon could (a transaction left open in `sqlite3` before it started) makes a write
    /// wait a bounded time and fail as busy; the next one, once the person lets go, commits
    /// and keeps the lock. The store tells whether the lock was held elsewhere at its last try.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_write_lock_is_kept_between_writes_and_one_taken_before_is_a_bounded_busy() {
        let dir = tempfile::TempDir::new().unwrap();
        let insert = |store: Store| async move {
            store
                .write(|c| Ok(c.execute_batch("INSERT INTO t VALUES (1)")?))
                .await
        };
        let (store, person) = opened_while_a_person_writes(dir.path()).await;
        person.busy_timeout(std::time::Duration::ZERO).unwrap();
        let started = std::time::Instant::now();
        let busy = insert(store.clone()).await;
        assert!(matches!(busy, Err(StoreError::Busy)), "{busy:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert!(store.write_lock_held_elsewhere());
        person.execute_batch("ROLLBACK").unwrap();
        insert(store.clone()).await.unwrap();
        assert!(!store.write_lock_held_elsewhere());
        for _ in 0..3 {
            let refused = person.execute_batch("BEGIN IMMEDIATE").unwrap_err();
            assert!(refused.to_string().contains("locked"), "{refused}");
            insert(store.clone()).await.unwrap();
        }
        let rows: i64 = person
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 4);
        store.close();
        person.execute_batch("BEGIN IMMEDIATE; ROLLBACK").unwrap();
    }

    /// Sixteen writes at once while a person holds the write lock: each is answered busy
    /// within its own wait for the lock, never the sum of the waits of the batches before it
    /// (4 s of the documented 2 s, when each batch waited 2 s afresh).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_queued_behind_a_busy_wait_are_busy_within_their_own_wait() {
        let dir = tempfile::TempDir::new().unwrap();
        let (store, person) = opened_while_a_person_writes(dir.path()).await;
        let writes = (0..16).map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let outcome = store
                    .write(|c| Ok(c.execute_batch("INSERT INTO t VALUES (1)")?))
                    .await;
                (outcome, started.elapsed())
            })
        });
        for write in futures_util::future::join_all(writes).await {
            let (outcome, took) = write.unwrap();
            assert!(matches!(outcome, Err(StoreError::Busy)), "{outcome:?}");
            let allowed = crate::BUSY_WAIT + std::time::Duration::from_millis(900);
            assert!(took < allowed, "busy after {took:?}");
        }
        person.execute_batch("ROLLBACK").unwrap();
        store.close();
    }

    /// Writes queued behind a busy writer commit as one batch; one that fails and one that
    /// panics roll back alone, and their callers hear why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_or_panicking_write_in_a_batch_rolls_back_alone() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = Store::open(&dir.path().join("t.db"), Synchronous::Full).unwrap();
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x INTEGER)")?))
            .await
            .unwrap();
        // Hold the writer until the batch is queued.
        let (running, started) = tokio::sync::oneshot::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(move |c| {
                        running.send(()).unwrap();
                        held.recv().unwrap();
                        Ok(c.execute("INSERT INTO t VALUES (0)", [])?)
                    })
                    .await
            }
        });
        started.await.unwrap();
        let writes = (1..=5).map(|x: i64| {
            store.write(move |c| {
                c.execute("INSERT INTO t VALUES (?1)", [x])?;
                match x {
                    2 => Err(StoreError::Conflict("refused".into())),
                    4 => panic!("write {x} panics"),
                    _ => Ok(x),
                }
            })
        });
        let mut batch = Box::pin(futures_util::future::join_all(writes));
        // One poll sends every job to the writer, which is still busy with the blocker.
        assert!(futures_util::poll!(&mut batch).is_pending());
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let results = batch.await;
        assert_eq!(results[0].as_ref().ok(), Some(&1));
        assert!(matches!(results[1], Err(StoreError::Conflict(_))));
        assert_eq!(results[2].as_ref().ok(), Some(&3));
        assert!(matches!(&results[3], Err(StoreError::Internal(m)) if m.contains("panicked")));
        assert_eq!(results[4].as_ref().ok(), Some(&5));
        let rows: Vec<i64> = store
            .read(|c| {
                Ok(c.prepare("SELECT x FROM t ORDER BY x")?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
            .unwrap();
        assert_eq!(rows, [0, 1, 3, 5]);
        store.close();
    }
}
