//! What the store keeps and the socket API shows alike: a message with its place in the
//! session, how a session came to be, and where its token figure comes from. Plain data, so
//! the store and the API crate share one definition instead of converting between copies.

use crate::message::{Message, Part, Role};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A stored message. `parts` stays raw JSON so serving history never re-encodes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StoredMessage {
    pub seq: u64,
    pub role: Role,
    #[cfg_attr(feature = "schema", schema(value_type = Vec<Part>))]
    pub parts: Box<RawValue>,
    pub tokens: usize,
    pub created_at: String,
    /// A system message or the session's task: never compacted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// Its tool outputs read as placeholders here (microcompaction); the stored message keeps
    /// them whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub masked: bool,
    /// Too large for the context, it is shown shortened here (long outputs keep their head and
    /// tail, with a marker naming this seq); the stored message keeps them whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shortened: bool,
    /// Where its branch starts, when the message before it on its branch is not `seq - 1`
    /// (0: it starts a new root). Set in history pages only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches_from: Option<u64>,
}

impl StoredMessage {
    /// A message of a proxied call the store could not take, as a context computed in memory
    /// holds it (the proxy's unrecorded mode): numbered `seq` after every stored message, never
    /// pinned, `created_at` empty (it was never stored).
    pub fn unrecorded(
        seq: u64,
        message: &Message,
        tokens: usize,
    ) -> serde_json::Result<StoredMessage> {
        Ok(StoredMessage {
            seq,
            role: message.role,
            parts: serde_json::value::to_raw_value(&message.parts)?,
            tokens,
            created_at: String::new(),
            pinned: false,
            masked: false,
            shortened: false,
            branches_from: None,
        })
    }

    /// The message as the engine sees it.
    pub fn to_message(&self) -> serde_json::Result<Message> {
        let parts: Vec<Part> = serde_json::from_str(self.parts.get())?;
        Ok(Message {
            role: self.role,
            parts,
        })
    }
}

/// How a session came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SessionKind {
    /// Made through the socket API.
    Api,
    /// A conversation the proxy records.
    Proxy,
    /// A proxied client's one-off calls (titles, commit messages).
    Side,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Api => "api",
            SessionKind::Proxy => "proxy",
            SessionKind::Side => "side",
        }
    }

    /// The kind stored as `s` (written by [`SessionKind::as_str`]); an unknown one reads as
    /// made through the API.
    pub fn parse(s: &str) -> SessionKind {
        match s {
            "proxy" => SessionKind::Proxy,
            "side" => SessionKind::Side,
            _ => SessionKind::Api,
        }
    }
}

/// Where a session's token figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TokenSource {
    /// The LazyEstimator over the pinned messages, the summary and the active messages.
    Estimated,
    /// The agent's reported `usage.input_tokens` plus estimates of what came after.
    Reported,
}
