//! The CLI: its grammar ([`args`]), running it ([`run`]), the commands that talk to a daemon
//! ([`remote`]), offline ones ([`offline`], [`transcripts`]) and printing ([`render`]). As
//! library code so tests can call it; `main.rs` only parses and exits.

pub mod args;
pub mod offline;
pub mod remote;
pub mod render;
pub mod run;
pub mod transcripts;

/// Reads a file for a command, naming the file in the error.
pub fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}
