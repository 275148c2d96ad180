//! A local model API that behaves as the providers document: OpenAI Chat Completions
//! ([`chat`]), the OpenAI Responses API ([`responses`]) and Anthropic Messages ([`messages`]),
//! streamed or not. It refuses, with the provider's own 400 and error shape, every request
//! their rules refuse (roles, tool-call pairing, thinking blocks and their signatures,
//! reasoning items and their encrypted content, empty content, a prompt over the model's
//! window), and counts every request the way a model server would (all of its text, tools and
//! system included), so a test can compare what the agent sent, what compactd sent and what
//! the upstream saw.
//!
//! As a model it plays a fixed task: it has the agent run `steps` shell commands, one per
//! step, each printing `STEP-k-BEGIN`, `lines` numbers spelled in letters (`seq` through `tr
//! 0-9 a-j`: compactd counts digits nearer what models spend on them, and the letters keep
//! the model counting twice the estimate) and `STEP-k-END`; it reads the step it
//! is at from the newest tool output it is given, and once all are done it answers
//! `All N steps done; the last output ended with STEP-N-END.` An agent whose context lost
//! the output it just got would run a step again or answer otherwise.

pub mod aider;
pub mod background_command;
pub mod chat;
pub mod count;
pub mod delegation;
pub mod messages;
pub mod responses;
pub mod task_list;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The task the model plays.
#[derive(Debug, Clone)]
pub struct Task {
    /// Shell steps before the final answer.
    pub steps: usize,
    /// Numbers each step's command prints, spelled in letters (about 1.2 tokens each).
    pub lines: usize,
    /// The model's context window in tokens, by model name (others: 1,000,000).
    pub windows: HashMap<String, usize>,
    /// The characters its tokenizer counts as one token.
    pub chars_per_token: usize,
    /// Anthropic Messages (Claude Code's `Agent` tool), the Responses API (Codex's
    /// `spawn_agent`) and Chat Completions (opencode's `task` tool): once this step is done,
    /// the model hands steps of its own to sub-agents ([`delegation`]).
    pub delegate_after: Option<usize>,
    /// How many sub-agents it hands steps to at once (one call each, in one answer; at most
    /// [`delegation::SUB_AGENTS`]).
    pub sub_agents: usize,
    /// The sub-agents start from the main conversation's history: Codex's `spawn_agent` with
    /// `fork_context` (its preamble and task, then theirs), Claude Code's `Agent` with
    /// `subagent_type: "fork"` (all of it, then their directive).
    pub fork_context: bool,
    /// Each step's call comes with a second one beside it in the same answer (`echo
    /// SIDE-k`), which the agent runs in parallel.
    pub parallel_calls: bool,
    /// Claude Code's sub-agents run in the background (`run_in_background`).
    pub background: bool,
    /// Before its first step the model starts a build in the background (Claude Code's `Bash`
    /// with `run_in_background`; Codex's `exec_command` outliving its yield time), and ends by
    /// reading its output (the file; `write_stdin` on its session) ([`background_command`]).
    pub background_command: bool,
    /// Anthropic Messages (Claude Code's `TaskStop`): before its first step the model starts a
    /// build in the background and stops it at once; it ends its task only if its context
    /// does not hold the build's start without its stop ([`background_command::stopping_turn`]).
    pub stopped_command: bool,
    /// Anthropic Messages (Claude Code 2.1's task tools): the model keeps a task list of two
    /// tasks one task at a time, and ends by finishing those its context says are pending
    /// ([`task_list`]).
    pub task_list: bool,
    /// Anthropic Messages (Claude Code's `Read` of an image or a PDF): after each step's
    /// output the model reads this file (a screenshot, a report) before it goes on; the API
    /// bills each image it is sent by its size, each PDF by its pages ([`count`]).
    pub read_after_step: Option<std::path::PathBuf>,
}

impl Default for Task {
    fn default() -> Task {
        Task {
            steps: 20,
            lines: 600,
            windows: HashMap::new(),
            chars_per_token: 4,
            delegate_after: None,
            sub_agents: 1,
            fork_context: false,
            parallel_calls: false,
            background: false,
            background_command: false,
            stopped_command: false,
            task_list: false,
            read_after_step: None,
        }
    }
}

/// One request the model API saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Value,
    /// Tokens of the request as this server counts them (all its text).
    pub tokens: usize,
    /// The refusal's message, if the request broke a rule.
    pub refused: Option<String>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn model(&self) -> &str {
        self.body["model"].as_str().unwrap_or("")
    }
}

/// What the next answer of the model is.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Run the command of `step`.
    Run { step: usize, command: String },
    /// The final answer.
    Finish(String),
    /// A one-off answer (a title, a summary): the request has no shell tool.
    Text(String),
}

#[derive(Default)]
pub(crate) struct Shared {
    task: Mutex<Task>,
    seen: Mutex<Vec<Seen>>,
    /// Signatures of the thinking blocks and encrypted reasoning this server gave out.
    issued: Mutex<HashSet<String>>,
    counter: Mutex<u64>,
}

impl Shared {
    pub(crate) fn next_id(&self) -> u64 {
        let mut n = self.counter.lock().unwrap();
        *n += 1;
        *n
    }

