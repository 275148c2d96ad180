//! The database file, checked without ever holding a descriptor of it.
//!
//! POSIX record locks belong to the process, not to the descriptor: closing *any* descriptor
//! of a file drops every lock the process holds on it, SQLite's included. SQLite guards its own
//! descriptors against this, but it cannot know about ours. Had compactd opened the database
//! (to check its mode, say) and closed that descriptor while its connections were open, SQLite's
//! shared lock would be gone: the next `sqlite3` to exit would believe itself the last
//! connection, checkpoint and unlink the `-wal` file, and every acknowledged write after that
//! would go to a WAL nobody finds again.
//!
//! So this module never opens an existing database file: it checks the path with `lstat` and
//! changes its mode with `chmod`, both by name. The one descriptor of the database it opens is
//! the one that creates a new, empty file, closed before any connection exists (no lock can be
//! held on a file that did not exist). SQLite then opens the path itself, refusing a symlink
//! (`SQLITE_OPEN_NOFOLLOW`), and [`DatabaseFile::confirm_opened`] checks by `stat` that the
//! path still names the file that was checked. The only other file it writes is a note of its
//! own beside a database found overwritten (see [`DatabaseFile::still_there`]).

use super::mark::OlderCopy;
use super::stat::look;
use super::{Result, StoreError};
use rusqlite::OpenFlags;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// SQLite refuses to open the database through a symlink (the check by name could race).
pub(super) const NO_SYMLINK: OpenFlags = OpenFlags::SQLITE_OPEN_NOFOLLOW;

/// The database file the store opened: its path, and the identity (device, inode) it had
/// when checked, to notice when the path stops naming it.
pub(super) struct DatabaseFile {
    path: PathBuf,
    identity: (u64, u64),
    /// The identities of the WAL and of the shared-memory index, once they exist: SQLite
    /// keeps both (the WAL truncated after checkpoints) while any connection is open, and
    /// the daemon keeps connections open until it stops.
    side_files: [OnceLock<(u64, u64)>; 2],
    /// Which side files were found gone (once gone, always gone; a removed index does not
    /// stop the WAL being looked at).
    side_gone: [OnceLock<PathBuf>; 2],
    /// The largest size the file was seen at, and the WAL's since the writer last let go of
    /// the write lock; how the file was found overwritten, once it was: see
    /// [`DatabaseFile::still_there`] and [`DatabaseFile::found_older`].
    size_seen: AtomicU64,
    wal_seen: AtomicU64,
    overwritten: OnceLock<Overwrite>,
    /// Whether another process held the write lock at the writer's last try.
    pub(super) outside_lock: super::outside_lock::OutsideLock,
}

/// The files SQLite keeps beside a database in WAL mode, in the order of `side_files`.
pub(super) const SIDE_FILES: [&str; 2] = ["-wal", "-shm"];

