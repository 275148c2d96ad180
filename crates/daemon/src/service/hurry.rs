//! Hurrying a compaction. A context over its session's trigger waits for the compaction that
//! will bring it under, but at most `max_wait_s`: past that the waiter hurries the compaction,
//! which then drops its model call and finishes with the extractive summarizer (recorded as a
//! fallback), so no agent waits longer than the bound and none is handed an over-limit context.
//!
//! A session's token lives from the first of its compaction or its hurrying to the end of the
//! compaction (or the waiter's leaving), so the map holds at most one entry per session with a
//! compaction running or a context waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct Hurries {
    map: Mutex<HashMap<String, CancellationToken>>,
}

impl Hurries {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, CancellationToken>) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What a compaction of `id` watches while its summarizer runs (already cancelled if a
    /// waiter past its bound hurried the session before the compaction got this far).
    pub(super) fn token(&self, id: &str) -> CancellationToken {
        self.with(|map| map.entry(id.to_string()).or_default().clone())
    }

    /// Asks the session's running compaction, or its next one, to finish now.
    pub(super) fn hurry(&self, id: &str) {
        self.with(|map| map.entry(id.to_string()).or_default().cancel());
    }

    /// A compaction of `id` ended: the next one starts unhurried.
    pub(super) fn finished(&self, id: &str) {
        self.with(|map| map.remove(id));
    }

    /// A waiter that hurried `id` leaves: a later compaction nobody waits for takes its time.
    pub(super) fn calm(&self, id: &str) {
        self.with(|map| {
            if map.get(id).is_some_and(|t| t.is_cancelled()) {
                map.remove(id);
            }
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.with(|map| map.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hurry_reaches_the_running_compaction_and_ends_with_it() {
        let hurries = Hurries::default();
        let running = hurries.token("s");
        assert!(!running.is_cancelled());
        hurries.hurry("s");
        assert!(running.is_cancelled(), "the running compaction sees it");
        hurries.finished("s");
        assert!(
            !hurries.token("s").is_cancelled(),
            "the next one is not hurried"
        );
        hurries.finished("s");
        assert_eq!(hurries.len(), 0);
    }

    #[test]
    fn a_hurry_before_the_compaction_looks_is_kept_until_the_waiter_leaves() {
        let hurries = Hurries::default();
        hurries.hurry("s");
        assert!(
            hurries.token("s").is_cancelled(),
            "hurried before it started"
        );
        hurries.calm("s");
        assert!(!hurries.token("s").is_cancelled());
        // Calming leaves an unhurried compaction's token alone.
        let running = hurries.token("s");
        hurries.calm("s");
        assert!(!running.is_cancelled() && hurries.len() == 1);
    }
}
