//! The context each socket session was last served, by its `compaction_num`. An agent's usage
//! report measures the context it sent, which it got from `GET /context`; when a compaction
//! has landed since (in the background while the model call was out), the report counts the
//! context before it and would make the session look as full as then, starting another
//! compaction at once. A client may say which context it measured (`usage.compaction_num`);
//! for one that does not, the context it was last served says it.
//!
//! Bounded by construction: at most [`MAX_SESSIONS`] entries, the map emptied when full. A
//! session missing from it (after a restart, or emptied out) has its report counted, as
//! before this existed.

use std::collections::HashMap;
use std::sync::Mutex;

/// The most sessions remembered at once (about 100 bytes each).
const MAX_SESSIONS: usize = 4096;

#[derive(Default)]
pub(super) struct Served {
    map: Mutex<HashMap<String, u32>>,
}

impl Served {
    /// Session `id` was served the context after compaction `num`.
    pub(super) fn record(&self, id: &str, num: u32) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_SESSIONS && !map.contains_key(id) {
            map.clear();
        }
        map.insert(id.to_string(), num);
    }

    /// The `compaction_num` of the context session `id` was last served, if remembered.
    pub(super) fn last(&self, id: &str) -> Option<u32> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_context_served_is_remembered_within_the_bound() {
        let served = Served::default();
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
