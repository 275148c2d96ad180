//! One compaction at a time per session.
//!
//! A session's lock is held for the whole of a compaction. Taking it *before* an append is
//! acknowledged (not inside the spawned task) means a client that asks for the context right
//! after its append always sees the compaction as in flight and waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub(super) struct SessionLocks {
    map: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
}

/// Held while a session compacts; the map entry goes away with the last user.
pub(super) struct SessionGuard {
    guard: Option<OwnedMutexGuard<()>>,
    map: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
    id: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.guard.take();
        if let Ok(mut map) = self.map.lock() {
            // Only the map's own reference left: nobody holds or waits for this lock.
            if map.get(&self.id).is_some_and(|m| Arc::strong_count(m) == 1) {
                map.remove(&self.id);
            }
        }
    }
}

impl SessionLocks {
    fn entry(&self, id: &str) -> Arc<AsyncMutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id.to_string()).or_default().clone()
    }

    fn guard(&self, id: &str, guard: OwnedMutexGuard<()>) -> SessionGuard {
        SessionGuard {
            guard: Some(guard),
            map: self.map.clone(),
            id: id.to_string(),
        }
    }

    /// The lock if nobody holds it.
    pub(super) fn try_lock(&self, id: &str) -> Option<SessionGuard> {
        let guard = self.entry(id).try_lock_owned().ok()?;
        Some(self.guard(id, guard))
    }

    /// The lock, waiting for a running compaction to finish.
    pub(super) async fn lock(&self, id: &str) -> SessionGuard {
        let guard = self.entry(id).lock_owned().await;
        self.guard(id, guard)
    }

    /// Waits until no compaction of the session is running.
    pub(super) async fn wait_idle(&self, id: &str) {
        let busy = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.get(id).cloned()
        };
        if let Some(lock) = busy {
            // Released through a SessionGuard, so the last one out removes the map's entry.
            let guard = lock.lock_owned().await;
            drop(self.guard(id, guard));
        }
    }

    pub(super) fn is_busy(&self, id: &str) -> bool {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).is_some_and(|m| m.try_lock().is_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn one_holder_per_session_and_sessions_are_independent() {
        let locks = SessionLocks::default();
        let a = locks.try_lock("a").expect("free");
        assert!(locks.is_busy("a") && !locks.is_busy("b"));
        assert!(locks.try_lock("a").is_none());
        let b = locks.try_lock("b").expect("another session is free");
        drop(a);
        assert!(!locks.is_busy("a"));
        assert!(locks.try_lock("a").is_some());
        drop(b);
    }

    #[tokio::test]
    async fn waiters_wait_for_the_holder_and_the_map_empties_after_the_last() {
        let locks = SessionLocks::default();
        let held = locks.lock("s").await;
        let mut waiting = Box::pin(locks.lock("s"));
        let mut idle = Box::pin(locks.wait_idle("s"));
        assert!((&mut waiting).now_or_never().is_none());
        assert!((&mut idle).now_or_never().is_none());
        drop(held);
        let next = waiting.await;
        assert!(locks.is_busy("s"), "the waiter holds it now");
        drop(next);
        idle.await;
        assert!(locks.map.lock().unwrap().is_empty(), "no entry left behind");
        // Idle sessions are not waited for.
        locks.wait_idle("never-locked").await;
    }
}
