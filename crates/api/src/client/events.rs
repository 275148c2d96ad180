//! `GET /v1/events` as a stream: server-sent events, parsed by `eventsource-stream` (UTF-8
//! split across reads, multi-line `data:`, comments used as keep-alives), into (kind, data)
//! or typed [`Event`]s.

use super::ClientError;
use crate::Event;
use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyDataStream;
use hyper::body::Incoming;
use serde_json::Value;
use std::path::PathBuf;
use std::pin::Pin;

type Frames =
    Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, ClientError>> + Send + 'static>>;

/// Server-sent events from the daemon.
pub struct EventStream {
    frames: Frames,
    socket: PathBuf,
}

impl EventStream {
    pub(super) fn new(body: Incoming, socket: PathBuf) -> EventStream {
        EventStream::of_chunks(BodyDataStream::new(body), socket)
    }

    /// Events parsed from a stream of byte chunks, however the chunks cut them.
    fn of_chunks<S, B, E>(chunks: S, socket: PathBuf) -> EventStream
    where
        S: Stream<Item = Result<B, E>> + Send + 'static,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let on = socket.clone();
        let frames = chunks.eventsource().map(move |item| {
            item.map_err(|e| ClientError::Transport {
                socket: on.clone(),
                reason: e.to_string(),
            })
        });
        EventStream {
            frames: Box::pin(frames),
            socket,
        }
    }

    /// The next event as (name, data); `None` when the daemon closed the stream.
    pub async fn next(&mut self) -> Option<Result<(String, Value), ClientError>> {
        loop {
            let event = match self.frames.next().await? {
                Ok(event) => event,
                Err(e) => return Some(Err(e)),
            };
            if event.data.is_empty() {
                continue;
            }
            let value = serde_json::from_str(&event.data).unwrap_or(Value::String(event.data));
            return Some(Ok((event.event, value)));
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_cut_anywhere_arrive_whole() {
        let text = "event: note\ndata: {\"text\": \"caf\u{e9} \u{1f600}\"}\n\n: keep-alive\n\nevent: lines\ndata: one\ndata: two\n\n";
        let bytes = text.as_bytes();
        // Every split point, including inside the multibyte characters.
        for cut in 1..bytes.len() {
            let chunks = vec![
                Ok::<_, std::convert::Infallible>(bytes[..cut].to_vec()),
                Ok(bytes[cut..].to_vec()),
            ];
            let mut stream = EventStream::of_chunks(futures_util::stream::iter(chunks), "s".into());
            let (name, data) = stream.next().await.unwrap().unwrap();
            assert_eq!(name, "note");
            assert_eq!(data["text"], "caf\u{e9} \u{1f600}", "cut at {cut}");
            let (name, data) = stream.next().await.unwrap().unwrap();
            assert_eq!(
                (name.as_str(), data),
                ("lines", Value::String("one\ntwo".into()))
            );
            assert!(stream.next().await.is_none());
        }
    }
}
