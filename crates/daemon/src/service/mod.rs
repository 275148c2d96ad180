//! The Processor: everything the daemon does, independent of HTTP.
//!
//! After every append it checks the trigger and, if it fires, starts a compaction of that
//! session (one at a time per session) while the append is acknowledged. Handlers, `replay`
//! and `bench` all call this, so the socket is only a transport.

mod answered;
pub(crate) mod fingerprint;
mod locks;
pub(crate) mod memory;
mod model_cutoff;
mod overflow;
mod per_session;
pub(crate) mod proxy;
mod rate;
mod recall;
mod scheduling;
mod settings;
mod summarizer_slots;
pub(crate) mod unrecorded;
pub(crate) mod views;

pub(crate) use settings::Settings;

use crate::protocol::{
    AppendResponse, CompactionHistory, ContextView, HistoryPage, SessionId, SessionView,
};
pub(crate) use crate::protocol::{ConfigStatus, Event};
pub(crate) use crate::store::StoreError;

use crate::compaction::microcompact::MaskingStart;
use crate::compaction::{CompactionConfig, Due, LazyEstimator, PinnedOverflow, check_due};
use crate::compaction_run::CompactError;
use crate::config::{Config, OverrideError, compaction_with_overrides};
use crate::message::{MessageBatch, MessageError};
use crate::store::{
    Append, AppendRules, ContextSnapshot, Idempotency, NewMessage, NewSession, SessionRow,
    SessionUpdate, Store,
};
use crate::summarize::{self, SummarizeError, Summarizer};
use locks::SessionLocks;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a request could not be served. Handlers map these to HTTP statuses.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("message {index}: {error}")]
    InvalidMessage { index: usize, error: MessageError },
    #[error("{0}")]
    BadRequest(String),
    /// A session's config overrides or context limit that cannot work (the key is named).
    #[error(transparent)]
    Overrides(#[from] OverrideError),
    #[error(transparent)]
    Summarizer(#[from] SummarizeError),
    #[error(transparent)]
    PinnedOverflow(#[from] PinnedOverflow),
    #[error("compactd is shutting down")]
    ShuttingDown,
}

/// A session to create; `None` fields take the configured defaults.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    pub id: Option<SessionId>,
    pub model: Option<String>,
    pub context_limit: Option<usize>,
    pub config: Option<Value>,
}

/// The sessions service: appends, contexts, compactions and the proxy's placement of calls,
/// over one store.
pub struct Service {
    store: Store,
    settings: RwLock<Arc<Settings>>,
    events: broadcast::Sender<Event>,
    locks: SessionLocks,
    /// Compactions a waiting context asked to finish now.
    model_cutoffs: model_cutoff::ModelCutoffs,
    estimator: LazyEstimator,
    /// (session, turn) pairs whose open breaker was already announced.
    breaker_announced: Mutex<HashSet<(String, u64)>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    started: Instant,
    config_status: RwLock<ConfigStatus>,
    memory: memory::Memory,
    /// How fast proxy callers over TCP make sessions.
    session_rate: rate::SessionRate,
    /// The context each socket session was last served: what a usage report measured.
    served: per_session::PerSession<u32>,
    /// The message count, limit and completion at which an automatic compaction of a session
    /// found nothing to compact: none is tried again until a message is appended.
    fruitless: per_session::PerSession<(u64, usize, usize)>,
    /// Sessions whose model server's usage report was said not to be believed.
    doubted: per_session::PerSession<()>,
    /// What unrecorded calls taught and compacted, by conversation.
    unrecorded: per_session::PerSession<unrecorded::Unrecorded>,
    /// Proxied conversations whose system prompt was stored unpinned, said once each.
    unpinned_prompts: per_session::PerSession<usize>,
}

impl Service {
    /// Builds the service on an open store; the summarizer is built from `config`.
    pub fn new(store: Store, config: Config) -> Result<Arc<Service>, SummarizeError> {
        let summarizer = summarize::from_config(&config.summarizer)?;
        Ok(Service::with_summarizer(store, config, summarizer))
    }

    /// Builds the service with a given summarizer (tests and embedders inject their own).
    pub fn with_summarizer(
        store: Store,
        config: Config,
        summarizer: Arc<dyn Summarizer>,
    ) -> Arc<Service> {
        let (events, _) = broadcast::channel(1024);
        Arc::new(Service {
            store,
            settings: RwLock::new(Arc::new(Settings::new(config, summarizer))),
            events,
            locks: SessionLocks::default(),
            model_cutoffs: model_cutoff::ModelCutoffs::default(),
            estimator: LazyEstimator::default(),
            breaker_announced: Mutex::new(HashSet::new()),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            started: Instant::now(),
            config_status: RwLock::new(ConfigStatus::default()),
            memory: memory::Memory::default(),
            session_rate: rate::SessionRate::default(),
            served: per_session::PerSession::default(),
            doubted: per_session::PerSession::default(),
            fruitless: per_session::PerSession::default(),
            unrecorded: per_session::PerSession::at_most(unrecorded::CONVERSATIONS),
            unpinned_prompts: per_session::PerSession::default(),
        })
    }

    /// The memory budgets every listener and compaction draws on ([`memory`]).
    pub fn memory(&self) -> &memory::Memory {
        &self.memory
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts a new configuration in force for every decision from now on.
    pub fn apply_config(&self, config: Config) -> Result<(), SummarizeError> {
        let summarizer = summarize::from_config(&config.summarizer)?;
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Settings::new(config, summarizer));
        Ok(())
    }

    pub fn config_status(&self) -> ConfigStatus {
        self.config_status
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_config_status(&self, update: impl FnOnce(&mut ConfigStatus)) {
        update(
            &mut self
                .config_status
                .write()
                .unwrap_or_else(|e| e.into_inner()),
        );
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub(crate) fn emit(&self, event: Event) {
        let _ = self.events.send(event);
    }

    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Cancelled when the daemon shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Cancels in-flight compactions (they record why) and waits for them to end.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// The compaction config of a session (see [`Settings::session_config`]).
    fn compaction_config(&self, session: &SessionRow) -> Arc<CompactionConfig> {
        self.settings().session_config(session)
    }

    /// Why `config` cannot apply to every live session (its compaction settings with a
    /// session's overrides must still leave that session room to compact), naming the
    /// sessions, and the key that owns each proxy session (by the start of its hash: the key
    /// itself is never stored). A config edit is checked like a PATCH is.
    pub async fn misfits(&self, config: &Config) -> Result<Vec<String>, ServiceError> {
        let (mut misfits, mut cursor) = (Vec::new(), String::new());
        loop {
            let page = self.store.next_sessions(&mut cursor).await?;
            if page.is_empty() {
                break;
            }
            for session in page {
                let why = compaction_with_overrides(&config.compaction, &session.overrides)
                    .and_then(|c| Ok(c.check_context_limit(session.context_limit)?));
                if let Err(why) = why {
                    let owner = match &session.owner {
                        Some(owner) => {
                            format!(", proxy key sha256 {}…", &owner[..owner.len().min(12)])
                        }
                        None => String::new(),
                    };
                    misfits.push(format!("session `{}`{owner}: {why}", session.id));
                }
            }
        }
        Ok(misfits)
    }

    fn view(&self, session: SessionRow) -> SessionView {
        let config = self.compaction_config(&session);
        let compacting = self.locks.is_busy(session.id.as_str());
        views::session_view(session, &config, compacting)
    }

    pub async fn create_session(
        &self,
        request: CreateSession,
    ) -> Result<SessionView, ServiceError> {
        let id = request.id.unwrap_or_else(generated_session_id);
        let new = self.new_session(id, request.model, request.context_limit, request.config)?;
        let session = self.store.create_session(new).await?;
        Ok(self.view(session))
    }

    fn new_session(
        &self,
        id: SessionId,
        model: Option<String>,
        context_limit: Option<usize>,
        overrides: Option<Value>,
    ) -> Result<NewSession, ServiceError> {
        let settings = self.settings();
        let overrides = overrides.unwrap_or_else(|| Value::Object(Default::default()));
        let config = compaction_with_overrides(&settings.config.compaction, &overrides)?;
        let context_limit =
            context_limit.unwrap_or(settings.config.compaction.default_context_limit);
        config
            .check_context_limit(context_limit)
            .map_err(OverrideError::from)?;
        Ok(NewSession {
            id,
            model,
            context_limit,
            overrides,
            owner: None,
            limit_source: None,
        })
    }

    /// A page of the sessions in id order, at most `limit` of them and about
    /// [`MAX_PAGE_BYTES`] as JSON: with 100,000 sessions no answer (and no lister) holds
    /// them all.
    pub async fn sessions_page(
        &self,
        after: String,
        limit: usize,
    ) -> Result<crate::protocol::SessionList, ServiceError> {
        let total = self.store.session_count().await?;
        let rows = self.store.sessions_page(after, limit + 1).await?;
        let more = rows.len() > limit;
        let mut sessions = Vec::with_capacity(rows.len().min(limit));
        let mut bytes = 0;
        for row in rows.into_iter().take(limit) {
            let view = self.view(row);
            bytes += serde_json::to_vec(&view).map_or(0, |v| v.len());
            sessions.push(view);
            if bytes >= MAX_PAGE_BYTES {
                break;
            }
        }
        let full = more || sessions.len() < limit && bytes >= MAX_PAGE_BYTES;
        let next_after = sessions.last().filter(|_| full).map(|s| s.id.to_string());
        Ok(crate::protocol::SessionList {
            sessions,
            total,
            next_after,
        })
    }

    pub async fn session(&self, id: &SessionId) -> Result<SessionView, ServiceError> {
        let (session, unpinned) = self.store.session_with_unpinned_system(id).await?;
        Ok(SessionView {
            unpinned_system_tokens: unpinned,
            ..self.view(session)
        })
    }

    /// Proxied conversations since start whose system prompt could not stay whole.
    pub fn unpinned_system_prompts(&self) -> usize {
        self.unpinned_prompts.len()
    }

    /// Changes a session; if the change puts it over its trigger (a lower `context_limit`,
    /// say), a compaction starts at once.
    pub async fn update_session(
        self: &Arc<Self>,
        id: &SessionId,
        request: crate::protocol::UpdateSessionRequest,
    ) -> Result<SessionView, ServiceError> {
        let update = SessionUpdate {
            model: request.model,
            context_limit: request.context_limit,
            overrides: request.config,
        };
        let current = self.store.session(id).await?;
        let overrides = update.overrides.as_ref().unwrap_or(&current.overrides);
        let config = compaction_with_overrides(&self.settings().config.compaction, overrides)?;
        config
            .check_context_limit(update.context_limit.unwrap_or(current.context_limit))
            .map_err(OverrideError::from)?;
        let session = self
            .store
            .update_session(id, update, self.append_rules())
            .await?;
        self.after_append(&session, false).await;
        Ok(self.view(session))
    }

    /// Starts the compactions a restart interrupted (or a config change made due): every
    /// session over its trigger compacts now rather than at its next append.
    pub async fn resume(self: &Arc<Self>) -> Result<usize, ServiceError> {
        let (mut started, mut cursor) = (0, String::new());
        loop {
            let page = self.store.next_sessions(&mut cursor).await?;
            if page.is_empty() {
                return Ok(started);
            }
            for session in page {
                if self.after_append(&session, false).await.is_some() {
                    started += 1;
                }
            }
        }
    }

    pub async fn delete_session(&self, id: &SessionId) -> Result<(), ServiceError> {
        Ok(self.store.delete_session(id).await?)
    }

    /// Appends a body's messages, as parsed once where they came in (creating the session with
    /// defaults if it is new), then starts a compaction if the trigger fires. A retry with the
    /// same `idempotency_key` appends nothing again.
    pub async fn append(
        self: &Arc<Self>,
        id: &SessionId,
        request: MessageBatch,
        idempotency_key: Option<String>,
    ) -> Result<AppendResponse, ServiceError> {
        let max = crate::protocol::MAX_REPORTED_TOKENS;
        if request.input_tokens.is_some_and(|n| n > max) {
            return Err(ServiceError::BadRequest(format!(
                "usage.input_tokens must be at most {max}"
            )));
        }
        // Within MAX_REPORTED_TOKENS, so it fits.
        let input_tokens = request.input_tokens.map(|n| n as usize);
        if request.messages.is_empty() {
            return Err(ServiceError::BadRequest("no messages to append".into()));
        }
        let mut new_messages = Vec::with_capacity(request.messages.len());
        for (index, message) in request.messages.into_iter().enumerate() {
            message
                .validate()
                .map_err(|error| ServiceError::InvalidMessage { index, error })?;
            let tokens = self.estimator.message(&message);
            new_messages.push(NewMessage::owned(message, tokens));
        }
        let create = self.new_session(id.clone(), None, None, None)?;
        let idempotency = match idempotency_key {
            Some(key) => {
                validate_idempotency_key(&key)?;
                Some(Idempotency::new(key, &new_messages, input_tokens))
            }
            None => None,
        };
        let outcome = self
            .store
            .append(
                Append {
                    session: id.clone(),
                    create: Some(create),
                    messages: new_messages,
                    reported_tokens: input_tokens,
                    // Without the client's word, the context it was last served.
                    reported_of: request
                        .compaction_num
                        .or_else(|| self.served.last(id.as_str())),
                    idempotency,
                },
                self.append_rules(),
            )
            .await?;
        if let Some(masking) = &outcome.masking {
            self.announce_masking(id, masking);
        }
        if request.input_tokens.is_some() {
            self.doubt_report(&outcome.session);
        }
        let compaction = self.compact_if_due(&outcome.session, request.wait).await;
        Ok(views::append_response(outcome, compaction))
    }

    /// Says, once per session and run, that the model server's usage report for it is not
    /// believed: it counts far fewer tokens (under a third) than compactd estimates the context
    /// at, and every real tokenizer counts at least as many. A server that cuts a prompt to a
    /// window of its own says nothing of it (Ollama past its `num_ctx` drops the oldest
    /// messages, system messages kept), and the agent loses its history while compactd, told a
    /// larger window, never compacts in time; the log is where a user finds why.
    fn doubt_report(&self, session: &crate::store::SessionRow) {
        let Some(reported) = session.reported_tokens else {
            return;
        };
        let (estimated, source) = session.context_tokens();
        if source != compactd_core::TokenSource::Estimated
            || self.doubted.last(session.id.as_str()).is_some()
        {
            return;
        }
        self.doubted.record(session.id.as_str(), ());
        tracing::warn!(
            session = %session.id,
            reported,
            estimated,
            context_limit = session.context_limit,
            "the model server counted far fewer tokens than this context holds, so compactd counts by its own estimate; a server that cuts prompts to a window of its own (Ollama past its num_ctx) does so silently: if it does, give the session that window (x-compactd-context-limit, [proxy.models], or its context_limit)"
        );
    }

    /// How the config (with the session's overrides) pins an append's messages and bounds
    /// the current step, decided in the append's own transaction from the session as it is
    /// then (so an append reads nothing beforehand).
    fn append_rules(&self) -> impl Fn(&SessionRow) -> AppendRules + Send + 'static {
        let settings = self.settings();
        move |session| {
            let config = settings.session_config(session);
            AppendRules {
                task_max_tokens: config.pin_first_user_tokens,
                max_pinned_tokens: config.max_pinned_tokens(session.context_limit),
                // A step's estimated tokens, against the limit in estimated tokens.
                step_budget: config.step_budget(session.estimated_limit(), session.fixed_tokens()),
                step_whole_under: config.token_threshold(session.estimated_limit()),
                lenient: false,
                pin_cap: 0,
                masking: MaskingStart::of(&config, session.context_limit),
                token_trigger: config.token_threshold(session.context_limit),
            }
        }
    }

    /// The current step's room for a session as it is (see [`AppendRules::step_budget`]).
    fn step_budgets(&self) -> impl Fn(&SessionRow) -> usize + Send + 'static {
        let rules = self.append_rules();
        move |session| rules(session).step_budget
    }

    /// A page of the session's history: messages after seq `after`, at most `limit` of them
    /// and about [`MAX_PAGE_BYTES`] of parts.
    pub async fn history(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<HistoryPage, ServiceError> {
        let (session, messages) = self.store.history(id, after, limit, MAX_PAGE_BYTES).await?;
        Ok(views::history_page(&session, messages))
    }

    /// What the agent sends to its model now. A context under its session's trigger is
    /// served as it is, even while a compaction runs (the compaction started in the
    /// background, at [`CompactionConfig::background_threshold`], and the agent goes on). With
    /// `wait`, a context over the trigger waits for the compaction that brings it under
    /// (starting one if none runs: after a restart or a config change), at most the session's
    /// `max_wait_s`; past it the compaction's model call is cut off and it finishes with the extractive
    /// summarizer. A context still over the trigger after that (the model failed fast and the
    /// breaker stopped trying) is compacted with the extractive summarizer at once, as a
    /// waiting one would have been. So an agent is never handed an over-limit context while
    /// compaction could prevent it, and never waits long for one.
    pub async fn context(
        self: &Arc<Self>,
        id: &SessionId,
        wait: bool,
    ) -> Result<ContextView, ServiceError> {
        let view = views::context_view(self.context_snapshot(id, wait, None).await?);
        self.served.record(id.as_str(), view.compaction_num);
        Ok(view)
    }

    /// [`Service::context`] as the store read it (with the session row and branch it was
    /// read with). With `head`, the context of the branch ending there (a proxied call's own:
    /// another call of the same conversation, on another branch, may have moved the session's
    /// current branch since this one was placed), else of the current branch.
    pub(crate) async fn context_snapshot(
        self: &Arc<Self>,
        id: &SessionId,
        wait: bool,
        head: Option<u64>,
    ) -> Result<ContextSnapshot, ServiceError> {
        if !wait {
            return self.read_context(id, head).await;
        }
        let mut deadline = None;
        let served = self.wait_under_trigger(id, head, &mut deadline).await;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            self.model_cutoffs.withdraw(id.as_str());
        }
        let served = served?;
        let session = &served.session;
        let config = self.compaction_config(session);
        if matches!(due(session, &config), Due::Urgent(_))
            && self.compact_extractively_now(session).await
        {
            return self.read_context(id, head).await;
        }
        Ok(served)
    }

    /// The session's context: of the branch ending at `head`, made the current one again if
    /// another branch's call moved it, else of the current branch.
    async fn read_context(
        &self,
        id: &SessionId,
        head: Option<u64>,
    ) -> Result<ContextSnapshot, ServiceError> {
        Ok(match head {
            Some(head) => self.store.context_on(id, head).await?,
            None => self.store.context(id).await?,
        })
    }

    /// The session's context once it is under its trigger, or after [`CONTEXT_WAIT_ROUNDS`]
    /// compactions (appends may keep coming) or an open breaker. `deadline` is set on the first
    /// wait; a compaction still running past it has its model call cut off.
    async fn wait_under_trigger(
        self: &Arc<Self>,
        id: &SessionId,
        head: Option<u64>,
        deadline: &mut Option<Instant>,
    ) -> Result<ContextSnapshot, ServiceError> {
        for _ in 0..CONTEXT_WAIT_ROUNDS {
            let snapshot = self.read_context(id, head).await?;
            // Appends mask as they land; a masking due here (after a config change) changes
            // the context, so it is read again rather than served as it was before.
            if self.mask_if_due(&snapshot.session).await.is_some() {
                continue;
            }
            let config = self.compaction_config(&snapshot.session);
            // Under the trigger with compactions in the background, the context is served as
            // it is; otherwise it waits for the compaction.
            let urgent = matches!(due(&snapshot.session, &config), Due::Urgent(_));
            // Starts the compaction that is due if none runs yet.
            let status = self.compact_if_due(&snapshot.session, false).await;
            if !urgent && config.in_background() {
                return Ok(snapshot);
            }
            match status.map(|s| s.status) {
                // Nothing due, nothing running.
                None => return Ok(snapshot),
                Some(crate::protocol::CompactionState::BreakerOpen) => return Ok(snapshot),
                Some(_) => {}
            }
            let until = *deadline
                .get_or_insert_with(|| Instant::now() + Duration::from_secs(config.max_wait_s));
            if tokio::time::timeout_at(until.into(), self.locks.wait_idle(id.as_str()))
                .await
                .is_err()
            {
                tracing::info!(
                    session = %id,
                    max_wait_s = config.max_wait_s,
                    "a context waited its bound for a compaction: finishing it with the extractive summarizer"
                );
                self.model_cutoffs.cut_off(id.as_str());
                self.locks.wait_idle(id.as_str()).await;
            }
        }
        self.read_context(id, head).await
    }

    /// A page of the session's compactions (after number `after`) and of its failed attempts
    /// (after id `failures_after`).
    pub async fn compaction_history(
        &self,
        id: &SessionId,
        page: HistoryRequest,
    ) -> Result<CompactionHistory, ServiceError> {
        let (session, compactions) = self
            .store
            .compactions(id, page.after, page.limit, MAX_PAGE_BYTES)
            .await?;
        let (failures, more_failures) = self
            .store
            .failures(id, page.failures_after, page.limit)
            .await?;
        let (maskings, more_maskings) = self
            .store
            .maskings(id, page.maskings_after, page.limit)
            .await?;
        Ok(views::compaction_history(
            &session,
            compactions,
            (failures, more_failures),
            (maskings, more_maskings),
        ))
    }
}

/// Compaction rounds a context waits through for its session to come under its trigger.
const CONTEXT_WAIT_ROUNDS: usize = 8;

/// Answers hold at most about this many bytes of messages or summaries (always at least one
/// item), so no request makes the daemon build an unbounded response.
pub(crate) const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Which page of a compaction history.
#[derive(Debug, Clone, Copy)]
pub struct HistoryRequest {
    pub after: u32,
    pub failures_after: u64,
    pub maskings_after: u64,
    pub limit: usize,
}

impl From<CompactError> for ServiceError {
    fn from(e: CompactError) -> ServiceError {
        match e {
            CompactError::Summarizer(e) => ServiceError::Summarizer(e),
            CompactError::PinnedOverflow(e) => ServiceError::PinnedOverflow(e),
        }
    }
}

/// Where `session` stands against its triggers under `config`, every figure as its model
/// counts it.
fn due(session: &SessionRow, config: &CompactionConfig) -> Due {
    let (tokens, _) = session.context_tokens();
    check_due(
        session.active_messages,
        tokens,
        session.context_limit,
        session.counted(session.pinned_tokens),
        session.counted(session.summary_tokens),
        config,
    )
}

/// Idempotency keys: 1 to 128 printable ASCII characters without spaces (a UUID fits).
fn validate_idempotency_key(key: &str) -> Result<(), ServiceError> {
    if (1..=128).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(ServiceError::BadRequest(format!(
            "invalid Idempotency-Key {:?}: use 1 to 128 printable ASCII characters, no spaces",
            truncate_for_error(key)
        )))
    }
}

fn truncate_for_error(text: &str) -> String {
    crate::compaction::truncate::truncate_chars(text, 80).into_owned()
}

/// A fresh session id: time-ordered and unique within this process (`s-` and hex digits,
/// valid by construction).
fn generated_session_id() -> SessionId {
    SessionId::unchecked(format!("s-{}", unique_stamp()))
}

/// The time in nanoseconds, the process id and a counter, in hex: time-ordered, and unique
/// among the stamps of every process on this machine.
fn unique_stamp() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{nanos:x}-{:x}-{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generated id passes the check every id from outside passes, and no two are alike.
    #[test]
    fn generated_session_ids_are_valid_and_distinct() {
        let (a, b) = (generated_session_id(), generated_session_id());
        assert_eq!(SessionId::parse(a.as_str()), Ok(a.clone()));
        assert_ne!(a, b);
    }
}
