//! The context of a proxied call the store cannot take (its disk full, its write lock held by
//! another process, its files gone): the session's stored context, read, and the call's
//! messages after it. An agent goes on through such an outage, and its conversation grows with
//! nothing stored; once the two would pass the session's trigger, they are compacted here, in
//! memory, by the built-in summarizer (a model summarizer's minutes are not worth spending on
//! a summary nobody keeps), as the store would have compacted them. A conversation nothing
//! was stored of yet (begun during the outage, or off its stored branch) is compacted from
//! its first message: every call carries its whole conversation.
//!
//! That compaction is kept in memory for the conversation's later calls, as the store keeps
//! one: they are sent with the same summary, byte for byte (the model server's prompt cache
//! holds), until they pass the trigger again, and the next compaction refines it. Nothing of
//! it is stored: once writes go on, the agent's next call stores every message it carries,
//! and the session compacts as usual.

use super::fingerprint::fingerprint;
use super::proxy::{Caller, Identity, Preview, ProxyTurn};
use super::scheduling::Loaded;
use super::{Service, ServiceError};
use crate::compaction::instruction::is_instruction;
use crate::compaction::{FileLists, Origin, PlanInput, step};
use crate::compaction_run::{self, Compacted};
use crate::message::{Message, Role};
use crate::provider::wire::{WireReply, WireRequest};
use crate::store::{
    Branch, ContextSnapshot, IMPLAUSIBLE_REPORT_DIVISOR, LatestSummary, SessionRow, StoreError,
};
use crate::summarize::extractive::Extractive;
use compactd_core::Overflow;
use compactd_core::StoredMessage;
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
    /// The conversation, as what its calls teach is kept (see [`Service::unrecorded_usage`]);
    /// empty for a call too small to teach anything worth keeping.
    pub key: String,
}

/// The upstream's refusal of an unrecorded call as longer than the model's window, and the
/// estimate of what was sent: the call is compacted to what the refusal counted and sent
/// once more, as a recorded one is.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    pub overflow: Overflow,
    pub sent_tokens: usize,
}

/// The most conversations whose unrecorded calls are remembered at once: each holds a
/// summary (at most a part of its window: tens of kilobytes).
pub(super) const CONVERSATIONS: usize = 64;

/// What unrecorded calls of a conversation taught and compacted, kept in memory for its
/// later calls (see [`super::per_session`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Unrecorded {
    taught: Option<Taught>,
    compacted: Option<Kept>,
}

/// What a refusal of an unrecorded call taught of its conversation's session (see
/// [`Service::teach`]).
#[derive(Debug, Clone, Copy, Default)]
struct Taught {
    /// The window a refusal said.
    context_limit: Option<usize>,
    /// The rate of the newest refusal or usage report.
    token_rate: f64,
    completion_tokens: usize,
}

/// An in-memory compaction of a conversation's unrecorded calls.
#[derive(Debug, Clone)]
struct Kept {
    /// The stored context it was made on (the session's message count and the compaction
    /// its branch starts from): once either moves, it stands for nothing any more.
    stored: (u64, u32),
    /// How many of a call's messages it stands for, and the fingerprint of the last of them:
    /// a later call of the same conversation carries them first.
    upto: usize,
    last: i64,
    summary: Arc<str>,
    /// The files its summary lists, which the next compaction's summary lists with its own.
    files: Arc<FileLists>,
    summary_tokens: usize,
    num: u32,
}

