//! Runs a parsed command line.

use super::args::{Cli, Command, ConfigCommand, InputArgs, SessionCommand};
use super::offline::{self, OfflineInput};
use super::remote;
use super::render::Output;
use crate::client::{Client, ClientError};
use crate::config::Config;
use crate::protocol::{CreateSessionRequest, UpdateSessionRequest};
use anyhow::{Context, Result};
use clap::CommandFactory;
use serde_json::Value;

/// What the process exits with when `run` fails: 3 when no daemon answers (scripts can tell
/// "not running" from "refused"), 1 otherwise. (clap exits with 2 on bad usage.)
pub fn exit_code(error: &anyhow::Error) -> u8 {
    let not_running = error.chain().any(|e| {
        matches!(
            e.downcast_ref::<ClientError>(),
            Some(ClientError::NotRunning { .. })
        )
    });
    if not_running { 3 } else { 1 }
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

/// `--config` JSON of `session create` / `session update`.
fn overrides(json: Option<String>) -> Result<Option<Value>> {
    json.map(|text| {
        serde_json::from_str(&text).with_context(|| format!("--config is not valid JSON: {text}"))
    })
    .transpose()
}

pub async fn run(cli: Cli) -> Result<()> {
    let socket = cli.socket.clone();
    let client = || Client::new(socket.clone().unwrap_or_else(crate::paths::default_socket));
    let out = Output { json: cli.json };
    match cli.command {
        Command::Serve { db, config } => {
            compactd_daemon::init_logging();
            let options = compactd_daemon::DaemonOptions {
                socket,
                db,
                config,
                listeners: None,
            };
            compactd_daemon::run(options, compactd_daemon::shutdown_signal()).await?;
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
            config,
        }) => {
            let request = CreateSessionRequest {
                id,
                model,
                context_limit,
                config: overrides(config)?,
            };
            remote::session_create(&client(), request, out).await?
        }
        Command::Session(SessionCommand::Update {
            id,
            model,
            context_limit,
            config,
        }) => {
            let request = UpdateSessionRequest {
                model,
                context_limit,
                config: overrides(config)?,
            };
            remote::session_update(&client(), &id, request, out).await?
        }
        Command::Session(SessionCommand::Delete { id }) => {
            remote::session_delete(&client(), &id, out).await?
        }
        Command::Append {
            session,
            role,
            text,
            wait,
        } => {
            let text = role.zip(text).map(|(role, text)| (role.into(), text));
            remote::append(&client(), &session, text, wait, out).await?
        }
        Command::Messages {
            session,
            after,
            limit,
        } => remote::messages(&client(), &session, after, limit, out).await?,
        Command::Search {
            session,
            words,
            limit,
        } => remote::search(&client(), &session, &words.join(" "), limit, out).await?,
        Command::Mcp { session } => crate::cli::mcp::serve(client(), session).await?,
        Command::Show { session, seqs } => remote::show(&client(), &session, seqs, out).await?,
        Command::Context {
            session,
            full,
            format,
        } => remote::context(&client(), &session, full, format.into(), out).await?,
        Command::Compact { session, focus } => {
            remote::compact(&client(), &session, focus, out).await?
        }
        Command::History { session, limit } => {
            remote::history(&client(), &session, limit, out).await?
        }
        Command::Summary { session } => remote::summary(&client(), &session, out).await?,
        Command::Events => remote::events(&client(), out).await?,
        Command::Config(ConfigCommand::Show { config }) => {
            let path = config.unwrap_or_else(crate::paths::default_config);
            let effective = Config::load(&path)?;
            outln!("# effective configuration ({})", path.display());
            out!("{}", toml::to_string_pretty(&effective)?);
        }
        Command::Backup { path, db, config } => {
            super::backup::backup(&client(), &path, db, config, out).await?
        }
        Command::Import {
            file,
            session,
            format,
            context_limit,
        } => {
            super::transcripts::import(&client(), &file, session, format, context_limit, out)
                .await?
        }
        Command::Replay {
            files,
            format,
            context_limit,
            config,
            tokenizer_ratio,
            report_usage,
            preamble_tokens,
        } => {
            let model = crate::measure::replay::Model {
                ratio: tokenizer_ratio,
                reports_usage: report_usage,
                preamble_tokens,
            };
            let config = config.as_deref();
            super::transcripts::replay_files(&files, format, context_limit, config, model, out)
                .await?
        }
        Command::Bench { quick, synchronous } => {
            let report = crate::measure::bench::run(quick, synchronous, |what| {
                if !out.json {
                    eprintln!("measuring {what}…");
                }
            })
            .await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", crate::measure::bench::render(&report));
            }
        }
        Command::Torture { seconds } => {
            let report =
                crate::measure::torture::run(std::time::Duration::from_secs(seconds), |what| {
                    if !out.json {
                        eprintln!("torture: {what}…");
                    }
                })
                .await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", crate::measure::torture::render(&report));
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
        Command::Openapi => out!("{}", compactd_daemon::openapi_pretty()),
        // Rendered whole, then written like every other output: into a closed pipe
        // (`| head`, `| true`) it ends quietly instead of panicking.
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "compactd", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
        }
        Command::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            out!("{}", String::from_utf8_lossy(&page));
        }
        Command::Plan { input, focus } => {
            let input = input.load(focus)?;
            outln!("{}", serde_json::to_string_pretty(&offline::plan(&input))?);
        }
        Command::Summarize { input } => {
            let input = input.load(None)?;
            outln!(
                "{}",
                serde_json::to_string_pretty(&offline::summarize(&input).await?)?
            );
        }
    }
    Ok(())
}
