//! The command line's grammar (clap), in the library so `completions` and `man` can render it.

// The help texts name config sections as they are written, in brackets (`[store] path`).
#![allow(rustdoc::broken_intra_doc_links)]

use crate::message::Role;
use crate::protocol::{ContextFormat, SessionId};
use crate::transcript::Format;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// compactd keeps long-running LLM agent sessions inside their context window.
///
/// Run `compactd serve` (or the systemd user service) once; agents append their messages to
/// it over a Unix socket and ask it for their context before every model call. The other
/// commands talk to the running daemon, or (plan, summarize, replay) work offline.
///
/// Exit codes: 0 success; 1 the command failed (the daemon refused, a file is unreadable, a
/// torture promise broke); 2 bad usage; 3 no daemon answers on the socket.
#[derive(Parser)]
#[command(name = "compactd", version, about, long_about)]
pub struct Cli {
    /// The daemon's socket [default: $XDG_RUNTIME_DIR/compactd/compactd.sock, else
    /// $TMPDIR/compactd-$UID/compactd.sock]
    #[arg(long, global = true, env = "COMPACTD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print JSON (the daemon's answer as is) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon (socket-activation aware; logs to stderr, level from COMPACTD_LOG).
    Serve {
        /// Database path [default: $XDG_DATA_HOME/compactd/compactd.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// Config file [default: $XDG_CONFIG_HOME/compactd/config.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Show whether the daemon runs: version, socket, database, config, summarizer, sessions.
    Status,
    /// List, show, create, change or delete sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Append a message: JSON on stdin (one message or a list), or --role and --text.
    Append {
        /// The session (created with the defaults if new).
        session: SessionId,
        /// Who wrote the message.
        #[arg(long, value_enum, requires = "text")]
        role: Option<CliRole>,
        /// The message's text.
        #[arg(long, requires = "role")]
        text: Option<String>,
        /// Wait for a compaction this append triggers to finish.
        #[arg(long)]
        wait: bool,
    },
    /// Print the session's stored messages, whole (the history; nothing is ever deleted).
    Messages {
        /// The session.
        session: SessionId,
        /// Messages after this seq.
        #[arg(long, default_value_t = 0, value_name = "SEQ")]
        after: u64,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: usize,
    },
    /// Search the session's whole history (compacted and masked messages included).
    Search {
        /// The session.
        session: SessionId,
        /// Plain words; a message holding them as a phrase ranks first.
        #[arg(required = true, num_args = 1..)]
        words: Vec<String>,
        /// At most this many results (1 to 100).
        #[arg(long, default_value_t = 10, value_name = "N")]
        limit: usize,
    },
    /// Print messages whole by seq: `show SESSION 412` or `show SESSION 410..415`.
    Show {
        /// The session.
        session: SessionId,
        /// A seq, or a range FROM..TO (both included, at most 1,000 messages).
        seqs: SeqRange,
    },
    /// Serve the Model Context Protocol on stdin/stdout: tools an agent recalls its history with
    /// (`claude mcp add compactd -- compactd mcp`).
    Mcp {
        /// The session the tools read when a call names none.
        #[arg(long, env = "COMPACTD_SESSION")]
        session: Option<SessionId>,
    },
    /// Print what the agent would send to its model now (pinned messages, summary, tail).
    Context {
        /// The session.
        session: SessionId,
        /// Print every message whole instead of a one-line preview.
        #[arg(long)]
        full: bool,
        /// Print it ready to send: as OpenAI Chat Completions or Anthropic Messages JSON.
        #[arg(long, value_enum, default_value = "compactd")]
        format: CliFormat,
    },
    /// Compact a session now (the spec's manual /compact).
    Compact {
        /// The session.
        session: SessionId,
        /// What the summary should focus on.
        #[arg(long)]
        focus: Option<String>,
    },
    /// The session's compactions, maskings of old outputs and failed attempts, newest last.
    History {
        /// The session.
        session: SessionId,
        /// Show at most this many compactions (the newest).
        #[arg(long, default_value_t = 20, value_name = "N")]
        limit: usize,
    },
    /// Print the session's latest summary, whole.
    Summary {
        /// The session.
        session: SessionId,
    },
    /// Follow the daemon's events (exits non-zero when the daemon stops).
    Events,
    /// Configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Copy the database, consistent while the daemon runs (SQLite's online backup), to a new
    /// file of mode 0600.
    Backup {
        /// Where the copy goes (a new file; an existing one is refused).
        path: PathBuf,
        /// The database to copy [default: the running daemon's, else [store] path, else
        /// $XDG_DATA_HOME/compactd/compactd.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// Config file, for its [store] path [default: $XDG_CONFIG_HOME/compactd/config.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Load an agent transcript into the daemon (Claude Code, OpenAI, mini-swe-agent, SWE-agent).
    Import {
        /// The transcript file.
        file: PathBuf,
        /// Session id [default: the transcript's own, else the file name]
        #[arg(long)]
        session: Option<SessionId>,
        /// The transcript's format [default: detected]
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// The session's context limit in tokens [default: the daemon's default_context_limit]
        #[arg(long, value_name = "TOKENS")]
        context_limit: Option<usize>,
    },
    /// Replay transcripts through an in-process daemon and report what compaction keeps and saves.
    Replay {
        /// Transcript files, or a synthetic session: synthetic:large-outputs (40 steps of
        /// 3,000-token outputs), synthetic:chatty (60 user instructions of up to 2,000 chars).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Their format [default: detected]
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// The context limit to replay at, in tokens.
        #[arg(long, default_value_t = 128_000, value_name = "TOKENS")]
        context_limit: usize,
        /// A config file (e.g. to replay with a model summarizer) [default: built-in defaults]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// The agent's model counts this many tokens per token compactd estimates (the shared
        /// transcripts' models: 1.2 to 2.0); the report gives each context as it counts it.
        #[arg(long, value_name = "RATIO", value_parser = tokenizer_ratio)]
        tokenizer_ratio: Option<f64>,
        /// The agent reports its model's count of each call (`usage.input_tokens`, with
        /// --tokenizer-ratio), as an agent that passes on its usage does.
        #[arg(long, requires = "tokenizer_ratio")]
        report_usage: bool,
        /// The agent sends a system prompt of about this many tokens first (the agents people
        /// run at small windows send 5,000 to 12,000); the report says at how many steps it
        /// was missing, and at how many the newest output was shortened.
        #[arg(long, default_value_t = 0, value_name = "TOKENS")]
        preamble_tokens: usize,
    },
    /// Measure throughput, latency, scaling and memory on this machine.
    Bench {
        /// A shorter run (under a minute); the full run gives steadier figures.
        #[arg(long)]
        quick: bool,
        /// Durability to measure at: full (the default) or normal.
        #[arg(long, value_enum, default_value = "full")]
        synchronous: crate::config::Synchronous,
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
    /// Print a shell completion script: `compactd completions bash > /etc/bash_completion.d/compactd`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `compactd man > ~/.local/share/man/man1/compactd.1`.
    Man,
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
pub enum SessionCommand {
    /// Every session, one line each.
    List,
    /// One session: tokens, threshold, counts, breaker, overrides.
    Show {
        /// The session.
        id: SessionId,
    },
    /// Create a session (an append to an unknown session also creates it).
    Create {
        /// Its id [default: generated]
        #[arg(long)]
        id: Option<SessionId>,
        /// The model's window in tokens [default: the daemon's default_context_limit]
        #[arg(long, value_name = "TOKENS")]
        context_limit: Option<usize>,
        /// The model's name (informational).
        #[arg(long)]
        model: Option<String>,
        /// [compaction] overrides for this session, as JSON: '{"max_messages": 40}'
        #[arg(long, value_name = "JSON")]
        config: Option<String>,
    },
    /// Change a session's model, context limit or overrides (a lower limit compacts at once).
    Update {
        /// The session.
        id: SessionId,
        /// The model's name (informational).
        #[arg(long)]
        model: Option<String>,
        /// The model's window in tokens.
        #[arg(long, value_name = "TOKENS")]
        context_limit: Option<usize>,
        /// Replaces the session's [compaction] overrides, as JSON.
        #[arg(long, value_name = "JSON")]
        config: Option<String>,
    },
    /// Hide a session from the API; its rows stay in the database.
    Delete {
        /// The session.
        id: SessionId,
    },
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (the file's values over the defaults), as TOML.
    Show {
        /// The file [default: $XDG_CONFIG_HOME/compactd/config.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}

/// The offline commands' input.
#[derive(clap::Args)]
pub struct InputArgs {
    /// A JSON array of messages, or {"messages": [...]}.
    #[arg(long, value_name = "PATH")]
    pub input: PathBuf,
    /// The model's context limit in tokens.
    #[arg(long, default_value_t = 128_000, value_name = "TOKENS")]
    pub context_limit: usize,
    /// A file holding the previous compaction's summary.
    #[arg(long, value_name = "PATH")]
    pub prior_summary: Option<PathBuf>,
}

/// `--role` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CliRole {
    /// What the person asked.
    User,
    /// What the model answered.
    Assistant,
    /// Instructions (never compacted).
    System,
    /// A tool's answer (needs JSON with tool_result parts: use stdin).
    Tool,
}

impl From<CliRole> for Role {
    fn from(role: CliRole) -> Role {
        match role {
            CliRole::User => Role::User,
            CliRole::Assistant => Role::Assistant,
            CliRole::System => Role::System,
            CliRole::Tool => Role::Tool,
        }
    }
}

/// `--format` values of `context`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CliFormat {
    /// compactd's own shape (text unless --json).
    Compactd,
    /// OpenAI Chat Completions `messages` (JSON).
    Openai,
    /// Anthropic Messages `system` and `messages` (JSON).
    Anthropic,
}

impl From<CliFormat> for ContextFormat {
    fn from(format: CliFormat) -> ContextFormat {
        match format {
            CliFormat::Compactd => ContextFormat::Compactd,
            CliFormat::Openai => ContextFormat::Openai,
            CliFormat::Anthropic => ContextFormat::Anthropic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand and every argument says what it is for.
    fn check(command: &clap::Command, path: &str) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(arg.get_help().is_some(), "{path} {id} has no help text");
        }
        for sub in command.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            let path = format!("{path} {}", sub.get_name());
            assert!(sub.get_about().is_some(), "{path} has no help text");
            check(sub, &path);
        }
    }

    #[test]
    fn every_command_and_flag_has_help() {
        Cli::command().debug_assert();
        check(&Cli::command(), "compactd");
    }
}

/// `SEQ` or `FROM..TO` (both included), as `compactd show` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRange {
    pub from: u64,
    pub to: u64,
}

/// Why a `SEQ[..SEQ]` argument cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadSeqRange(String);

impl std::str::FromStr for SeqRange {
    type Err = BadSeqRange;

    fn from_str(text: &str) -> Result<SeqRange, BadSeqRange> {
        let seq = |s: &str| {
            s.trim()
                .parse::<u64>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| BadSeqRange(format!("{s:?} is not a seq (1, 2, 3, ...)")))
        };
        let (from, to) = match text.split_once("..") {
            Some((from, to)) => (seq(from)?, seq(to)?),
            None => (seq(text)?, seq(text)?),
        };
        if to < from {
            return Err(BadSeqRange(format!(
                "{text}: the range ends before it starts"
            )));
        }
        if to - from >= 1_000 {
            return Err(BadSeqRange(format!(
                "{text}: at most 1,000 messages at once"
            )));
        }
        Ok(SeqRange { from, to })
    }
}

/// A tokenizer ratio: a number from 0.25 to 10.
fn tokenizer_ratio(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if (0.25..=10.0).contains(&r) => Ok(r),
        _ => Err(format!("{value} is not a ratio from 0.25 to 10 (e.g. 1.7)")),
    }
}
