//! Cutting off a compaction's model call. A context over its session's trigger waits for the
//! compaction that will bring it under, but at most `max_wait_s`: past that the waiter cuts
//! the compaction's model call off, and the compaction finishes with the extractive summarizer
//! (recorded as a fallback), so no agent waits longer than the bound and none is handed an
//! over-limit context.
//!
//! A session's token lives from the first of its compaction or its cut-off to the end of the
//! compaction (or the waiter's leaving), so the map holds at most one entry per session with a
//! compaction running or a context waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct ModelCutoffs {
    map: Mutex<HashMap<String, CancellationToken>>,
}

impl ModelCutoffs {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, CancellationToken>) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What a compaction of `id` watches while its summarizer runs (already cancelled if a
    /// waiter past its bound cut the session's model call off before the compaction got this far).
    pub(super) fn token(&self, id: &str) -> CancellationToken {
        self.with(|map| map.entry(id.to_string()).or_default().clone())
    }

    /// Asks the session's running compaction, or its next one, to finish now.
    pub(super) fn cut_off(&self, id: &str) {
        self.with(|map| map.entry(id.to_string()).or_default().cancel());
    }

    /// A compaction of `id` ended: the next one starts with its model call uncut.
    pub(super) fn finished(&self, id: &str) {
        self.with(|map| map.remove(id));
    }

    /// A waiter that cut `id` off leaves: a later compaction nobody waits for takes its time.
    pub(super) fn withdraw(&self, id: &str) {
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
    fn a_cut_off_reaches_the_running_compaction_and_ends_with_it() {
        let cutoffs = ModelCutoffs::default();
        let running = cutoffs.token("s");
        assert!(!running.is_cancelled());
        cutoffs.cut_off("s");
        assert!(running.is_cancelled(), "the running compaction sees it");
        cutoffs.finished("s");
        assert!(
            !cutoffs.token("s").is_cancelled(),
            "the next one is not cut off"
        );
        cutoffs.finished("s");
        assert_eq!(cutoffs.len(), 0);
    }

    #[test]
    fn a_cut_off_before_the_compaction_looks_is_kept_until_the_waiter_leaves() {
        let cutoffs = ModelCutoffs::default();
        cutoffs.cut_off("s");
        assert!(
            cutoffs.token("s").is_cancelled(),
            "cut off before it started"
        );
        cutoffs.withdraw("s");
        assert!(!cutoffs.token("s").is_cancelled());
        // Withdrawing leaves a compaction's token alone when nobody cut it off.
        let running = cutoffs.token("s");
        cutoffs.withdraw("s");
        assert!(!running.is_cancelled() && cutoffs.len() == 1);
    }
}
