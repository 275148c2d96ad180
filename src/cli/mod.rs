//! The CLI: its grammar ([`args`]), running it ([`run`]), the commands that talk to a daemon
//! ([`remote`]), offline ones ([`offline`], [`transcripts`]) and printing ([`render`]).
//! `main.rs` only parses and exits.

/// `print!` for the CLI's output: a reader that goes away (`compactd ... | head`) ends the
/// command quietly. SIGPIPE stays ignored, so a daemon that closes its socket mid-request
/// (killed, restarting, refusing at its connection limit) is an error the client handles, not a
/// signal that kills it.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::write_stdout(format_args!($($arg)*)) };
}

/// `println!` for the CLI's output; see [`out!`].
macro_rules! outln {
    () => { $crate::cli::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

pub mod args;
pub mod backup;
pub mod mcp;
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

/// Writes to standard output; exits quietly when the reader has gone away.
pub fn write_stdout(text: std::fmt::Arguments) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(text)
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}
