//! A session's history of compactions as the API shows it: each compaction, each failed
//! attempt, each masking of old outputs. The store keeps its own rows of these; the service
//! turns them into these types (`service::views`), so a change of table is not a change of
//! the API.

use compactd_core::SessionId;
use compactd_core::compaction::{CompactionResult, Trigger};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A successful compaction.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Compaction {
    #[serde(flatten)]
    pub result: CompactionResult,
    #[schema(value_type = String)]
    pub session_id: SessionId,
    pub trigger: Trigger,
    pub focus: Option<String>,
    /// The first message this compaction summarized.
    pub first_seq: u64,
    /// The first message of the tail it kept verbatim.
    pub boundary_seq: u64,
    pub summarizer: String,
    pub chunks: u32,
    /// Set when the fallback summarizer wrote it: why the model failed.
    pub fallback_reason: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

/// A failed compaction attempt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompactionFailure {
    /// Its id, for paging.
    pub id: u64,
    pub trigger: Trigger,
    pub focus: Option<String>,
    pub summarizer: String,
    pub reason: String,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

/// One masking of old tool outputs (microcompaction).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Masking {
    /// Its id, for paging.
    pub id: u64,
    /// Tool outputs of messages below this seq read as placeholders from then on.
    pub through_seq: u64,
    /// Outputs this masking hid.
    pub outputs: u64,
    pub pre_tokens: usize,
    pub post_tokens: usize,
    pub created_at: String,
}
