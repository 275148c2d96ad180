//! Whether another process holds the database's write lock: a person's transaction left
//! open in `sqlite3` since before the daemon first took the lock, which it then keeps until
//! it stops (see `kept_lock`).
//!
//! While it does, every write waits its [`super::BUSY_WAIT`] and fails `busy`. A proxied
//! call loses nothing by going upstream unrecorded (the agent resends its whole conversation
//! with the next call, which stores it once the lock is let go), so it need not wait that
//! long each time: it goes at once once the lock is known held ([`OutsideLock::held`]).
//! What the writer learns at each try of the lock (every write, every idle second) keeps
//! this up to date, said once in the log each way, and shown by `/health`.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
pub(super) struct OutsideLock {
    held: AtomicBool,
}

impl OutsideLock {
    /// Notes the outcome of the writer's try of the write lock: `elsewhere` when another
    /// process had it.
    pub(super) fn tried(&self, elsewhere: bool) {
        if self.held.swap(elsewhere, Ordering::AcqRel) == elsewhere {
            return;
        }
        match elsewhere {
            true => tracing::warn!(
                "another process holds the database's write lock (a transaction left open in \
                 sqlite3?): appends wait up to 2 s and answer 503 busy, proxied calls go \
                 upstream unrecorded, until it lets go"
            ),
            false => tracing::info!("the database's write lock is free again: writes go on"),
        }
    }

    /// Whether another process held the write lock at the writer's last try.
    pub(super) fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }
}
