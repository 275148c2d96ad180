//! What the daemon tells subscribers of `GET /v1/events`: server-sent events whose `event:`
//! line is the kind and whose `data:` line is one of these as JSON (with `"event"` repeated
//! inside). A subscriber too slow to keep up gets a `lagged` event (`{"event": "lagged"}`): it missed
//! some, and should re-read what it shows from the API.

use compactd_core::compaction::Trigger;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An event, serialized as `{"event": "compaction_finished", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    CompactionStarted {
        session_id: String,
        trigger: Trigger,
        /// Started before any context needs it: contexts are served as they are meanwhile.
        background: bool,
    },
    CompactionFinished {
        session_id: String,
        trigger: Trigger,
        compaction_num: u32,
        pre_tokens: usize,
        post_tokens: usize,
        boundary_seq: u64,
        summarizer: String,
        chunks: usize,
        fallback_reason: Option<String>,
        duration_ms: u64,
        /// It ran in the background (see `compaction_started`).
        background: bool,
    },
    CompactionFailed {
        session_id: String,
        trigger: Trigger,
        reason: String,
    },
    /// Old tool outputs of the session now read as placeholders in its context.
    OutputsMasked {
        session_id: String,
        through_seq: u64,
        outputs: u64,
        pre_tokens: usize,
        post_tokens: usize,
    },
    /// Automatic compaction stopped for this user turn; manual compaction still works.
    BreakerOpen {
        session_id: String,
        attempts: u32,
        threshold: u32,
    },
    ConfigReloaded {
        path: String,
    },
    ConfigRejected {
        path: String,
        error: String,
    },
    /// This subscriber missed events (it read too slowly); sent by the stream, not broadcast.
    Lagged {},
}

impl Event {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::CompactionStarted { .. } => "compaction_started",
            Event::CompactionFinished { .. } => "compaction_finished",
            Event::CompactionFailed { .. } => "compaction_failed",
            Event::OutputsMasked { .. } => "outputs_masked",
            Event::BreakerOpen { .. } => "breaker_open",
            Event::ConfigReloaded { .. } => "config_reloaded",
            Event::ConfigRejected { .. } => "config_rejected",
            Event::Lagged {} => "lagged",
        }
    }
}
