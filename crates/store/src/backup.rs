//! `compactd backup`: a consistent copy of the database while the daemon runs.
//!
//! SQLite's online backup API copies every page under one read transaction, so the copy is the
//! database as of one moment, whatever the daemon commits meanwhile (in WAL mode the writer
//! never waits for it). It runs in the CLI's own process: SQLite's locks there are its own, so
//! nothing it opens or closes can touch the daemon's.

use super::file::{DatabaseFile, NO_SYMLINK};
use super::{Result, StoreError};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// What a backup copied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupReport {
    pub sessions: u64,
    pub messages: u64,
    pub bytes: u64,
}

/// Copies the database at `source` to `dest`, a new file made 0600 (an existing one is
/// refused rather than overwritten), and checks the copy.
pub fn backup(source: &Path, dest: &Path) -> Result<BackupReport> {
    if std::fs::symlink_metadata(source).is_err() {
        return Err(StoreError::io(
            source,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no database there"),
        ));
    }
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(StoreError::io(
            dest,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; name a new file (a backup never overwrites)",
            ),
        ));
    }
    let file = DatabaseFile::prepare(dest)?;
    copy(source, dest)
        .inspect_err(|_| {
            // Nothing half made stays behind: the file is the one made just now.
            for leftover in ["", "-journal", "-wal", "-shm"] {
                let _ = std::fs::remove_file(file.side_file(leftover));
            }
        })
        .map_err(|e| match e {
            // The database's own disk is not the one that filled.
            StoreError::Full => StoreError::io(
                dest,
                std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "the disk holding the copy is full",
                ),
            ),
            other => other,
        })
}

/// The copy itself, into `dest` (made just now, empty).
fn copy(source: &Path, dest: &Path) -> Result<BackupReport> {
    let from = Connection::open_with_flags(
        source,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | NO_SYMLINK,
    )?;
    from.busy_timeout(super::BUSY_WAIT)?;
    from.execute_batch("PRAGMA query_only = ON;")?;
    let mut to = Connection::open_with_flags(dest, OpenFlags::default() | NO_SYMLINK)?;
    {
        let copy = rusqlite::backup::Backup::new(&from, &mut to)?;
        // All pages in one step: one read transaction, so one moment of the database.
        copy.step(-1)?;
    }
    let check: String = to.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        return Err(StoreError::Corrupt(format!(
            "the copy fails its check: {check}"
        )));
    }
    let count = |table: &str| -> Result<u64> {
        Ok(to.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?)
    };
    let report = BackupReport {
        sessions: count("sessions")?,
        messages: count("messages")?,
        bytes: 0,
    };
    // Fold the copy's WAL into it, so the backup is the one file.
    to.execute_batch("PRAGMA journal_mode = DELETE;")?;
    drop(to);
    let bytes = std::fs::metadata(dest)
        .map_err(|e| StoreError::io(dest, e))?
        .len();
    Ok(BackupReport { bytes, ..report })
}
