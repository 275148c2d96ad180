//! What the API answers with. The service builds these (`service::views`); the server
//! serializes them; clients, the CLI and the tests deserialize them.

use super::ErrorCode;
use super::{Compaction, CompactionFailure, Masking, SessionKind, StoredMessage, TokenSource};
use compactd_core::compaction::Trigger;
use compactd_core::message::{Message, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`; `refusing_writes` while the database file (or its WAL or index) is removed,
    /// replaced or overwritten under the daemon, until a restart; `storage_full` while the
    /// disk holding the database is full, until there is room. `writes_refused` says which
    /// and what to do.
    pub status: String,
    /// Why every write is refused now (503 `storage_gone` or 507 `storage_full`), if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_refused: Option<String>,
    /// Another process held the database's write lock at the daemon's last try (a
    /// transaction left open in `sqlite3`?): appends wait up to 2 s and answer 503 `busy`,
    /// proxied calls go upstream unrecorded, until it lets go. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write_lock_held_elsewhere: bool,
    pub version: String,
    pub uptime_s: u64,
    pub pid: u32,
    /// The summarizer in force: `extractive`, `openai`, `anthropic` or `command`.
    pub summarizer: String,
    /// The database file.
    pub database: String,
    pub config: ConfigStatus,
    /// The OpenAI-compatible proxy: where it forwards and the TCP address it also serves on.
    #[serde(default)]
    pub proxy: ProxyStatus,
    /// What requests and compactions hold in memory now, against their budgets.
    #[serde(default)]
    pub memory: MemoryStatus,
    /// What the database takes on its disk, and what is left there.
    #[serde(default)]
    pub disk: DiskStatus,
    /// Compactions calling the summarizer now, and waiting for a slot to
    /// (`[summarizer] max_concurrent`).
    #[serde(default)]
    pub summarizer_calls: SummarizerCalls,
}

/// Compactions calling the summarizer (a model or a command) now, at most `max_concurrent`
/// (and one more that a context or a manual compaction waits for), and waiting for a slot.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SummarizerCalls {
    pub running: usize,
    pub waiting: usize,
    pub max_concurrent: usize,
}

/// The database file and its WAL (bytes), and the space left on their file system for the
/// daemon's user (nothing is ever deleted, so the database only grows; when the disk fills,
/// writes are refused until there is room). `free_bytes` is absent where the file system does
/// not say.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DiskStatus {
    pub database_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
}

/// The daemon's memory budgets and what is charged to them now (bytes): bodies being read,
/// parsed and answered, and answers being recorded, draw on `requests`; compactions on
/// `compactions`. A request that finds no room within a few seconds gets a 503 `busy`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct MemoryStatus {
    pub requests_bytes: usize,
    pub request_budget_bytes: usize,
    pub compactions_bytes: usize,
    pub compaction_budget_bytes: usize,
}

/// The proxy's settings in force (`listen` as configured: it applies at the next start).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ProxyStatus {
    /// `POST /v1/chat/completions` goes here.
    pub openai_upstream: String,
    /// `POST /v1/messages` goes here.
    #[serde(default)]
    pub anthropic_upstream: String,
    /// The loopback TCP address the proxy also serves on, if any.
    pub listen: Option<String>,
    /// Proxied conversations whose system prompt could not stay whole beside the smallest
    /// summary and the current step, as the daemon remembers them since it started (at most
    /// 4,096 at once; each session's view says how much: `unpinned_system_tokens`; the log
    /// names each once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpinned_system_prompts: usize,
}

/// Where the configuration came from and whether the last edit of it was rejected.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ConfigStatus {
    /// The config file watched (it may not exist: then the defaults are in force).
    pub path: Option<String>,
    /// Whether that file exists.
    #[serde(default)]
    pub exists: bool,
    /// Why the file on disk is not in force (the previous config is), if it is not.
    pub error: Option<String>,
    /// Successful reloads since start.
    pub reloads: u64,
}

/// A session as `GET /v1/session/{id}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    #[schema(value_type = String)]
    pub id: super::SessionId,
    pub model: Option<String>,
    pub context_limit: usize,
    /// The session's `[compaction]` overrides.
    pub config: Value,
    pub created_at: String,
    pub updated_at: String,
    pub message_count: u64,
    /// Messages not yet compacted.
    pub active_messages: usize,
    pub compaction_count: u32,
    /// Tokens in the context now.
    pub tokens: usize,
    pub token_source: TokenSource,
    /// Once the model has reported usage: tokens it counted per token compactd estimated (1
    /// to 4), kept across compactions; what came after the report, and a context no report
    /// has measured yet, count at this rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_rate: Option<f64>,
    /// Compaction starts at this many tokens (context_limit - reserve; the reserve is at least
    /// `completion_tokens`).
    pub token_threshold: usize,
    pub max_messages: usize,
    /// A compaction of this session is running.
    pub compacting: bool,
    pub breaker: BreakerView,
    /// How the session came to be: `api` (the socket API), `proxy` (a conversation the proxy
    /// records), `side` (a proxied client's one-off calls: titles, commit messages).
    pub kind: SessionKind,
    /// Branches of a proxied conversation (where its client changed what it sends); 1 for
    /// every other session.
    pub branches: u64,
    /// Why `context_limit` is what it is: the model table, `[proxy.models]`, a header, the
    /// default, or the window the model named when it refused a call as too long (`upstream
    /// refusal`, for the proxy's calls and `POST /session/{id}/overflow`); absent for sessions
    /// made through the API, whose limit the client chose, until such a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_source: Option<String>,
    /// Tokens of the tools and system a proxied client sends with each call, counted in
    /// `tokens`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overhead_tokens: usize,
    /// The completion the client asks room for beside each prompt (a proxied call's
    /// `max_tokens`, or the one a refusal named): kept free below `context_limit` while it
    /// takes at most three quarters of it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub completion_tokens: usize,
    /// With `limit_source` `upstream refusal`: when the model's refusal taught the limit (this
    /// session's, or one of the same caller and model that this session started from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_taught_at: Option<String>,
    /// Tokens of system messages (a proxied agent's system prompt) that could not stay whole
    /// in the context: they did not fit beside the smallest summary and the current step, so
    /// they are summarized or shown as the tail allows. Absent when every one is pinned.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpinned_system_tokens: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The circuit breaker of automatic compaction.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BreakerView {
    /// Automatic attempts in this turn that have not yet brought the session under its trigger.
    pub attempts: u32,
    pub threshold: u32,
    /// Automatic compaction is paused until the next user message.
    pub open: bool,
}

