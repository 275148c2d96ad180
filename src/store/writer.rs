//! The writer thread and its group commit.

use super::{Result, StoreError};
use rusqlite::Connection;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// Called with the batch's commit outcome; sends the job's result to its caller.
type Completion = Box<dyn FnOnce(Result<()>) + Send>;
/// A write: runs in a savepoint (or, given no connection, does not run at all) and returns how
/// to complete once the batch's outcome is known.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;

/// Writes queued behind one commit are applied together, up to this many.
const MAX_BATCH: usize = 256;

pub(super) struct Writer {
    jobs: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    pub(super) fn start(conn: Connection) -> Result<Writer> {
        let (tx, rx) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("compactd-writer".into())
            .spawn(move || run(conn, rx))
            .map_err(|e| StoreError::Sqlite(format!("cannot start writer thread: {e}")))?;
        Ok(Writer {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

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
        let sender = self.jobs.lock().ok().and_then(|s| s.clone());
        sender
            .ok_or(StoreError::Closed)?
            .send(job)
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
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

fn run(conn: Connection, jobs: Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let begun = run_statement(&conn, "BEGIN IMMEDIATE");
        if let Err(e) = begun {
            // Without a transaction nothing runs: every caller hears why.
            for job in batch {
                job(None)(Err(e.clone()));
            }
            continue;
        }
        let completions: Vec<Completion> = batch.into_iter().map(|job| job(Some(&conn))).collect();
        let commit = run_statement(&conn, "COMMIT");
        if commit.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for complete in completions {
            complete(commit.clone());
        }
    }
    // Channel closed: fold the WAL back into the database before the connection closes.
    let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
}

/// Runs one transaction-control statement, prepared once per connection: these run several
/// times per write, and parsing them each time shows in the append latency.
fn run_statement(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Runs `f` in a savepoint: its changes stay on success and vanish on error or panic.
fn in_savepoint<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    run_statement(conn, "SAVEPOINT job")?;
    let result = catch_unwind(AssertUnwindSafe(|| f(conn)))
        .unwrap_or_else(|_| Err(StoreError::Sqlite("internal error while writing".into())));
    match &result {
        Ok(_) => run_statement(conn, "RELEASE job")?,
        Err(_) => {
            run_statement(conn, "ROLLBACK TO job")?;
            run_statement(conn, "RELEASE job")?;
        }
    }
    result
}
