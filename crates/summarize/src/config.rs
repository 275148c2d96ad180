//! The `[summarizer]` section of compactd's `config.toml`: which summarizer writes summaries,
//! and how to reach it. Owned here, where it is read; the daemon's config embeds it.

use serde::{Deserialize, Serialize};

/// Which summarizer writes summaries, and how to reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizerConfig {
    pub kind: SummarizerKind,
    /// API root: `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`, `https://api.anthropic.com`.
    pub base_url: Option<String>,
    /// The compaction model (not the agent's).
    pub model: Option<String>,
    /// The environment variable holding the API key (the key itself is never in the config).
    pub api_key_env: Option<String>,
    /// Connect and total timeout of one call, seconds.
    pub timeout_s: u64,
    /// Retries on connection errors, 5xx and 429.
    pub max_retries: u32,
    /// The summarizer's own context window, tokens; prompts larger than
    /// `context_window - max_output_tokens` are compacted in chunks.
    pub context_window: Option<usize>,
    pub max_output_tokens: usize,
    /// For `kind = "command"`: argv (`["llm", "-m", "x"]`) or a shell line. Prompt on stdin,
    /// summary on stdout.
    pub command: Option<CommandLine>,
    /// What to do when the summarizer fails: `"extractive"` compacts with the built-in one.
    pub fallback: Option<Fallback>,
    /// Replace credentials with `[redacted]` in summaries and in every prompt sent to a model.
    pub redact_secrets: bool,
    /// How many compactions call a model or command summarizer at once; others wait their turn
    /// (one more may run for a compaction an agent waits for).
    pub max_concurrent: usize,
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        SummarizerConfig {
            kind: SummarizerKind::Extractive,
            base_url: None,
            model: None,
            api_key_env: None,
            timeout_s: 120,
            max_retries: 3,
            context_window: None,
            max_output_tokens: 4_096,
            command: None,
            fallback: None,
            redact_secrets: true,
            max_concurrent: 4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummarizerKind {
    Extractive,
    Openai,
    Anthropic,
    Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    Extractive,
}

/// A command as argv, or as one line for `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommandLine {
    Argv(Vec<String>),
    Shell(String),
}
