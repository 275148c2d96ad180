//! Outside readers of the database during the kill cycles, as people use it: short-lived
//! `sqlite3` CLI processes (each one's exit is what once took the daemon's locks and its WAL
//! along) and one long-lived `sqlite3` session that stays open across kills and restarts; and
//! the system `sqlite3`'s `integrity_check` after every kill. Beside them, a careless
//! operator's writes ([`careless_writes`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Whether the system `sqlite3` is there (without it, the readers are left out).
pub(super) fn available() -> bool {
    std::process::Command::new("sqlite3")
        .arg("-version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs short-lived `sqlite3` readers one after another until `stop` is cancelled, and
/// returns how many ran. Every other one checkpoints the WAL instead of counting, as a person
/// "making the file complete" before copying it does: the daemon must never take another
/// process's checkpoint for a copy put over its file (see `store::mark`).
pub(super) async fn short_lived(db: PathBuf, stop: tokio_util::sync::CancellationToken) -> usize {
    let mut ran = 0;
    while !stop.is_cancelled() {
        let sql = match ran % 2 {
            0 => "select count(*) from messages",
            _ => "pragma wal_checkpoint",
        };
        let query = Command::new("sqlite3")
            .arg(&db)
            .arg(sql)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if query.await.is_ok() {
            ran += 1;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
        }
    }
    ran
}

/// An older copy of the database, for the careless operator's `.restore`s: `sqlite3`'s own
/// `.backup` of it now (`None` without one).
pub(super) async fn older_copy(db: &Path) -> Option<PathBuf> {
    let copy = db.with_extension("older-copy");
    let made = Command::new("sqlite3")
        .arg(db)
        .arg(format!(".backup '{}'", copy.display()))
        .status()
        .await;
    made.is_ok_and(|s| s.success()).then_some(copy)
}

/// Outside writes tried, and how many succeeded (each would have rewritten the live
/// database under acknowledged appends).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Writes {
    pub tried: usize,
    pub taken: usize,
}

/// A careless operator's writes to the live database, one after another until `stop` is
/// cancelled: `.restore` of `older`, then a transaction that drops a trigger and deletes the
/// messages, each retrying a busy lock (`.timeout`). Under load both once took the lock in
/// the instant after a commit. Stop it before the daemon dies: with no daemon, they succeed.
pub(super) async fn careless_writes(
    db: PathBuf,
    older: PathBuf,
    stop: tokio_util::sync::CancellationToken,
) -> Writes {
    let restore = format!(".restore '{}'", older.display());
    let ddl =
        "begin immediate; drop trigger messages_delete_by_hand; delete from messages; commit;";
    let mut writes = Writes::default();
    while !stop.is_cancelled() {
        // `.restore` retries by itself for some 400 ms; the transaction, for its timeout.
        let sql = [ddl, ddl, ddl, restore.as_str()][writes.tried % 4];
        let out = Command::new("sqlite3")
            .args(["-cmd", ".timeout 50"])
            .arg(&db)
            .arg(sql)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await;
        let Ok(out) = out else { break };
        writes.tried += 1;
        // The CLI exits 0 after a failed `.restore`; it says why on stderr.
        if out.status.success() && out.stderr.is_empty() {
            writes.taken += 1;
        }
    }
    writes
}

/// One `sqlite3` session kept open for the whole run, asked a question now and then.
pub(super) struct LongLived {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LongLived {
    pub(super) fn open(db: &Path) -> std::io::Result<LongLived> {
        let mut child = Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(LongLived {
            _child: child,
            stdin,
            stdout,
        })
    }

    /// How many messages it sees now (`None` if it stopped answering).
    pub(super) async fn count(&mut self) -> Option<u64> {
        self.stdin
            .write_all(b"select count(*) from messages;\n")
            .await
            .ok()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).await.ok()?;
        line.trim().parse().ok()
    }
}

/// The system `sqlite3`'s verdict on the file: `Ok` when `integrity_check` says ok.
pub(super) async fn integrity_check(db: &Path) -> anyhow::Result<()> {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg("pragma integrity_check")
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run sqlite3: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && said == "ok" {
        Ok(())
    } else {
        anyhow::bail!("{said}{}", String::from_utf8_lossy(&out.stderr))
    }
}
