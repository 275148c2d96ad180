//! compactd keeps long-running LLM agent sessions inside their context window.
//!
//! The library holds everything; `main.rs` only parses arguments. Start reading at
//! [`compaction`] (the pure engine that implements SPEC.md), then [`compactor`] (one compaction
//! end to end), then the daemon layers.

pub mod bench;
pub mod cli;
pub mod client;
pub mod compaction;
pub mod compactor;
pub mod config;
pub mod config_watch;
pub mod daemon;
pub mod daemon_process;
pub mod message;
pub mod paths;
pub mod protocol;
pub mod provider;
pub mod replay;
pub mod server;
pub mod service;
pub mod store;
pub mod summarize;
pub mod synthetic;
pub mod torture;
pub mod transcript;
