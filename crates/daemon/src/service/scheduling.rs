//! Scheduling compactions (when they run; how one runs is `compaction_run`, what it computes
//! is the engine, `compaction`): automatic ones after an append or in the background,
//! manual ones on request, ones whose model call a waiter cut off past `max_wait_s`, and the circuit breaker between
//! them.
//!
//! The breaker (SPEC.md 5.2) counts automatic attempts per user turn (from one user text
//! message to the next). Every compaction that made the context smaller starts the count over
//! (when a usage report measured the context, the model server's next report says whether it
//! did; see [`crate::store::Store::commit_compaction`]): the breaker exists to stop *loops*
//! (compactions that fail, or do not help), and an agent that works for hours in one turn, or
//! appends faster than a slow summarizer compacts, must still be compacted as often as it
//! needs. After `breaker_threshold` attempts that failed or did not shrink the context,
//! automatic compaction stops until the next user message; manual
//! compaction still works.
//!
//! A session's lock is held for one compaction at a time: between two compactions of a busy
//! session the lock is released and taken again in turn (the lock is fair), so a manual
//! `/summarize` or a `/context` waiting for it is served in between.

use super::locks::SessionGuard;
use super::summarizer_slots::SummarizerSlots;
use super::{Service, ServiceError, Settings, memory};
use crate::compaction::constants::PRESERVE_RECENT_OUTPUTS;
use crate::compaction::microcompact::MaskingStart;
use crate::compaction::{CompactionConfig, CompactionPlan, Due, FileLists, PlanInput, Trigger};
use crate::compaction_run::{self, CompactError, Compacted, NOTHING_TO_COMPACT};
use crate::message::Message;
use crate::protocol::{CompactionStatus, Event, SessionId, SummarizeOutcome};
use crate::store::ContextSnapshot;
use crate::store::{CompactionRow, MaskingRow, NewCompaction, NewFailure, SessionRow};
use crate::summarize::extractive::Extractive;
use crate::summarize::{SummarizeError, Summarizer};
use std::sync::Arc;
use std::time::Instant;

/// Whether a session should compact automatically now.
enum Decision {
    Idle,
    Compact(Trigger),
    BreakerOpen(Trigger),
}

/// A finished compaction as the store takes it (its timing and fallback still to be said).
/// `seqs` are the compacted messages' (the boundary is the first kept one, or the one after
/// the last when none is kept).
fn to_store(
    attempt: &AttemptOf,
    session: &SessionRow,
    seqs: &[u64],
    done: Compacted,
) -> NewCompaction {
    let first_seq = session.active_from_seq;
    let boundary_seq = seqs
        .get(done.boundary.index)
        .copied()
        .unwrap_or_else(|| seqs.last().map_or(first_seq, |last| last + 1));
    NewCompaction {
        session_id: attempt.id.clone(),
        trigger: attempt.trigger,
        focus: attempt.focus.clone(),
        summary_tokens: done.summary_tokens,
        first_seq,
        boundary_seq,
        head_seq: session.head_seq,
        summarizer: done.summarizer,
        chunks: done.chunks,
        fallback_reason: None,
        duration_ms: 0,
        mask_tail: None,
        result: done.result,
    }
}

/// What an attempt that found nothing to compact depends on: the messages of the branch it
/// compacted (the branch ending at its last one; an append moves that on) and the room a
/// compaction plans for (the limit, the completion kept free beside it). Not the session's
/// message count: a proxied conversation's other branch moves that, and its attempt is not
/// this one's.
fn fruitless_key(session: &SessionRow) -> (u64, usize, usize) {
    (
        session.head_seq,
        session.estimated_limit(),
        session.completion_tokens,
    )
}

/// A session's active messages as the engine takes them.
pub(super) struct Loaded {
    pub(super) snapshot: ContextSnapshot,
    messages: Vec<Message>,
    tokens: Vec<usize>,
    pinned: Vec<bool>,
    seqs: Vec<u64>,
    prior_files: FileLists,
}

