//! The database file's mark: which state of it the file on disk holds, so that an older copy
//! put over it is told from it, whatever its size.
//!
//! `cp backup.db compactd.db` under the running daemon keeps the file's inode; a copy smaller
//! than the file is told by its size (see [`super::file`]), one as large is not. Once a
//! checkpoint (anyone's) has copied WAL frames into the file, SQLite reads those pages from the
//! file alone, never from the WAL again: a copy older than what was checkpointed takes them,
//! every append acknowledged after goes into a mix, and reads fail `database disk image is
//! malformed`.
//!
//! So the writer raises a number in the file's header, SQLite's `application_id` (offset 68
//! of page 1, which nothing else of SQLite uses): in the commit after which it checkpoints,
//! before its idle checkpoint, in a commit that finds the whole WAL in the file (it likely
//! starts the WAL over), and in any commit 100 ms or more after the last raise (an agent's
//! every step; one commit in some hundreds of a tight loop). Checkpoints copy pages into the
//! file in commit order, so the file's number only grows, whoever checkpoints. Before every
//! commit and at every idle look the writer reads the file's own four bytes (not the WAL's
//! view): a number smaller than one seen before is an older copy put over the file. And when
//! the wal-index says every frame of the WAL is in the file, the file holds the whole database
//! as committed, so its number must be the one committed last. Not told: a copy taken after
//! the last raise that reached the file (a backup, then appends and another process's
//! checkpoint within 100 ms), and one put in place after another process's partial
//! checkpoint with no look of the writer between the two. The mark cannot tell the latter:
//! a checkpoint that stops short of the WAL's end (another reader holds an older snapshot)
//! copies each page's newest frame only if it is within the stop, so page 1, written again
//! by a later commit, stays as it was while pages it lies beside are copied. Reading the
//! wal-index's checkpointed count as "the raises before it are in the file" refused a long
//! reader's growing WAL as a copy (tried, in `hardening`'s long-reader test).
//!
//! A daemon killed, then a copy put in place with the WAL left beside it, is told as the next
//! daemon starts ([`copied_under_wal`]): SQLite replays the whole WAL over the file then, so
//! the file must be no older than it was when the WAL began, which the WAL's first page 1
//! says (its mark, or one more).
//!
//! The file is read through SQLite's own open file (`SQLITE_FCNTL_FILE_POINTER`, then the
//! VFS's `xRead`): no descriptor of ours is opened, so none is closed, and no lock of
//! SQLite's is dropped (see [`super::file`]).

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, ffi};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where SQLite keeps `application_id` in page 1.
const OFFSET: i64 = 68;
/// The WAL's length (pages) past which the writer checkpoints after a commit, as SQLite's own
/// automatic checkpoint does.
const CHECKPOINT_PAGES: i32 = 1_000;
/// A commit at least this long after the last raise raises the mark again: a checkpoint by
/// another process then finds in the WAL a mark at most this old. An agent's steps come
/// further apart, so each raises it (page 1 is one more page in their commit); a tight loop
/// raises it once in some hundreds of commits.
const RAISE_EVERY: Duration = Duration::from_millis(100);

/// The mark's state, shared by the writer and the WAL hook that checkpoints after a commit.
pub(super) struct FileMark {
    /// The mark the next raise writes. SQLite keeps 32 bits of it: raised ten times a second
    /// by time and as often again by checkpoints in a tight loop, it would wrap (and be taken
    /// for an older copy) after some seven years of writing without a pause.
    next: AtomicU64,
    /// When the last raise committed, if one did.
    raised_at: Mutex<Option<Instant>>,
    /// The WAL is long enough to checkpoint: the next commit raises the mark first.
    checkpoint_due: AtomicBool,
    /// The whole WAL is in the file: the next commit likely starts it over, and raises the
    /// mark in its first frames (what a daemon starting after a kill reads).
    restart_due: AtomicBool,
    /// The commit under way raises the mark (set before `COMMIT`, read by the WAL hook).
    raising: AtomicBool,
    /// The largest mark found in the file, or known put there by a checkpoint of ours.
    seen: AtomicU64,
    /// The mark as last committed (what the database holds, the WAL's page 1 over the file's).
    committed: AtomicU64,
}

/// A mark in the file smaller than one seen before: an older copy of the file put over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OlderCopy {
    pub was: u64,
    pub now: u64,
}

impl FileMark {
    /// The mark of the database `conn` has open: the next raise continues from its current one.
    pub(super) fn new(conn: &Connection) -> Arc<FileMark> {
        let seen = MainFile::of(conn).and_then(|f| f.mark()).unwrap_or(0);
        // Unread, it is taken to be the file's (never a reason to find the file older).
        let current = conn
            .pragma_query_value(None, "application_id", |r| r.get::<_, i64>(0))
            .map_or(seen, |id| u64::from(id as i32 as u32));
        Arc::new(FileMark {
            next: AtomicU64::new(current.max(seen) + 1),
            committed: AtomicU64::new(current),
            raised_at: Mutex::new(None),
            checkpoint_due: AtomicBool::new(false),
            restart_due: AtomicBool::new(false),
            raising: AtomicBool::new(false),
            seen: AtomicU64::new(seen),
        })
    }

