//! Summarizers: what turns a compaction prompt into a summary.
//!
//! The [`Summarizer`] trait is async so model backends (HTTP calls, child processes) fit behind
//! it; the built-in [`extractive::Extractive`] summarizer is offline and deterministic and is the
//! default when no model is configured.

pub mod extractive;

use crate::compaction::FileLists;
use crate::message::Message;
use async_trait::async_trait;

/// What a summarizer is asked to summarize. Model backends read `prompt`; the extractive
/// summarizer works from the structured fields, which carry the same content.
#[derive(Debug, Clone, Default)]
pub struct SummaryRequest {
    /// The full compaction prompt (SPEC.md 5.4).
    pub prompt: String,
    /// The messages being compacted, unmasked and untruncated.
    pub messages: Vec<Message>,
    pub prior_summary: Option<String>,
    /// The session's files (prior lists plus this compaction's).
    pub files: FileLists,
    pub focus: Option<String>,
    /// How long the summary may be, in tokens, so it never crowds the context it serves.
    pub max_summary_tokens: Option<usize>,
}

/// Why a summary could not be produced. Every variant leaves the session unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummarizeError {
    #[error("summarizer unreachable: {0}")]
    Unavailable(String),
    #[error("summarizer timed out after {0} s")]
    Timeout(u64),
    #[error("summarizer answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("summarizer response could not be read: {0}")]
    BadResponse(String),
    #[error("summarizer returned a blank summary")]
    Blank,
    #[error("summarizer command failed: {0}")]
    Command(String),
    #[error("summarizer call cancelled by shutdown")]
    Cancelled,
    #[error("summarizer misconfigured: {0}")]
    Config(String),
}

/// Something that writes summaries.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// A short name recorded with each compaction, e.g. `extractive` or `openai:gpt-4o-mini`.
    fn name(&self) -> String;

    /// The summarizer's own context window in tokens; `None` when it has no limit.
    fn context_window(&self) -> Option<usize> {
        None
    }

    /// The most tokens a summary may take (room reserved in the window for the answer).
    fn max_output_tokens(&self) -> usize {
        4_096
    }

    /// Writes the summary.
    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError>;
}

/// Builds the summarizer the config names.
pub fn from_config(
    config: &crate::config::SummarizerConfig,
) -> Result<std::sync::Arc<dyn Summarizer>, SummarizeError> {
    use crate::config::SummarizerKind;
    match config.kind {
        SummarizerKind::Extractive => Ok(std::sync::Arc::new(extractive::Extractive)),
        other => Err(SummarizeError::Config(format!(
            "summarizer kind {other:?} is not available"
        ))),
    }
}
