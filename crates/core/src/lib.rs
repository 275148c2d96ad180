//! compactd's engine, pure: SPEC.md as functions, with no I/O, clock or SQL, so every rule
//! of compaction can be tested (and replayed) without a daemon. The daemon, the summarizers,
//! the proxy and the measurements all decide through it.
//!
//! - [`message`]: messages and their parts, as stored and as the engine reads them.
//! - [`SessionId`]: a session's name, checked once where it enters; [`reported`]: the bounds
//!   a model's reported count is believed within; [`stored`]: a message with its place in
//!   the session, as the store keeps it and the socket API shows it.
//! - [`compaction`]: token estimates, triggers, the preserved tail and its pair rule, the
//!   current step's room, file tracking, the summary prompt, masking, secret redaction.
//!
//! This crate depends on no runtime, database or HTTP crate (the workspace's layering is
//! the crates' dependency graph); with the `schema` feature its API types derive their
//! OpenAPI schema for the socket API's document.

#![forbid(unsafe_code)]

pub mod compaction;
pub mod message;
pub mod reported;
pub mod session_id;
pub mod stored;

pub use reported::{MAX_REPORTED_TOKENS, Overflow, reported_tokens};
pub use session_id::{InvalidSessionId, SessionId};
pub use stored::{SessionKind, StoredMessage, TokenSource};
