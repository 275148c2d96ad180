//! A model's refusal of a context as longer than its window. compactd's estimate (four
//! characters a token) can fall short of a model's tokenizer before any usage report anchors
//! it; the refusal's own counts then stand as the session's usage, a window it names under the
//! session's limit becomes the limit, and the context is compacted to fit before the call goes
//! again. The proxy reads refusals from the upstream's answers itself; an agent on the socket
//! API passes its model's answer on.

use super::proxy::{Caller, Identity, ProxyTurn};
use super::{Service, ServiceError};
use crate::config::{OverrideError, compaction_with_overrides};
use crate::protocol::{MAX_REPORTED_TOKENS, OverflowOutcome, OverflowReport, SessionId};
use crate::provider::overflow::overflow;
use crate::provider::wire::WireRequest;
use crate::store::{ContextVersion, SentContext};
use compactd_core::Overflow;
use serde_json::{Value, json};
use std::sync::Arc;

impl Service {
    /// The upstream refused the call sent with `turn`'s context as longer than the model's
    /// window: what it counted becomes the session's usage (and a window it named under the
    /// session's limit, the limit), so the call's next context is compacted to fit. Returns
    /// the context refused, for [`Self::proxy_retry`].
    pub async fn proxy_overflow(
        &self,
        turn: &ProxyTurn,
        overflow: Overflow,
    ) -> Result<RefusedContext, ServiceError> {
        let refused = RefusedContext {
            head: turn.last_seq,
            sent: turn.sent,
            overflow,
        };
        let noted = self.note_refusal(&turn.id, refused).await?;
        tracing::warn!(
            session = %turn.id,
            tokens = ?overflow.tokens,
            limit = ?overflow.limit,
            noted,
            "the upstream refused the context as longer than the model's window: compacting it and sending the call once more"
        );
        Ok(refused)
    }

    /// The turn of a call going once more after the upstream refused its context: as
    /// [`Self::proxy_turn`], but never the refused context itself. The refused count stands
    /// as the session's usage only while the call's branch stays the current one: another
    /// branch's call between the refusal and the retry makes its own branch current, which
    /// drops the usage (it measured another branch), and its answer's usage teaches that
    /// branch's rate, lower for a branch the model counts fewer tokens of. Nothing then said
    /// this branch was due, its context went again as it was, and the second refusal reached
    /// the agent (CI: two branches taking turns under load). The refusal is the model's word
    /// on this very context: it is noted again and the branch compacted, under the session's
    /// lock, before the call goes.
    pub async fn proxy_retry(
        self: &Arc<Self>,
        caller: &Caller,
        identity: Identity,
        request: &WireRequest,
        refused: RefusedContext,
    ) -> Result<ProxyTurn, ServiceError> {
        let turn = self.proxy_turn(caller, identity.clone(), request).await?;
        if !refused.is(turn.last_seq, turn.sent) {
            return Ok(turn);
        }
        let guard = self.locks.lock(turn.id.as_str()).await;
        // The compaction plans with the refusal's rate: noted again, it is the session's
        // (a later answer of the other branch would have to land in between to move it).
        if self.note_refusal(&turn.id, refused).await?
            && let Err(e) = self.compact_refused(&turn.id, refused.head).await
        {
            tracing::warn!(session = %turn.id, error = %e, "cannot compact the refused context: the call goes as it is");
        }
        drop(guard);
        self.proxy_turn(caller, identity, request).await
    }

    /// Notes `refused` on its branch (made the current one): whether it still stands for the
    /// context the branch serves (no compaction of it landed since).
    async fn note_refusal(
        &self,
        id: &SessionId,
        refused: RefusedContext,
    ) -> Result<bool, ServiceError> {
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
                id,
                SentContext::Proxied(refused.sent, refused.head),
                refused.overflow,
                fits,
                self.step_budgets(),
            )
            .await?;
        Ok(noted.is_some())
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

/// A context the upstream refused as longer than the model's window: the head of the branch
/// it was for, its version, and what the upstream said.
#[derive(Debug, Clone, Copy)]
pub struct RefusedContext {
    head: u64,
    sent: ContextVersion,
    overflow: Overflow,
}

impl RefusedContext {
    /// Whether the context of the branch ending at `head`, at `version`, is the one refused
    /// (a masking since only shrank it: still refused).
    fn is(&self, head: u64, version: ContextVersion) -> bool {
        head == self.head && !self.sent.compacted_since(version)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Synchronous};
    use crate::message::{Message, Part, Role};
    use crate::provider::wire::{Wire, WireReply};
    use crate::store::Store;

