//! A figure remembered per session, in memory, within a bound: at most [`MAX_SESSIONS`]
//! entries, the map emptied when full. A session missing from it (after a restart, or
//! emptied out) is treated as before anything was remembered: both uses below only spare
//! work or a wrong count, never decide what is stored.
//!
//! - The context each socket session was last served, by its `compaction_num`. An agent's
//!   usage report measures the context it sent, which it got from `GET /context`; when a
//!   compaction has landed since (in the background while the model call was out), the report
//!   counts the context before it and would make the session look as full as then, starting
//!   another compaction at once. A client may say which context it measured
//!   (`usage.compaction_num`); for one that does not, the context it was last served says it.
//! - The `message_count` (and the limit planned against) at which an automatic compaction
//!   found nothing to compact (every active message in the preserved tail: the current step
//!   alone over the trigger). Until a message is appended another attempt would find the
//!   same; made at every append and every `GET /context`, each would be recorded as a failure
//!   and open the circuit breaker for the rest of the turn, so the context grew unchecked once
//!   the step was done.
//! - What a model's refusal of an unrecorded proxied call taught of its conversation (its
//!   window, the rate it counts compactd's estimate at, the completion asked), and the last
//!   in-memory compaction of its calls (at most [`super::unrecorded::CONVERSATIONS`] of
//!   them): the store could not keep either, and without them every later call of the outage
//!   would be refused once more before it was compacted to fit, and compacted anew (its
//!   summary, the prefix of what the model gets, different each time) (see
//!   `service::unrecorded`).
//! - The proxied conversations whose system prompt was stored unpinned (it did not fit beside
//!   the smallest summary and the current step), so the log says so once per conversation
//!   and `/health` counts them.

use std::collections::HashMap;
use std::sync::Mutex;

/// The most sessions remembered at once (about 100 bytes each).
const MAX_SESSIONS: usize = 4096;

pub(super) struct PerSession<T> {
    map: Mutex<HashMap<String, T>>,
    /// The most entries held at once.
    max: usize,
}

impl<T> Default for PerSession<T> {
    fn default() -> Self {
        PerSession::at_most(MAX_SESSIONS)
    }
}

impl<T> PerSession<T> {
    /// A map of at most `max` entries (for figures larger than a few bytes).
    pub(super) fn at_most(max: usize) -> Self {
        PerSession {
            map: Mutex::new(HashMap::new()),
            max,
        }
    }
}

impl<T: Clone> PerSession<T> {
    /// Remembers `value` for session `id`.
    pub(super) fn record(&self, id: &str, value: T) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.max && !map.contains_key(id) {
            map.clear();
        }
        map.insert(id.to_string(), value);
    }

    /// How many sessions are remembered.
    pub(super) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// What was last remembered for session `id`, if anything.
    pub(super) fn last(&self, id: &str) -> Option<T> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_figure_is_remembered_within_the_bound() {
        let served = PerSession::default();
        assert_eq!(served.last("a"), None);
        served.record("a", 1);
        served.record("a", 2);
        assert_eq!(served.last("a"), Some(2));
        for n in 0..MAX_SESSIONS {
            served.record(&format!("s{n}"), 0);
        }
        assert!(served.map.lock().unwrap().len() <= MAX_SESSIONS);
        served.record("a", 3);
        assert_eq!(served.last("a"), Some(3));
    }
}
