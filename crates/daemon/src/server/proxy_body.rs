//! A proxied call's body as the proxy reads it: every field parsed but the conversation,
//! which stays the client's text until its messages are read one at a time
//! ([`crate::provider::wire::Native`]). An agent resends its whole history with every call;
//! parsed whole, each of its JSON objects would cost hundreds of bytes for as long as the
//! call lasts.

use super::error::ApiError;
use super::extract::json_text;
use super::offload::SLOTS;
use crate::provider::wire::{UnreadableRequest, Wire, WireRequest, split};
use axum::body::Bytes;
use serde_json::Value;
use std::ops::Range;

pub(super) struct ProxyBody {
    wire: Wire,
    /// The body as the client sent it.
    bytes: Bytes,
    /// Its fields but the conversation.
    pub(super) fields: Value,
    /// Where the conversation's JSON lies in `bytes`, if the body has one.
    conversation: Option<Range<usize>>,
}

impl ProxyBody {
    /// Reads the body of a call in `wire`'s API (off the workers if it is large); an empty
    /// body reads as `{}`.
    pub(super) async fn read(wire: Wire, bytes: Bytes) -> Result<ProxyBody, ApiError> {
        SLOTS
            .run(bytes.len(), move || {
                let (fields, conversation) = split(json_text(&bytes), wire.conversation_field())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
                Ok(ProxyBody {
                    wire,
                    bytes,
                    fields,
                    conversation,
                })
            })
            .await?
    }

    /// No body (a `GET`).
    pub(super) fn none(wire: Wire) -> ProxyBody {
        ProxyBody {
            wire,
            bytes: Bytes::new(),
            fields: Value::Null,
            conversation: None,
        }
    }

    /// The body's size in bytes.
    pub(super) fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The body as the client sent it.
    pub(super) fn sent(&self) -> Vec<u8> {
        self.bytes.to_vec()
    }

    /// Reads the conversation (on the calling thread: run it in a slot); gives back the
    /// request and the body's other fields. The client's bytes are dropped.
    pub(super) fn parse(self) -> Result<(WireRequest, Value), UnreadableRequest> {
        // Read as JSON by `split` already; the body is UTF-8 (`Utf8Body`).
        let conversation = self
            .conversation
            .map(|range| std::str::from_utf8(&self.bytes[range]))
            .transpose()
            .map_err(|e| UnreadableRequest(e.to_string()))?;
        let request = self.wire.parse(&self.fields, conversation)?;
        Ok((request, self.fields))
    }
}
