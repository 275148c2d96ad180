//! The Processor: everything the daemon does, independent of HTTP.
//!
//! After every append it checks the trigger and, if it fires, starts a compaction of that
//! session (one at a time per session) while the append is acknowledged. Handlers, `replay`
//! and `bench` all call this, so the socket is only a transport.

mod answered;
mod compact;
mod locks;
pub mod memory;
pub mod proxy;
mod rate;
pub mod views;

use crate::protocol::{
    AppendResponse, CompactionHistory, ContextView, HistoryPage, SessionId, SessionView,
};
pub use crate::protocol::{ConfigStatus, Event};
pub use crate::store::StoreError;

use crate::compaction::{CompactionConfig, LazyEstimator, PinnedOverflow, Trigger, check_trigger};
use crate::compactor::CompactError;
use crate::config::{Config, compaction_with_overrides};
use crate::message::{Message, MessageError};
use crate::store::{
    AppendRules, Idempotency, NewMessage, NewSession, SessionRow, SessionUpdate, Store,
};
use crate::summarize::{self, SummarizeError, Summarizer};
use locks::SessionLocks;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
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
    #[error(transparent)]
    Summarizer(#[from] SummarizeError),
    #[error(transparent)]
    PinnedOverflow(#[from] PinnedOverflow),
    #[error("compactd is shutting down")]
    ShuttingDown,
}

/// The configuration in force and the summarizer built from it, swapped whole on reload.
pub struct Settings {
    pub config: Config,
    pub summarizer: Arc<dyn Summarizer>,
}

/// A session to create; `None` fields take the configured defaults.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    pub id: Option<SessionId>,
    pub model: Option<String>,
    pub context_limit: Option<usize>,
    pub config: Option<Value>,
}

/// Messages to append.
#[derive(Debug, Clone, Default)]
pub struct AppendRequest {
    pub messages: Vec<Message>,
    /// The agent's `usage.input_tokens` for its last model call.
    pub input_tokens: Option<usize>,
    /// Respond only after a compaction this append triggers has finished.
    pub wait: bool,
    /// The client's Idempotency-Key: a retry with the same key appends nothing again.
    pub idempotency_key: Option<String>,
}

/// The Processor.
pub struct Service {
    store: Store,
    settings: RwLock<Arc<Settings>>,
    events: broadcast::Sender<Event>,
    locks: SessionLocks,
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
            settings: RwLock::new(Arc::new(Settings { config, summarizer })),
            events,
            locks: SessionLocks::default(),
            estimator: LazyEstimator::default(),
            breaker_announced: Mutex::new(HashSet::new()),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            started: Instant::now(),
            config_status: RwLock::new(ConfigStatus::default()),
            memory: memory::Memory::default(),
            session_rate: rate::SessionRate::default(),
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
            Arc::new(Settings { config, summarizer });
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

    /// The compaction config of a session: global settings plus its overrides, fitted to
    /// its context limit (see [`CompactionConfig::fitted_to`]).
    fn compaction_config(&self, session: &SessionRow) -> CompactionConfig {
        session_config(&self.settings().config.compaction, session)
    }

    /// Why `config` cannot apply to every live session (its compaction settings with a
    /// session's overrides must still leave that session room to compact), naming the
    /// sessions, and the key that owns each proxy session (by the start of its hash: the key
    /// itself is never stored). A config edit is checked like a PATCH is.
    pub async fn misfits(&self, config: &Config) -> Result<Vec<String>, ServiceError> {
        let mut misfits = Vec::new();
        for session in self.store.sessions().await? {
            let why = compaction_with_overrides(&config.compaction, &session.overrides)
                .and_then(|c| c.check_context_limit(session.context_limit));
            if let Err(why) = why {
                let owner = match &session.owner {
                    Some(owner) => format!(", proxy key sha256 {}…", &owner[..owner.len().min(12)]),
                    None => String::new(),
                };
                misfits.push(format!("session `{}`{owner}: {why}", session.id));
            }
        }
        Ok(misfits)
    }

    fn view(&self, session: SessionRow) -> SessionView {
        let config = self.compaction_config(&session);
        let compacting = self.locks.is_busy(&session.id);
        SessionView::new(session, &config, compacting)
    }

    pub async fn create_session(
        &self,
        request: CreateSession,
    ) -> Result<SessionView, ServiceError> {
        let id = request.id.unwrap_or_else(SessionId::generate);
        let new = self.new_session(
            id.to_string(),
            request.model,
            request.context_limit,
            request.config,
        )?;
        let session = self.store.create_session(new).await?;
        Ok(self.view(session))
    }

