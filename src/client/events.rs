//! `GET /v1/events` as a stream: server-sent events parsed into (kind, data) or typed
//! [`Event`]s.

use super::ClientError;
use crate::protocol::Event;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use std::path::PathBuf;

/// Server-sent events from the daemon.
pub struct EventStream {
    pub(super) body: Incoming,
    pub(super) buffer: String,
    pub(super) socket: PathBuf,
}

impl EventStream {
    /// The next event as (name, data); `None` when the daemon closed the stream.
    pub async fn next(&mut self) -> Option<Result<(String, Value), ClientError>> {
        let (mut name, mut data) = (String::new(), String::new());
        loop {
            while let Some(end) = self.buffer.find('\n') {
                let line: String = self.buffer.drain(..=end).collect();
                let line = line.trim_end_matches(['\r', '\n']);
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if line.is_empty() && !data.is_empty() {
                    let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                    return Some(Ok((name, value)));
                }
            }
            let frame = match self.body.frame().await? {
                Ok(frame) => frame,
                Err(e) => {
                    return Some(Err(ClientError::Transport {
                        socket: self.socket.clone(),
                        reason: e.to_string(),
                    }));
                }
            };
            if let Some(chunk) = frame.data_ref() {
                self.buffer.push_str(&String::from_utf8_lossy(chunk));
            }
        }
    }
}

impl EventStream {
    /// The next event, typed; `None` when the daemon closed the stream (it stopped).
    pub async fn next_event(&mut self) -> Option<Result<Event, ClientError>> {
        let (name, data) = match self.next().await? {
            Ok(item) => item,
            Err(e) => return Some(Err(e)),
        };
        Some(
            serde_json::from_value(data).map_err(|e| ClientError::Transport {
                socket: self.socket.clone(),
                reason: format!("event `{name}` did not parse: {e}"),
            }),
        )
    }
}