impl Loaded {
    /// What compacting `snapshot` starts from, the files its summary lists `prior_files`.
    pub(super) fn of(
        snapshot: ContextSnapshot,
        prior_files: FileLists,
    ) -> Result<Loaded, ServiceError> {
        let messages = snapshot
            .tail
            .iter()
            .map(|m| m.to_message())
            .collect::<Result<_, _>>()
            .map_err(crate::store::StoreError::from)?;
        Ok(Loaded {
            messages,
            // Estimated once, when each message was appended; pinned when it was appended.
            tokens: snapshot.tail.iter().map(|m| m.tokens).collect(),
            pinned: snapshot.tail.iter().map(|m| m.pinned).collect(),
            seqs: snapshot.tail.iter().map(|m| m.seq).collect(),
            prior_files,
            snapshot,
        })
    }
}

/// A finished compaction's run, as [`Service::store_outcome`] stores it.
struct FinishedRun<'a> {
    attempt: &'a AttemptOf<'a>,
    loaded: &'a Loaded,
    duration_ms: u64,
    mask_tail: Option<usize>,
    background: bool,
}

/// Which compaction attempt a failure belongs to.
struct AttemptOf<'a> {
    id: &'a SessionId,
    trigger: Trigger,
    focus: &'a Option<String>,
    summarizer: String,
}

/// How one attempt ended.
enum Attempt {
    Compacted(Box<CompactionRow>),
    NothingToCompact,
}

impl Service {
    /// Masks old outputs if due, then decides whether to compact and starts the compaction
    /// if so. With `wait`, returns once it has finished.
    pub(super) async fn after_append(
        self: &Arc<Self>,
        session: &SessionRow,
        wait: bool,
    ) -> Option<CompactionStatus> {
        // Masking old outputs comes first; a summary only when that is not enough.
        let masked = self.mask_if_due(session).await;
        self.compact_if_due(masked.as_ref().unwrap_or(session), wait)
            .await
    }

    /// Decides whether to compact `session` (masked as far as is due); starts the compaction
    /// if so. With `wait`, returns once it has finished.
    pub(super) async fn compact_if_due(
        self: &Arc<Self>,
        session: &SessionRow,
        wait: bool,
    ) -> Option<CompactionStatus> {
        let trigger = match self.decide(session) {
            Decision::Idle => return None,
            Decision::BreakerOpen(trigger) => return Some(CompactionStatus::breaker_open(trigger)),
            Decision::Compact(trigger) => trigger,
        };
        let Some(guard) = self.locks.try_lock(session.id.as_str()) else {
            return Some(CompactionStatus::in_progress(trigger));
        };
        let service = self.clone();
        let (id, head) = (session.id.clone(), session.head_seq);
        let task = self
            .tasks
            .spawn(async move { service.auto_compact(id, head, guard).await });
        if !wait {
            return Some(CompactionStatus::started(trigger));
        }
        Some(task.await.unwrap_or_else(|_| {
            CompactionStatus::failed(trigger, "compaction task stopped".into())
        }))
    }

