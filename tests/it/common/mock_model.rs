//! A local mock of model APIs (OpenAI chat completions and Anthropic messages) that replies
//! from a script and records every request, for testing summarizers without the network.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the mock answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with an OpenAI chat completion whose content is the text.
    OpenAi(String),
    /// 200 with an Anthropic message whose text block is the text.
    Anthropic(String),
    /// 200 with an OpenAI completion whose content names the call number:
    /// "summary written by call N" under the nine headings.
    OpenAiNumbered,
    /// Any status, body and headers.
    Raw {
        status: u16,
        body: String,
        headers: Vec<(&'static str, String)>,
    },
    /// Never answers.
    Hang,
    /// `OpenAiNumbered`, after this long.
    After(Duration),
    /// As a model with a window of this many tokens (4 characters each): a request longer
    /// than that gets OpenAI's 400 `context_length_exceeded`, others `OpenAiNumbered`.
    Window(usize),
    /// As a model whose tokenizer counts a token every `chars_per_token` characters of the
    /// request's messages, system and tools (as JSON), with a window of `window` tokens: a
    /// longer request gets the provider's documented refusal (Anthropic's "prompt is too long:
    /// N tokens > M maximum" on `/v1/messages`, and there a prompt that leaves `max_tokens` no
    /// room its "input length and `max_tokens` exceed context limit"; OpenAI's
    /// `context_length_exceeded` elsewhere, or
    /// for a model named `gemini…` Gemini's, for `mistral…` Mistral's, for `vllm…` vLLM's
    /// older root-level form);
    /// others are answered "noted", their usage the count.
    Tokenized {
        window: usize,
        chars_per_token: usize,
    },
    /// As [`Reply::Tokenized`] refuses a request longer than its window; `then` answers one
    /// that fits.
    Fitting {
        window: usize,
        chars_per_token: usize,
        then: Box<Reply>,
    },
    /// The reply, once the test adds a permit to the semaphore (a model call in flight for as
    /// long as the test needs).
    Gated(Arc<tokio::sync::Semaphore>, Box<Reply>),
}

impl Reply {
    pub fn status(status: u16, body: &str) -> Reply {
        Reply::Raw {
            status,
            body: body.to_string(),
            headers: vec![],
        }
    }
}

/// A recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// The compaction prompt in the request (OpenAI or Anthropic shape).
    pub fn prompt(&self) -> String {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}

#[derive(Default)]
struct MockState {
    script: Mutex<VecDeque<Reply>>,
    otherwise: Mutex<Option<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    arrived: Condvar,
}

pub struct MockModel {
    pub base: String,
    state: Arc<MockState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A nine-section summary with `body` in section 1.
pub fn nine_sections(body: &str) -> String {
    compactd_core::compaction::sections::SUMMARY_SECTIONS
        .iter()
        .map(|s| {
            format!(
                "{}\n{}",
                compactd_core::compaction::sections::heading(s),
                if s.number == 1 { body } else { "-" }
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl MockModel {
    /// Starts the mock; `script` answers the first requests in order, `otherwise` the rest.
    /// A model with a window no test fills, answering every call "noted" with its usage.
    pub fn roomy() -> MockModel {
        MockModel::start(
            vec![],
            Reply::Tokenized {
                window: 1_000_000,
                chars_per_token: 4,
            },
        )
    }

    pub fn start(script: Vec<Reply>, otherwise: Reply) -> MockModel {
        let state = Arc::new(MockState::default());
        *state.script.lock().unwrap() = script.into();
        *state.otherwise.lock().unwrap() = Some(otherwise);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                let app = Router::new().fallback(handle).with_state(shared);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let address = ready_rx.recv().unwrap();
        MockModel {
            base: format!("http://{address}"),
            state,
            stop: Some(stop),
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests have arrived.
    pub fn wait_for_requests(&self, n: usize) -> Vec<Recorded> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut requests = self.state.requests.lock().unwrap();
        while requests.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "only {} of {n} requests arrived",
                requests.len()
            );
            requests = self.state.arrived.wait_timeout(requests, left).unwrap().0;
        }
        requests.clone()
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn handle(
    State(state): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request_tokens = body["messages"].to_string().len() / 4;
    let counted = (uri.path().to_string(), body.clone());
    let n = {
        let mut requests = state.requests.lock().unwrap();
        requests.push(Recorded {
            path: uri.path().to_string(),
            headers,
            body,
        });
        state.arrived.notify_all();
        requests.len()
    };
    let mut reply = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| state.otherwise.lock().unwrap().clone().unwrap());
    if let Reply::Gated(gate, inner) = reply {
        gate.acquire().await.unwrap().forget();
        reply = *inner;
    }
    if let Reply::Fitting {
        window,
        chars_per_token,
        then,
    } = reply
    {
        if let Some(refusal) = refusal(&counted, window, chars_per_token) {
            return refusal;
        }
        reply = *then;
    }
    match reply {
        Reply::OpenAi(text) => axum::Json(openai_completion(&text)).into_response(),
        Reply::OpenAiNumbered => axum::Json(openai_completion(&nine_sections(&format!(
            "summary written by call {n}"
        ))))
        .into_response(),
        Reply::Anthropic(text) => axum::Json(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}
        }))
        .into_response(),
        Reply::Raw {
            status,
            body,
            headers,
        } => {
            let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        Reply::Window(tokens) if request_tokens > tokens => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {
                "message": format!("This model's maximum context length is {tokens} tokens. However, your messages resulted in {request_tokens} tokens."),
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"
            }})),
        )
            .into_response(),
        Reply::Window(_) => axum::Json(openai_completion(&nine_sections(&format!(
            "summary written by call {n}"
        ))))
        .into_response(),
        Reply::Tokenized {
            window,
            chars_per_token,
        } => tokenized(&counted, window, chars_per_token),
        Reply::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Reply::Gated(..) | Reply::Fitting { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, "nested twice").into_response()
        }
        Reply::After(wait) => {
            tokio::time::sleep(wait).await;
            axum::Json(openai_completion(&nine_sections(&format!(
                "summary written by call {n}"
            ))))
            .into_response()
        }
    }
}