impl DatabaseFile {
    /// Makes sure `path` is a private regular file of ours, creating it (and its directory)
    /// if missing: it holds whole conversations. A symlink is refused (it could point
    /// anywhere); a looser mode is tightened to 0600. Call it before SQLite opens the path.
    pub(super) fn prepare(path: &Path) -> Result<DatabaseFile> {
        let io = |e: std::io::Error| StoreError::io(path, e);
        if let Some(dir) = path.parent() {
            crate::private_dir::ensure_private_dir(dir).map_err(io)?;
        }
        let metadata = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_empty_private(path).map_err(io)?;
                std::fs::symlink_metadata(path).map_err(io)?
            }
            other => other.map_err(io)?,
        };
        if metadata.file_type().is_symlink() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a symlink; compactd opens only a real file there",
            )));
        }
        if !metadata.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is not a regular file",
            )));
        }
        make_private(path)?;
        if beside(path, OVERWRITTEN_NOTE).exists() {
            tracing::warn!(database = %path.display(), "a daemon before this one found the database overwritten and was killed before it set the side files aside: set aside now");
            set_aside_side_files(path);
        } else if let Some(OlderCopy { was, now }) = super::mark::copied_under_wal(path) {
            tracing::warn!(database = %path.display(), mark = now, wal_began_at = was, "the database file holds an older state than its WAL was written over (a copy put in place after compactd was killed, the WAL left beside it): the WAL is set aside, not folded into the copy");
            set_aside_side_files(path);
        }
        Ok(DatabaseFile {
            path: path.to_path_buf(),
            identity: (metadata.dev(), metadata.ino()),
            side_files: Default::default(),
            side_gone: Default::default(),
            size_seen: AtomicU64::new(metadata.len()),
            wal_seen: AtomicU64::new(0),
            overwritten: OnceLock::new(),
            outside_lock: Default::default(),
        })
    }

    /// After SQLite opened the path: it must still name the file [`prepare`](Self::prepare)
    /// checked (nothing swapped it in between).
    pub(super) fn confirm_opened(&self) -> Result<()> {
        self.still_there().map_err(|_| {
            StoreError::io(
                &self.path,
                std::io::Error::other("was replaced while compactd opened it"),
            )
        })
    }

    /// Whether the path still names the file we write to (not deleted, not replaced), and
    /// its `-wal` and `-shm` paths the files SQLite uses. Looks by name, opening nothing, and
    /// without asking for the files' times (see [`super::stat`]): every commit looks first.
    ///
    /// `rm *.db-wal *.db-shm`, an old remedy for a locked database, run under the daemon: a
    /// removed WAL stays open in SQLite, which goes on writing to it and would lose it, with
    /// every write since the last checkpoint, when the daemon stops; with its index removed,
    /// another process builds an index of its own and may checkpoint while the daemon
    /// writes. See [`StoreError::SideFileGone`].
    ///
    /// And that neither file shrank. The WAL: while the writer holds the write lock no other
    /// process can checkpoint it to nothing, and the writer's own SQLite shrinks it only to
    /// `journal_size_limit` (its own truncating checkpoints let go of the lock, and
    /// [`wal_rebaseline`](Self::wal_rebaseline) follows). One emptied under it (`: >
    /// compactd.db-wal`, to free the space a "log" takes) took every write since the last
    /// checkpoint (tried: the next append acknowledged, then `file is not a database`, all 21
    /// messages gone). The database file: while the daemon runs it holds the write lock and
    /// nothing vacuums, so SQLite only ever grows the file (a checkpoint writes pages, never
    /// fewer). One that shrank was written outside SQLite, a `cp old.db` over it most likely:
    /// locks do not stop `cp`, and the file then holds old pages that the WAL's newer ones no
    /// longer fit (tried: the next append acknowledged, `PRAGMA integrity_check` failing,
    /// 1,106 of 1,301 messages readable). See [`StoreError::Overwritten`] and
    /// [`set_aside_side_files`](Self::set_aside_side_files). A copy as large as the file was
    /// is told by its mark instead ([`found_older`](Self::found_older)).
    pub(super) fn still_there(&self) -> Result<()> {
        let size = match look(&self.path) {
            Ok(seen) if seen.identity == self.identity => seen.size,
            _ => return Err(self.gone()),
        };
        self.never_shrank(size)?;
        let [wal_gone, _] = &self.side_gone;
        if wal_gone.get().is_none() {
            for ((suffix, known), gone) in
                SIDE_FILES.iter().zip(&self.side_files).zip(&self.side_gone)
            {
                let path = self.side_file(suffix);
                let seen = look(&path);
                let now = seen.as_ref().map(|seen| seen.identity);
                match (known.get(), now) {
                    (Some(known), Ok(now)) if *known == now => {
                        if let (&"-wal", Ok(seen)) = (suffix, &seen) {
                            self.wal_never_shrank(seen.size);
                        }
                    }
                    (Some(_), _) => {
                        let _ = gone.set(path);
                    }
                    (None, Ok(now)) => {
                        let _ = known.set(now);
                    }
                    (None, Err(_)) => {}
                }
            }
        }
        match self.refused_for_good() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Why writes are refused until a restart, if they are, as last seen (no new look): a
    /// side file removed or replaced (the WAL first: what it holds must be folded into the
    /// database), or the file or its WAL shrunk.
    pub(super) fn refused_for_good(&self) -> Option<StoreError> {
        let side_gone = self.side_gone.iter().zip([true, false]);
        side_gone
            .filter_map(|(gone, wal)| {
                let path = gone.get()?.clone();
                Some(StoreError::SideFileGone { path, wal })
            })
            .next()
            .or_else(|| self.unless_overwritten().err())
    }

    /// The error of a database file removed or replaced under the daemon.
    pub(super) fn gone(&self) -> StoreError {
        StoreError::Gone(self.path.clone())
    }

    /// Whether the file or its WAL was seen to shrink (see [`still_there`](Self::still_there)),
    /// or the file older by its mark ([`found_older`](Self::found_older)): once it was, it
    /// stays so, whatever it holds later.
    pub(super) fn overwritten(&self) -> bool {
        self.overwritten.get().is_some()
    }

    /// The file was found holding an older state than it held before (see [`super::mark`]):
    /// overwritten, as a file that shrank.
    pub(super) fn found_older(&self, older: OlderCopy) {
        self.mark_overwritten(Overwrite::Older(older));
    }

    /// Forgets the WAL's size: the writer let go of the write lock (to checkpoint, or another
    /// process took it), so another process may have checkpointed it to nothing, as SQLite
    /// allows. The next look takes its size afresh.
    pub(super) fn wal_rebaseline(&self) {
        self.wal_seen.store(0, Ordering::Relaxed);
    }

    fn wal_never_shrank(&self, size: u64) {
        let seen = self.wal_seen.fetch_max(size, Ordering::Relaxed);
        if size < seen.min(super::WAL_SIZE_LIMIT) {
            self.mark_overwritten(Overwrite::Shrunk {
                wal: true,
                was: seen,
                now: size,
            });
        }
    }

    /// Notes the file's size after SQLite may have grown it (a checkpoint, which SQLite runs
    /// inside a commit once the WAL is long, and the writer's when idle): a copy is told by
    /// its size against the largest seen, so that must be the latest. A `stat` by name.
    pub(super) fn note_size(&self) {
        if let Ok(seen) = look(&self.path)
            && seen.identity == self.identity
        {
            let _ = self.never_shrank(seen.size);
        }
    }

    fn never_shrank(&self, size: u64) -> Result<()> {
        let seen = self.size_seen.fetch_max(size, Ordering::Relaxed);
        if size < seen {
            self.mark_overwritten(Overwrite::Shrunk {
                wal: false,
                was: seen,
                now: size,
            });
        }
        self.unless_overwritten()
    }

    /// Notes the first overwrite found: for good in memory, and in a note beside the
    /// database should the daemon be killed before it stops and sets the WAL aside (the next
    /// one finds the note and does it: see `prepare`).
    fn mark_overwritten(&self, how: Overwrite) {
        if self.overwritten.set(how).is_ok()
            && let Err(why) = self.unless_overwritten()
        {
            let note = beside(&self.path, OVERWRITTEN_NOTE);
            let _ = write_private(&note, why.to_string().as_bytes());
        }
    }

    /// [`StoreError::Overwritten`] once the file was found overwritten: nothing read from it
    /// then is sound (its pages mixed with the WAL's), nor anything written.
    pub(super) fn unless_overwritten(&self) -> Result<()> {
        let Some(&how) = self.overwritten.get() else {
            return Ok(());
        };
        let (path, how) = match how {
            Overwrite::Shrunk { wal, was, now } => (
                if wal {
                    self.side_file("-wal")
                } else {
                    self.path.clone()
                },
                format!(
                    "it shrank to {now} bytes from {was} or more: a copy put over it, or emptied?"
                ),
            ),
            Overwrite::Older(OlderCopy { was, now }) => (
                self.path.clone(),
                format!(
                    "it holds an older state than it did, its mark (SQLite's application_id) down to {now} from {was}: an older copy put over it?"
                ),
            ),
        };
        Err(StoreError::Overwritten {
            path,
            database: self.path.clone(),
            how,
        })
    }

    /// Notes which files the `-wal` and `-shm` paths name, once SQLite made them (after the
    /// store's first write), so that a later look can tell them removed or replaced.
    pub(super) fn note_side_files(&self) {
        for (suffix, known) in SIDE_FILES.iter().zip(&self.side_files) {
            if let Ok(seen) = look(&self.side_file(suffix)) {
                let _ = known.set(seen.identity);
            }
        }
    }

    /// Renames the `-wal` and `-shm` files of an overwritten database (see
    /// [`still_there`](Self::still_there)) to `<name>.overwritten-<unix seconds>`, once every
    /// connection of ours is closed (no lock of ours left to drop): left in place, the WAL's
    /// frames would be folded into the copy by the next process to open it, which would find
    /// it malformed. Renamed, nothing is deleted, and the copy opens as copied.
    pub(super) fn set_aside_side_files(&self) {
        if self.overwritten() {
            set_aside_side_files(&self.path);
        }
    }

    /// The database file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The `-wal` or `-shm` file beside the database.
    pub(super) fn side_file(&self, suffix: &str) -> PathBuf {
        beside(&self.path, suffix)
    }

    /// The WAL's size in bytes (0 when there is none), by `stat`.
    pub(super) fn wal_size(&self) -> u64 {
        look(&self.side_file("-wal")).map_or(0, |seen| seen.size)
    }
}

