//! The shapes the API answers with.

use crate::compaction::{CompactionConfig, Trigger, summary_message};
use crate::store::{
    AppendOutcome, CompactionRow, ContextSnapshot, FailureRow, MaskingRow, SessionRow,
    StoredMessage, TokenSource,
};
use serde::Serialize;
use serde_json::Value;

/// A session as `GET /session/{id}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    pub id: String,
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
    /// Compaction starts at this many tokens (context_limit - reserve).
    pub token_threshold: usize,
    pub max_messages: usize,
    /// A compaction of this session is running.
    pub compacting: bool,
    pub breaker: BreakerView,
}

#[derive(Debug, Clone, Serialize)]
pub struct BreakerView {
    /// Automatic attempts in this turn that have not yet brought the session under its trigger.
    pub attempts: u32,
    pub threshold: u32,
    /// Automatic compaction is paused until the next user message.
    pub open: bool,
}

impl SessionView {
    pub fn new(session: SessionRow, config: &CompactionConfig, compacting: bool) -> SessionView {
        let (tokens, token_source) = session.context_tokens();
        SessionView {
            token_threshold: config.token_threshold(session.context_limit),
            max_messages: config.max_messages,
            breaker: BreakerView {
                attempts: session.turn_attempts,
                threshold: config.breaker_threshold,
                open: session.turn_attempts >= config.breaker_threshold,
            },
            compacting,
            tokens,
            token_source,
            id: session.id,
            model: session.model,
            context_limit: session.context_limit,
            config: session.overrides,
            created_at: session.created_at,
            updated_at: session.updated_at,
            message_count: session.message_count,
            active_messages: session.active_messages,
            compaction_count: session.compaction_count,
        }
    }
}

/// What an append triggered.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionStatus {
    pub trigger: Option<Trigger>,
    /// `started`, `in_progress`, `completed`, `failed`, `breaker_open`, `not_needed`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<CompactionRow>>,
}

impl CompactionStatus {
    fn of(trigger: Option<Trigger>, status: &'static str) -> CompactionStatus {
        CompactionStatus {
            trigger,
            status,
            reason: None,
            result: None,
        }
    }
    pub fn started(trigger: Trigger) -> Self {
        Self::of(Some(trigger), "started")
    }
    pub fn in_progress(trigger: Trigger) -> Self {
        Self::of(Some(trigger), "in_progress")
    }
    pub fn breaker_open(trigger: Trigger) -> Self {
        Self::of(Some(trigger), "breaker_open")
    }
    pub fn not_needed() -> Self {
        Self::of(None, "not_needed")
    }
    pub fn completed(trigger: Trigger, row: CompactionRow) -> Self {
        CompactionStatus {
            result: Some(Box::new(row)),
            ..Self::of(Some(trigger), "completed")
        }
    }
    pub fn failed(trigger: Trigger, reason: String) -> Self {
        CompactionStatus {
            reason: Some(reason),
            ..Self::of(Some(trigger), "failed")
        }
    }
}

/// The answer to an append.
#[derive(Debug, Clone, Serialize)]
pub struct AppendResponse {
    pub session_id: String,
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
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// The compaction this append triggered, if any.
    pub compaction: Option<CompactionStatus>,
}

impl AppendResponse {
    pub fn new(outcome: AppendOutcome, compaction: Option<CompactionStatus>) -> AppendResponse {
        let (tokens, token_source) = outcome.session.context_tokens();
        AppendResponse {
            session_id: outcome.session.id,
            first_seq: outcome.first_seq,
            last_seq: outcome.last_seq,
            message_count: outcome.session.message_count,
            tokens,
            token_source,
            created: outcome.created,
            replayed: outcome.replayed,
            compaction,
        }
    }
}

/// A page of history.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryPage {
    pub messages: Vec<HistoryMessage>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HistoryMessage {
    #[serde(flatten)]
    pub message: StoredMessage,
    /// Summarized by a compaction (no longer sent verbatim; pinned messages never are).
    pub compacted: bool,
}

impl HistoryPage {
    pub fn new(session: &SessionRow, messages: Vec<StoredMessage>) -> HistoryPage {
        let next_after = messages
            .last()
            .map(|m| m.seq)
            .filter(|&seq| seq < session.message_count);
        HistoryPage {
            messages: messages
                .into_iter()
                .map(|message| HistoryMessage {
                    compacted: message.seq < session.active_from_seq && !message.pinned,
                    message,
                })
                .collect(),
            next_after,
        }
    }
}

