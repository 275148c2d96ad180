//! A full disk, said once. The first write refused for want of room is logged; the refusals
//! after it are only counted, and once there is room again a line says how many there were.
//! A client retrying a refused append every second (as `Retry-After` asks) would otherwise
//! write a line to the journal each time, and the journal is often on the same disk. While
//! the disk is full, `/health` says so ([`FullDisk::refusing`]).
//!
//! A full disk still takes some writes: a small one that fits in pages the database or its
//! WAL already has (a compaction's failure noted, say) commits while every append is refused.
//! So a committed write ends the spell only when the file system has room again
//! ([`ROOM`]), not by committing.

use super::StoreError;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Free space (for the daemon's user) that ends a spell: the lesser of 16 MiB (four times
/// the usual WAL) and a tenth of the file system.
const ROOM: u64 = 16 << 20;

pub(super) struct FullDisk {
    /// The database's directory: its file system is the one that filled.
    dir: PathBuf,
    /// Whether a spell is on: what a committed write checks before taking the lock.
    on: AtomicBool,
    spell: Mutex<Option<Spell>>,
}

/// Writes refused for want of room since the first of them.
struct Spell {
    since: String,
    refused: u64,
}

impl FullDisk {
    pub(super) fn new(database: &Path) -> FullDisk {
        FullDisk {
            // `c.db`'s parent is the empty path, which statvfs does not take.
            dir: database
                .parent()
                .filter(|dir| !dir.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            on: AtomicBool::new(false),
            spell: Mutex::new(None),
        }
    }

    /// The directory whose file system the database is on.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes note of a write's outcome: a refusal for want of room starts or extends a spell,
    /// a committed write ends one if the file system has room again.
    pub(super) fn note<T>(&self, outcome: &Result<T, StoreError>) {
        match outcome {
            Err(StoreError::Full) => {
                let mut spell = self.spell.lock().unwrap_or_else(|e| e.into_inner());
                match spell.as_mut() {
                    Some(spell) => spell.refused += 1,
                    None => {
                        tracing::error!(
                            "the disk holding the database is full: writes are refused (507 storage_full) until there is room, and go on by themselves then; nothing acknowledged is lost"
                        );
                        *spell = Some(Spell {
                            since: super::clock::now(),
                            refused: 1,
                        });
                        self.on.store(true, Ordering::Release);
                    }
                }
            }
            Ok(_) if self.on.load(Ordering::Acquire) && has_room(&self.dir) => {
                let mut spell = self.spell.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(ended) = spell.take() {
                    self.on.store(false, Ordering::Release);
                    tracing::info!(
                        refused = ended.refused,
                        since = %ended.since,
                        "room again on the database's disk: writes go on"
                    );
                }
            }
            _ => {}
        }
    }

    /// While the disk is full: since when, and how many writes were refused.
    pub(super) fn refusing(&self) -> Option<String> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let spell = self.spell.lock().unwrap_or_else(|e| e.into_inner());
        spell.as_ref().map(|s| {
            let writes = match s.refused {
                1 => "1 write".to_string(),
                n => format!("{n} writes"),
            };
            format!(
                "the disk holding the database is full: {writes} refused since {} (nothing acknowledged is lost; writes go on by themselves once there is room)",
                s.since
            )
        })
    }
}

/// Whether the file system holding `dir` has [`ROOM`] free for an unprivileged user (or a
/// tenth of its size, if that is less); a file system that cannot say is taken to have it.
fn has_room(dir: &Path) -> bool {
    free_space(dir).is_none_or(|(free, size)| free >= ROOM.min(size / 10))
}

/// The bytes free for an unprivileged user on the file system holding `dir`, and its size;
/// `None` if it cannot say.
pub(super) fn free_space(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut fs = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a NUL-terminated string and `fs` a buffer statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), fs.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `fs`.
    let fs = unsafe { fs.assume_init() };
    // The fields are 32-bit on some targets.
    #[allow(clippy::unnecessary_cast)]
    let (unit, available, blocks) = (fs.f_frsize as u64, fs.f_bavail as u64, fs.f_blocks as u64);
    Some((available.saturating_mul(unit), blocks.saturating_mul(unit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spell_starts_at_the_first_refusal_counts_the_rest_and_ends_at_a_commit() {
        // A relative path's directory is the current one.
        assert_eq!(FullDisk::new(Path::new("c.db")).dir(), Path::new("."));
        assert!(free_space(FullDisk::new(Path::new("c.db")).dir()).is_some());
        // A temp directory's file system has room: a committed write ends a spell.
        let dir = tempfile::TempDir::new().unwrap();
        let disk = FullDisk::new(&dir.path().join("compactd.db"));
        disk.note(&Ok::<(), StoreError>(()));
        assert!(disk.refusing().is_none(), "no refusal yet");
        disk.note::<()>(&Err(StoreError::Busy));
        assert!(
            disk.refusing().is_none(),
            "a locked database is not a full disk"
        );
        for _ in 0..3 {
            disk.note::<()>(&Err(StoreError::Full));
        }
        let said = disk.refusing().unwrap();
        assert!(said.contains("full: 3 writes refused since 20"), "{said}");
        disk.note(&Ok::<(), StoreError>(()));
        assert!(
            disk.refusing().is_none(),
            "a write committed: there is room"
        );
        disk.note::<()>(&Err(StoreError::Full));
        assert!(disk.refusing().unwrap().contains("full: 1 write refused"));
    }
}
