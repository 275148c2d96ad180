//! The compactd daemon as a library: the sessions service (append, check, compact, the
//! proxy's placement of calls), the socket server and the proxy's HTTP side, the
//! configuration and its hot reload, and [`run`], which is `compactd serve`.
//!
//! The layers under it are crates of the workspace (ARCHITECTURE.md), used here under short
//! names: the engine (`compactd-core`: `message`, `compaction`), the formats
//! (`compactd-formats`: `provider`, `fnv`, `json_shape`), the summarizers
//! (`compactd-summarize`), the store (`compactd-store`: `store`, `blocking`) and the socket
//! API (`compactd-api`: `protocol`, `paths`). This crate's modules, lowest first; each uses
//! only the ones above it:
//!
//! - [`compaction_run`]: one compaction end to end (plan, summarize in chunks, redact,
//!   result), shared by the daemon, `compactd summarize` and replay.
//! - `service`: append, check, compact: per-session locks, the breaker, events; `views`
//!   turns the store's rows into the API's answers.
//! - `server`: HTTP over the Unix socket: accept loop, peer-uid check, routes, errors, SSE,
//!   the proxy's HTTP side, the OpenAPI document.
//! - `daemon` ([`run`]) runs it all, `config_watch` reloads [`config`], `database_lock` keeps
//!   a second daemon off its database.
//!
//! What the crate offers is at its root: running the daemon, its configuration, and the
//! [`Service`] that the replay and the tests drive in-process.

#![warn(unreachable_pub)]
// The crate is read with `cargo doc --document-private-items`, where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod compaction_run;
pub mod config;
pub(crate) mod config_watch;
mod daemon;
pub(crate) mod database_lock;
pub(crate) mod server;
pub(crate) mod service;

pub(crate) use compactd_api as protocol;
pub(crate) use compactd_api::paths;
pub(crate) use compactd_core::{compaction, message};
pub(crate) use compactd_formats::{fnv, json_shape, provider};
pub(crate) use compactd_store as store;
pub(crate) use compactd_store::blocking;
pub(crate) use compactd_summarize as summarize;

pub use config::Config;
pub use daemon::{DaemonOptions, Listeners, init_logging, run, shutdown_signal};
pub use server::SHUTDOWN_GRACE;
pub use server::openapi::{document as openapi_document, pretty as openapi_pretty};
pub use service::fingerprint::fingerprint;
pub use service::proxy::{Caller, Identity};
pub use service::{CreateSession, HistoryRequest, Service};
