//! Summarizers: what turns a compaction prompt into a summary.
//!
//! The [`Summarizer`] trait is async so model backends (HTTP calls, child processes) fit behind
//! it; the built-in [`extractive::Extractive`] summarizer is offline and deterministic and is the
//! default when no model is configured.

#![forbid(unsafe_code)]

pub mod anthropic;
pub mod command;
pub mod config;
pub mod extractive;
pub mod http;
pub mod model;
pub mod openai;

// The engine's types and the formats' readers, under the paths the modules here use.
use compactd_core::{compaction, message};
use compactd_formats::provider;

use crate::compaction::FileLists;
use crate::config::{SummarizerConfig, SummarizerKind};
use crate::message::Message;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// What a summarizer is asked to summarize. Model backends read `prompt`; the extractive
/// summarizer works from the structured fields, which carry the same content.
#[derive(Debug, Clone, Default)]
pub struct SummaryRequest {
    /// The full compaction prompt (SPEC.md 5.4).
    pub prompt: String,
    /// The messages being compacted, unmasked and untruncated (pinned ones are not here: they
    /// stay in the context verbatim).
    pub messages: Vec<Message>,
    /// The stored seq of each message, so a summary can point to the whole original.
    pub seqs: Vec<u64>,
    pub prior_summary: Option<String>,
    /// The session's files (prior lists plus this compaction's).
    pub files: FileLists,
    pub focus: Option<String>,
    /// How long the summary may be, in tokens, so it never crowds the context it serves.
    pub max_summary_tokens: Option<usize>,
    /// How long it may grow past that to keep every user instruction whole (section 6);
    /// nothing else may take it past `max_summary_tokens`.
    pub summary_ceiling_tokens: Option<usize>,
    /// The session's task (first user instruction), when this compaction covers it.
    pub task: Option<TaskNote>,
}

/// Where the session's task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNote {
    pub seq: u64,
    /// Its text.
    pub text: String,
    /// Kept verbatim at the start of the context (so a summary only points to it).
    pub pinned: bool,
    /// When not pinned (too large), section 6 keeps this many characters of it.
    pub max_chars: usize,
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
    /// The model refused the prompt as longer than its context window. `compaction_run` answers
    /// this by cutting the conversation into smaller chunks and trying again.
    #[error("summarizer's context window exceeded: {0}")]
    ContextExceeded(String),
    #[error("summarizer response could not be read: {0}")]
    BadResponse(String),
    #[error("summarizer returned a blank summary")]
    Blank,
    /// A summary longer than the context leaves it (a model that ignored `max_tokens`, or a
    /// `max_output_tokens` larger than a small context allows): stored, it would put the
    /// context over its trigger or its limit.
    #[error(
        "summarizer wrote {tokens} tokens, over the {ceiling} this session's context leaves a summary; lower [summarizer] max_output_tokens"
    )]
    TooLong { tokens: usize, ceiling: usize },
    #[error("summarizer command failed: {0}")]
    Command(String),
    #[error("summarizer call cancelled by shutdown")]
    Cancelled,
    #[error("summarizer misconfigured: {0}")]
    Config(String),
    #[error("summarizer failed: {0}")]
    Internal(String),
}

/// Something that writes summaries.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// A short name recorded with each compaction, e.g. `extractive` or `openai:gpt-4o-mini`.
    fn name(&self) -> String;

    /// Whether it answers in milliseconds, in process (no model, no program): compactions
    /// with it need not start early in the background.
    fn is_instant(&self) -> bool {
        false
    }

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

/// The system prompt model summarizers receive with the compaction prompt.
pub const SYSTEM_PROMPT: &str = include_str!("system_prompt.md");

/// Builds the summarizer the config names. API keys are read from the environment here, once
/// per (re)load, and live only in memory.
pub fn from_config(config: &SummarizerConfig) -> Result<Arc<dyn Summarizer>, SummarizeError> {
    Ok(match config.kind {
        SummarizerKind::Extractive => Arc::new(extractive::Extractive),
        SummarizerKind::Openai => Arc::new(model_summarizer(
            openai::OpenAi,
            config,
            "https://api.openai.com/v1",
            "/chat/completions",
        )?),
        SummarizerKind::Anthropic => Arc::new(model_summarizer(
            anthropic::Anthropic,
            config,
            "https://api.anthropic.com",
            "/v1/messages",
        )?),
        SummarizerKind::Command => Arc::new(command::Command {
            command: config
                .command
                .clone()
                .ok_or_else(|| SummarizeError::Config("[summarizer] command is required".into()))?,
            timeout: Duration::from_secs(config.timeout_s),
            max_output_tokens: config.max_output_tokens,
            context_window: config.context_window,
        }),
    })
}

/// An HTTP summarizer for `api` at `base_url` (or `default_base`) + `path`.
fn model_summarizer<A: model::ModelApi>(
    api: A,
    config: &SummarizerConfig,
    default_base: &str,
    path: &str,
) -> Result<model::ModelSummarizer<A>, SummarizeError> {
    let api_key = match &config.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            SummarizeError::Config(format!(
                "[summarizer] api_key_env names ${var}, which is not set"
            ))
        })?),
        None => None,
    };
    let base = config
        .base_url
        .as_deref()
        .unwrap_or(default_base)
        .trim_end_matches('/');
    Ok(model::ModelSummarizer {
        api,
        url: format!("{base}{path}"),
        model: config
            .model
            .clone()
            .ok_or_else(|| SummarizeError::Config("[summarizer] model is required".into()))?,
        policy: http::CallPolicy {
            timeout: Duration::from_secs(config.timeout_s),
            max_retries: config.max_retries,
            secret: api_key.clone(),
        },
        api_key,
        max_output_tokens: config.max_output_tokens,
        context_window: config.context_window,
    })
}