/// [`Reply::Tokenized`]'s answer to the request `(path, body)`.
fn tokenized(counted: &(String, Value), window: usize, chars_per_token: usize) -> Response {
    if let Some(refusal) = refusal(counted, window, chars_per_token) {
        return refusal;
    }
    let anthropic = counted.0.ends_with("/messages");
    let tokens = tokens_of(&counted.1, chars_per_token, anthropic);
    let answer = match anthropic {
        true => json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": "noted"}],
            "stop_reason": "end_turn", "usage": {"input_tokens": tokens, "output_tokens": 1}
        }),
        false => {
            let mut answer = openai_completion("noted");
            answer["usage"]["prompt_tokens"] = json!(tokens);
            answer
        }
    };
    axum::Json(answer).into_response()
}

/// The tokens of a request's messages, system and tools (as JSON), a token every
/// `chars_per_token` characters; images as the API (Anthropic's on `anthropic`) bills them,
/// their base64 text not counted (see [`super::vision`]).
fn tokens_of(body: &Value, chars_per_token: usize, anthropic: bool) -> usize {
    let chars: usize = ["messages", "system", "tools"]
        .iter()
        .filter(|key| !body[**key].is_null())
        .map(|key| {
            super::vision::without_media_data(&body[*key])
                .to_string()
                .len()
        })
        .sum();
    chars / chars_per_token + super::vision::media_tokens(&body["messages"], anthropic)
}

/// The provider's refusal of the request `(path, body)` when it is longer than `window`
/// tokens (see [`Reply::Tokenized`]).
fn refusal(
    (path, body): &(String, Value),
    window: usize,
    chars_per_token: usize,
) -> Option<Response> {
    let tokens = tokens_of(body, chars_per_token, path.ends_with("/messages"));
    if path.ends_with("/messages") {
        if let Some(message) = super::model_api::messages::length_refusal(body, tokens, window) {
            let refusal = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": message}});
            return Some((StatusCode::BAD_REQUEST, axum::Json(refusal)).into_response());
        }
    } else if tokens > window {
        let model = body["model"].as_str().unwrap_or_default();
        let refusal = match model {
            // Gemini's OpenAI-compatible endpoint: its own sentence, in a list of one error.
            _ if model.starts_with("gemini") => json!([{"error": {"code": 400,
                "message": format!("The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window})."),
                "status": "INVALID_ARGUMENT"}}]),
            // Mistral's platform: its own sentence, the error object the answer.
            _ if model.starts_with("mistral") => json!({"object": "error",
                "message": format!("Prompt contains {tokens} tokens, too large for model with {window} maximum context length"),
                "type": "invalid_request_error", "param": null, "code": null}),
            // vLLM before its errors were nested: the error object is the answer.
            _ if model.starts_with("vllm") => json!({"object": "error",
                "message": format!("This model's maximum context length is {window} tokens. However, you requested {} tokens ({tokens} in the messages, 16 in the completion). Please reduce the length of the messages or completion.", tokens + 16),
                "type": "BadRequestError", "param": null, "code": 400}),
            _ => json!({"error": {
                "message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."),
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        };
        return Some((StatusCode::BAD_REQUEST, axum::Json(refusal)).into_response());
    }
    None
}

fn openai_completion(text: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}