impl Service {
    /// What an unrecorded call goes upstream with: its session's context and the call's newer
    /// messages, as the conversation's last in-memory compaction left them, compacted again
    /// when they pass the session's trigger (the preview then stands for every message of
    /// the call), after `refused` as that refusal counted. `None` for a call with no messages.
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
        let (snapshot, matched, stored) = match self.previewed(call).await? {
            Some((snapshot, matched)) => (snapshot, matched, true),
            None => (empty(unstored), 0, false),
        };
        let key = match stored {
            true => snapshot.session.id.to_string(),
            false => conversation,
        };
        let mut memory = self.unrecorded.last(&key).unwrap_or_default();
        let mut session = snapshot.session.clone();
        if let Some(taught) = memory.taught {
            taught.apply(&mut session);
        }
        if let Some(refused) = refused {
            let taught = self.teach(&session, refused);
            taught.apply(&mut session);
            memory.taught = Some(taught);
        }
        // The call's messages after the ones it shares with the branch stand right after
        // the branch's last: the rendering finds each by its place on the branch.
        let on_branch = (snapshot.branch)
            .position(snapshot.session.head_seq)
            .map_or(0, |p| p + 1);
        let (snapshot, matched) = match on_branch == matched {
            true => {
                let context = ContextSnapshot {
                    session,
                    ..snapshot
                };
                let (context, remembered) = self
                    .unrecorded_context(context, request, matched, stored, memory.compacted)
                    .await?;
                memory.compacted = remembered;
                (context, request.messages.len())
            }
            false => (snapshot, matched),
        };
        // Only what there is to remember: a side call's nothing would push a conversation out.
        if memory.taught.is_some() || memory.compacted.is_some() {
            self.unrecorded.record(&key, memory);
        }
        let turn = ProxyTurn::previewed(snapshot, stored);
        let after: usize = (matched..request.messages.len())
            .map(|i| request.message_tokens(i, &self.estimator))
            .sum();
        let tokens = turn.context.tokens + after + request.overhead_tokens;
        // A small call's answer (a side call's, a conversation's first steps) is not worth
        // a place: what it teaches is learned as the conversation nears its trigger.
        let key = match tokens * 4 >= turn.context.context_limit {
            true => key,
            false => String::new(),
        };
        Ok(Some(UnrecordedPreview {
            tokens,
            preview: Preview { turn, matched },
            stored,
            key,
        }))
    }

    /// What an unrecorded call's answer teaches its conversation (`key`; none when empty):
    /// the rate at which the model counts compactd's estimate, its usage (the context it was
    /// sent and the answer) against the estimate of the same (`sent_tokens` and the answer's).
    /// A recorded session learns it from the same reports; without it, the conversation's
    /// first call past the window was refused before it was compacted to fit.
    pub fn unrecorded_usage(&self, key: &str, sent_tokens: usize, reply: &WireReply) {
        let Some(counted) = reply.context_tokens.filter(|_| !key.is_empty()) else {
            return;
        };
        let estimated = sent_tokens
            + self.estimator.message(&reply.message)
            + self
                .estimator
                .left_out(&reply.message, reply.unrecorded_chars);
        // Not believed, as a stored session does not believe it (a server that counts
        // nothing, or answers nonsense).
        if counted * IMPLAUSIBLE_REPORT_DIVISOR < estimated {
            return;
        }
        let mut memory = self.unrecorded.last(key).unwrap_or_default();
        let taught = memory.taught.get_or_insert(Taught::default());
        taught.token_rate = counted as f64 / estimated.max(1) as f64;
        self.unrecorded.record(key, memory);
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
            .window_under(session.context_limit)
            .filter(|limit| config.check_context_limit(*limit).is_ok())
            .map_or(session.context_limit, |l| l.min(session.context_limit));
        let counted = overflow.tokens.unwrap_or(limit + 1);
        let rate = counted as f64 / sent_tokens.max(1) as f64;
        Taught {
            context_limit: Some(limit),
            token_rate: rate.max(session.report_rate().unwrap_or(1.0)),
            completion_tokens: overflow.completion.unwrap_or(session.completion_tokens),
        }
    }

    /// `snapshot` with the call's messages after its first `matched` appended, as `kept` (the
    /// conversation's last in-memory compaction, if it still applies) compacted them, and
    /// compacted again if they pass the session's token trigger; and the compaction to keep
    /// for the next call.
    async fn unrecorded_context(
        &self,
        snapshot: ContextSnapshot,
        request: &WireRequest,
        matched: usize,
        stored: bool,
        kept: Option<Kept>,
    ) -> Result<(ContextSnapshot, Option<Kept>), ServiceError> {
        let bound = self.settings().config.proxy.max_recorded_bytes;
        let at = (snapshot.session.message_count, snapshot.session.summary_num);
        let mut context = self.appended(snapshot, request, matched, stored)?;
        let kept = kept.filter(|k| {
            k.stored == at
                && k.upto <= request.messages.len()
                && k.upto > 0
                && fingerprint(&request.messages[k.upto - 1], bound) == k.last
        });
        if let Some(kept) = &kept {
            kept.apply(&mut context);
        }
        let config = self.compaction_config(&context.session);
        if context.session.context_tokens().0
            < config.token_threshold(context.session.context_limit)
        {
            return Ok((context, kept));
        }
        // The files the summary the context starts from lists: this conversation's last
        // in-memory one, else the session's stored one.
        let prior_files = match &kept {
            Some(kept) => (*kept.files).clone(),
            None if stored && context.session.summary_num > 0 => {
                self.store.prior_files(&context.session).await?
            }
            None => Default::default(),
        };
        let (mut context, summary) = self
            .compacted_in_memory(context, prior_files, stored)
            .await?;
        let Some(summary) = summary else {
            return Ok((context, kept));
        };
        let kept = Kept {
            stored: at,
            last: fingerprint(&request.messages[summary.upto - 1], bound),
            ..summary
        };
        kept.apply(&mut context);
        Ok((context, Some(kept)))
    }

    /// `snapshot` with the call's messages after its first `matched` appended after its
    /// branch, unstored: numbered after every stored message (so no seq is taken twice; once
    /// writes go on, a stored session's next messages take the same), never pinned, shortened
    /// and counted as appends are (an output too large for the step's room keeps its head and
    /// tail; its marker names the session only when it is `stored`).
    fn appended(
        &self,
        mut snapshot: ContextSnapshot,
        request: &WireRequest,
        matched: usize,
        stored: bool,
    ) -> Result<ContextSnapshot, ServiceError> {
        let newer = &request.messages[matched..];
        let config = self.compaction_config(&snapshot.session);
        let session = &mut snapshot.session;
        let step_budget = config.step_budget(session.estimated_limit(), session.fixed_tokens());
        let first = session.message_count + 1;
        snapshot.branch = snapshot.branch.followed_by(first, newer.len());
        for ((message, seq), index) in newer.iter().zip(first..).zip(matched..) {
            if message.role == Role::Assistant {
                session.step_calls = message.tool_call_ids().count();
            }
            let at = Origin {
                session: if stored { session.id.as_str() } else { "" },
                seq,
            };
            let tokens = request.message_tokens(index, &self.estimator);
            // A proxied client's results are its own, placed as its API requires: each
            // takes its share of the step (see `step::message_budget`).
            let room = step::StepRoom::shares(step_budget, session.step_calls);
            let outside_media = request.media.get(index).map_or(0, |media| media.outside);
            let shortened = step::shown_in_step(message, tokens, outside_media, at, room);
            let appended = match shortened {
                Some(parts) => {
                    let kept_media = request
                        .media
                        .get(index)
                        .map_or(0, |media| media.kept(&message.parts, &parts));
                    let shown = Message {
                        role: message.role,
                        parts,
                    };
                    let tokens = self.estimator.message(&shown) + kept_media;
                    StoredMessage {
                        shortened: true,
                        ..StoredMessage::unrecorded(seq, &shown, tokens)
                            .map_err(StoreError::from)?
                    }
                }
                None => {
                    StoredMessage::unrecorded(seq, message, tokens).map_err(StoreError::from)?
                }
            };
            session.active_tokens += appended.tokens;
            session.tokens_since_report += appended.tokens;
            session.active_messages += 1;
            snapshot.tail.push(appended);
        }
        session.message_count += newer.len() as u64;
        // A session nothing was stored of: its task is its first instruction, as an append
        // would have found it.
        if session.task_seq.is_none() {
            let at = newer.iter().position(is_instruction);
            session.task_seq = at.map(|at| first + at as u64);
        }
        Ok(snapshot)
    }

    /// A compaction of `context` by the built-in summarizer (its summary listing the files
    /// `prior_files` lists and those of its messages): `context` back, and the summary with
    /// how many of the call's messages it stands for (the rest of [`Kept`] the caller's);
    /// none when there is nothing to compact. The summary names the session for recall when
    /// it is `stored`.
    async fn compacted_in_memory(
        &self,
        context: ContextSnapshot,
        prior_files: FileLists,
        stored: bool,
    ) -> Result<(ContextSnapshot, Option<Kept>), ServiceError> {
        let _charge = self.charge_for(&context.session).await?;
        let session = &context.session;
        let planning = (*self.compaction_config(session))
            .clone()
            .fitted_beside(session.estimated_limit(), session.fixed_tokens());
        let num = context.latest.as_ref().map_or(0, |l| l.compaction_num) + 1;
        let loaded = Loaded::of(context, prior_files)?;
        let settings = self.settings();
        let input = PlanInput {
            session: match stored {
                true => loaded.snapshot.session.id.as_str(),
                false => "",
            },
            ..self.plan_input(&loaded, &planning, None, &settings)
        };
        let compacted = compaction_run::compact(&input, &Extractive, num).await?;
        let context = loaded.snapshot;
        let Some(Compacted {
            result,
            boundary,
            summary_tokens,
            ..
        }) = compacted
        else {
            return Ok((context, None));
        };
        tracing::info!(session = %context.session.id, pre = result.pre_tokens, post = result.post_tokens, "an unrecorded call compacted in memory");
        // Where the preserved tail starts in the call (past its end: all of it compacted).
        let upto = match context.tail.get(boundary.index) {
            Some(first_kept) => context.branch.position(first_kept.seq),
            None => {
                (context.tail.last()).and_then(|m| context.branch.position(m.seq).map(|p| p + 1))
            }
        };
        let kept = upto.filter(|upto| *upto > 0).map(|upto| Kept {
            stored: (0, 0),
            upto,
            last: 0,
            files: Arc::new(FileLists {
                read: result.read_files,
                modified: result.modified_files,
                created: result.created_files,
                deleted: result.deleted_files,
            }),
            summary: result.summary.into(),
            summary_tokens,
            num,
        });
        Ok((context, kept))
    }
}

