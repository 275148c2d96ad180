//! A model's refusal of a context as longer than its window. compactd's estimate (four
//! characters a token) can fall short of a model's tokenizer before any usage report anchors
//! it; the refusal's own counts then stand as the session's usage, a window it names under the
//! session's limit becomes the limit, and the context is compacted to fit before the call goes
//! again. The proxy reads refusals from the upstream's answers itself; an agent on the socket
//! API passes its model's answer on.

use super::proxy::ProxyTurn;
use super::{Service, ServiceError};
use crate::config::{OverrideError, compaction_with_overrides};
use crate::protocol::{MAX_REPORTED_TOKENS, OverflowOutcome, OverflowReport, SessionId};
use crate::provider::overflow::{Overflow, overflow};
use crate::store::SentContext;
use serde_json::{Value, json};
use std::sync::Arc;

impl Service {
    /// The upstream refused the call sent with `turn`'s context as longer than the model's
    /// window: what it counted becomes the session's usage (and a window it named under the
    /// session's limit, the limit), so the call's next context is compacted to fit.
    pub async fn proxy_overflow(
        &self,
        turn: &ProxyTurn,
        overflow: Overflow,
    ) -> Result<(), ServiceError> {
        let settings = self.settings();
        let fits = move |limit: usize| {
            settings
                .config
                .compaction
                .check_context_limit(limit)
                .is_ok()
        };
        let noted = self
            .store
            .note_overflow(
                &turn.id,
                SentContext::Proxied(turn.sent, turn.last_seq),
                overflow,
                fits,
                self.step_budgets(),
            )
            .await?;
        tracing::warn!(
            session = %turn.id,
            tokens = ?overflow.tokens,
            limit = ?overflow.limit,
            noted = noted.is_some(),
            "the upstream refused the context as longer than the model's window: compacting it and sending the call once more"
        );
        Ok(())
    }

    /// An agent on the socket API says its model refused the context as longer than its
    /// window (`POST /session/{id}/overflow`): recorded as the proxy records its upstream's
    /// refusals, and the compaction that makes the context fit started, so the agent's next
    /// `GET /context` is one the model takes.
    pub async fn report_overflow(
        self: &Arc<Self>,
        id: &SessionId,
        report: OverflowReport,
    ) -> Result<OverflowOutcome, ServiceError> {
        let read = read_report(&report)?;
        let current = self.store.session(id).await?;
        let config =
            compaction_with_overrides(&self.settings().config.compaction, &current.overrides)?;
        if let Some(limit) = report.context_limit {
            config
                .check_context_limit(limit)
                .map_err(OverrideError::from)?;
        }
        let fits = move |limit: usize| config.check_context_limit(limit).is_ok();
        // Without the client's word, the context it was last served; a session never served
        // one was sent the one it serves.
        let sent = report
            .compaction_num
            .or_else(|| self.served.last(id.as_str()))
            .unwrap_or(current.compaction_count);
        let noted = self
            .store
            .note_overflow(
                id,
                SentContext::Served(sent),
                read,
                fits,
                self.step_budgets(),
            )
            .await?;
        tracing::warn!(
            session = %id,
            tokens = ?read.tokens,
            limit = ?read.limit,
            noted = noted.is_some(),
            "the agent's model refused the context as longer than its window"
        );
        let was_noted = noted.is_some();
        let (session, compaction) = match noted {
            Some(session) => {
                let compaction = self.after_append(&session, false).await;
                (session, compaction)
            }
            None => (self.store.session(id).await?, None),
        };
        Ok(OverflowOutcome {
            noted: was_noted,
            tokens: read.tokens,
            context_limit: read.limit,
            session: self.view(session),
            compaction,
        })
    }
}

/// What a refusal said: the figures the client gave, else those its model's error answer
/// holds. An error answer that is not a refusal of a prompt as too long is refused: taking,
/// say, a rate limit for one would shrink the session's context for nothing.
fn read_report(report: &OverflowReport) -> Result<Overflow, ServiceError> {
    if let Some(tokens) = report.tokens
        && !(1..=MAX_REPORTED_TOKENS).contains(&tokens)
    {
        return Err(ServiceError::BadRequest(format!(
            "tokens must be 1 to {MAX_REPORTED_TOKENS}"
        )));
    }
    let from_error = match &report.error {
        None => Overflow {
            tokens: None,
            limit: None,
            completion: None,
        },
        Some(error) => overflow(400, &error_answer(error)).ok_or_else(|| {
            ServiceError::BadRequest(
                "`error` is not a refusal of a prompt as longer than the model's window that compactd reads (Anthropic's `prompt is too long`, OpenAI's `context_length_exceeded`, llama.cpp's `exceed_context_size_error`, Gemini's `input token count (N) exceeds the maximum`, Mistral's `too large for model with M maximum context length`), or it says the completion asked for takes over three quarters of the window (no compaction makes room beside it: ask for less); give `tokens` and `context_limit` as the model counted them instead, or neither".into(),
            )
        })?,
    };
    Ok(Overflow {
        tokens: report.tokens.map(|t| t as usize).or(from_error.tokens),
        limit: report.context_limit.or(from_error.limit),
        completion: from_error.completion,
    })
}

/// A model API's error answer as its JSON body, however the client holds it: the body itself
/// (or the `error` object alone, as the OpenAI SDKs keep it: the reading takes either), its
/// text, or only its message.
fn error_answer(error: &Value) -> Vec<u8> {
    let answer = match error {
        Value::String(text) => {
            serde_json::from_str(text).unwrap_or_else(|_| json!({"error": {"message": text}}))
        }
        other => other.clone(),
    };
    serde_json::to_vec(&answer).unwrap_or_default()
}