    /// A signature only this server can have issued for `what`.
    pub(crate) fn sign(&self, what: &str) -> String {
        use sha2::Digest;
        let n = self.next_id();
        let digest = sha2::Sha256::digest(format!("mock-secret:{n}:{what}").as_bytes());
        let signature: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.issued.lock().unwrap().insert(signature.clone());
        signature
    }

    pub(crate) fn issued(&self, signature: &str) -> bool {
        self.issued.lock().unwrap().contains(signature)
    }

    pub(crate) fn task(&self) -> Task {
        self.task.lock().unwrap().clone()
    }
}

/// The running server.
pub struct ModelApi {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ModelApi {
    pub fn start(task: Task) -> ModelApi {
        let shared = Arc::new(Shared::default());
        *shared.task.lock().unwrap() = task;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                let app = Router::new().fallback(handle).with_state(state);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let address = ready_rx.recv().unwrap();
        ModelApi {
            base: format!("http://{address}"),
            shared,
            stop: Some(stop),
        }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The requests it refused, with why.
    pub fn refused(&self) -> Vec<(String, String)> {
        self.seen()
            .into_iter()
            .filter_map(|s| s.refused.map(|why| (s.path, why)))
            .collect()
    }
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What the model does next, given the newest tool output it sees (if any) and whether the
/// request offers a shell tool.
pub fn decide(task: &Task, newest_output: Option<&str>, has_shell: bool) -> Action {
    if !has_shell {
        return Action::Text("A short title".into());
    }
    let done = newest_output.and_then(last_step_end).unwrap_or(0);
    if done >= task.steps {
        return Action::Finish(format!(
            "All {} steps done; the last output ended with STEP-{done}-END.",
            task.steps
        ));
    }
    let step = done + 1;
    Action::Run {
        step,
        command: format!(
            "echo STEP-{step}-BEGIN; seq 1 {} | tr 0-9 a-j; echo STEP-{step}-END",
            task.lines
        ),
    }
}

/// The number of the last `STEP-k-END` in `output`.
fn last_step_end(output: &str) -> Option<usize> {
    last_end(output, "STEP-")
}

/// The number of the last `{prefix}k-END` in `output`, if the last `-END` is one.
pub(crate) fn last_end(output: &str, prefix: &str) -> Option<usize> {
    let at = output.rfind("-END")?;
    let start = output[..at].rfind(prefix)? + prefix.len();
    output[start..at].parse().ok()
}

/// A message's content or a tool's output as text: a string as it is, a list of parts as
/// their texts, one a line.
pub(crate) fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The command of the side call beside step `step`'s (see [`Task::parallel_calls`]).
pub(crate) fn side_command(step: usize) -> String {
    format!("echo SIDE-{step}")
}

/// Whether a tool's output is a side call's (which says nothing of the steps done).
pub(crate) fn is_side_output(output: &str) -> bool {
    output.contains("SIDE-") && !output.contains("-END")
}

/// A 400 in OpenAI's error shape.
pub(crate) fn openai_error(message: &str, code: Option<&str>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}})),
    )
        .into_response()
}

/// A 400 in Anthropic's error shape.
pub(crate) fn anthropic_error(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})),
    )
        .into_response()
}

/// A server-sent event stream of `events` (name, data), all at once.
pub(crate) fn sse(events: Vec<(Option<String>, Value)>, done: bool) -> Response {
    let mut body = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            body.push_str(&format!("event: {name}\n"));
        }
        body.push_str(&format!("data: {data}\n\n"));
    }
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    ([("content-type", "text/event-stream")], body).into_response()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = uri.path().to_string();
    let task = shared.task();
    let anthropic = path.contains("/messages");
    let tokens = count::request_tokens(&value, task.chars_per_token, anthropic);
    let window = task
        .windows
        .get(value["model"].as_str().unwrap_or(""))
        .copied()
        .unwrap_or(1_000_000);
    let outcome: Result<Response, String> = match (method.as_str(), path.as_str()) {
        ("GET", p) if p.ends_with("/models") => Ok(axum::Json(json!({"object": "list", "data": [
            {"id": "mock-model", "object": "model", "type": "model", "display_name": "Mock"}
        ]}))
        .into_response()),
        (_, p) if p.ends_with("/messages/count_tokens") => messages::validate(&shared, &value)
            .map(|()| axum::Json(json!({"input_tokens": tokens})).into_response()),
        (_, p) if p.ends_with("/messages") => {
            messages::answer(&shared, &task, &value, tokens, window)
        }
        (_, p) if p.ends_with("/chat/completions") => {
            chat::answer(&shared, &task, &value, tokens, window)
        }
        (_, p) if p.ends_with("/responses") => {
            responses::answer(&shared, &task, &value, tokens, window)
        }
        _ => Err(format!("no such endpoint: {method} {path}")),
    };
    let refused = outcome.as_ref().err().cloned();
    shared.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        query: uri.query().map(str::to_string),
        headers,
        body: value,
        tokens,
        refused: refused.clone(),
    });
    match outcome {
        Ok(response) => response,
        Err(why) if path.ends_with("/messages") || path.ends_with("/count_tokens") => {
            anthropic_error(&why)
        }
        Err(why)
            if why.contains("maximum context length")
                || why.contains("exceeds the context window") =>
        {
            openai_error(&why, Some("context_length_exceeded"))
        }
        Err(why) => openai_error(&why, None),
    }
}