    fn new_session(
        &self,
        id: String,
        model: Option<String>,
        context_limit: Option<usize>,
        overrides: Option<Value>,
    ) -> Result<NewSession, ServiceError> {
        let settings = self.settings();
        let overrides = overrides.unwrap_or_else(|| Value::Object(Default::default()));
        let config = compaction_with_overrides(&settings.config.compaction, &overrides)
            .map_err(ServiceError::BadRequest)?;
        let context_limit =
            context_limit.unwrap_or(settings.config.compaction.default_context_limit);
        config
            .check_context_limit(context_limit)
            .map_err(ServiceError::BadRequest)?;
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
            next_after,
        })
    }

    pub async fn sessions(&self) -> Result<Vec<SessionView>, ServiceError> {
        Ok(self
            .store
            .sessions()
            .await?
            .into_iter()
            .map(|s| self.view(s))
            .collect())
    }

    pub async fn session(&self, id: &SessionId) -> Result<SessionView, ServiceError> {
        Ok(self.view(self.store.session(id.as_str()).await?))
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
        let current = self.store.session(id.as_str()).await?;
        let overrides = update.overrides.as_ref().unwrap_or(&current.overrides);
        let config = compaction_with_overrides(&self.settings().config.compaction, overrides)
            .map_err(ServiceError::BadRequest)?;
        config
            .check_context_limit(update.context_limit.unwrap_or(current.context_limit))
            .map_err(ServiceError::BadRequest)?;
        let session = self
            .store
            .update_session(id.to_string(), update, self.append_rules())
            .await?;
        self.after_append(&session, false).await;
        Ok(self.view(session))
    }

    /// Starts the compactions a restart interrupted (or a config change made due): every
    /// session over its trigger compacts now rather than at its next append.
    pub async fn resume(self: &Arc<Self>) -> Result<usize, ServiceError> {
        let mut started = 0;
        for session in self.store.sessions().await? {
            if self.after_append(&session, false).await.is_some() {
                started += 1;
            }
        }
        Ok(started)
    }

    pub async fn delete_session(&self, id: &SessionId) -> Result<(), ServiceError> {
        Ok(self.store.delete_session(id.to_string()).await?)
    }

    /// Appends messages (creating the session with defaults if it is new), then starts a
    /// compaction if the trigger fires.
    pub async fn append(
        self: &Arc<Self>,
        id: &SessionId,
        request: AppendRequest,
    ) -> Result<AppendResponse, ServiceError> {
        let id = id.as_str();
        if request.messages.is_empty() {
            return Err(ServiceError::BadRequest("no messages to append".into()));
        }
        let mut new_messages = Vec::with_capacity(request.messages.len());
        for (index, message) in request.messages.iter().enumerate() {
            message
                .validate()
                .map_err(|error| ServiceError::InvalidMessage { index, error })?;
            new_messages.push(NewMessage::new(message, self.estimator.message(message)));
        }
        let create = self.new_session(id.to_string(), None, None, None)?;
        let idempotency = match request.idempotency_key {
            Some(key) => {
                validate_idempotency_key(&key)?;
                Some(Idempotency::new(key, &new_messages, request.input_tokens))
            }
            None => None,
        };
        let outcome = self
            .store
            .append(
                id.to_string(),
                Some(create),
                new_messages,
                request.input_tokens,
                self.append_rules(),
                idempotency,
            )
            .await?;
        let compaction = self.after_append(&outcome.session, request.wait).await;
        Ok(AppendResponse::new(outcome, compaction))
    }

    /// How the config (with the session's overrides) pins an append's messages and bounds
    /// the current step, decided in the append's own transaction from the session as it is
    /// then (so an append reads nothing beforehand).
    fn append_rules(&self) -> impl Fn(&SessionRow) -> AppendRules + Send + 'static {
        let global = self.settings().config.compaction.clone();
        move |session| {
            let config = session_config(&global, session);
            AppendRules {
                task_max_tokens: config.pin_first_user_tokens,
                max_pinned_tokens: config.max_pinned_tokens(session.context_limit),
                step_budget: config.step_budget(session.context_limit, session.fixed_tokens()),
                lenient: false,
                pin_cap: 0,
            }
        }
    }

    /// A page of the session's history: messages after seq `after`, at most `limit` of them
    /// and about [`MAX_PAGE_BYTES`] of parts.
    pub async fn history(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<HistoryPage, ServiceError> {
        let (session, messages) = self
            .store
            .history(id.as_str(), after, limit, MAX_PAGE_BYTES)
            .await?;
        Ok(HistoryPage::new(&session, messages))
    }

    /// What the agent sends to its model now. With `wait`, a running compaction of the
    /// session finishes first, and a session found over its trigger with none running (after
    /// a restart or a config change) compacts first, so an agent is never handed an
    /// over-limit context while compaction could prevent it.
    pub async fn context(
        self: &Arc<Self>,
        id: &SessionId,
        wait: bool,
    ) -> Result<ContextView, ServiceError> {
        let id = id.as_str();
        if !wait {
            return Ok(ContextView::new(self.store.context(id).await?));
        }
        // Compactions of a busy session take turns with its readers: wait through a few of
        // them for the session to come under its trigger, not forever (appends may keep
        // coming).
        let mut rounds = 0;
        loop {
            self.locks.wait_idle(id).await;
            let snapshot = self.store.context(id).await?;
            rounds += 1;
            match self.after_append(&snapshot.session, true).await {
                Some(status)
                    if status.status != crate::protocol::CompactionState::BreakerOpen
                        && rounds < CONTEXT_WAIT_ROUNDS => {}
                _ => return Ok(ContextView::new(snapshot)),
            }
        }
    }

    /// A page of the session's compactions (after number `after`) and of its failed attempts
    /// (after id `failures_after`).
    pub async fn compaction_history(
        &self,
        id: &SessionId,
        page: HistoryRequest,
    ) -> Result<CompactionHistory, ServiceError> {
        let id = id.as_str();
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
        Ok(CompactionHistory::new(
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
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

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

/// Whether `session` should compact now under `config`.
fn trigger_under(session: &SessionRow, config: &CompactionConfig) -> Option<Trigger> {
    let (tokens, _) = session.context_tokens();
    check_trigger(
        session.active_messages,
        tokens,
        session.context_limit,
        config,
    )
}

/// Idempotency keys: 1 to 128 printable ASCII characters without spaces (a UUID fits).
/// A session's compaction config: `global` with its overrides, fitted to its context limit
/// (see [`CompactionConfig::fitted_to`]).
pub(crate) fn session_config(global: &CompactionConfig, session: &SessionRow) -> CompactionConfig {
    compaction_with_overrides(global, &session.overrides)
        .unwrap_or_else(|_| global.clone())
        .fitted_to(session.context_limit)
        .0
}

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