impl Taught {
    /// `session` as the refusal taught it: never a larger window, nor a lower rate, than it
    /// has; its usage report, made before, no longer counts.
    fn apply(self, session: &mut SessionRow) {
        if let Some(limit) = self.context_limit {
            session.context_limit = session.context_limit.min(limit);
        }
        let rate = self.token_rate.max(session.report_rate().unwrap_or(1.0));
        session.token_rate = Some(rate);
        session.reported_tokens = None;
        session.completion_tokens = session.completion_tokens.max(self.completion_tokens);
    }
}

impl Kept {
    /// `context` (with a call's messages appended) as this compaction left it: its summary in
    /// place of the messages it stands for, the pinned ones among them kept before it.
    fn apply(&self, context: &mut ContextSnapshot) {
        let branch = &context.branch;
        let (before, after): (Vec<StoredMessage>, Vec<StoredMessage>) =
            std::mem::take(&mut context.tail)
                .into_iter()
                .partition(|m| branch.position(m.seq).is_some_and(|p| p < self.upto));
        context
            .pinned
            .extend(before.into_iter().filter(|m| m.pinned));
        context.tail = after;
        context.latest = Some(LatestSummary {
            compaction_num: self.num,
            summary: self.summary.to_string(),
        });
        let session = &mut context.session;
        session.summary_tokens = self.summary_tokens;
        session.active_tokens = context
            .tail
            .iter()
            .filter(|m| !m.pinned)
            .map(|m| m.tokens)
            .sum();
        session.active_messages = context.tail.len();
        // A usage report measured the context before.
        session.reported_tokens = None;
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
