//! Running the real agents (pinned releases `.ci/run` installs into `target/agents`) against a
//! model API, directly or through compactd, each in its own working directory and home.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The completion Claude Code (`CLAUDE_CODE_MAX_OUTPUT_TOKENS`) and opencode (its model's
/// `limit.output`) ask for in these tests, unless a test leaves them their own defaults.
pub const AGENTS_MAX_OUTPUT: usize = 8_000;

/// Where `.ci/run` installs the agents: `npm/` (Claude Code, Codex, opencode, Copilot CLI) and `venv/`
/// (mini-swe-agent, aider). `COMPACTD_AGENTS_DIR` points elsewhere.
pub fn agents_dir() -> PathBuf {
    std::env::var_os("COMPACTD_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agents"))
}

/// The agent's executable, or `None` (with a message saying how to get it) when it is not
/// installed.
pub fn installed(agent: Agent) -> Option<PathBuf> {
    let path = agents_dir().join(agent.executable());
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "SKIP: {} is not installed at {} (.ci/run installs the agents; the registry may have been unreachable)",
            agent.name(),
            path.display()
        );
        None
    }
}

/// The agents tested, with their pinned versions (`.ci/run` installs these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    Codex,
    Opencode,
    MiniSwe,
    Aider,
    /// Copilot CLI in its offline mode (`COPILOT_OFFLINE`), with a model of one's own over
    /// Chat Completions (`COPILOT_PROVIDER_BASE_URL`), as it is run against a local model.
    Copilot,
}

impl Agent {
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code 2.1.332",
            Agent::Codex => "Codex CLI 0.171.0",
            Agent::Opencode => "opencode 1.18.33",
            Agent::MiniSwe => "mini-swe-agent 2.4.6",
            Agent::Aider => "aider 0.86.2",
            Agent::Copilot => "Copilot CLI 1.0.102",
        }
    }

    fn executable(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "npm/node_modules/.bin/claude",
            Agent::Codex => "npm/node_modules/.bin/codex",
            Agent::Opencode => "npm/node_modules/.bin/opencode",
            Agent::MiniSwe => "venv/bin/mini",
            Agent::Aider => "venv/bin/aider",
            Agent::Copilot => "npm/node_modules/.bin/copilot",
        }
    }
}

/// What an agent run produced.
#[derive(Debug)]
pub struct Run {
    pub output: Output,
    /// The agent's own log files, where it writes them (their tails).
    pub logs: String,
    /// The agent's final answer, as it reported it.
    pub answer: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.output.status.success()
    }

    /// Asserts the agent exited well, its task done to the last step (the mock's final
    /// answer names the last step's output); `context` (a daemon's log) shows on failure.
    pub fn assert_done(&self, context: &str) {
        assert!(self.ok(), "{}\n{context}", self.log());
        assert!(
            self.answer
                .contains("All 20 steps done; the last output ended with STEP-20-END"),
            "{}",
            self.log()
        );
    }
    pub fn log(&self) -> String {
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}\nagent logs:\n{}",
            self.output.status,
            tail(&self.output.stdout),
            tail(&self.output.stderr),
            self.logs
        )
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(4_000);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text[start..].to_string()
}

/// How one run is set up: where the model API is (compactd's proxy or the mock itself),
/// the model's name, and the task's prompt.
pub struct Setup<'a> {
    pub agent: Agent,
    /// `http://127.0.0.1:PORT` (no path).
    pub base: &'a str,
    pub model: &'a str,
    pub dir: &'a Path,
    pub prompt: &'a str,
    pub key: &'a str,
    /// The completion Claude Code and opencode are told to ask for ([`AGENTS_MAX_OUTPUT`]);
    /// `None`: their own defaults (Claude Code's is 32,000 tokens for `claude-sonnet-4-5`,
    /// 128,000 for a model it does not know; opencode's 32,000).
    pub max_output: Option<usize>,
    /// Whether Claude Code thinks (its default for the model) or not
    /// (`CLAUDE_CODE_DISABLE_THINKING`); the other agents think as they do.
    pub thinking: bool,
    /// Claude Code offers its task tools (TaskCreate, TaskUpdate, TaskList), as it does
    /// interactively (`CLAUDE_CODE_ENABLE_TODO_TOOLS=1`; off in print mode otherwise).
    pub task_tools: bool,
}