    /// One conversation, as Claude Code names it in a header.
    fn conversation() -> Identity {
        Identity {
            conversation: Some("conversation-1".into()),
            ..Identity::default()
        }
    }

    /// A conversation's call: its task, the answer to it, and then `branch`'s messages.
    fn call(branch: &[Value]) -> WireRequest {
        let mut messages = vec![
            json!({"role": "user", "content": "Read every module and fix the failing test."}),
            json!({"role": "assistant", "content": "Reading them."}),
        ];
        messages.extend_from_slice(branch);
        Wire::Chat
            .parse_value(&mut json!({"model": "branch-test", "messages": messages}))
            .unwrap()
    }

    /// The turn of the conversation's call with `branch`'s messages.
    async fn turn(service: &Arc<Service>, caller: &Caller, branch: &[Value]) -> ProxyTurn {
        let request = call(branch);
        let turn = service.proxy_turn(caller, conversation(), &request);
        turn.await.unwrap()
    }

    /// The even branch's call is refused; before it goes again, the odd branch's call makes
    /// its branch the current one (dropping the refused count) and its answer's usage
    /// teaches the rate of compactd's own estimate. The session's counters then say the even
    /// branch is far under its trigger: sent as they say, the refused context would go again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_never_sends_the_context_refused_though_another_branch_moved_the_session() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = Store::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let mut config = Config::default();
        config.proxy.models.insert("branch-test".into(), 16_000);
        let service = Service::new(store, config).unwrap();
        let caller = Caller::new("Bearer sk-branches", true);
        let module =
            |name: &str, n: usize| format!("def {name}_{n}(x):\n    return x\n").repeat(60);
        let mut even = vec![json!({"role": "user", "content": "Take the even modules."})];
        for n in 0..16 {
            even.push(json!({"role": "assistant", "content": format!("Module {n}.")}));
            even.push(json!({"role": "user", "content": module("even", n)}));
        }
        let odd = [json!({"role": "user", "content": "Take the odd modules."})];
        let refused_turn = turn(&service, &caller, &even).await;
        // The model counts a token every two characters of the context as JSON: over its
        // window, and over twice compactd's estimate.
        let counted =
            |turn: &ProxyTurn| serde_json::to_string(&turn.context.messages).unwrap().len() / 2;
        let refused_count = counted(&refused_turn);
        assert!(refused_count > 16_000, "{refused_count}");
        assert!(
            refused_count > 2 * refused_turn.context.tokens,
            "{refused_count}"
        );
        let overflow = Overflow {
            tokens: Some(refused_count),
            limit: Some(16_000),
            completion: None,
        };
        let refused = service
            .proxy_overflow(&refused_turn, overflow)
            .await
            .unwrap();
        let other = turn(&service, &caller, &odd).await;
        assert_eq!(other.id, refused_turn.id, "one conversation, two branches");
        let answer = WireReply {
            message: Message {
                role: Role::Assistant,
                parts: vec![Part::Text {
                    text: "On it.".into(),
                }],
            },
            context_tokens: Some(other.context.tokens),
            unrecorded_chars: 0,
        };
        service
            .proxy_reply(&other.id, other.last_seq, other.sent, answer)
            .await
            .unwrap();
        // What the counters alone serve the even branch now: the context refused.
        let unaware = turn(&service, &caller, &even).await;
        assert!(refused.is(unaware.last_seq, unaware.sent));
        let retried = service
            .proxy_retry(&caller, conversation(), &call(&even), refused)
            .await
            .unwrap();
        assert!(!refused.is(retried.last_seq, retried.sent));
        assert!(counted(&retried) <= 16_000, "{} tokens", counted(&retried));
        let text = serde_json::to_string(&retried.context.messages).unwrap();
        assert!(
            text.contains("Take the even modules."),
            "the task and instruction stay"
        );
        assert!(!text.contains("odd"), "nothing of the other branch");
    }
}
