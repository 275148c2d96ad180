//! compactd's socket API as its clients see it: the wire types, in one place (what clients
//! send, [`requests`]; what the daemon answers, [`responses`]; what it announces, [`events`];
//! how it refuses, [`ErrorCode`]), a typed [`client`] of it, and the default [`paths`] of the
//! socket, the database and the config. The daemon, the CLI, bench, torture and the tests
//! all use these; the OpenAPI document (`GET /v1/openapi.json`, `docs/openapi.json`) is
//! generated from them. No SQL, no server: a plugin author can depend on this crate alone.
//!
//! A stored message is the engine's [`StoredMessage`] (one definition for the store and the
//! API); compactions, failures and maskings have API types of their own ([`history`]).

pub mod client;
mod errors;
pub mod events;
pub mod history;
pub mod paths;
pub mod requests;
pub mod responses;

pub use compactd_core::compaction::{CompactionResult, Trigger};
pub use compactd_core::message::{Message, Part, Role};
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