/// `GET /v1/session`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// In id order.
    pub sessions: Vec<SessionView>,
    /// Live sessions in all, on every page: a count needs no walk through the pages.
    #[serde(default)]
    pub total: u64,
    /// More sessions follow: ask again with `after` set to this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `DELETE /v1/session/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Deleted {
    pub deleted: bool,
    #[schema(value_type = String)]
    pub id: super::SessionId,
}

/// Where a compaction an append triggered stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompactionState {
    /// Running in the background; `compaction_finished` or `compaction_failed` follows.
    Started,
    /// One was already running for the session.
    InProgress,
    /// Finished before the answer (`"wait": true`); `result` holds it.
    Completed,
    /// Failed (`"wait": true`); `reason` says why, and the failure is recorded.
    Failed,
    /// Automatic compaction is paused until the next user message.
    BreakerOpen,
    /// Nothing was due.
    NotNeeded,
}

/// What an append triggered.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompactionStatus {
    pub trigger: Option<Trigger>,
    pub status: CompactionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<Compaction>>,
}

/// The answer to an append.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AppendResponse {
    #[schema(value_type = String)]
    pub session_id: super::SessionId,
    /// Sequence numbers given to the appended messages.
    pub first_seq: u64,
    pub last_seq: u64,
    pub message_count: u64,
    pub tokens: usize,
    pub token_source: TokenSource,
    /// The session was created by this append.
    pub created: bool,
    /// An earlier append with the same Idempotency-Key stored these messages; this one
    /// stored nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// The compaction this append triggered, if any.
    pub compaction: Option<CompactionStatus>,
}