    /// Inside the write transaction about to commit, after [`check`](Self::check): raises
    /// the mark if a checkpoint follows this commit, the WAL likely starts over with it, or
    /// the last raise is [`RAISE_EVERY`] old. A failure (a full disk, say)
    /// leaves the mark as it was; the commit goes on.
    pub(super) fn raise_if_due(&self, conn: &Connection) {
        let last = *self
            .raised_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let due = self.checkpoint_due.load(Ordering::Relaxed)
            || self.restart_due.swap(false, Ordering::Relaxed)
            || last.is_none_or(|at| at.elapsed() >= RAISE_EVERY);
        if due && self.raise(conn) {
            self.raising.store(true, Ordering::Relaxed);
        }
    }

    /// Writes the next mark in the open transaction; whether it did.
    fn raise(&self, conn: &Connection) -> bool {
        let next = self.next.load(Ordering::Relaxed) as u32 as i32;
        conn.execute_batch(&format!("PRAGMA application_id = {next}"))
            .is_ok()
    }

    /// After the commit ended, `ok` if it committed: a raise in it is counted.
    pub(super) fn committed(&self, ok: bool) {
        if self.raising.swap(false, Ordering::Relaxed) && ok {
            let raised = self.next.fetch_add(1, Ordering::Relaxed);
            self.committed.store(raised, Ordering::Relaxed);
            *self
                .raised_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
    }

    /// Raises the mark in the write transaction `conn` holds (or one of its own), committed:
    /// the writer's idle checkpoint follows. Whether it committed.
    pub(super) fn raise_alone(&self, conn: &Connection) -> bool {
        if conn.is_autocommit() && conn.execute_batch("BEGIN IMMEDIATE").is_err() {
            return false;
        }
        if !self.raise(conn) {
            let _ = conn.execute_batch("ROLLBACK");
            return false;
        }
        self.raising.store(true, Ordering::Relaxed);
        let ok = conn.execute_batch("COMMIT").is_ok();
        if !ok {
            let _ = conn.execute_batch("ROLLBACK");
        }
        self.committed(ok);
        ok
    }

    /// A checkpoint copied the whole WAL into the file after [`raise_alone`](Self::raise_alone)
    /// committed: the file holds that mark now.
    pub(super) fn checkpointed(&self) {
        let put = self.next.load(Ordering::Relaxed) - 1;
        self.seen.fetch_max(put, Ordering::Relaxed);
    }

    /// Run by SQLite after each commit with the WAL's length, in place of its own automatic
    /// checkpoint: past [`CHECKPOINT_PAGES`], a commit that raised the mark is checkpointed
    /// (passively, as SQLite would); one that did not asks the next commit to raise it.
    pub(super) fn after_commit(&self, wal: &mut Wal, pages: i32) {
        if pages < CHECKPOINT_PAGES {
            return;
        }
        if !self.raising.load(Ordering::Relaxed) {
            self.checkpoint_due.store(true, Ordering::Relaxed);
            return;
        }
        self.checkpoint_due.store(false, Ordering::Relaxed);
        if let Ok((log, done)) = wal.checkpoint_v2(CheckpointMode::PASSIVE)
            && log == done
        {
            // `next` still names the mark this commit wrote: `committed` counts it after.
            self.seen
                .fetch_max(self.next.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Reads the file's mark: an [`OlderCopy`] if it is smaller than one seen before, or,
    /// with the whole WAL in the file, other than the mark committed last (the file then
    /// holds the whole database as committed). Read twice to be sure: another process's
    /// checkpoint may be writing page 1 just then.
    pub(super) fn check(&self, conn: &Connection) -> Result<(), OlderCopy> {
        let Some(file) = MainFile::of(conn) else {
            return Ok(());
        };
        let older = || {
            let folded = file.wal_folded() == Some(true);
            self.restart_due.store(folded, Ordering::Relaxed);
            let now = file.mark()?;
            let seen = self.seen.fetch_max(now, Ordering::Relaxed);
            let committed = self.committed.load(Ordering::Relaxed);
            match (now < seen, folded && now != committed) {
                (true, _) => Some(OlderCopy { was: seen, now }),
                (false, true) => Some(OlderCopy {
                    was: committed,
                    now,
                }),
                _ => None,
            }
        };
        if older().is_none() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
        older().map_or(Ok(()), Err)
    }
}

/// At start, before the store opens the database: the file's mark and the mark its WAL was
/// started over with, if the file's is the older (the mark a WAL's first raise wrote, less
/// one, is what the file held when the WAL began: see [`FileMark::raise_if_due`]). A file
/// older than that is a copy put in place after the daemon was killed, its WAL left beside it:
/// SQLite would fold the WAL's pages into the copy, whose own no longer fit them. The file is
/// read through a connection of its own (SQLite closes its descriptor safely), the WAL with a
/// descriptor of ours (SQLite locks no byte of it).
pub(super) fn copied_under_wal(database: &Path) -> Option<OlderCopy> {
    let mut side = database.as_os_str().to_os_string();
    side.push("-wal");
    let base = wal_base(Path::new(&side))?;
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | super::file::NO_SYMLINK;
    let conn = Connection::open_with_flags(database, flags).ok()?;
    let now = MainFile::of(&conn)?.mark()?;
    (now + 1 < base).then(|| OlderCopy {
        was: base.saturating_sub(1),
        now,
    })
}

/// The mark of the first page 1 in the WAL's valid frames (those with the header's salts), if
/// there is one among its first [`WAL_FRAMES_READ`].
fn wal_base(wal: &Path) -> Option<u64> {
    let mut file = std::io::BufReader::new(std::fs::File::open(wal).ok()?);
    let mut header = [0u8; 32];
    file.read_exact(&mut header).ok()?;
    if !matches!(be32(&header), 0x377f_0682 | 0x377f_0683) {
        return None;
    }
    let page_size = match be32(&header[8..]) {
        1 => 65_536,
        size => i64::from(size),
    };
    let salts = &header[16..24];
    let mut frame = [0u8; 24];
    for _ in 0..WAL_FRAMES_READ {
        file.read_exact(&mut frame).ok()?;
        if &frame[8..16] != salts {
            return None;
        }
        if be32(&frame) == 1 {
            let mut page = [0u8; 72];
            file.read_exact(&mut page).ok()?;
            return Some(u64::from(be32(&page[68..])));
        }
        file.seek_relative(page_size).ok()?;
    }
    None
}

/// How far into a WAL [`wal_base`] looks for page 1: its first raise is in its first commit.
const WAL_FRAMES_READ: usize = 10_000;

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// SQLite's open main database file of `conn` (`SQLITE_FCNTL_FILE_POINTER`), valid while the
/// connection is open and borrowed.
struct MainFile<'c> {
    file: *mut ffi::sqlite3_file,
    methods: &'c ffi::sqlite3_io_methods,
    _conn: &'c Connection,
}

impl MainFile<'_> {
    fn of(conn: &Connection) -> Option<MainFile<'_>> {
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: the handle is this open connection's; FILE_POINTER writes one pointer to
        // the main database's `sqlite3_file`, which lives as long as the connection, borrowed
        // by the returned value.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return None;
        }
        // SAFETY: an open file's methods are the VFS's static table (null once closed).
        let methods = unsafe { (*file).pMethods.as_ref()? };
        Some(MainFile {
            file,
            methods,
            _conn: conn,
        })
    }

