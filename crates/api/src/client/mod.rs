//! A small HTTP/1.1 client over the daemon's Unix socket, for the CLI (and tests): one
//! connection per request, JSON in and out, API errors turned into [`ClientError::Api`].
//! This file is the transport (raw and JSON calls); [`api`] has one typed method per
//! endpoint, and [`events`] the event stream.

mod api;
mod events;

pub use events::EventStream;

use crate::ApiCode;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokio::net::UnixStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no compactd is answering on {socket} ({reason}); start one with `compactd serve` or `systemctl --user start compactd.socket`"
    )]
    NotRunning { socket: PathBuf, reason: String },
    #[error("{message} (HTTP {status}, {code})")]
    Api {
        status: u16,
        code: ApiCode,
        message: String,
    },
    #[error("talking to compactd on {socket}: {reason}")]
    Transport { socket: PathBuf, reason: String },
}

/// How long [`Client::append`] keeps retrying an append the daemon did not answer.
pub const APPEND_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// A key no other append of this user uses: pid, time and a counter.
fn idempotency_key() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("cli-{}-{nanos:x}-{n}", std::process::id())
}

/// A client of the daemon at one socket path.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

/// A raw answer: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        Client {
            socket: socket.into(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn connect(
        &self,
    ) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|e| ClientError::NotRunning {
                    socket: self.socket.clone(),
                    reason: e.to_string(),
                })?;
        // Whoever made the socket could read every message we send: it must be our own user's
        // daemon (another local user can create a socket in a shared directory first).
        let own = crate::paths::current_uid();
        match stream.peer_cred().map(|c| c.uid()) {
            Ok(uid) if uid == own => {}
            Ok(uid) => {
                return Err(ClientError::Transport {
                    socket: self.socket.clone(),
                    reason: format!(
                        "the process listening there runs as uid {uid}, not as you (uid {own}); refusing to send it anything"
                    ),
                });
            }
            Err(e) => return Err(self.transport(e)),
        }
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport(e))?;
        tokio::spawn(connection);
        Ok(sender)
    }

    fn transport(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Transport {
            socket: self.socket.clone(),
            reason: e.to_string(),
        }
    }

    /// Sends a request on a fresh connection and returns the response head with its
    /// streaming body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        self.keep_alive().await?.send(method, path, body).await
    }

    /// A connection that stays open for many requests, one after another.
    pub async fn keep_alive(&self) -> Result<Connection, ClientError> {
        Ok(Connection {
            sender: self.connect().await?,
            client: self.clone(),
        })
    }

    /// Sends a request and reads the whole answer, whatever its status.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Answer, ClientError> {
        self.keep_alive().await?.raw(method, path, body).await
    }

    /// Sends JSON (or nothing) and returns the JSON answer; an error status becomes `Api`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        self.call_with(method, path, &[], body).await
    }

    /// [`Client::call`] with extra headers.
    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let answer = self
            .keep_alive()
            .await?
            .raw_with(method, path, headers, bytes)
            .await?;
        let json = answer.json();
        if answer.status.is_success() {
            return Ok(json);
        }
        let error = &json["error"];
        Err(ClientError::Api {
            status: answer.status.as_u16(),
            code: ApiCode::parse(error["code"].as_str().unwrap_or("unknown")),
            message: error["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&answer.body).into_owned()),
        })
    }

    /// Appends `body` (a message, an array, or `{"messages": [...]}`) to session `id` at most
    /// once, however the connection fails: the request carries a fresh `Idempotency-Key`, and
    /// a failure before an answer (the daemon restarting, a dropped connection, a busy
    /// database) is retried with the same key for up to [`APPEND_RETRY_FOR`], so an append
    /// the daemon committed but could not acknowledge is not stored twice.
    pub async fn append_json(
        &self,
        id: &crate::SessionId,
        body: &Value,
    ) -> Result<Value, ClientError> {
        let key = idempotency_key();
        let path = format!("/v1/session/{id}/message");
        let headers = [("idempotency-key", key.as_str())];
        let deadline = tokio::time::Instant::now() + APPEND_RETRY_FOR;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let result = self
                .call_with(Method::POST, &path, &headers, Some(body))
                .await;
            let retry = match &result {
                // A socket file nobody answers on is a daemon restarting; no file at all is
                // one that is not running, and waiting would only delay the error.
                Err(ClientError::NotRunning { .. }) => self.socket.exists(),
                Err(ClientError::Transport { .. }) => true,
                Err(ClientError::Api { code, .. }) => code.is_transient(),
                Ok(_) => false,
            };
            if !retry || tokio::time::Instant::now() + pause > deadline {
                return result;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call(Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::DELETE, path, None).await
    }

    /// Subscribes to `GET /v1/events`. Once this returns, the daemon is sending this
    /// subscriber every event that happens.
    pub async fn events(&self) -> Result<EventStream, ClientError> {
        let response = self.send(Method::GET, "/v1/events", Bytes::new()).await?;
        if !response.status().is_success() {
            return Err(ClientError::Api {
                status: response.status().as_u16(),
                code: ApiCode::Unknown("events".into()),
                message: "cannot subscribe to events".into(),
            });
        }
        Ok(EventStream::new(response.into_body(), self.socket.clone()))
    }
}

/// One open HTTP/1.1 connection to the daemon.
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    client: Client,
}

impl Connection {
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        self.send_with(method, path, &[], body).await
    }

    /// Sends a request with extra headers (an `Idempotency-Key`, say).
    pub async fn send_with(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "compactd")
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| self.client.transport(e))?;
        self.sender
            .ready()
            .await
            .map_err(|e| self.client.transport(e))?;
        self.sender
            .send_request(request)
            .await
            .map_err(|e| self.client.transport(e))
    }

    /// Sends a request and reads the whole answer.
    pub async fn raw(
        &mut self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Answer, ClientError> {
        self.raw_with(method, path, &[], body).await
    }

    /// Sends a request with extra headers and reads the whole answer.
    pub async fn raw_with(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, ClientError> {
        let response = self.send_with(method, path, headers, body.into()).await?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.client.transport(e))?
            .to_bytes();
        Ok(Answer { status, body })
    }
}