/// The answer to `POST /v1/session/{id}/overflow`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OverflowOutcome {
    /// The refusal was recorded. False when the session serves another context by now (a
    /// compaction landed while the call was out): the next `GET /context` is that one.
    pub noted: bool,
    /// The prompt's tokens, as the refusal gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<usize>,
    /// The model's window, as the refusal named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<usize>,
    /// The session now: `tokens` what the model counted, `context_limit` the window it named
    /// when under the session's limit.
    pub session: SessionView,
    /// The compaction the refusal started, if any: the next `GET /context` waits for it.
    pub compaction: Option<CompactionStatus>,
}

/// `GET /v1/session/{id}/search`: the session's messages that best match a query.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SearchResults {
    pub session_id: super::SessionId,
    pub query: String,
    /// Best first (bm25), newest first among equals.
    pub results: Vec<SearchResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SearchResult {
    /// Read it whole with `GET /v1/session/{id}/message?after=SEQ-1&limit=1`.
    pub seq: u64,
    pub role: Role,
    /// The message's text around the first word found (about 240 characters, one line).
    pub snippet: String,
    /// Relevance (bm25, higher is better); compares within one answer only.
    pub score: f64,
    /// The context shows this message whole now (not summarized, masked or shortened).
    pub in_context: bool,
}

/// A page of history: `GET /v1/session/{id}/message`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HistoryPage {
    pub messages: Vec<HistoryMessage>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u64>,
}

/// A stored message as the history shows it: always whole (never masked).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HistoryMessage {
    /// 1-based position in the session.
    pub seq: u64,
    pub role: Role,
    #[schema(value_type = Vec<compactd_core::message::Part>)]
    pub parts: Box<RawValue>,
    /// Estimated tokens.
    pub tokens: usize,
    pub created_at: String,
    /// A system message or the session's task: never compacted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// Summarized by a compaction (no longer sent verbatim; pinned messages never are).
    pub compacted: bool,
    /// Where a branch of a proxied conversation starts: the message before this one on its
    /// branch (absent when that is `seq - 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches_from: Option<u64>,
}

/// A page of a session's compaction history: `GET /v1/session/{id}/compaction`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompactionHistory {
    pub compactions: Vec<Compaction>,
    /// Pass as `after` for the next page of compactions; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u32>,
    pub failures: Vec<CompactionFailure>,
    /// Pass as `failures_after` for the next page of failures; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures_next_after: Option<u64>,
    /// Maskings of old tool outputs (microcompaction).
    pub maskings: Vec<Masking>,
    /// Pass as `maskings_after` for the next page of maskings; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maskings_next_after: Option<u64>,
}

/// The answer to a manual compaction: `POST /v1/session/{id}/summarize`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SummarizeOutcome {
    /// `"compacted": true` and the compaction's fields.
    Compacted {
        /// Always true here.
        compacted: bool,
        #[serde(flatten)]
        compaction: Box<Compaction>,
    },
    /// `"compacted": false` and why not.
    NotCompacted {
        /// Always false here.
        compacted: bool,
        reason: String,
    },
}

impl SummarizeOutcome {
    pub fn compacted(compaction: Compaction) -> SummarizeOutcome {
        SummarizeOutcome::Compacted {
            compacted: true,
            compaction: Box::new(compaction),
        }
    }

    pub fn not_compacted(reason: impl Into<String>) -> SummarizeOutcome {
        SummarizeOutcome::NotCompacted {
            compacted: false,
            reason: reason.into(),
        }
    }

    /// The compaction, if one ran.
    pub fn compaction(&self) -> Option<&Compaction> {
        match self {
            SummarizeOutcome::Compacted { compaction, .. } => Some(compaction),
            SummarizeOutcome::NotCompacted { .. } => None,
        }
    }
}

/// The context: pinned messages that were compacted past, the summary (once there is one),
/// and the verbatim tail.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ContextView {
    #[schema(value_type = String)]
    pub session_id: super::SessionId,
    pub messages: Vec<ContextMessage>,
    /// Estimated tokens of these messages.
    pub tokens: usize,
    pub context_limit: usize,
    pub compaction_num: u32,
}

