//! The API's wire types, in one place: what clients send ([`requests`]), what the daemon
//! answers ([`responses`]), what it announces ([`events`]) and how it refuses ([`ErrorCode`]).
//! The server, the CLI's client, bench, torture and the tests all use these; the OpenAPI
//! document (`server::openapi`, `GET /v1/openapi.json`, `docs/openapi.json`) is generated from them.
//!
//! A stored message is the engine's [`StoredMessage`] (one definition for the store and the
//! API); compactions, failures and maskings have API types of their own ([`history`]).

mod errors;
pub mod events;
pub mod history;
pub mod requests;
pub mod responses;

pub use crate::compaction::{CompactionResult, Trigger};
pub use crate::message::{Message, Part, Role};
pub use compactd_core::{
    InvalidSessionId, MAX_REPORTED_TOKENS, SessionId, SessionKind, StoredMessage, TokenSource,
    reported_tokens,
};
pub use errors::{ApiCode, ErrorCode};
pub use events::Event;
pub use history::{Compaction, CompactionFailure, Masking};
pub use requests::*;
pub use responses::*;

/// The current API version's path prefix.
pub const API_PREFIX: &str = "/v1";
