//! The `compactd` command line: parses arguments and calls into the library.

use anyhow::Result;
use clap::{Parser, Subcommand};
use compactd::cli::offline::{self, OfflineInput};
use compactd::compaction::CompactionConfig;
use std::path::PathBuf;
use std::process::ExitCode;

/// compactd keeps long-running LLM agent sessions inside their context window.
#[derive(Parser)]
#[command(name = "compactd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (socket activation aware; logs to stderr, level from COMPACTD_LOG).
    Serve {
        /// Socket path [default: $XDG_RUNTIME_DIR/compactd/compactd.sock]
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Database path [default: $XDG_DATA_HOME/compactd/compactd.db]
        #[arg(long)]
        db: Option<PathBuf>,
        /// Config file [default: $XDG_CONFIG_HOME/compactd/config.toml]
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show what compaction would do to a file of messages (offline, JSON).
    Plan {
        #[command(flatten)]
        input: InputArgs,
        /// Instructions for the summary, as for a manual compaction.
        #[arg(long)]
        focus: Option<String>,
    },
    /// Compact a file of messages with the extractive summarizer (offline, JSON).
    Summarize {
        #[command(flatten)]
        input: InputArgs,
    },
}

#[derive(clap::Args)]
struct InputArgs {
    /// A JSON array of messages, or {"messages": [...]}.
    #[arg(long)]
    input: PathBuf,
    /// The model's context limit in tokens.
    #[arg(long, default_value_t = 128_000)]
    context_limit: usize,
    /// A file holding the previous compaction's summary.
    #[arg(long)]
    prior_summary: Option<PathBuf>,
}

impl InputArgs {
    fn load(&self, focus: Option<String>) -> Result<OfflineInput> {
        OfflineInput::load(
            &self.input,
            self.prior_summary.as_deref(),
            focus,
            self.context_limit,
            CompactionConfig::default(),
        )
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve { socket, db, config } => {
            init_logging();
            let options = compactd::daemon::DaemonOptions { socket, db, config };
            compactd::daemon::run(options, compactd::daemon::shutdown_signal()).await?;
        }
        Command::Plan { input, focus } => {
            let input = input.load(focus)?;
            println!("{}", serde_json::to_string_pretty(&offline::plan(&input))?);
        }
        Command::Summarize { input } => {
            let input = input.load(None)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&offline::summarize(&input).await?)?
            );
        }
    }
    Ok(())
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("COMPACTD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