/// Runs the agent to its end (at most `limit`), in `dir/work` with `dir/home` as its home.
pub fn run(setup: &Setup, limit: Duration) -> Run {
    let exe = agents_dir().join(setup.agent.executable());
    let work = setup.dir.join("work");
    let home = setup.dir.join("home");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let answer_file = setup.dir.join("answer.txt");
    let mut command = Command::new(&exe);
    command
        .current_dir(&work)
        // Some agents (opencode) take their directory from PWD, not the process's own.
        .env("PWD", &work)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    match setup.agent {
        Agent::ClaudeCode => {
            // As one sets it for a model of a small window: Claude Code asks up to 128,000
            // output tokens otherwise, which the Messages API refuses beside any prompt in the
            // windows these tests give.
            if let Some(tokens) = setup.max_output {
                command.env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", tokens.to_string());
            }
            if !setup.thinking {
                command.env("CLAUDE_CODE_DISABLE_THINKING", "1");
            }
            if setup.task_tools {
                command.env("CLAUDE_CODE_ENABLE_TODO_TOOLS", "1");
            }
            command
                .env("ANTHROPIC_BASE_URL", setup.base)
                .env("ANTHROPIC_API_KEY", setup.key)
                .env("DISABLE_AUTOUPDATER", "1")
                .env("DISABLE_TELEMETRY", "1")
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .env("IS_SANDBOX", "1")
                .args([
                    "-p",
                    setup.prompt,
                    "--output-format",
                    "json",
                    "--max-turns",
                    "80",
                ])
                .args([
                    "--model",
                    setup.model,
                    "--allowedTools",
                    "Bash",
                    "--permission-mode",
                    "bypassPermissions",
                ]);
        }
        Agent::Codex => {
            let codex_home = home.join(".codex");
            std::fs::create_dir_all(&codex_home).unwrap();
            std::fs::write(
                codex_home.join("config.toml"),
                format!(
                    "model_provider = \"mock\"\nmodel = \"{}\"\n[model_providers.mock]\nname = \"mock\"\nbase_url = \"{}/v1\"\nenv_key = \"MOCK_API_KEY\"\nwire_api = \"responses\"\n",
                    setup.model, setup.base
                ),
            )
            .unwrap();
            command
                .env("CODEX_HOME", &codex_home)
                .env("MOCK_API_KEY", setup.key)
                .args([
                    "exec",
                    "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                ])
                .arg("--output-last-message")
                .arg(&answer_file)
                .arg(setup.prompt);
        }
        Agent::Opencode => {
            std::fs::write(
                work.join("opencode.json"),
                serde_json::json!({
                    "$schema": "https://opencode.ai/config.json",
                    "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "Mock",
                        "options": {"baseURL": format!("{}/v1", setup.base), "apiKey": setup.key},
                        // As one sets it for a model of a small window: opencode asks 32,000
                        // output tokens otherwise, which OpenAI's API (and vLLM) refuse beside
                        // any prompt in the windows these tests give. A context of 0 (unknown,
                        // as without a limit) leaves compacting to compactd.
                        "models": {setup.model: {"name": setup.model,
                            "limit": {"context": 0, "output": setup.max_output.unwrap_or(0)}}}}},
                    "permission": {"bash": "allow", "edit": "allow"}
                })
                .to_string(),
            )
            .unwrap();
            command.args(["run", "-m", &format!("mock/{}", setup.model), setup.prompt]);
        }
        Agent::Copilot => {
            command
                .env("COPILOT_OFFLINE", "true")
                .env("COPILOT_AUTO_UPDATE", "false")
                .env("COPILOT_PROVIDER_TYPE", "openai")
                .env("COPILOT_PROVIDER_BASE_URL", format!("{}/v1", setup.base))
                .env("COPILOT_PROVIDER_API_KEY", setup.key)
                .env("COPILOT_MODEL", setup.model)
                .args(["-p", setup.prompt, "--allow-all-tools", "-s"])
                .arg("--disable-client-telemetry");
            if let Some(tokens) = setup.max_output {
                command.env("COPILOT_PROVIDER_MAX_OUTPUT_TOKENS", tokens.to_string());
            }
        }
        Agent::MiniSwe => {
            command
                .env("OPENAI_API_BASE", format!("{}/v1", setup.base))
                .env("OPENAI_API_KEY", setup.key)
                .env("MSWEA_COST_TRACKING", "ignore_errors")
                .env("MSWEA_CONFIGURED", "true")
                .args(["-y", "-l", "0", "--exit-immediately", "-t", setup.prompt])
                .args(["-m", &format!("openai/{}", setup.model), "-o"])
                .arg(setup.dir.join("trajectory.json"));
        }
        Agent::Aider => {
            if !work.join(".git").exists() {
                prepare_aider_repo(&work);
            }
            command
                .env("OPENAI_API_BASE", format!("{}/v1", setup.base))
                .env("OPENAI_API_KEY", setup.key)
                .env("GIT_AUTHOR_NAME", "test")
                .env("GIT_AUTHOR_EMAIL", "test@example.com")
                .env("GIT_COMMITTER_NAME", "test")
                .env("GIT_COMMITTER_EMAIL", "test@example.com")
                .args(["--model", &format!("openai/{}", setup.model)])
                .args(["--weak-model", &format!("openai/{}-weak", setup.model)])
                .args([
                    "--edit-format",
                    "whole",
                    "--auto-test",
                    "--test-cmd",
                    "python3 check.py",
                ])
                .args([
                    "--restore-chat-history",
                    "--yes-always",
                    "--no-check-update",
                    "--no-pretty",
                ])
                .args([
                    "--no-show-model-warnings",
                    "--no-analytics",
                    "--no-stream",
                    "--map-tokens",
                    "0",
                ])
                // compactd compacts the history: aider need not summarize it itself (the
                // README's advice; its own summary would replace the task it shares).
                .args(["--max-chat-history-tokens", "1000000"])
                .args(["--message", setup.prompt, "lib.py"]);
        }
    }
    let output = run_with_limit(command, limit);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let answer = match setup.agent {
        Agent::ClaudeCode => serde_json::from_str::<serde_json::Value>(stdout.trim())
            .ok()
            .and_then(|v| v["result"].as_str().map(str::to_string))
            .unwrap_or_default(),
        Agent::Codex => std::fs::read_to_string(&answer_file).unwrap_or_default(),
        Agent::MiniSwe => std::fs::read_to_string(setup.dir.join("trajectory.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["info"]["submission"].as_str().map(str::to_string))
            .unwrap_or_default(),
        Agent::Opencode | Agent::Aider | Agent::Copilot => stdout,
    };
    let logs = agent_logs(&home);
    Run {
        output,
        answer,
        logs,
    }
}

/// The tails of the log files an agent wrote under its home.
fn agent_logs(home: &Path) -> String {
    let mut out = String::new();
    for dir in [".local/share/opencode/log", ".codex/log", ".claude/debug"] {
        for entry in std::fs::read_dir(home.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read(entry.path()).unwrap_or_default();
            out.push_str(&format!("== {}\n{}\n", entry.path().display(), tail(&text)));
        }
    }
    out
}

/// A git repository with an empty `lib.py` and the `check.py` aider's test command runs: each
/// `fN` in `lib.py` must return `N`.
fn prepare_aider_repo(work: &Path) {
    std::fs::write(work.join("lib.py"), "").unwrap();
    std::fs::write(
        work.join("check.py"),
        "import re, lib\nnames = sorted((int(n[1:]), n) for n in dir(lib) if re.fullmatch(r'f\\d+', n))\nfor k, n in names:\n    got = getattr(lib, n)()\n    if got != k:\n        raise SystemExit(f'check failed: {n}() returned {got}, expected {k}')\nprint(f'check passed: {len(names)} functions')\n",
    )
    .unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "."],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "commit",
            "-qm",
            "start",
        ],
    ] {
        let ok = Command::new("git")
            .args(args)
            .current_dir(work)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
}

/// Runs `command`, killing it after `limit`, and everything it started: the agents' npm
/// launchers are node scripts that run the agent as a child, which holds the output pipes
/// open (and the test waiting) after the launcher alone is killed. So the agent runs as a
/// process group of its own, and the group is killed.
fn run_with_limit(mut command: Command, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    let child = command
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (done, waiting) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        if waiting.recv_timeout(limit).is_err() {
            // SAFETY: signalling the process group of a child of ours, which leads it.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    });
    let output = child.wait_with_output().unwrap();
    let _ = done.send(());
    let _ = killer.join();
    output
}
