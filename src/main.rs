//! The `compactd` command line: parses arguments and runs them (`compactd::cli`).

use clap::Parser;
use compactd::cli::args::{Cli, Command};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        // `compactd ... | head`: end quietly when the reader goes away, as other CLIs do,
        // instead of failing on the closed pipe. The daemon keeps ignoring SIGPIPE.
        // SAFETY: restoring a signal's default disposition at start, before any threads use it.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match compactd::cli::run::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactd: {e:#}");
            ExitCode::from(compactd::cli::run::exit_code(&e))
        }
    }
}
