//! One daemon per database. Two daemons on one file would not lose data (SQLite orders their
//! writes, and a compaction commits only over the state it read), but each would keep its own
//! per-session locks, waits and events, so agents on one socket would wait for nothing while
//! the other daemon compacts, compactions would fail against each other's, and a newer binary
//! would migrate the schema under an older one still serving. It happens by accident: a shell
//! without `XDG_RUNTIME_DIR` (su, cron, some ssh logins) picks another default socket but the
//! same default database as the systemd service.
//!
//! So `compactd serve` holds an exclusive `flock` on `<database>.lock` from before it opens the
//! database until it exits; a second one finds it taken and refuses to start, naming the
//! first's pid (written in the file). The kernel drops the lock when the process dies, kill -9
//! included, so there is no stale lock to clean up. `flock`, and on a file of its own: a POSIX
//! record lock on the database itself would be dropped by closing any descriptor of it, and
//! would drop SQLite's with it (see `store::file`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Held for as long as the daemon serves the database; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct DatabaseLock {
    _file: Option<File>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    #[error(
        "another compactd{} already serves the database {}; stop it first (`systemctl --user stop compactd` if it is the service)",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        db.display()
    )]
    Held { db: PathBuf, pid: Option<u32> },
    #[error("cannot open the lock file {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot use the directory of the database {}: {error}", db.display())]
    Directory { db: PathBuf, error: std::io::Error },
}

/// The lock file of the database at `db`.
fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes the database's lock, or says which daemon holds it. Where the file system cannot
/// lock at all, the daemon runs unguarded (said in the log) rather than not at all.
pub(crate) fn lock(db: &Path) -> Result<DatabaseLock, LockError> {
    let path = lock_path(db);
    let io = |error| LockError::Io {
        path: path.clone(),
        error,
    };
    if let Some(dir) = path.parent() {
        compactd_store::private_dir::ensure_private_dir(dir).map_err(|error| {
            LockError::Directory {
                db: db.to_path_buf(),
                error,
            }
        })?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(LockError::Held {
                db: db.to_path_buf(),
                pid: holder.trim().parse().ok(),
            });
        }
        Err(TryLockError::Error(error)) => {
            tracing::warn!(path = %path.display(), %error, "cannot lock the database for this daemon alone; a second daemon on it would not be refused");
            return Ok(DatabaseLock { _file: None });
        }
    }
    // Only for the message a second daemon gives: the lock is the flock, not this.
    let _ = file
        .set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()));
    Ok(DatabaseLock { _file: Some(file) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock on the same database is refused with the holder's pid, whatever the
    /// path's spelling; once the first is dropped, it is free.
    #[test]
    fn a_held_database_lock_refuses_a_second_and_frees_on_drop() {
        let dir = tempfile::TempDir::new().unwrap();
        let db = dir.path().join("c.db");
        let first = lock(&db).unwrap();
        let spelled_otherwise = dir.path().join(".").join("c.db");
        match lock(&spelled_otherwise) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        let again = lock(&db);
        assert!(again.is_ok(), "{again:?}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(lock_path(&db)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}
