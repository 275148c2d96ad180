//! The context of a proxied call the store cannot take (its disk full, its write lock held by
//! another process, its files gone): the session's stored context, read, and the call's
//! messages after it. An agent goes on through such an outage, and its conversation grows with
//! nothing stored; once the two would pass the session's trigger, they are compacted here, in
//! memory, by the built-in summarizer (a model summarizer's minutes are not worth spending on
//! a summary nobody keeps), as the store would have compacted them. A conversation nothing
//! was stored of yet (begun during the outage, or off its stored branch) is compacted from
//! its first message: every call carries its whole conversation. Nothing of it is stored:
//! once writes go on, the agent's next call stores every message it carries, and the
//! session compacts as usual.

use super::proxy::{Caller, Identity, Preview, ProxyTurn};
use super::{Service, ServiceError, memory};
use crate::compaction::PlanInput;
use crate::compaction::instruction::is_instruction;
use crate::compaction_run::{self, Compacted};
use crate::message::Message;
use crate::protocol::ContextView;
use crate::provider::overflow::Overflow;
use crate::provider::wire::WireRequest;
use crate::store::{Branch, ContextSnapshot, LatestSummary, SessionRow, StoredMessage};
use crate::summarize::extractive::Extractive;
use std::sync::Arc;

/// What an unrecorded call goes upstream with.
#[derive(Debug)]
pub struct UnrecordedPreview {
    pub preview: Preview,
    /// Whether the preview's session is stored (its id names something the client can read).
    pub stored: bool,
    /// Estimated tokens of what goes upstream: the context, the call's messages after it,
    /// and its tools and system.
    pub tokens: usize,
}

/// What a refusal of an unrecorded call taught of its conversation's session (see
/// [`Service::teach`]), remembered until the store takes writes again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taught {
    context_limit: usize,
    token_rate: f64,
    completion_tokens: usize,
}

/// The upstream's refusal of an unrecorded call as longer than the model's window, and the
/// estimate of what was sent: the call is compacted to what the refusal counted and sent
/// once more, as a recorded one is.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    pub overflow: Overflow,
    pub sent_tokens: usize,
}

impl Service {
    /// What an unrecorded call goes upstream with: its session's context, compacted in memory
    /// with the call's newer messages when together they pass the session's trigger (the
    /// preview then stands for every message of the call), after `refused` as that refusal
    /// counted. `None` for a call with no messages.
    pub async fn unrecorded_preview(
        self: &Arc<Self>,
        caller: &Caller,
        identity: Identity,
        request: &WireRequest,
        refused: Option<Refused>,
    ) -> Result<Option<UnrecordedPreview>, ServiceError> {
        if request.messages.is_empty() {
            return Ok(None);
        }
        let call = self.proxy_call(caller, &identity, request)?;
        let unstored = SessionRow::unstored(
            &call.new_session,
            call.overhead_tokens,
            call.completion_tokens,
        );
        // A conversation nothing is stored of is known by its name, its header, or its
        // key's and first message's fingerprint.
        let conversation = (call.named.clone())
            .or(call.conversation.clone())
            .unwrap_or_else(|| format!("{}.{:x}", call.owner, call.root_hash));
        let (mut snapshot, matched, stored) = match self.previewed(call).await? {
            Some((snapshot, matched)) => (snapshot, matched, true),
            None => (empty(unstored), 0, false),
        };
        let key = match stored {
            true => snapshot.session.id.to_string(),
            false => conversation,
        };
        if let Some(taught) = self.taught_unrecorded.last(&key) {
            taught.apply(&mut snapshot.session);
        }
        if let Some(refused) = refused {
            let taught = self.teach(&snapshot.session, refused);
            taught.apply(&mut snapshot.session);
            self.taught_unrecorded.record(&key, taught);
        }
        // The call's messages after the ones it shares with the branch stand right after
        // the branch's last: the rendering finds each by its place on the branch.
        let on_branch = (snapshot.branch)
            .position(snapshot.session.head_seq)
            .map_or(0, |p| p + 1);
        let newer = &request.messages[matched..];
        let compacted = match on_branch == matched {
            true => self.compacted_in_memory(&snapshot, newer, stored).await?,
            false => None,
        };
        let (snapshot, matched) = match compacted {
            Some(compacted) => (compacted, request.messages.len()),
            None => (snapshot, matched),
        };
        let turn = ProxyTurn::previewed(snapshot, stored);
        let after: usize = request.messages[matched..]
            .iter()
            .map(|m| self.estimator.message(m))
            .sum();
        Ok(Some(UnrecordedPreview {
            tokens: turn.context.tokens + after + request.overhead_tokens,
            preview: Preview { turn, matched },
            stored,
        }))
    }

    /// What a refusal teaches of `session`: the model's window (when the refusal said one
    /// that the config allows, and it is smaller), the completion it said the client asked
    /// room for, and the rate at which the model counts compactd's estimate (what it counted,
    /// or just over the window when it did not say, against the estimate of what was sent).
    fn teach(&self, session: &SessionRow, refused: Refused) -> Taught {
        let Refused {
            overflow,
            sent_tokens,
        } = refused;
        let config = &self.settings().config.compaction;
        let limit = overflow
            .limit
            .or(overflow.tokens.filter(|t| *t <= session.context_limit))
            .filter(|limit| config.check_context_limit(*limit).is_ok())
            .map_or(session.context_limit, |l| l.min(session.context_limit));
        let counted = overflow.tokens.unwrap_or(limit + 1);
        let rate = counted as f64 / sent_tokens.max(1) as f64;
        Taught {
            context_limit: limit,
            token_rate: rate.max(session.report_rate().unwrap_or(1.0)),
            completion_tokens: overflow.completion.unwrap_or(session.completion_tokens),
        }
    }