    /// The mark in the database file itself (not the WAL's newer page 1); `None` if it
    /// cannot be read (a file shorter than a header).
    fn mark(&self) -> Option<u64> {
        let read = self.methods.xRead?;
        let mut bytes = [0u8; 4];
        // SAFETY: `xRead` of the open file reads `bytes.len()` bytes into `bytes` at the
        // offset, like `pread`.
        let rc = unsafe { read(self.file, bytes.as_mut_ptr().cast(), 4, OFFSET) };
        (rc == ffi::SQLITE_OK).then(|| u64::from(be32(&bytes)))
    }

    /// Whether every frame of the WAL is in the database file (a checkpoint copied them all,
    /// or there are none): then the file holds the whole database as committed. Read from
    /// the wal-index SQLite has mapped (its documented layout: the last valid frame at byte
    /// 16 of the header, the frames checkpointed at byte 96, native order); `None` if it is
    /// not mapped.
    fn wal_folded(&self) -> Option<bool> {
        if self.methods.iVersion < 2 {
            return None;
        }
        let map = self.methods.xShmMap?;
        let mut region: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: region 0 of the connection's wal-index, already mapped while it has a
        // transaction open (`bExtend` 0: never created here); the pointer stays valid while
        // the connection is open. The two words are read as SQLite's own readers do, volatile.
        unsafe {
            let rc = map(self.file, 0, 32_768, 0, &raw mut region);
            if rc != ffi::SQLITE_OK || region.is_null() {
                return None;
            }
            let words = region.cast::<u32>();
            let last_frame = words.add(4).read_volatile();
            let backfilled = words.add(24).read_volatile();
            Some(backfilled >= last_frame)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mark read from the file is the checkpointed one, not the WAL's newer page 1.
    #[test]
    fn the_mark_is_read_from_the_file_not_the_wal() {
        let dir = tempfile::TempDir::new().unwrap();
        let conn = Connection::open(dir.path().join("t.db")).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x);")
            .unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let file = || MainFile::of(&conn).unwrap();
        assert_eq!(file().mark(), Some(0));
        conn.execute_batch("PRAGMA application_id = 7").unwrap();
        assert_eq!(file().mark(), Some(0), "in the WAL only");
        assert_eq!(file().wal_folded(), Some(false));
        conn.execute_batch("PRAGMA wal_checkpoint").unwrap();
        assert_eq!(file().mark(), Some(7));
        assert_eq!(file().wal_folded(), Some(true));
    }
}
