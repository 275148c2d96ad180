//! The configuration in force, and each session's compaction settings derived from it.
//!
//! A session's settings are the global ones with its overrides, fitted to its context limit
//! in estimated tokens (the limit over the rate its model counts at, in steps of a quarter),
//! their reserve at least the completion its client asks room for.
//! Merging overrides is a serde round trip of the whole `[compaction]` table; an append
//! needed it three times (its pin rules, masking, the trigger), a proxied append four, and
//! it showed in the writer's profile. Sessions share few distinct overrides, so each merge is
//! made once per settings and kept.

use super::summarizer_slots::SummarizerSlots;
use crate::compaction::CompactionConfig;
use crate::compaction::config::completion_share;
use crate::compaction::constants::BACKGROUND_AT;
use crate::config::{Config, compaction_with_overrides};
use crate::store::SessionRow;
use crate::summarize::Summarizer;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Distinct (overrides, context limit, completion) kept; past this the memo starts over, so a
/// client making sessions with ever new overrides costs a merge each, never memory.
const MAX_MERGED: usize = 256;

/// How long a window a model's refusal taught is shared with the caller's new sessions.
const TAUGHT_WINDOW_KEPT: Duration = Duration::from_secs(24 * 3600);

/// The configuration in force and the summarizer built from it, swapped whole on reload.
pub struct Settings {
    pub config: Config,
    pub summarizer: Arc<dyn Summarizer>,
    /// How many compactions call it at once (a reload makes new slots: calls running on the
    /// old ones finish there).
    pub summarizer_slots: SummarizerSlots,
    /// When this configuration was loaded: a window a model's refusal taught before then is
    /// not shared with new sessions (see [`Settings::windows_taught_since`]).
    loaded_at: SystemTime,
    merged: Mutex<Vec<Merged>>,
}

struct Merged {
    overrides: Value,
    estimated_limit: usize,
    /// [`CompactionConfig::completion_share`]'s bits.
    completion_share: u64,
    config: Arc<CompactionConfig>,
}

impl Settings {
    pub fn new(config: Config, summarizer: Arc<dyn Summarizer>) -> Settings {
        Settings {
            summarizer_slots: SummarizerSlots::new(config.summarizer.max_concurrent),
            config,
            summarizer,
            loaded_at: SystemTime::now(),
            merged: Mutex::new(Vec::new()),
        }
    }

    /// Since when a window a model's refusal taught one session is where the caller's new
    /// sessions of the model start: this configuration's load (a `[proxy.models]` entry
    /// corrected since drops what the old one taught), and at most [`TAUGHT_WINDOW_KEPT`] ago
    /// (a model server restarted with a larger window is found again the next day, for one
    /// refused call).
    pub fn windows_taught_since(&self) -> SystemTime {
        let day_ago = SystemTime::now()
            .checked_sub(TAUGHT_WINDOW_KEPT)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.loaded_at.max(day_ago)
    }

    /// The compaction settings of `session`: global settings plus its overrides, fitted to
    /// its context limit in estimated tokens (see [`CompactionConfig::fitted_to`] and
    /// [`SessionRow::estimated_limit`]), the completion its client asks room for kept free
    /// (see [`completion_share`]). An unset `background_at` is
    /// resolved by summarizer (see [`BACKGROUND_AT`]). Overrides that no longer validate
    /// (the global settings changed under them) give the global settings.
    pub fn session_config(&self, session: &SessionRow) -> Arc<CompactionConfig> {
        let estimated_limit = session.estimated_limit();
        let share = completion_share(session.context_limit, session.completion_tokens);
        let share = share.unwrap_or(0.0);
        let mut merged = self.merged.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = merged.iter().find(|m| {
            m.estimated_limit == estimated_limit
                && m.completion_share == share.to_bits()
                && m.overrides == session.overrides
        }) {
            return found.config.clone();
        }
        let config = Arc::new(self.merge(session, estimated_limit, share));
        if merged.len() >= MAX_MERGED {
            merged.clear();
        }
        merged.push(Merged {
            overrides: session.overrides.clone(),
            estimated_limit,
            completion_share: share.to_bits(),
            config: config.clone(),
        });
        config
    }

    fn merge(&self, session: &SessionRow, estimated_limit: usize, share: f64) -> CompactionConfig {
        let global = &self.config.compaction;
        let mut config = compaction_with_overrides(global, &session.overrides)
            .unwrap_or_else(|_| global.clone());
        config.completion_share = share;
        let mut config = config.fitted_to(estimated_limit).0;
        if config.background_at.is_none() && !self.summarizer.is_instant() {
            config.background_at = Some(BACKGROUND_AT);
        }
        config
    }
}