/// One message of a context: the summary, or a stored message.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ContextMessage {
    /// The summary of what was compacted, as a user message.
    Summary {
        role: Role,
        parts: Vec<compactd_core::message::Part>,
        /// Marks the summary message, for clients that want to show it differently.
        summary: bool,
        compaction_num: u32,
    },
    /// A stored message; its old tool outputs may be masked (`masked: true`).
    Stored(StoredMessage),
}

/// By hand, because an untagged enum buffers its input and a stored message's raw `parts`
/// cannot be read from a buffer: the summary is told by its `"summary": true`.
impl<'de> Deserialize<'de> for ContextMessage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        struct Summary {
            role: Role,
            parts: Vec<compactd_core::message::Part>,
            summary: bool,
            compaction_num: u32,
        }
        let value = Value::deserialize(d)?;
        if value.get("summary").and_then(Value::as_bool) == Some(true) {
            let s: Summary = serde_json::from_value(value).map_err(D::Error::custom)?;
            Ok(ContextMessage::Summary {
                role: s.role,
                parts: s.parts,
                summary: s.summary,
                compaction_num: s.compaction_num,
            })
        } else {
            serde_json::from_str(&value.to_string())
                .map(ContextMessage::Stored)
                .map_err(D::Error::custom)
        }
    }
}

/// Which shape a context is answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextFormat {
    /// compactd's own: stored messages with seq, tokens, pinned, masked; the summary marked.
    #[default]
    Compactd,
    /// OpenAI Chat Completions `messages`.
    Openai,
    /// Anthropic Messages `system` and `messages`.
    Anthropic,
}

/// A context ready to send to a model API: `messages` (and `system` for Anthropic) go into
/// the request body as they are.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProviderContext {
    #[schema(value_type = String)]
    pub session_id: super::SessionId,
    pub format: ContextFormat,
    /// Anthropic only: the system messages' text, lifted out of `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Chat Completions messages, or Messages API messages.
    pub messages: Vec<Value>,
    pub tokens: usize,
    pub context_limit: usize,
    pub compaction_num: u32,
}

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What went wrong, for a person.
    pub message: String,
}

impl CompactionStatus {
    fn of(trigger: Option<Trigger>, status: CompactionState) -> CompactionStatus {
        CompactionStatus {
            trigger,
            status,
            reason: None,
            result: None,
        }
    }
    /// A compaction of `trigger` started in the background.
    pub fn started(trigger: Trigger) -> Self {
        Self::of(Some(trigger), CompactionState::Started)
    }
    /// One was already running.
    pub fn in_progress(trigger: Trigger) -> Self {
        Self::of(Some(trigger), CompactionState::InProgress)
    }
    /// The circuit breaker kept it from starting.
    pub fn breaker_open(trigger: Trigger) -> Self {
        Self::of(Some(trigger), CompactionState::BreakerOpen)
    }
    /// Nothing was due.
    pub fn not_needed() -> Self {
        Self::of(None, CompactionState::NotNeeded)
    }
    /// It finished before the answer.
    pub fn completed(trigger: Trigger, compaction: Compaction) -> Self {
        CompactionStatus {
            result: Some(Box::new(compaction)),
            ..Self::of(Some(trigger), CompactionState::Completed)
        }
    }
    /// It failed, for `reason`.
    pub fn failed(trigger: Trigger, reason: String) -> Self {
        CompactionStatus {
            reason: Some(reason),
            ..Self::of(Some(trigger), CompactionState::Failed)
        }
    }
}

impl ContextView {
    /// The context's messages in the neutral shape (the summary as a user message).
    pub fn to_messages(&self) -> Vec<Message> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ContextMessage::Stored(stored) => stored.to_message().ok(),
                ContextMessage::Summary { role, parts, .. } => Some(Message {
                    role: *role,
                    parts: parts.clone(),
                }),
            })
            .collect()
    }
}
