//! What clients send: request bodies and query strings.

use super::{ContextFormat, SessionId};
use compactd_core::message::{Part, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/session`: every field optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Generated (`s-...`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub id: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model's window in tokens (default `[compaction] default_context_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<usize>,
    /// `[compaction]` keys overriding the daemon's for this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

/// `PATCH /v1/session/{id}`: the fields to change.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSessionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A lower limit that puts the session over its trigger compacts it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<usize>,
    /// Replaces the session's `[compaction]` overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

/// A message as a client may send it: `parts`, or `content` as a shorthand for one text part.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageInput {
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<Part>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// What the model API reported for the agent's last call.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// At most 1,000,000,000.
    pub input_tokens: u64,
    /// The `compaction_num` of the context the call was sent with (`GET /context` answers
    /// it): a report of a context compacted since is not counted. Absent, the context
    /// `GET /context` last served the session stands for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_num: Option<u32>,
}

/// The three body forms `POST /v1/session/{id}/message` accepts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AppendBody {
    One(MessageInput),
    Many(Vec<MessageInput>),
    Object {
        messages: Vec<MessageInput>,
        #[serde(default)]
        usage: Option<Usage>,
        #[serde(default)]
        wait: bool,
    },
}

/// `GET /v1/session/{id}/message`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Messages after this seq (0: from the first).
    #[serde(default)]
    pub after: u64,
    /// At most this many (1 to 1,000; default 100); a page also stops near 4 MiB.
    pub limit: Option<usize>,
}

/// `GET /v1/session/{id}/search`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Plain words (no syntax: quotes, `*`, `NEAR`, `-` search for themselves); a message
    /// with the words as a phrase ranks first, then those with more of them.
    pub q: String,
    /// At most this many results (1 to 100; default 10).
    pub limit: Option<usize>,
}

/// `GET /v1/session/{id}/context`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ContextQuery {
    /// Wait for a running compaction of the session (default true).
    pub wait: Option<bool>,
    /// `compactd` (default), `openai` or `anthropic`.
    #[serde(default)]
    pub format: ContextFormat,
}

/// `POST /v1/session/{id}/summarize`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SummarizeRequest {
    /// What the summary should keep in particular (like Claude Code's `/compact <focus>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
}

/// `POST /v1/session/{id}/overflow`: the agent's model refused the context as longer than
/// its window. Every field optional: a refusal with no figures still says the context is too
/// long as the model counts it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverflowReport {
    /// The `compaction_num` of the context the refused call was sent with (`GET /context`
    /// answers it). Absent, the context `GET /context` last served the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_num: Option<u32>,
    /// The model API's error answer as it came, its JSON or its text: the prompt's tokens and
    /// the window are read from it (Anthropic's `prompt is too long`, OpenAI's
    /// `context_length_exceeded` and compatible servers', llama.cpp's
    /// `exceed_context_size_error`, Gemini's input token count, Mistral's
    /// `too large for model with M maximum context length`). Another error is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The prompt's tokens as the model counted them (1 to 1,000,000,000), when its error
    /// says so in a form compactd does not read; over what `error` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// The model's window in tokens, when its error names it; over what `error` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<usize>,
}

/// `GET /v1/session`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionListQuery {
    /// Sessions whose id sorts after this one.
    #[serde(default)]
    pub after: String,
    /// At most this many (1 to 1,000; default 1,000); a page also stops near 4 MiB.
    pub limit: Option<usize>,
}

/// `GET /v1/session/{id}/compaction`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CompactionQuery {
    /// Compactions after this number.
    #[serde(default)]
    pub after: u32,
    /// Failures after this id.
    #[serde(default)]
    pub failures_after: u64,
    /// Maskings after this id.
    #[serde(default)]
    pub maskings_after: u64,
    /// At most this many of each (1 to 100; default 100).
    pub limit: Option<usize>,
}
