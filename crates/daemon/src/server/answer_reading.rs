//! An upstream's answer read as it passes to the client, for what it is for
//! ([`Then`]): a proxied call's answer recorded in its session before the client sees its
//! end; an unrecorded call's usage taught to its conversation. What it holds is bounded
//! (`[proxy] max_recorded_bytes` a text, the rest given up) and charged to the request budget.

use crate::protocol::SessionId;
use crate::provider::bounded_json::BoundedJson;
use crate::provider::wire::Wire;
use crate::service::memory::Charge;
use crate::service::{Service, ServiceError};
use crate::store::ContextVersion;
use axum::body::Bytes;
use futures_util::{Stream, StreamExt};
use std::sync::Arc;

/// An answer in `wire`'s shape (`streamed` or whole) to be read as it passes, for `then`.
pub(super) fn recording(
    service: &Arc<Service>,
    then: Then,
    wire: Wire,
    streamed: bool,
) -> Recording {
    let max_bytes = service.settings().config.proxy.max_recorded_bytes;
    Recording {
        service: service.clone(),
        then,
        recorder: match streamed {
            true => Captured::Stream(Box::new(wire.recorder(max_bytes))),
            false => Captured::Whole(BoundedJson::new(max_bytes)),
        },
        wire,
        max_bytes,
        charge: None,
    }
}

/// An answer being recorded as it passes, what it holds charged to the request budget.
pub(super) struct Recording {
    service: Arc<Service>,
    then: Then,
    recorder: Captured,
    wire: Wire,
    max_bytes: usize,
    charge: Option<Charge>,
}

/// What an answer read as it passes is for.
pub(super) enum Then {
    /// Recorded in session `id` after message `after_seq`, its usage counting the context
    /// `sent` while the session still serves it.
    Record {
        id: SessionId,
        after_seq: u64,
        sent: ContextVersion,
    },
    /// An unrecorded call's: its usage teaches the conversation (`key`) the rate the model
    /// counts compactd's estimate at, against the estimate of what was sent.
    Learn { key: String, sent_tokens: usize },
}

enum Captured {
    Stream(Box<crate::provider::wire::Recorder>),
    /// A whole JSON answer, its strings bounded as they pass.
    Whole(BoundedJson),
    /// Given up: the budget had no room, or the answer holds more than its bound. Nothing
    /// is recorded (the client's next call carries the answer).
    Abandoned,
}

/// A recording's charge grows in steps of this many bytes.
const RECORDING_STEP: usize = 256 * 1024;

impl Recording {
    fn feed(&mut self, chunk: &[u8]) {
        let held = match &mut self.recorder {
            Captured::Stream(recorder) => {
                recorder.feed(chunk);
                recorder.held()
            }
            Captured::Whole(capture) => {
                capture.feed(chunk);
                capture.held()
            }
            Captured::Abandoned => return,
        };
        if held > 3 * self.max_bytes + RECORDING_STEP {
            return self.abandon("it holds more than its bound");
        }
        let charged = self.charge.as_ref().map_or(0, Charge::bytes);
        if held <= charged {
            return;
        }
        let budget = &self.service.memory().requests;
        let more = held - charged + RECORDING_STEP;
        let room = match self.charge.as_mut() {
            Some(charge) => budget.try_extend(charge, more),
            None => {
                self.charge = budget.try_take(more);
                self.charge.is_some()
            }
        };
        if !room {
            self.abandon("the memory budget is spent");
        }
    }

    fn abandon(&mut self, why: &str) {
        match &self.then {
            Then::Record { id, .. } => {
                tracing::warn!(session = %id, reason = why, "not recording an upstream answer; the client's next call carries it")
            }
            Then::Learn { key, .. } => {
                tracing::debug!(conversation = %key, reason = why, "not reading an unrecorded answer's usage")
            }
        }
        self.recorder = Captured::Abandoned;
        self.charge = None;
    }

    async fn finish(self) {
        let reply = match self.recorder {
            Captured::Stream(recorder) => recorder.finish(),
            Captured::Whole(capture) => capture.finish().and_then(|(bytes, dropped)| {
                let mut reply = self.wire.reply(&bytes)?;
                reply.unrecorded_chars = dropped;
                Some(reply)
            }),
            Captured::Abandoned => None,
        };
        let Some(reply) = reply else { return };
        let (id, after_seq, sent) = match self.then {
            Then::Record {
                id,
                after_seq,
                sent,
            } => (id, after_seq, sent),
            Then::Learn { key, sent_tokens } => {
                return self.service.unrecorded_usage(&key, sent_tokens, &reply);
            }
        };
        match self.service.proxy_reply(&id, after_seq, sent, reply).await {
            Ok(()) => {}
            // The store says a full disk, a file gone or a database locked from outside once;
            // the client's next call, which carries this answer, records it once writes go on.
            Err(ServiceError::Store(e)) if e.leaves_a_call_unrecorded() => {
                tracing::debug!(session = %id, error = %e, "proxied answer not recorded");
            }
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "could not record a proxied answer")
            }
        }
    }
}

/// The upstream's body, passed through chunk by chunk (nothing held but what the recording
/// keeps, within its bound); at its end the answer is recorded before the client sees the end.
pub(super) fn passed_on(
    upstream: impl Stream<Item = reqwest::Result<Bytes>> + Send + Unpin + 'static,
    recording: Option<Recording>,
) -> impl Stream<Item = Result<Bytes, reqwest::Error>> + Send {
    futures_util::stream::unfold(
        (upstream, recording),
        |(mut upstream, mut recording)| async move {
            match upstream.next().await {
                Some(Ok(chunk)) => {
                    if let Some(r) = recording.as_mut() {
                        r.feed(&chunk);
                    }
                    Some((Ok(chunk), (upstream, recording)))
                }
                Some(Err(e)) => Some((Err(e), (upstream, None))),
                None => {
                    if let Some(r) = recording.take() {
                        r.finish().await;
                    }
                    None
                }
            }
        },
    )
}
