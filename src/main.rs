//! The `compactd` command line: parses arguments and runs them (`compactd::cli`).

use clap::Parser;
use compactd::cli::args::Cli;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    // SIGPIPE stays ignored (Rust's default): the CLI's output ends quietly on a closed pipe
    // by itself (`cli::write_stdout`), and a socket the daemon closes is an error, not death.
    let cli = Cli::parse();
    match compactd::cli::run::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactd: {e:#}");
            ExitCode::from(compactd::cli::run::exit_code(&e))
        }
    }
}
