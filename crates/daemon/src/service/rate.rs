//! How fast proxy callers over the loopback listener may make sessions. Any local user can
//! reach that port with any key, and a fresh session per call costs a row forever (nothing is
//! deleted): each key may make [`PER_KEY`] sessions a minute, and all keys together
//! [`ALL_KEYS`]; calls that continue a session are never limited. Memory is bounded too: at
//! most [`MAX_KEYS`] keys are tracked (expired windows are forgotten first; past that, an
//! untracked key counts against the shared limit only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(super) const PER_KEY: usize = 120;
pub(super) const ALL_KEYS: usize = 1_200;
pub(super) const WINDOW: Duration = Duration::from_secs(60);
const MAX_KEYS: usize = 4_096;

#[derive(Default)]
pub(super) struct SessionRate {
    windows: Mutex<Windows>,
}

#[derive(Default)]
struct Windows {
    keys: HashMap<String, Window>,
    all: Option<Window>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    made: usize,
}

impl Window {
    fn current(window: Option<Window>, now: Instant) -> Window {
        match window {
            Some(w) if now.duration_since(w.started) < WINDOW => w,
            _ => Window {
                started: now,
                made: 0,
            },
        }
    }
}

impl SessionRate {
    /// Whether `owner` may make a session now; if not, the seconds until it may.
    pub(super) fn allows(&self, owner: &str, now: Instant) -> Result<(), u64> {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let key = Window::current(windows.keys.get(owner).copied(), now);
        let all = Window::current(windows.all, now);
        let full = [(key, PER_KEY), (all, ALL_KEYS)]
            .into_iter()
            .filter(|(w, cap)| w.made >= *cap)
            .map(|(w, _)| WINDOW.saturating_sub(now.duration_since(w.started)))
            .max();
        match full {
            Some(wait) => Err(wait.as_secs().max(1)),
            None => Ok(()),
        }
    }

    /// Counts a session `owner` made.
    pub(super) fn made(&self, owner: &str, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = Window::current(windows.all, now);
        all.made += 1;
        windows.all = Some(all);
        if !windows.keys.contains_key(owner) && windows.keys.len() >= MAX_KEYS {
            windows
                .keys
                .retain(|_, w| now.duration_since(w.started) < WINDOW);
            if windows.keys.len() >= MAX_KEYS {
                return;
            }
        }
        let mut key = Window::current(windows.keys.get(owner).copied(), now);
        key.made += 1;
        windows.keys.insert(owner.to_string(), key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_and_all_keys_together_are_limited_per_minute() {
        let rate = SessionRate::default();
        let now = Instant::now();
        for _ in 0..PER_KEY {
            assert!(rate.allows("a", now).is_ok());
            rate.made("a", now);
        }
        let wait = rate.allows("a", now).unwrap_err();
        assert!((1..=60).contains(&wait));
        assert!(rate.allows("b", now).is_ok(), "another key is not held up");
        assert!(rate.allows("a", now + WINDOW).is_ok(), "a minute later");
        for i in 0..ALL_KEYS {
            rate.made(&format!("k{i}"), now);
        }
        assert!(
            rate.allows("fresh", now).is_err(),
            "fresh keys share a limit"
        );
        let windows = rate.windows.lock().unwrap();
        assert!(windows.keys.len() <= MAX_KEYS);
    }
}