    /// `snapshot` and the call's `newer` messages after it, compacted, when together they
    /// pass the session's token trigger; `None` when they do not (or there is nothing to
    /// compact). The summary names the session for recall when it is `stored`.
    async fn compacted_in_memory(
        &self,
        snapshot: &ContextSnapshot,
        newer: &[Message],
        stored: bool,
    ) -> Result<Option<ContextSnapshot>, ServiceError> {
        let session = &snapshot.session;
        let config = self.compaction_config(session);
        let estimates: Vec<usize> = newer.iter().map(|m| self.estimator.message(m)).collect();
        let tokens = session.context_tokens().0 + session.counted(estimates.iter().sum());
        if tokens < config.token_threshold(session.context_limit) {
            return Ok(None);
        }
        let _charge = self
            .memory()
            .compactions
            .take(
                (snapshot.tail.len() + newer.len()) * memory::COMPACTION_MESSAGE_COST
                    + tokens * memory::COMPACTION_TOKEN_COST,
                None,
            )
            .await
            .ok_or(ServiceError::ShuttingDown)?;
        // Numbered after every stored message, so no seq of the branch is taken twice.
        let first = session.message_count + 1;
        let mut all = snapshot.tail.clone();
        for ((message, &tokens), seq) in newer.iter().zip(&estimates).zip(first..) {
            all.push(StoredMessage::unrecorded(seq, message, tokens)?);
        }
        let messages = all
            .iter()
            .map(StoredMessage::to_message)
            .collect::<Result<Vec<_>, _>>()?;
        let tokens: Vec<usize> = all.iter().map(|m| m.tokens).collect();
        let pinned: Vec<bool> = all.iter().map(|m| m.pinned).collect();
        let seqs: Vec<u64> = all.iter().map(|m| m.seq).collect();
        // A session nothing was stored of: its task is its first instruction, as an append
        // would have found it.
        let task_seq = session.task_seq.or_else(|| {
            let at = newer.iter().position(is_instruction)?;
            Some(first + at as u64)
        });
        let planning = (*config)
            .clone()
            .fitted_beside(session.estimated_limit(), session.pinned_tokens);
        let prior_files = match snapshot.latest {
            Some(_) => self.store.prior_files(&session.id).await?,
            None => Default::default(),
        };
        let settings = self.settings();
        let input = PlanInput {
            pinned: &pinned,
            pinned_tokens: session.pinned_tokens,
            seqs: &seqs,
            task_seq,
            prior_summary: snapshot.latest.as_ref().map(|l| l.summary.as_str()),
            prior_files: &prior_files,
            estimator: self.estimator,
            redact_secrets: settings.config.summarizer.redact_secrets,
            session: if stored { session.id.as_str() } else { "" },
            ..PlanInput::new(&messages, &tokens, session.estimated_limit(), &planning)
        };
        let num = session.compaction_count + 1;
        let Some(Compacted {
            result,
            boundary,
            summary_tokens,
            ..
        }) = compaction_run::compact(&input, &Extractive, num).await?
        else {
            return Ok(None);
        };
        tracing::info!(session = %session.id, pre = result.pre_tokens, post = result.post_tokens, "an unrecorded call compacted in memory");
        let tail = all.split_off(boundary.index);
        let mut compacted = ContextSnapshot {
            pinned: snapshot.pinned.clone(),
            latest: Some(LatestSummary {
                compaction_num: num,
                summary: result.summary,
            }),
            tail,
            branch: snapshot.branch.followed_by(first, newer.len()),
            session: snapshot.session.clone(),
        };
        compacted
            .pinned
            .extend(all.into_iter().filter(|m| m.pinned));
        compacted.session.summary_tokens = summary_tokens;
        Ok(Some(compacted))
    }
}

impl Taught {
    /// `session` as the refusal taught it: never a larger window, nor a lower rate, than it
    /// has; its usage report, made before, no longer counts.
    fn apply(self, session: &mut SessionRow) {
        session.context_limit = session.context_limit.min(self.context_limit);
        let rate = self.token_rate.max(session.report_rate().unwrap_or(1.0));
        session.token_rate = Some(rate);
        session.reported_tokens = None;
        session.completion_tokens = session.completion_tokens.max(self.completion_tokens);
    }
}

/// The context of a session nothing is stored of: none.
fn empty(session: SessionRow) -> ContextSnapshot {
    ContextSnapshot {
        session,
        pinned: Vec::new(),
        latest: None,
        tail: Vec::new(),
        branch: Branch::empty(),
    }
}

impl ProxyTurn {
    /// The turn a previewed `snapshot` makes (nothing stored: its answer is not recorded);
    /// its summary names the session for recall when the session is `stored`.
    pub(super) fn previewed(snapshot: ContextSnapshot, stored: bool) -> ProxyTurn {
        ProxyTurn {
            id: snapshot.session.id.clone(),
            branch: snapshot.branch.clone(),
            sent: snapshot.session.context_version(),
            kind: snapshot.session.kind,
            last_seq: snapshot.session.head_seq,
            context: ContextView::recalling(snapshot, stored),
        }
    }
}