/// A page of a session's compaction history.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionHistory {
    pub compactions: Vec<CompactionRow>,
    /// Pass as `after` for the next page of compactions; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u32>,
    pub failures: Vec<FailureRow>,
    /// Pass as `failures_after` for the next page of failures; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures_next_after: Option<u64>,
    /// Maskings of old tool outputs (microcompaction).
    pub maskings: Vec<MaskingRow>,
    /// Pass as `maskings_after` for the next page of maskings; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maskings_next_after: Option<u64>,
}

impl CompactionHistory {
    /// Pages as read; `failures` and `maskings` say whether more follow theirs.
    pub fn new(
        session: &SessionRow,
        compactions: Vec<CompactionRow>,
        (failures, more_failures): (Vec<FailureRow>, bool),
        (maskings, more_maskings): (Vec<MaskingRow>, bool),
    ) -> CompactionHistory {
        let next_after = compactions
            .last()
            .map(|c| c.result.compaction_num)
            .filter(|&num| num < session.compaction_count);
        CompactionHistory {
            compactions,
            next_after,
            failures_next_after: failures.last().map(|f| f.id).filter(|_| more_failures),
            failures,
            maskings_next_after: maskings.last().map(|m| m.id).filter(|_| more_maskings),
            maskings,
        }
    }
}

/// The context: pinned messages that were compacted past, the summary (once there is one),
/// and the verbatim tail.
#[derive(Debug, Clone, Serialize)]
pub struct ContextView {
    pub session_id: String,
    pub messages: Vec<ContextMessage>,
    /// Estimated tokens of these messages.
    pub tokens: usize,
    pub context_limit: usize,
    pub compaction_num: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ContextMessage {
    Summary {
        role: &'static str,
        parts: Value,
        /// Marks the summary message, for clients that want to show it differently.
        summary: bool,
        compaction_num: u32,
    },
    Stored(StoredMessage),
}

impl ContextView {
    pub fn new(snapshot: ContextSnapshot) -> ContextView {
        let mut messages = Vec::with_capacity(snapshot.pinned.len() + 1 + snapshot.tail.len());
        // Estimates were stored at append, and the summary message's with the compaction.
        let mut tokens = snapshot.session.pinned_tokens + snapshot.session.summary_tokens;
        messages.extend(snapshot.pinned.into_iter().map(ContextMessage::Stored));
        if let Some(latest) = &snapshot.latest {
            let message = summary_message(&latest.summary);
            messages.push(ContextMessage::Summary {
                role: "user",
                parts: serde_json::to_value(&message.parts).unwrap_or_default(),
                summary: true,
                compaction_num: latest.compaction_num,
            });
        }
        // Pinned messages of the tail are in `pinned_tokens` already.
        tokens += snapshot
            .tail
            .iter()
            .filter(|m| !m.pinned)
            .map(|m| m.tokens)
            .sum::<usize>();
        messages.extend(snapshot.tail.into_iter().map(ContextMessage::Stored));
        ContextView {
            session_id: snapshot.session.id,
            messages,
            tokens,
            context_limit: snapshot.session.context_limit,
            compaction_num: snapshot.session.compaction_count,
        }
    }
}

impl ContextView {
    /// The context's messages in the neutral shape (the summary as a user message).
    pub fn to_messages(&self) -> Vec<crate::message::Message> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ContextMessage::Stored(stored) => stored.to_message().ok(),
                ContextMessage::Summary { parts, .. } => Some(crate::message::Message {
                    role: crate::message::Role::User,
                    parts: serde_json::from_value(parts.clone()).ok()?,
                }),
            })
            .collect()
    }
}

/// Which shape a context is answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, Serialize)]
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

/// A context ready to send to a model API: `messages` (and `system` for Anthropic) go into the
/// request body as they are.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderContext {
    pub session_id: String,
    pub format: ContextFormat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<Value>,
    pub tokens: usize,
    pub context_limit: usize,
    pub compaction_num: u32,
}

impl ProviderContext {
    /// `view` in `format` (not [`ContextFormat::Compactd`], which is `view` itself).
    pub fn new(view: &ContextView, format: ContextFormat) -> ProviderContext {
        let messages = view.to_messages();
        let (system, messages) = match format {
            ContextFormat::Anthropic => {
                let c = crate::provider::anthropic::conversation(&messages);
                (c.system, c.messages)
            }
            _ => (None, crate::provider::openai::messages(&messages)),
        };
        ProviderContext {
            session_id: view.session_id.clone(),
            format,
            system,
            messages,
            tokens: view.tokens,
            context_limit: view.context_limit,
            compaction_num: view.compaction_num,
        }
    }
}
