//! A summarizer that runs a program: the prompt on its stdin, the summary on its stdout.
//! Anything that reads text and writes text can summarize (`llm`, a local script, ...).

use super::http::MAX_ANSWER_BYTES;
use super::{SummarizeError, Summarizer, SummaryRequest};
use crate::config::CommandLine;
use async_trait::async_trait;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        let output = tokio::time::timeout(self.timeout, bounded_output(&mut child))
            .await
            .map_err(|_| SummarizeError::Timeout(self.timeout.as_secs()))?;
        writer.abort();
        let (stdout, stderr, status) = output?;
        if !status.success() {
            let stderr = String::from_utf8_lossy(&stderr);
            let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(SummarizeError::Command(format!(
                "{} exited with {status}: {first}",
                self.program(),
            )));
        }
        String::from_utf8(stdout)
            .map_err(|_| SummarizeError::BadResponse("the command's output is not UTF-8".into()))
    }
}

/// Of a command's stderr, only this much is kept (its first line goes into the error); the
/// rest is read and dropped, so the program never blocks on a full pipe.
const STDERR_KEPT: u64 = 64 * 1024;

/// The program's stdout (at most [`MAX_ANSWER_BYTES`]), the start of its stderr, and its
/// exit status. A program that writes more than that is killed (when `child` is dropped) and
/// the summary fails at once, instead of the daemon holding all it writes until the timeout.
async fn bounded_output(
    child: &mut tokio::process::Child,
) -> Result<(Vec<u8>, Vec<u8>, std::process::ExitStatus), SummarizeError> {
    let failed = |e: std::io::Error| SummarizeError::Command(e.to_string());
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let errors = tokio::spawn(async move {
        let mut kept = Vec::new();
        let mut stderr = stderr;
        let _ = (&mut stderr).take(STDERR_KEPT).read_to_end(&mut kept).await;
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        kept
    });
    let mut out = Vec::new();
    stdout
        .take(MAX_ANSWER_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .await
        .map_err(failed)?;
    if out.len() > MAX_ANSWER_BYTES {
        errors.abort();
        return Err(SummarizeError::BadResponse(format!(
            "the command wrote more than {} MiB",
            MAX_ANSWER_BYTES >> 20
        )));
    }
    let status = child.wait().await.map_err(failed)?;
    Ok((out, errors.await.unwrap_or_default(), status))
}
