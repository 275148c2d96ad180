//! A summarizer that runs a program: the prompt on its stdin, the summary on its stdout.
//! Anything that reads text and writes text can summarize (`llm`, a local script, ...).

use super::{SummarizeError, Summarizer, SummaryRequest};
use crate::config::CommandLine;
use async_trait::async_trait;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command as Process;

pub struct Command {
    pub command: CommandLine,
    pub timeout: Duration,
    pub max_output_tokens: usize,
    pub context_window: Option<usize>,
}

impl Command {
    fn process(&self) -> Result<Process, SummarizeError> {
        let mut process = match &self.command {
            CommandLine::Argv(argv) => {
                let (program, args) = argv.split_first().ok_or_else(|| {
                    SummarizeError::Config("[summarizer] command is empty".into())
                })?;
                let mut p = Process::new(program);
                p.args(args);
                p
            }
            CommandLine::Shell(line) => {
                let mut p = Process::new("sh");
                p.arg("-c").arg(line);
                p
            }
        };
        process
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A timed-out or cancelled compaction must not leave the program running.
            .kill_on_drop(true);
        Ok(process)
    }

    fn program(&self) -> String {
        match &self.command {
            CommandLine::Argv(argv) => argv.first().cloned().unwrap_or_default(),
            CommandLine::Shell(_) => "sh".into(),
        }
    }
}

#[async_trait]
impl Summarizer for Command {
    fn name(&self) -> String {
        format!("command:{}", self.program())
    }

    fn context_window(&self) -> Option<usize> {
        self.context_window
    }

    fn max_output_tokens(&self) -> usize {
        self.max_output_tokens
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let mut child = self.process()?.spawn().map_err(|e| {
            SummarizeError::Command(format!("cannot start {}: {e}", self.program()))
        })?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let prompt = request.prompt.clone();
        // Write in the background: a program may answer before reading all of its input.
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(prompt.as_bytes()).await;
        });
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| SummarizeError::Timeout(self.timeout.as_secs()))?
            .map_err(|e| SummarizeError::Command(e.to_string()))?;
        writer.abort();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(SummarizeError::Command(format!(
                "{} exited with {}: {first}",
                self.program(),
                output.status
            )));
        }
        String::from_utf8(output.stdout)
            .map_err(|_| SummarizeError::BadResponse("the command's output is not UTF-8".into()))
    }
}