    /// Compacts while the trigger fires and the breaker allows. Appends that arrive meanwhile
    /// can fire the trigger again, hence the loop; the lock is given up between rounds. A
    /// round follows another only when something was appended in between (a compaction that
    /// left the context over the background line is not followed by one that cannot do better).
    /// Each round compacts the branch `head` lies on (grown since, or moved back to), the one
    /// the append or the call that started it is on: see [`crate::store::Store::session_on`].
    async fn auto_compact(
        self: Arc<Self>,
        id: SessionId,
        mut head: u64,
        guard: SessionGuard,
    ) -> CompactionStatus {
        let mut status = None;
        let mut guard = guard;
        let mut last_round_from = None;
        loop {
            let session = match self.store.session_on(&id, Some(head)).await {
                Ok(session) => session,
                Err(e) => return CompactionStatus::failed(Trigger::Tokens, e.to_string()),
            };
            // Appended to this branch since the last round (another branch's appends leave
            // this branch's context as the last round left it).
            if last_round_from == Some(session.head_seq) {
                break;
            }
            head = session.head_seq;
            last_round_from = Some(head);
            let trigger = match self.decide(&session) {
                Decision::Idle => break,
                Decision::BreakerOpen(trigger) => {
                    return status.unwrap_or(CompactionStatus::breaker_open(trigger));
                }
                Decision::Compact(trigger) => trigger,
            };
            let _ = self.store.record_attempt(&id, session.turn_start_seq).await;
            match self
                .compact_once(&id, trigger, None, None, Some(head))
                .await
            {
                Ok(Attempt::Compacted(row)) => {
                    status = Some(CompactionStatus::completed(
                        trigger,
                        super::views::compaction(*row),
                    ));
                    if self.shutdown.is_cancelled() {
                        break;
                    }
                }
                Ok(Attempt::NothingToCompact) => {
                    self.fruitless.record(id.as_str(), fruitless_key(&session));
                    return CompactionStatus::failed(trigger, NOTHING_TO_COMPACT.into());
                }
                Err(e) => return CompactionStatus::failed(trigger, e.to_string()),
            }
            // Let whoever waits for the session (a manual compaction, a context) go first.
            drop(guard);
            guard = self.locks.lock(id.as_str()).await;
        }
        status.unwrap_or(CompactionStatus::not_needed())
    }

