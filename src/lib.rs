//! compactd keeps long-running LLM agent sessions inside their context window: agents append
//! every message over a Unix socket, and when a session nears its model's limit the older part
//! becomes one structured summary while a recent tail stays verbatim.
//!
//! The library holds everything; `main.rs` only parses arguments. Layers, lowest first; each
//! uses only the ones above it in this list:
//!
//! - [`message`]: messages and their parts, as stored and as the engine reads them.
//! - [`compaction`]: the engine, pure (no I/O, clock or SQL): SPEC.md as functions: token
//!   estimates, triggers, the preserved tail and its pair rule, file tracking, the prompt,
//!   masking, secret redaction.
//! - [`summarize`]: the `Summarizer` trait and its kinds: extractive (built in), OpenAI-compatible,
//!   Anthropic, an external command; retries, timeouts and key scrubbing for the HTTP ones.
//! - `compaction_run`: one compaction end to end (plan, summarize in chunks, redact, result), shared
//!   by the daemon, `compactd summarize` and replay.
//! - [`store`]: SQLite: one writer thread with group commit, a read pool, migrations; all SQL.
//! - [`protocol`]: the wire types (requests, responses, events, error codes), and [`provider`]:
//!   a context in OpenAI or Anthropic shape.
//! - [`service`]: append, check, compact: per-session locks, the breaker, events.
//! - [`server`]: HTTP over the Unix socket: accept loop, peer-uid check, routes, errors, SSE,
//!   the OpenAPI document. [`daemon`] runs it all (`compactd serve`), `config_watch` reloads
//!   [`config`].
//! - [`client`]: a typed client of the socket API; [`cli`]: the commands.
//! - [`transcript`]: converters from agents' session files.
//! - [`measure`]: what measures and stresses the daemon and is no part of it: `replay`,
//!   `bench`, `torture`, and the synthetic sessions and daemon processes they (and the tests)
//!   use.

pub mod cli;
pub mod client;
pub mod compaction;
pub(crate) mod compaction_run;
pub mod config;
pub(crate) mod config_watch;
pub mod daemon;
pub mod measure;
pub mod message;
pub(crate) mod paths;
pub mod protocol;
pub mod provider;
pub mod server;
pub mod service;
pub mod store;
pub mod summarize;
pub mod transcript;
