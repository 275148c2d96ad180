//! The CLI's commands, as library functions so tests can call them. `main.rs` parses arguments
//! and calls these.

pub mod offline;
pub mod remote;
pub mod transcripts;

/// Reads a file for a command, naming the file in the error.
pub fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}