    /// Masks the session's old tool outputs if its context has passed the point where masking
    /// starts and a masking would save a batch's worth. Returns the session as it stands when
    /// its masking moved past what `session` shows: masked by this call, or by another request
    /// since `session` was read (a context read before that masking is stale).
    pub(super) async fn mask_if_due(&self, session: &SessionRow) -> Option<SessionRow> {
        let config = self.compaction_config(session);
        let min_saving = MaskingStart::of(&config, session.context_limit)?
            .saving_due(session.context_tokens().0, session.pinned_tokens)?;
        let (row, now) = match self
            .store
            .mask_outputs(
                &session.id,
                session.head_seq,
                PRESERVE_RECENT_OUTPUTS,
                min_saving,
            )
            .await
        {
            Ok(masked) => masked,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "cannot mask old outputs");
                return None;
            }
        };
        if let Some(row) = &row {
            self.announce_masking(&session.id, row);
        }
        (now.masked_through_seq != session.masked_through_seq).then_some(now)
    }

    /// Logs a masking and tells the event stream.
    pub(super) fn announce_masking(&self, id: &SessionId, row: &MaskingRow) {
        tracing::debug!(session = %id, through = row.through_seq, pre = row.pre_tokens, post = row.post_tokens, "masked old outputs");
        self.emit(Event::OutputsMasked {
            session_id: id.to_string(),
            through_seq: row.through_seq,
            outputs: row.outputs,
            pre_tokens: row.pre_tokens,
            post_tokens: row.post_tokens,
        });
    }

    /// What the trigger and the circuit breaker say about the session now. An open breaker
    /// is announced (once per turn).
    fn decide(&self, session: &SessionRow) -> Decision {
        let config = self.compaction_config(session);
        let Some(trigger) = super::due(session, &config).trigger() else {
            return Decision::Idle;
        };
        // The same messages and limit as when the last automatic attempt found nothing to
        // compact.
        if self.fruitless.last(session.id.as_str()) == Some(fruitless_key(session)) {
            return Decision::Idle;
        }
        if session.turn_attempts >= config.breaker_threshold {
            self.announce_breaker(session, &config);
            Decision::BreakerOpen(trigger)
        } else {
            Decision::Compact(trigger)
        }
    }

    fn announce_breaker(&self, session: &SessionRow, config: &CompactionConfig) {
        let key = (session.id.to_string(), session.turn_start_seq);
        let fresh = self
            .breaker_announced
            .lock()
            .map(|mut announced| {
                // Earlier turns of this session are over: keep the set as small as the open breakers.
                announced.retain(|(id, turn)| id != &key.0 || *turn == key.1);
                announced.insert(key)
            })
            .unwrap_or(false);
        if fresh {
            tracing::warn!(session = %session.id, attempts = session.turn_attempts, "circuit breaker open: automatic compaction paused until the next user message");
            self.emit(Event::BreakerOpen {
                session_id: session.id.to_string(),
                attempts: session.turn_attempts,
                threshold: config.breaker_threshold,
            });
        }
    }

    /// Manual compaction (`/compact`, `POST /session/{id}/summarize`): waits for a running
    /// compaction of the session, then compacts whatever the trigger says.
    pub async fn summarize(
        &self,
        id: &SessionId,
        focus: Option<String>,
    ) -> Result<SummarizeOutcome, ServiceError> {
        self.store.session(id).await?;
        let _guard = self.locks.lock(id.as_str()).await;
        let focus = focus.filter(|f| !f.trim().is_empty());
        match self
            .compact_once(id, Trigger::Manual, focus, None, None)
            .await?
        {
            Attempt::Compacted(row) => {
                Ok(SummarizeOutcome::compacted(super::views::compaction(*row)))
            }
            Attempt::NothingToCompact => Ok(SummarizeOutcome::not_compacted(NOTHING_TO_COMPACT)),
        }
    }

    /// One compaction of the branch ending at `head`, whatever the trigger says: the model
    /// refused its context (see `Service::proxy_retry`). The caller holds the session's lock.
    /// Nothing to compact is recorded as a failed attempt, as for any automatic compaction.
    pub(super) async fn compact_refused(
        &self,
        id: &SessionId,
        head: u64,
    ) -> Result<(), ServiceError> {
        self.compact_once(id, Trigger::Tokens, None, None, Some(head))
            .await
            .map(|_| ())
    }

    /// One compaction of the session's current state. The caller holds the session's lock.
    /// Success and failure are both recorded and announced; a failure changes nothing else.
    /// With nothing to compact, a manual compaction says so and nothing is announced; an
    /// automatic one is recorded as a failed attempt.
    /// With `instead`, the extractive summarizer writes the summary, recorded as a fallback
    /// for that reason (a compact_extractively_now: see [`Self::compact_extractively_now`]).
    async fn compact_once(
        &self,
        id: &SessionId,
        trigger: Trigger,
        focus: Option<String>,
        instead: Option<String>,
        head: Option<u64>,
    ) -> Result<Attempt, ServiceError> {
        let _charge = self.compaction_charge(id, head).await?;
        let loaded = self.load(id, head).await?;
        let session = &loaded.snapshot.session;
        let config = self.compaction_config(session);
        let planning = (*config)
            .clone()
            .fitted_beside(session.estimated_limit(), session.fixed_tokens());
        let settings = self.settings();
        let input = self.plan_input(&loaded, &planning, focus.as_deref(), &settings);
        let attempt = AttemptOf {
            id,
            trigger,
            focus: &focus,
            summarizer: settings.summarizer.name(),
        };
        let plan = match compaction_run::plan(&input) {
            Ok(Some(plan)) => plan,
            Ok(None) if trigger == Trigger::Manual => return Ok(Attempt::NothingToCompact),
            Ok(None) => {
                self.record_failure(&attempt, NOTHING_TO_COMPACT.into(), 0)
                    .await?;
                return Ok(Attempt::NothingToCompact);
            }
            Err(error) => {
                self.record_failure(&attempt, error.to_string(), 0).await?;
                return Err(error.into());
            }
        };
        // Started before any context needs it: the agent goes on meanwhile.
        let background = trigger != Trigger::Manual
            && config.in_background()
            && !matches!(super::due(session, &config), Due::Urgent(_));
        self.emit(Event::CompactionStarted {
            session_id: id.to_string(),
            trigger,
            background,
        });
        let started = Instant::now();
        let num = session.compaction_count + 1;
        let run = Run {
            id,
            summarizer: settings.summarizer.as_ref(),
            slots: &settings.summarizer_slots,
            waited_for: !background,
            num,
            fallback: settings.config.summarizer.fallback.is_some(),
            max_wait_s: config.max_wait_s,
        };
        let outcome = match instead {
            Some(why) => compaction_run::run(&input, &plan, &Extractive, num)
                .await
                .map(|done| (done, Some(why))),
            None => self.run_summarizer(&input, &plan, run).await,
        };
        self.model_cutoffs.finished(id.as_str());
        let duration_ms = started.elapsed().as_millis() as u64;
        let mask_tail =
            (trigger != Trigger::Manual && config.microcompact).then_some(PRESERVE_RECENT_OUTPUTS);
        let finished = FinishedRun {
            attempt: &attempt,
            loaded: &loaded,
            duration_ms,
            mask_tail,
            background,
        };
        self.store_outcome(finished, outcome).await
    }

    /// Stores what a compaction came to: the compaction (an automatic one masks its tail's
    /// old outputs as it lands: it rewrote everything after the pinned messages, so masking
    /// now costs no prompt cache), or its failure.
    async fn store_outcome(
        &self,
        finished: FinishedRun<'_>,
        outcome: Result<(Compacted, Option<String>), CompactError>,
    ) -> Result<Attempt, ServiceError> {
        let FinishedRun {
            attempt,
            loaded,
            duration_ms,
            mask_tail,
            background,
        } = finished;
        let (id, trigger) = (attempt.id, attempt.trigger);
        let session = &loaded.snapshot.session;
        match outcome {
            Ok((done, fallback_reason)) => {
                let new = NewCompaction {
                    fallback_reason,
                    duration_ms,
                    mask_tail,
                    ..to_store(attempt, session, &loaded.seqs, done)
                };
                match self.commit(new, background).await {
                    Ok(row) => Ok(Attempt::Compacted(Box::new(row))),
                    Err(error) => {
                        let reason = format!("the compaction could not be stored: {error}");
                        tracing::warn!(session = %id, trigger = trigger.as_str(), reason = %reason, "compaction failed");
                        let _ = self.record_failure(attempt, reason, duration_ms).await;
                        Err(error)
                    }
                }
            }
            Err(error) => {
                tracing::warn!(session = %id, trigger = trigger.as_str(), reason = %error, "compaction failed");
                self.record_failure(attempt, error.to_string(), duration_ms)
                    .await?;
                Err(error.into())
            }
        }
    }

    /// A context over its session's trigger that compaction did not bring under (the model
    /// failed, fast, with no fallback configured, and the breaker then stopped trying): it is
    /// compacted now with the extractive summarizer, recorded as a fallback with why, as a
    /// context that waited `max_wait_s` for a slow model would have been; past the trigger
    /// the room left for the model's answer runs out, past the limit the model refuses the
    /// call. A compaction still running has its model call cut off instead (it finishes the same way). With
    /// the extractive summarizer configured there is nothing else to try: an open breaker
    /// says it did not help. Returns whether the session may have changed (its context is
    /// worth reading again).
    pub(super) async fn compact_extractively_now(&self, session: &SessionRow) -> bool {
        let settings = self.settings();
        if settings.summarizer.is_instant() {
            return false;
        }
        let id = &session.id;
        let Some(_guard) = self.locks.try_lock(id.as_str()) else {
            self.model_cutoffs.cut_off(id.as_str());
            self.locks.wait_idle(id.as_str()).await;
            self.model_cutoffs.withdraw(id.as_str());
            return true;
        };
        // A compaction may have landed since `session` was read (or another branch's call
        // moved the session: it is `session`'s branch that needs the compact_extractively_now).
        let Ok(session) = self.store.session_on(id, Some(session.head_seq)).await else {
            return true;
        };
        let config = self.compaction_config(&session);
        if !matches!(super::due(&session, &config), Due::Urgent(_)) {
            return true;
        }
        // One compact_extractively_now per open breaker: counted as an attempt, it did not help if the breaker
        // is still open past its threshold (the model server's next count is still over the
        // trigger), and another would only rewrite the summary again.
        if session.turn_attempts > config.breaker_threshold {
            return false;
        }
        let _ = self.store.record_attempt(id, session.turn_start_seq).await;
        let why = format!(
            "{}: a context over its trigger ({} tokens, limit {}) was left uncompacted by it",
            settings.summarizer.name(),
            session.context_tokens().0,
            session.context_limit
        );
        tracing::warn!(session = %id, reason = %why, "compacting a context over its trigger with the extractive summarizer");
        if let Err(e) = self
            .compact_once(id, Trigger::Tokens, None, Some(why), Some(session.head_seq))
            .await
        {
            tracing::warn!(session = %id, error = %e, "a context over its trigger could not be compacted");
        }
        true
    }

    /// The engine's input for compacting `loaded`.
    pub(super) fn plan_input<'a>(
        &self,
        loaded: &'a Loaded,
        config: &'a CompactionConfig,
        focus: Option<&'a str>,
        settings: &Settings,
    ) -> PlanInput<'a> {
        let session = &loaded.snapshot.session;
        PlanInput {
            pinned: &loaded.pinned,
            // A proxied client's tools and system go with every call, as pinned messages do.
            pinned_tokens: session.fixed_tokens(),
            seqs: &loaded.seqs,
            task_seq: session.task_seq,
            prior_summary: loaded.snapshot.latest.as_ref().map(|l| l.summary.as_str()),
            prior_files: &loaded.prior_files,
            focus,
            estimator: self.estimator,
            redact_secrets: settings.config.summarizer.redact_secrets,
            session: session.id.as_str(),
            // The plan's figures are estimates: so is the limit it plans against.
            ..PlanInput::new(
                &loaded.messages,
                &loaded.tokens,
                session.estimated_limit(),
                config,
            )
        }
    }

    /// What compacting the session (the branch `head` lies on) will hold, from the compaction
    /// budget: a compaction waits until others leave room (one larger than the whole budget
    /// runs alone).
    async fn compaction_charge(
        &self,
        id: &SessionId,
        head: Option<u64>,
    ) -> Result<memory::Charge, ServiceError> {
        let session = self.store.session_on(id, head).await?;
        self.charge_for(&session).await
    }

    /// [`Self::compaction_charge`] for a compaction of `session` as it stands.
    pub(super) async fn charge_for(
        &self,
        session: &SessionRow,
    ) -> Result<memory::Charge, ServiceError> {
        let bytes = session.active_messages * memory::COMPACTION_MESSAGE_COST
            + (session.active_tokens + session.summary_tokens) * memory::COMPACTION_TOKEN_COST;
        tokio::select! {
            charge = self.memory().compactions.take(bytes, None) => charge.ok_or(ServiceError::ShuttingDown),
            _ = self.shutdown.cancelled() => Err(ServiceError::ShuttingDown),
        }
    }

    /// What a compaction of the branch `head` lies on (the current one without `head`) starts
    /// from, in one snapshot: its context and the file lists its summary extends.
    async fn load(&self, id: &SessionId, head: Option<u64>) -> Result<Loaded, ServiceError> {
        let (snapshot, prior_files) = self.store.compaction_input(id, head).await?;
        Loaded::of(snapshot, prior_files)
    }

    /// Stores a finished compaction and announces it.
    async fn commit(
        &self,
        new: NewCompaction,
        background: bool,
    ) -> Result<CompactionRow, ServiceError> {
        let (id, trigger, chunks, duration_ms) = (
            new.session_id.clone(),
            new.trigger,
            new.chunks,
            new.duration_ms,
        );
        let (row, _, masking) = self.store.commit_compaction(new).await?;
        let num = row.result.compaction_num;
        tracing::info!(
            session = %id,
            num,
            trigger = trigger.as_str(),
            pre = row.result.pre_tokens,
            post = row.result.post_tokens,
            "compacted"
        );
        self.emit(Event::CompactionFinished {
            session_id: id.to_string(),
            trigger,
            compaction_num: num,
            pre_tokens: row.result.pre_tokens,
            post_tokens: row.result.post_tokens,
            boundary_seq: row.boundary_seq,
            summarizer: row.summarizer.clone(),
            chunks,
            fallback_reason: row.fallback_reason.clone(),
            duration_ms,
            background,
        });
        if let Some(masking) = masking {
            self.announce_masking(&id, &masking);
        }
        Ok(row)
    }

    /// Records a failed attempt and announces it.
    async fn record_failure(
        &self,
        attempt: &AttemptOf<'_>,
        reason: String,
        duration_ms: u64,
    ) -> Result<(), ServiceError> {
        let recorded = self
            .store
            .record_failure(NewFailure {
                session_id: attempt.id.clone(),
                trigger: attempt.trigger,
                focus: attempt.focus.clone(),
                summarizer: attempt.summarizer.clone(),
                reason: reason.clone(),
                duration_ms,
            })
            .await;
        // Announced even when the store takes nothing (its disk full): the attempt's start
        // was, and a plugin showing it waits for its end.
        self.emit(Event::CompactionFailed {
            session_id: attempt.id.to_string(),
            trigger: attempt.trigger,
            reason,
        });
        Ok(recorded?)
    }

    /// Runs the planned compaction, cancelled by shutdown; on failure, the extractive fallback
    /// if configured, and when a waiting context cuts it off (see [`super::model_cutoff`]), the
    /// extractive summarizer in any case. Returns the compaction and, if the extractive
    /// summarizer stood in, why.
    async fn run_summarizer(
        &self,
        input: &PlanInput<'_>,
        plan: &CompactionPlan,
        run: Run<'_>,
    ) -> Result<(Compacted, Option<String>), CompactError> {
        let cut_off = self.model_cutoffs.token(run.id.as_str());
        let attempt = tokio::select! {
            result = async {
                // The built-in summarizer only computes: it takes no slot.
                let _slot = match run.summarizer.is_instant() {
                    true => None,
                    false => Some(run.slots.take(run.waited_for).await),
                };
                compaction_run::run(input, plan, run.summarizer, run.num).await
            } => result,
            _ = self.shutdown.cancelled() => Err(SummarizeError::Cancelled.into()),
            _ = cut_off.cancelled() => {
                let done = compaction_run::run(input, plan, &Extractive, run.num).await?;
                let why = format!(
                    "{}: a context over the trigger waited max_wait_s ({} s)",
                    run.summarizer.name(),
                    run.max_wait_s
                );
                return Ok((done, Some(why)));
            }
        };
        match attempt {
            Ok(done) => Ok((done, None)),
            Err(CompactError::Summarizer(SummarizeError::Cancelled)) => {
                Err(SummarizeError::Cancelled.into())
            }
            Err(error) if run.fallback => {
                tracing::warn!(%error, "summarizer failed; compacting with the extractive fallback");
                let done = compaction_run::run(input, plan, &Extractive, run.num).await?;
                Ok((done, Some(format!("{}: {error}", run.summarizer.name()))))
            }
            Err(error) => Err(error),
        }
    }
}

/// One compaction's summarizer and what decides when another stands in for it.
struct Run<'a> {
    id: &'a SessionId,
    summarizer: &'a dyn Summarizer,
    slots: &'a SummarizerSlots,
    /// A context or a manual compaction waits for this one.
    waited_for: bool,
    num: u32,
    /// The extractive fallback is configured.
    fallback: bool,
    max_wait_s: u64,
}