/// How a file was found written outside SQLite under the daemon.
#[derive(Clone, Copy)]
enum Overwrite {
    /// The WAL or the database file shrank, from what size (at least) to what.
    Shrunk { wal: bool, was: u64, now: u64 },
    /// The database file holds an older state than it held before (see [`super::mark`]).
    Older(OlderCopy),
}

/// Left beside a database found overwritten (see [`DatabaseFile::still_there`]) until its
/// side files are set aside, saying why.
const OVERWRITTEN_NOTE: &str = ".overwritten";

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut side = path.as_os_str().to_os_string();
    side.push(suffix);
    PathBuf::from(side)
}

/// Renames the `-wal` and `-shm` files beside `path` to `<name>.overwritten-<unix seconds>`
/// (and `-1`, `-2`... should that name be taken), saying so, then removes the
/// [`OVERWRITTEN_NOTE`]; only with no connection of ours open.
fn set_aside_side_files(path: &Path) {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = |suffix: &str, n: u32| match n {
        0 => beside(path, &format!("{suffix}.overwritten-{seconds}")),
        n => beside(path, &format!("{suffix}.overwritten-{seconds}-{n}")),
    };
    // A rename replaces what has the new name: never one set aside before.
    let n = (0..)
        .find(|&n| SIDE_FILES.iter().all(|suffix| !aside(suffix, n).exists()))
        .unwrap_or(0);
    for suffix in SIDE_FILES {
        let (from, to) = (beside(path, suffix), aside(suffix, n));
        if std::fs::rename(&from, &to).is_ok() {
            tracing::warn!(from = %from.display(), to = %to.display(), "a side file that no longer fits the database file set aside: the database file opens as it is");
        }
    }
    let _ = std::fs::remove_file(beside(path, OVERWRITTEN_NOTE));
}

/// Writes a small file of ours, mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .write_all(bytes)
}

/// Creates a new empty file with mode 0600, failing if anything (a symlink included) is
/// already there. Its descriptor is closed at once: SQLite opens the file by name later.
fn create_empty_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map(drop)
}

/// Mode 0600 for a file of ours that exists (no-op when it does not), by `chmod` on its name.
pub(super) fn make_private(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m)
            if m.is_file()
                && m.uid() == crate::private_dir::current_uid()
                && m.mode() & 0o077 != 0 =>
        {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| StoreError::io(path, e))
        }
        _ => Ok(()),
    }
}
