//! The `compactd` command line: parses arguments and calls into the library.

use anyhow::Result;
use clap::{Parser, Subcommand};
use compactd::cli::offline::{self, OfflineInput};
use compactd::cli::remote::{self, Output};
use compactd::client::Client;
use compactd::config::Config;
use compactd::protocol::SessionId;
use compactd::transcript::Format;
use std::path::PathBuf;
use std::process::ExitCode;

/// compactd keeps long-running LLM agent sessions inside their context window.
#[derive(Parser)]
#[command(name = "compactd", version, about)]
struct Cli {
    /// The daemon's socket [default: $XDG_RUNTIME_DIR/compactd/compactd.sock]
    #[arg(long, global = true, env = "COMPACTD_SOCKET")]
    socket: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (socket-activation aware; logs to stderr, level from COMPACTD_LOG).
    Serve {
        /// Database path [default: $XDG_DATA_HOME/compactd/compactd.db]
        #[arg(long)]
        db: Option<PathBuf>,
        /// Config file [default: $XDG_CONFIG_HOME/compactd/config.toml]
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show whether the daemon runs, and how.
    Status,
    /// List, show, create or delete sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Append a message: JSON on stdin (one message or a list), or --role and --text.
    Append {
        session: SessionId,
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        text: Option<String>,
        /// Wait for a compaction this append triggers.
        #[arg(long)]
        wait: bool,
    },
    /// Print what the agent would send to its model now.
    Context { session: SessionId },
    /// Compact a session now (the spec's manual /compact).
    Compact {
        session: SessionId,
        /// What the summary should focus on.
        #[arg(long)]
        focus: Option<String>,
    },
    /// The session's compactions (and failed attempts).
    History { session: SessionId },
    /// Follow the daemon's events.
    Events,
    /// Configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Load an agent transcript into the daemon (Claude Code, OpenAI, mini-swe-agent, SWE-agent).
    Import {
        file: PathBuf,
        /// Session id [default: the transcript's own, else the file name]
        #[arg(long)]
        session: Option<SessionId>,
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[arg(long)]
        context_limit: Option<usize>,
    },
    /// Replay transcripts through an in-process daemon and report what compaction keeps and saves.
    Replay {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[arg(long, default_value_t = 128_000)]
        context_limit: usize,
        /// A config file (e.g. to replay with a model summarizer) [default: built-in defaults]
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Measure throughput, latency, scaling and memory on this machine.
    Bench {
        /// A shorter run (under a minute); the full run gives steadier figures.
        #[arg(long)]
        quick: bool,
        /// Durability to measure at: full (the default) or normal.
        #[arg(long, value_enum, default_value = "full")]
        synchronous: compactd::config::Synchronous,
    },
    /// Abuse a real daemon (kill -9 cycles under appends, hostile requests, slow clients) and
    /// check every promise; exits non-zero if one broke.
    Torture {
        /// How long to run, in seconds (CI runs 60).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Print the API's OpenAPI 3.1 document (docs/openapi.json is this output).
    Openapi,
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

#[derive(Subcommand)]
enum SessionCommand {
    List,
    Show {
        id: SessionId,
    },
    Create {
        #[arg(long)]
        id: Option<SessionId>,
        #[arg(long)]
        context_limit: Option<usize>,
        #[arg(long)]
        model: Option<String>,
    },
    Delete {
        id: SessionId,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (the file's values over the defaults), as TOML.
    Show {
        #[arg(long)]
        config: Option<PathBuf>,
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
            Default::default(),
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
    let socket = cli.socket.clone();
    let client = || {
        Client::new(
            socket
                .clone()
                .unwrap_or_else(compactd::paths::default_socket),
        )
    };
    let out = Output { json: cli.json };
    match cli.command {
        Command::Serve { db, config } => {
            init_logging();
            let options = compactd::daemon::DaemonOptions { socket, db, config };
            compactd::daemon::run(options, compactd::daemon::shutdown_signal()).await?;
        }
        Command::Status => remote::status(&client(), out).await?,
        Command::Session(SessionCommand::List) => remote::session_list(&client(), out).await?,
        Command::Session(SessionCommand::Show { id }) => {
            remote::session_show(&client(), &id, out).await?
        }
        Command::Session(SessionCommand::Create {
            id,
            context_limit,
            model,
        }) => remote::session_create(&client(), id, context_limit, model, out).await?,
        Command::Session(SessionCommand::Delete { id }) => {
            remote::session_delete(&client(), &id, out).await?
        }
        Command::Append {
            session,
            role,
            text,
            wait,
        } => remote::append(&client(), &session, role, text, wait, out).await?,
        Command::Context { session } => remote::context(&client(), &session, out).await?,
        Command::Compact { session, focus } => {
            remote::compact(&client(), &session, focus, out).await?
        }
        Command::History { session } => remote::history(&client(), &session, out).await?,
        Command::Events => remote::events(&client(), out).await?,
        Command::Config(ConfigCommand::Show { config }) => {
            let path = config.unwrap_or_else(compactd::paths::default_config);
            let effective = Config::load(&path)?;
            println!("# effective configuration ({})", path.display());
            print!("{}", toml::to_string_pretty(&effective)?);
        }
        Command::Import {
            file,
            session,
            format,
            context_limit,
        } => {
            compactd::cli::transcripts::import(
                &client(),
                &file,
                session,
                format,
                context_limit,
                out,
            )
            .await?
        }
        Command::Replay {
            files,
            format,
            context_limit,
            config,
        } => {
            compactd::cli::transcripts::replay_files(
                &files,
                format,
                context_limit,
                config.as_deref(),
                out,
            )
            .await?
        }
        Command::Bench { quick, synchronous } => {
            let report = compactd::bench::run(quick, synchronous, |what| {
                if !out.json {
                    eprintln!("measuring {what}…");
                }
            })
            .await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", compactd::bench::render(&report));
            }
        }
        Command::Torture { seconds } => {
            let report = compactd::torture::run(std::time::Duration::from_secs(seconds), |what| {
                if !out.json {
                    eprintln!("torture: {what}…");
                }
            })
            .await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", compactd::torture::render(&report));
            }
            let failures = report.failures();
            if !failures.is_empty() {
                anyhow::bail!(
                    "{} promises broken: {}",
                    failures.len(),
                    failures.join("; ")
                );
            }
        }
        Command::Openapi => print!("{}", compactd::protocol::openapi::pretty()),
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
