//! The agents people use, unmodified, through compactd's proxy: Claude Code (its default
//! model, with thinking on), Codex CLI, opencode, mini-swe-agent, aider and Copilot CLI, each driven
//! through a task of many tool steps by a local model API that refuses what the providers
//! refuse ([`crate::common::model_api`]), first directly, then through compactd. Through
//! compactd, the model's tokenizer counts two characters a token where compactd's estimate
//! counts four (the shared transcripts' models counted 1.2 to 2.0 times the estimate), so
//! compactd must follow the usage the model reports, not its own estimate.

mod background_command;
mod harness;
mod small_window;
mod task_list;
mod taught_window;

use crate::common::free_port;
use crate::common::model_api::{ModelApi, Seen, Task};
use harness::{AGENTS_MAX_OUTPUT, Agent, Setup, installed, run};
use std::time::Duration;

const PROMPT: &str = "Run the numbered steps the model gives you with your shell tool, one per step, until it says they are done.";

fn direct(agent: Agent, model: &str) {
    direct_with(agent, model, Task::default());
}

fn direct_with(agent: Agent, model: &str, task: Task) -> Vec<Seen> {
    direct_thinking(agent, model, task, true)
}

/// [`direct_with`], the agent thinking or not ([`Setup::thinking`]).
fn direct_thinking(agent: Agent, model: &str, task: Task, thinking: bool) -> Vec<Seen> {
    if installed(agent).is_none() {
        return Vec::new();
    }
    let task_tools = task.task_list;
    let api = ModelApi::start(task);
    let dir = tempfile::TempDir::new().unwrap();
    let setup = Setup {
        agent,
        base: &api.base,
        model,
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-direct",
        max_output: Some(AGENTS_MAX_OUTPUT),
        thinking,
        task_tools,
    };
    let result = run(&setup, Duration::from_secs(300));
    let refused = api.refused();
    eprintln!(
        "{} direct: {} requests, refused {:?}\nanswer: {}",
        agent.name(),
        api.seen().len(),
        refused,
        result.answer
    );
    result.assert_done("");
    assert!(refused.is_empty(), "{refused:?}");
    api.seen()
}

#[test]
fn claude_code_runs_the_task_directly() {
    direct(Agent::ClaudeCode, "claude-opus-5-5");
}

#[test]
fn codex_runs_the_task_directly() {
    direct(Agent::Codex, "gpt-5-codex");
}

#[test]
fn opencode_runs_the_task_directly() {
    direct(Agent::Opencode, "mock-model");
}

#[test]
fn mini_swe_agent_runs_the_task_directly() {
    direct(Agent::MiniSwe, "mock-model");
}

/// Every session of the daemon: (id, kind, compactions, messages), read from its database
/// with the system's own view of it.
fn sessions(daemon: &crate::common::TestDaemon) -> Vec<(String, String, u64, u64)> {
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    conn.prepare(
        "SELECT id, kind, compaction_count, message_count FROM sessions ORDER BY created_at",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The model a run goes through, and what compactd is told of it.
struct Model {
    name: &'static str,
    /// Its window, in tokens as its tokenizer counts them.
    window: usize,
    /// The characters its tokenizer counts as a token (compactd's estimate: 4).
    chars_per_token: usize,
    /// The window `[proxy.models]` gives compactd for it.
    told: usize,
    /// The completion the agent is told to ask for (see [`Setup::max_output`]).
    max_output: Option<usize>,
    /// Whether the agent thinks, where it may (Claude Code: `CLAUDE_CODE_DISABLE_THINKING`
    /// otherwise).
    thinking: bool,
}

impl Model {
    /// A model of `window` tokens at `chars_per_token`, which compactd is told of rightly.
    fn new(name: &'static str, window: usize, chars_per_token: usize) -> Model {
        Model {
            name,
            window,
            chars_per_token,
            told: window,
            max_output: Some(AGENTS_MAX_OUTPUT),
            thinking: true,
        }
    }
}

/// Whether the model API refused a request for its length.
fn too_long(why: &str) -> bool {
    why.starts_with("prompt is too long")
        || why.starts_with("input length and `max_tokens` exceed context limit")
        || why.contains("maximum context length")
        || why.contains("exceeds the context window")
}

/// Runs `agent` through compactd's loopback proxy to `model`, and checks what every such run
/// must show: the agent finishes its task and the model API refuses nothing but, where
/// compactd was told a window larger than the model's, a call too long for it, which compactd
/// compacts and sends again at once (the agent never sees it), learning the window.
fn through(agent: Agent, model: Model) {
    through_with(agent, model, |_| {});
}

/// [`through`] with the model's task changed by `change` (sub-agents, parallel calls);
/// every call the model API saw is returned.
fn through_with(agent: Agent, model: Model, change: impl FnOnce(&mut Task)) -> Vec<Seen> {
    through_inspected(agent, model, change, |_| {})
}

/// [`through_with`], then `inspect` given the daemon, before it stops.
fn through_inspected(
    agent: Agent,
    model: Model,
    change: impl FnOnce(&mut Task),
    inspect: impl FnOnce(&crate::common::TestDaemon),
) -> Vec<Seen> {
    if installed(agent).is_none() {
        return Vec::new();
    }
    let mut task = Task {
        lines: 1_500,
        chars_per_token: model.chars_per_token,
        ..Task::default()
    };
    change(&mut task);
    let delegation = task.delegate_after.map(|_| task.sub_agents);
    // A Claude Code fork starts from its parent's whole history, steps and all.
    let inherited = match (agent, task.fork_context) {
        (Agent::ClaudeCode, true) => task.delegate_after.unwrap_or(0),
        _ => 0,
    };
    let (name, limit) = (model.name, model.window);
    task.windows.insert(name.to_string(), limit);
    let task_tools = task.task_list;
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n\n[proxy.models]\n\"{name}\" = {told}\n",
        base = api.base,
        told = model.told,
    );
    let daemon = crate::common::TestDaemon::start(&config);
    let dir = tempfile::TempDir::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let setup = Setup {
        agent,
        base: &base,
        model: name,
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-through",
        max_output: model.max_output,
        thinking: model.thinking,
        task_tools,
    };
    let result = run(&setup, Duration::from_secs(400));
    let refused = api.refused();
    let seen = api.seen();
    eprintln!(
        "{} through compactd: {} requests, refused {:?}\nanswer: {}",
        agent.name(),
        seen.len(),
        refused,
        result.answer
    );
    result.assert_done(&format!("daemon log:\n{}", daemon.log()));
    let sessions = sessions(&daemon);
    eprintln!(
        "sessions: {sessions:?}\nrequest tokens: {:?}",
        seen.iter().map(|s| s.tokens).collect::<Vec<_>>()
    );
    // A sub-agent's conversation is its own, under the same conversation header: each
    // conversation is a session and compacts apart.
    let conversations: Vec<&(String, String, u64, u64)> =
        sessions.iter().filter(|s| s.1 == "proxy").collect();
    assert_eq!(
        conversations.len(),
        1 + delegation.unwrap_or(0),
        "one session per conversation and its sub-agents: {sessions:?}"
    );
    if delegation.is_some() {
        assert!(
            conversations.iter().all(|s| s.2 >= 1),
            "each session compacted: {sessions:?}"
        );
    }
    // A sub-agent forked under its parent's header keeps the client's preamble (Codex's
    // instructions) pinned as its parent does, as the file says (its own preamble may go on
    // with the parent's task, `fork_context`).
    let conn = rusqlite::Connection::open(daemon.db()).unwrap();
    let pinned_preamble = |id: &str| -> Vec<(u64, bool)> {
        conn.prepare(
            "SELECT m.seq, m.pinned FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE m.session_id = ?1 AND m.seq <= s.static_seq ORDER BY m.seq",
        )
        .unwrap()
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    for (fork, parent) in conversations
        .iter()
        .filter_map(|s| Some((&s.0, s.0.rsplit_once('.')?.0)))
    {
        let (forked, parents) = (pinned_preamble(fork), pinned_preamble(parent));
        assert_eq!(
            forked[..parents.len().min(forked.len())],
            parents,
            "the preamble pinned in {fork} and its parent"
        );
    }
    let main = conversations.iter().max_by_key(|s| s.3).unwrap();
    assert!(
        main.2 >= 2,
        "the conversation compacted at least twice: {sessions:?}\n{}",
        daemon.log()
    );
    if model.told <= model.window {
        assert!(
            refused.is_empty(),
            "the model API refused: {refused:?}\ndaemon log:\n{}",
            daemon.log()
        );
    } else {
        // Refused for length only, each time followed by the same call compacted and
        // accepted; once compactd knows the window, never again.
        assert!(!refused.is_empty(), "the told window was never reached");
        for (n, s) in seen.iter().enumerate() {
            if let Some(why) = &s.refused {
                assert!(too_long(why), "refused for another reason: {why}");
                let next = seen.get(n + 1).expect("a call after the refusal");
                assert!(next.refused.is_none() && next.tokens <= limit, "{why}");
            }
        }
        let conn = rusqlite::Connection::open(daemon.db()).unwrap();
        let (learned, source): (usize, String) = conn
            .query_row(
                "SELECT context_limit, limit_source FROM sessions WHERE id = ?1",
                [&main.0],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(source, "upstream refusal");
        // The Responses API's refusal names no window (OpenAI's says only that the input
        // exceeds it): the limit learned is compactd's count of the call refused, by the
        // model's own reports.
        let first = seen.iter().position(|s| s.refused.is_some()).unwrap();
        let why = seen[first].refused.as_deref().unwrap_or_default();
        match seen[first].path.ends_with("/responses") {
            true => assert!(learned < model.told, "{learned}"),
            false => assert_eq!(learned, limit, "{why}"),
        }
        // The prompt left the completion asked for no room: that completion is kept free
        // from then on.
        if why.starts_with("input length") {
            let reserved = seen[first].body["max_tokens"].as_u64().unwrap();
            let completion: u64 = conn
                .query_row(
                    "SELECT completion_tokens FROM sessions WHERE id = ?1",
                    [&main.0],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(completion, reserved, "{why}");
        }
        assert_eq!(
            refused.len(),
            1,
            "refused again after compactd learned the window: {refused:?}"
        );
    }
    for s in seen.iter().filter(|s| s.refused.is_none()) {
        assert!(
            s.tokens <= limit,
            "a request of {} tokens reached a {limit}-token model",
            s.tokens
        );
    }
    if let Some(n) = delegation {
        each_conversation_its_own(&seen, n, inherited);
    }
    inspect(&daemon);
    drop(api);
    seen
}

#[test]
fn claude_code_runs_the_task_through_compactd() {
    through(Agent::ClaudeCode, Model::new("claude-opus-5-5", 48_000, 2));
}

/// Claude Code reading a file after every step (its `Read`, which sends an image or a PDF to
/// the model whole in the tool result) against a window of `window` tokens, 20 steps: the
/// most media tokens one request carried, and the tokens of each stored message whose parts
/// hold `stored_as` (how compactd keeps the read). `None` if Claude Code is not installed.
fn claude_code_reading(
    name: &str,
    contents: &[u8],
    window: usize,
    stored_as: &str,
) -> Option<(usize, Vec<usize>)> {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, contents).unwrap();
    let change = |task: &mut Task| {
        task.read_after_step = Some(file.clone());
        task.lines = 300;
    };
    let mut stored = Vec::new();
    let model = Model::new("claude-opus-5-5", window, 2);
    let seen = through_inspected(Agent::ClaudeCode, model, change, |daemon| {
        let conn = rusqlite::Connection::open(daemon.db()).unwrap();
        stored = conn
            .prepare("SELECT tokens FROM messages WHERE instr(parts, ?1) > 0")
            .unwrap()
            .query_map([stored_as], |r| r.get::<_, usize>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    });
    let most = seen
        .iter()
        .map(|s| crate::common::vision::media_tokens(&s.body["messages"], true))
        .max()?;
    Some((most, stored))
}

/// Claude Code reads a screenshot after every step (a 1366 × 768 PNG: 1,399 tokens to
/// Anthropic, however few bytes the file has) against a 48,000-token window. Each screenshot
/// reaches the model, none is refused, no request passes the window, and the task ends with
/// its last step's output; each stored screenshot counts what the model bills for it (as its
/// note it counted a few tokens: with Claude Code's large instructions, the usage reports'
/// rate made up for it here, where `proxy_images` shows what it could not).
#[test]
fn claude_code_reads_screenshots_through_compactd() {
    let png = crate::common::vision::png_file(1366, 768);
    let Some((most, stored)) = claude_code_reading("screen.png", &png, 48_000, "[image omitted]")
    else {
        return;
    };
    assert!(
        most >= 5 * 1_399,
        "the screenshots reached the model: {most}"
    );
    assert_eq!(stored.len(), 20, "each screenshot stored once: {stored:?}");
    assert!(stored.iter().all(|&t| t >= 1_399), "{stored:?}");
}

/// Claude Code reads a four-page PDF report after every step (sent whole as a `document`
/// block, which the model bills by its pages: 9,388 tokens here, whatever its 900 bytes)
/// against a 128,000-token window. The same holds; each stored report counts its pages (as
/// its note it counted 14 tokens, and the largest request reached 116,916 tokens where it now
/// stays under 107,000: the usage reports' rate made up for the rest).
#[test]
fn claude_code_reads_pdfs_through_compactd() {
    let pdf = crate::common::vision::pdf_file(4);
    let Some((most, stored)) = claude_code_reading("report.pdf", &pdf, 128_000, "PDF file read")
    else {
        return;
    };
    let page = crate::common::vision::PDF_PAGE_TOKENS;
    assert!(
        most >= 5 * 4 * page,
        "the reports reached the model: {most}"
    );
    assert_eq!(stored.len(), 20, "each report stored once: {stored:?}");
    assert!(stored.iter().all(|&t| t >= 4 * page), "{stored:?}");
}

#[test]
fn codex_runs_the_task_through_compactd() {
    through(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2));
}

#[test]
fn opencode_runs_the_task_through_compactd() {
    through(Agent::Opencode, Model::new("mock-model", 32_000, 2));
}

#[test]
fn mini_swe_agent_runs_the_task_through_compactd() {
    through(Agent::MiniSwe, Model::new("mock-model", 16_000, 2));
}

#[test]
fn claude_code_with_a_thinking_model_runs_the_task_through_compactd() {
    through(
        Agent::ClaudeCode,
        Model::new("claude-sonnet-4-5", 80_000, 2),
    );
}

/// Claude Code hands steps of its task to a sub-agent (its `Agent` tool: a fresh agent, a
/// conversation of its own under the same `X-Claude-Code-Session-Id`) and goes on when it
/// reports. Through compactd, at a window that compacts both: the task ends as it should and
/// the model API refuses nothing (as [`through`] checks), and each conversation reaches the
/// model with its own messages only.
#[test]
fn claude_code_hands_steps_to_a_sub_agent_through_compactd() {
    through_with(
        Agent::ClaudeCode,
        Model::new("claude-opus-5-5", 48_000, 2),
        |task| task.delegate_after = Some(10),
    );
}

/// Two sub-agents at once (two `Agent` calls in one message, which Claude Code runs side by
/// side): their calls interleave under one conversation header and one system prompt, and
/// each still reaches the model with its own steps only.
#[test]
fn claude_code_hands_steps_to_two_sub_agents_at_once_through_compactd() {
    through_with(
        Agent::ClaudeCode,
        Model::new("claude-opus-5-5", 48_000, 2),
        |task| {
            task.delegate_after = Some(10);
            task.sub_agents = 2;
        },
    );
}

/// Two sub-agents run in the background (`run_in_background`): Claude Code answers each
/// `Agent` call at once, the main conversation goes on with its own steps while the
/// sub-agents run theirs (three conversations calling at once under one header), and each
/// report comes in a notification (a system message of its own, mid-conversation, or a
/// reminder in the next call's user message when the main conversation has ended its turn
/// waiting; Claude Code's print mode waits for its background agents). The main conversation
/// ends only once it can read both reports. Through compactd, handed over after step 3, the
/// reports come while the main conversation has steps to go and compacts: the summary keeps
/// them (before, the extractive summary dropped a system message's report, and the main
/// conversation waited for reports it had been given, in every run). Each conversation still
/// reaches the model with its own steps only, and nothing is refused.
#[test]
fn claude_code_hands_steps_to_two_sub_agents_in_the_background_through_compactd() {
    through_with(
        Agent::ClaudeCode,
        Model::new("claude-opus-5-5", 48_000, 2),
        |task| {
            task.delegate_after = Some(3);
            task.sub_agents = 2;
            task.background = true;
        },
    );
}

/// The same with Claude Code straight at the model API: the mock's background sub-agents
/// work with the real agent.
#[test]
fn claude_code_hands_steps_to_two_sub_agents_in_the_background_directly() {
    claude_code_hands_steps_to_two_directly(|task| task.background = true, false);
}

/// Claude Code forks itself (its `Agent` tool with `subagent_type: "fork"`, which it offers
/// the model by default): the fork's conversation is the parent's history, then the `Agent`
/// call answered "Fork started" beside the fork's directive, then the fork's own steps, under
/// the parent's `X-Claude-Code-Session-Id` and system prompt. Through compactd, at a window
/// that compacts both: the task ends right, nothing is refused, each conversation compacts
/// apart and reaches the model with its own steps only, and the fork keeps its directive
/// (the mock knows a fork by it: without it, the fork would take up the parent's steps).
/// Thinking off: with it on, Claude Code sends the forking call's message without the
/// thinking block that began it, which the mock refuses by the documented rule, compactd or
/// not (seen with Claude Code straight at it; whether the API itself does when the user
/// message adds text beside the results is not documented).
#[test]
fn claude_code_hands_steps_to_a_fork_of_itself_through_compactd() {
    through_forks(1);
}

/// Two forks at once (two `Agent` calls in one message): each fork's conversation holds its
/// own call only, so the two part at that call; the second is a session of its own, not a
/// branch of the first's.
#[test]
fn claude_code_hands_steps_to_two_forks_of_itself_through_compactd() {
    through_forks(2);
}

/// Claude Code, thinking off, through compactd to a model that has it fork `n` times.
fn through_forks(n: usize) {
    let model = Model {
        thinking: false,
        ..Model::new("claude-opus-5-5", 48_000, 2)
    };
    through_with(Agent::ClaudeCode, model, |task| {
        task.delegate_after = Some(10);
        task.sub_agents = n;
        task.fork_context = true;
    });
}

/// The same with Claude Code straight at the model API: the mock's forks work with the real
/// agent.
#[test]
fn claude_code_hands_steps_to_two_forks_of_itself_directly() {
    claude_code_hands_steps_to_two_directly(|task| task.fork_context = true, false);
}

/// Claude Code names a sub-agent (a fork too) in its calls' `x-claude-code-agent-id`, Codex
/// in its `thread-id`: one id for all of a sub-agent's calls, another for each, none in the
/// main conversation's calls (Codex: its conversation header's own value). compactd keys a
/// sub-agent's session by it.
fn each_sub_agent_names_itself(seen: &[Seen], n: usize, header: &str) {
    if seen.is_empty() {
        return;
    }
    let mut ids: std::collections::BTreeMap<char, std::collections::BTreeSet<String>> =
        Default::default();
    for s in seen.iter().filter(|s| s.body["tools"].is_array()) {
        let id = s.header(header).map(str::to_string);
        match sub_agent_of_call(s) {
            Some(name) => {
                let id = id.unwrap_or_else(|| panic!("sub-agent {name}'s call names no agent"));
                ids.entry(name).or_default().insert(id);
            }
            None => assert!(
                id.is_none() || id.as_deref() == s.header("session-id"),
                "a main call names an agent: {id:?}"
            ),
        }
    }
    assert_eq!(ids.len(), n, "{ids:?}");
    assert!(ids.values().all(|i| i.len() == 1), "{ids:?}");
    let distinct: std::collections::BTreeSet<_> = ids.values().flatten().collect();
    assert_eq!(distinct.len(), n, "{ids:?}");
}

/// Every step's call comes with a second one beside it in the same answer (`echo SIDE-k`),
/// which the agent runs in parallel and sends back as two results: through compactd, with
/// its compactions, each result stays with its call (the model API refuses a result without
/// its call, or a call without its result), and the task ends as it should.
fn through_with_parallel_calls(agent: Agent, model: Model) {
    let seen = through_with(agent, model, |task| task.parallel_calls = true);
    if let Some(last) = seen.iter().rev().find(|s| s.body["tools"].is_array()) {
        assert!(
            last.body.to_string().contains("SIDE-20"),
            "the side call of the last step went up"
        );
    }
}

/// Two `tool_use` blocks in one message, answered in one message of two `tool_result`s.
#[test]
fn claude_code_with_parallel_calls_runs_the_task_through_compactd() {
    through_with_parallel_calls(Agent::ClaudeCode, Model::new("claude-opus-5-5", 48_000, 2));
}

/// Two `function_call` items in one response (the Responses API's parallel calls), answered
/// by two `function_call_output` items.
#[test]
fn codex_with_parallel_calls_runs_the_task_through_compactd() {
    through_with_parallel_calls(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2));
}

/// Chat Completions' `tool_calls` of two, answered by two `tool` messages.
#[test]
fn opencode_with_parallel_calls_runs_the_task_through_compactd() {
    through_with_parallel_calls(Agent::Opencode, Model::new("mock-model", 32_000, 2));
}

/// The same task with Claude Code straight at the model API: the mock's sub-agents work with
/// the real agent.
#[test]
fn claude_code_hands_steps_to_two_sub_agents_directly() {
    claude_code_hands_steps_to_two_directly(|_| {}, true);
}

/// Claude Code, `thinking` or not, straight at the model API, handing steps to two sub-agents
/// after step 10 as `change` has it (forks, in the background): each conversation reaches the
/// model with its own steps only, and each sub-agent names itself in its calls.
fn claude_code_hands_steps_to_two_directly(change: impl FnOnce(&mut Task), thinking: bool) {
    let mut task = Task {
        delegate_after: Some(10),
        sub_agents: 2,
        ..Task::default()
    };
    change(&mut task);
    // A fork starts from its parent's whole history, steps and all.
    let inherited = if task.fork_context { 10 } else { 0 };
    let seen = direct_thinking(Agent::ClaudeCode, "claude-opus-5-5", task, thinking);
    each_conversation_its_own(&seen, 2, inherited);
    each_sub_agent_names_itself(&seen, 2, "x-claude-code-agent-id");
}

/// Codex hands steps to a sub-agent (`spawn_agent`, then `wait_agent`): the sub-agent's
/// thread calls the model under the same `session-id` header, instructions and preamble as
/// the main one, then its own task, and compactd holds it as a session of its own. Through
/// compactd: the task ends right, nothing is refused, each thread compacts apart and gets
/// its own messages only (before, its task was summarized away and it ran in circles).
#[test]
fn codex_hands_steps_to_a_sub_agent_through_compactd() {
    through_with(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2), |task| {
        task.delegate_after = Some(10)
    });
}

/// Two sub-agents at once (two `spawn_agent` calls in one answer, then `wait_agent` until
/// both finished).
#[test]
fn codex_hands_steps_to_two_sub_agents_at_once_through_compactd() {
    through_with(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2), |task| {
        task.delegate_after = Some(10);
        task.sub_agents = 2;
    });
}

/// A sub-agent spawned with `fork_context`: Codex gives it the main conversation's preamble
/// and task, then its own task. compactd holds it as a session of its own, forked where it
/// leaves the main conversation (its task pinned there), not as a branch of the main one,
/// where its task would be a message like any other, summarized away at its first
/// compaction (it ran in circles: 1,197 calls in 400 s, before).
#[test]
fn codex_hands_steps_to_a_sub_agent_with_its_context_through_compactd() {
    through_with(Agent::Codex, Model::new("gpt-5-codex", 40_000, 2), |task| {
        task.delegate_after = Some(10);
        task.fork_context = true;
    });
}

/// The same straight at the model API.
#[test]
fn codex_hands_steps_to_a_sub_agent_with_its_context_directly() {
    let task = Task {
        delegate_after: Some(10),
        fork_context: true,
        ..Task::default()
    };
    let seen = direct_with(Agent::Codex, "gpt-5-codex", task);
    each_conversation_its_own(&seen, 1, 0);
}

/// The same with Codex straight at the model API: the mock's `spawn_agent` and `wait_agent`
/// work with the real agent.
#[test]
fn codex_hands_steps_to_two_sub_agents_directly() {
    let task = Task {
        delegate_after: Some(10),
        sub_agents: 2,
        ..Task::default()
    };
    let seen = direct_with(Agent::Codex, "gpt-5-codex", task);
    each_conversation_its_own(&seen, 2, 0);
    each_sub_agent_names_itself(&seen, 2, "thread-id");
}

/// opencode hands steps to a sub-agent (its `task` tool): the sub-agent is a session of
/// opencode's own, with its own `x-session-id`. Through compactd: the task ends right,
/// nothing is refused, each conversation compacts apart and gets its own messages only.
#[test]
fn opencode_hands_steps_to_a_sub_agent_through_compactd() {
    through_with(
        Agent::Opencode,
        Model::new("mock-model", 32_000, 2),
        |task| task.delegate_after = Some(10),
    );
}

/// Two at once (two `task` calls in one answer).
#[test]
fn opencode_hands_steps_to_two_sub_agents_at_once_through_compactd() {
    through_with(
        Agent::Opencode,
        Model::new("mock-model", 32_000, 2),
        |task| {
            task.delegate_after = Some(10);
            task.sub_agents = 2;
        },
    );
}

/// The same with opencode straight at the model API: the mock's `task` calls work with the
/// real agent.
#[test]
fn opencode_hands_steps_to_two_sub_agents_directly() {
    let task = Task {
        delegate_after: Some(10),
        sub_agents: 2,
        ..Task::default()
    };
    let seen = direct_with(Agent::Opencode, "mock-model", task);
    each_conversation_its_own(&seen, 2, 0);
}

/// The sub-agent a call is of, by the task handed to it; `None` for the main conversation.
fn sub_agent_of_call(s: &Seen) -> Option<char> {
    let messages = s.body["messages"].as_array().cloned().unwrap_or_default();
    match s.body["input"].as_array() {
        Some(items) => crate::common::model_api::responses::sub_agent_in(items),
        None if s.path.ends_with("/chat/completions") => {
            crate::common::model_api::chat::sub_agent_of(&messages)
        }
        None => crate::common::model_api::messages::sub_agent_of(&messages),
    }
}

/// What every run with `n` sub-agents shows: each ran its steps; no call of one conversation
/// carries another's steps (a sub-agent's in the main conversation or in the other
/// sub-agent's, the main conversation's in a sub-agent's, but for the first `inherited`, which
/// a fork has from its parent); the main conversation handed its steps over once and went on
/// from the reports.
fn each_conversation_its_own(seen: &[Seen], n: usize, inherited: usize) {
    use crate::common::model_api::delegation::{SUB_AGENTS, SUB_STEPS};
    if seen.is_empty() {
        return;
    }
    let with_tools: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.body["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .collect();
    let mut main = Vec::new();
    let mut subs: std::collections::BTreeMap<char, Vec<&Seen>> = Default::default();
    for s in with_tools {
        match sub_agent_of_call(s) {
            Some(name) => subs.entry(name).or_default().push(s),
            None => main.push(s),
        }
    }
    assert_eq!(subs.len(), n, "sub-agents that ran: {:?}", subs.keys());
    for (name, calls) in &subs {
        assert!(
            calls.len() > SUB_STEPS,
            "sub-agent {name}: {} calls",
            calls.len()
        );
        for s in calls {
            let body = s.body.to_string();
            let after = format!("STEP-{}-BEGIN", inherited + 1);
            assert!(
                !body.contains(&after),
                "a main step in sub-agent {name}'s call: {after}"
            );
            for other in SUB_AGENTS.iter().filter(|o| *o != name) {
                let leak = format!("SUB{other}-");
                assert!(
                    !body.contains(&leak),
                    "sub-agent {other}'s step in sub-agent {name}'s call: {}",
                    body.find(&leak).map_or("", |at| &body
                        [at.saturating_sub(1500)..(at + 300).min(body.len())])
                );
            }
        }
    }
    for s in &main {
        let body = s.body.to_string();
        for name in SUB_AGENTS {
            assert!(
                !body.contains(&format!("SUB{name}-1-BEGIN")),
                "sub-agent {name}'s step in the main conversation"
            );
        }
    }
    // Claude Code's `Agent` calls, Codex's `spawn_agent` calls, opencode's `task` calls.
    let handed: std::collections::HashSet<&str> = main
        .iter()
        .flat_map(|s| {
            let messages = s.body["messages"].as_array().into_iter().flatten();
            let blocks = messages.clone().flat_map(|m| {
                let content = m["content"].as_array().into_iter().flatten();
                content.chain(m["tool_calls"].as_array().into_iter().flatten())
            });
            blocks.chain(s.body["input"].as_array().into_iter().flatten())
        })
        .filter(|b| match b["type"].as_str() {
            Some("tool_use") => b["name"] == "Agent",
            Some("function_call") => b["name"] == "spawn_agent",
            Some("function") => b["function"]["name"] == "task",
            _ => false,
        })
        .filter_map(|b| b["id"].as_str().or(b["call_id"].as_str()))
        .collect();
    assert_eq!(handed.len(), n, "calls handing steps over: {handed:?}");
}

/// Claude Code through compactd while the disk under compactd's database fills in the middle
/// of its task: the agent finishes the task all the same and the model API refuses nothing
/// (the calls after the disk filled went upstream unrecorded, from the stored context plus
/// the newer messages), what was stored before stays, and the log says the full disk once.
#[test]
fn claude_code_finishes_its_task_through_compactd_when_the_disk_fills() {
    if installed(Agent::ClaudeCode).is_none() {
        return;
    }
    let Some(disk) = crate::common::SmallDisk::mount("16m") else {
        eprintln!("SKIP: cannot mount a tmpfs here (needs root)");
        return;
    };
    let api = ModelApi::start(Task::default());
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n",
        base = api.base,
    );
    let daemon = crate::common::TestDaemon::builder()
        .db(disk.mount.join("compactd.db"))
        .config(&config)
        .start();
    // Room for the first few steps only.
    let _filler = disk.fill_leaving(128 * 1024);
    let dir = tempfile::TempDir::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let setup = Setup {
        agent: Agent::ClaudeCode,
        base: &base,
        model: "claude-opus-5-5",
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-full-disk",
        max_output: Some(AGENTS_MAX_OUTPUT),
        thinking: true,
        task_tools: false,
    };
    let result = run(&setup, Duration::from_secs(400));
    let log = daemon.log();
    result.assert_done(&format!("daemon log:\n{log}"));
    assert!(api.refused().is_empty(), "{:?}", api.refused());
    assert_eq!(
        log.matches("the disk holding the database is full: writes are refused")
            .count(),
        1,
        "{log}"
    );
    // What the model got last (the whole conversation) against what the session stored.
    let (stored, sent) = stored_and_sent_last(&daemon, &api);
    assert!(stored >= 1 && stored < sent, "{stored} stored, {sent} sent");
}

/// After a run of Claude Code's through `daemon` (one conversation, no answer it could not
/// record: the log says so): how many messages its session stored, and how many the model
/// got in the last call of the conversation.
fn stored_and_sent_last(daemon: &crate::common::TestDaemon, api: &ModelApi) -> (u64, u64) {
    let log = daemon.log();
    assert!(!log.contains("could not record"), "{log}");
    let sessions = sessions(daemon);
    let main: Vec<_> = sessions.iter().filter(|s| s.1 == "proxy").collect();
    assert_eq!(main.len(), 1, "{sessions:?}");
    let last = api
        .seen()
        .into_iter()
        .rfind(|s| s.path.ends_with("/messages") && s.body["model"] == "claude-opus-5-5")
        .unwrap();
    let sent = last.body["messages"].as_array().unwrap().len() as u64;
    eprintln!("stored {} of the {sent} messages sent last", main[0].3);
    (main[0].3, sent)
}

/// Claude Code through compactd while a person's `sqlite3` transaction holds the database's
/// write lock (taken before the daemon started: while it runs, it holds the lock itself), let
/// go in the middle of the task: the agent finishes, the model API refuses nothing (the calls
/// under the lock went upstream unrecorded, at once), and once the lock is let go the session
/// stores the whole conversation the agent sent last. (At first, each call under the lock
/// answered 503 `busy`: Claude Code retried for 207 s, then stopped with `API Error: 503`;
/// then each waited the 2 s a write waits for a lock, and the run took 14 s.)
#[test]
fn claude_code_finishes_its_task_through_compactd_while_a_person_holds_the_write_lock() {
    if installed(Agent::ClaudeCode).is_none() {
        return;
    }
    let api = ModelApi::start(Task::default());
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n",
        base = api.base,
    );
    let mut daemon = crate::common::TestDaemon::builder().config(&config).start();
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let dir = tempfile::TempDir::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let setup = Setup {
        agent: Agent::ClaudeCode,
        base: &base,
        model: "claude-opus-5-5",
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-locked",
        max_output: Some(AGENTS_MAX_OUTPUT),
        thinking: true,
        task_tools: false,
    };
    // The person lets go once the model has answered this many calls (or the agent ended).
    let under_lock = 6;
    let ended = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        let (api, ended) = (&api, &ended);
        scope.spawn(move || {
            while api.seen().len() < under_lock && !ended.load(std::sync::atomic::Ordering::Relaxed)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            person.execute_batch("ROLLBACK").unwrap();
        });
        let result = run(&setup, Duration::from_secs(400));
        ended.store(true, std::sync::atomic::Ordering::Relaxed);
        result
    });
    result.assert_done(&format!("daemon log:\n{}", daemon.log()));
    assert!(api.refused().is_empty(), "{:?}", api.refused());
    // The last call's messages and its answer, all stored once writes went on.
    let (stored, sent) = stored_and_sent_last(&daemon, &api);
    assert!(stored > sent, "{stored} stored, {sent} sent last");
}

/// Claude Code through compactd on a model of a 48,000-token window, its task longer than
/// that (20 outputs of about 4,000 tokens each), while a person's `sqlite3` transaction holds
/// the database's write lock all along: nothing can be stored, and the agent still finishes,
/// never seeing a refusal. Its calls past the session's trigger are compacted in memory,
/// unrecorded, from its whole conversation (nothing of it was stored), at the rate the model's
/// usage reports of the earlier calls taught. Before, each call past the window went as the
/// agent sent it past the stored context, and was refused: 15 refusals in a run, each passed to
/// the agent.
#[test]
fn claude_code_finishes_a_task_longer_than_its_window_while_a_person_holds_the_write_lock() {
    finishes_a_long_task_while_a_person_holds_the_write_lock(Agent::ClaudeCode, "claude-opus-5-5");
}

/// The same with Codex, whose calls go through the Responses API: its in-memory compactions
/// are rendered to that wire, and the model takes every call.
#[test]
fn codex_finishes_a_task_longer_than_its_window_while_a_person_holds_the_write_lock() {
    finishes_a_long_task_while_a_person_holds_the_write_lock(Agent::Codex, "gpt-5-codex");
}

/// `agent` on model `name` of a 48,000-token window, through compactd whose database's write
/// lock another process holds throughout: the task is done, no call refused, nothing stored.
fn finishes_a_long_task_while_a_person_holds_the_write_lock(agent: Agent, name: &str) {
    if installed(agent).is_none() {
        return;
    }
    let window = 48_000;
    let mut task = Task {
        lines: 1_500,
        chars_per_token: 2,
        ..Task::default()
    };
    task.windows.insert(name.to_string(), window);
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\nanthropic_upstream = \"{base}\"\n\n[proxy.models]\n\"{name}\" = {window}\n",
        base = api.base,
    );
    let mut daemon = crate::common::TestDaemon::builder().config(&config).start();
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let dir = tempfile::TempDir::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let setup = Setup {
        agent,
        base: &base,
        model: name,
        dir: dir.path(),
        prompt: PROMPT,
        key: "sk-test-locked-long",
        max_output: Some(AGENTS_MAX_OUTPUT),
        thinking: agent == Agent::ClaudeCode,
        task_tools: false,
    };
    let result = run(&setup, Duration::from_secs(400));
    let log = daemon.log();
    let seen = api.seen();
    eprintln!(
        "{} under a held lock: {} requests, tokens {:?}",
        agent.name(),
        seen.len(),
        seen.iter().map(|s| s.tokens).collect::<Vec<_>>()
    );
    result.assert_done(&format!("daemon log:\n{log}"));
    // No refusal: the usage the model reported of the calls before the trigger taught
    // compactd how it counts, as a recorded session learns it.
    let refused = api.refused();
    assert!(refused.is_empty(), "{refused:?}");
    assert!(
        log.contains("an unrecorded call compacted in memory"),
        "{log}"
    );
    // Nothing stored: the lock was held throughout.
    assert!(sessions(&daemon).is_empty(), "{:?}", sessions(&daemon));
    drop(person);
}

/// Claude Code asking its own default completion, 32,000 tokens of a 100,000-token window
/// (compactd's own reserve is 20,000): compactd keeps it free beside every prompt, and the
/// Messages API never refuses a prompt for leaving it no room.
#[test]
fn claude_code_asking_its_default_completion_runs_the_task_through_compactd() {
    through(
        Agent::ClaudeCode,
        Model {
            max_output: None,
            thinking: true,
            ..Model::new("claude-sonnet-4-5", 100_000, 2)
        },
    );
}

/// Claude Code through compactd told a window twice the model's (a `[proxy.models]` entry, or
/// a table, that is wrong for the server actually behind it): the model refuses the first
/// call too long for it, compactd compacts that call and sends it again, and from then on
/// compacts under the window the refusal named. The agent never sees a refusal.
#[test]
fn claude_code_never_sees_a_refusal_when_compactd_was_told_too_large_a_window() {
    through(
        Agent::ClaudeCode,
        Model {
            told: 96_000,
            ..Model::new("claude-opus-5-5", 48_000, 2)
        },
    );
}

/// The same with two sub-agents: their sessions (one by its own system prompt, the other
/// its fork) start from the window the main conversation's refusal taught, so the model
/// refuses one call of the run.
#[test]
fn claude_code_sub_agents_start_from_the_window_compactd_learned_when_told_too_large_a_one() {
    let model = Model {
        told: 96_000,
        ..Model::new("claude-opus-5-5", 48_000, 2)
    };
    through_with(Agent::ClaudeCode, model, |task| {
        task.delegate_after = Some(10);
        task.sub_agents = 2;
    });
}

/// Codex the same way, over the Responses API, whose refusal names no window: the call is
/// compacted and sent again, and compactd takes its own count of it (by the model's reports)
/// as the limit; Codex never sees a refusal.
#[test]
fn codex_never_sees_a_refusal_when_compactd_was_told_too_large_a_window() {
    through(
        Agent::Codex,
        Model {
            told: 80_000,
            ..Model::new("gpt-5-codex", 40_000, 2)
        },
    );
}

/// The same with two sub-agents: each is a session of its own, which starts from the window
/// its parent's session learned, so the model refuses one call of the three conversations,
/// not one of each.
#[test]
fn codex_sub_agents_start_from_the_window_compactd_learned_when_told_too_large_a_one() {
    let model = Model {
        told: 80_000,
        ..Model::new("gpt-5-codex", 40_000, 2)
    };
    through_with(Agent::Codex, model, |task| {
        task.delegate_after = Some(10);
        task.sub_agents = 2;
    });
}

/// aider's rounds: `rounds` runs of `aider --message`, each restoring the chat history
/// aider keeps, each asking for one more function; returns the final `lib.py` and the runs.
fn aider_rounds(base: &str, dir: &std::path::Path, rounds: usize) -> (String, Vec<harness::Run>) {
    let mut runs = Vec::new();
    for k in 1..=rounds {
        let prompt = format!("Round {k}: add a function f{k}() to lib.py that returns {k}.");
        let setup = Setup {
            agent: Agent::Aider,
            base,
            model: "mock-aider",
            dir,
            prompt: &prompt,
            key: "sk-test-aider",
            max_output: Some(AGENTS_MAX_OUTPUT),
            thinking: true,
            task_tools: false,
        };
        let run = run(&setup, Duration::from_secs(120));
        assert!(run.ok(), "round {k}: {}", run.log());
        runs.push(run);
    }
    let lib = std::fs::read_to_string(dir.join("work/lib.py")).unwrap_or_default();
    (lib, runs)
}

#[test]
fn aider_runs_its_rounds_directly() {
    if installed(Agent::Aider).is_none() {
        return;
    }
    let api = ModelApi::start(Task::default());
    let dir = tempfile::TempDir::new().unwrap();
    let (lib, _) = aider_rounds(&api.base, dir.path(), 3);
    let refused = api.refused();
    eprintln!(
        "aider direct: {} requests, refused {refused:?}\n{lib}",
        api.seen().len()
    );
    assert!(refused.is_empty());
    assert!(
        lib.contains("def f3():") && lib.contains("    return 3\n"),
        "{lib}"
    );
}

#[test]
fn aider_runs_its_rounds_through_compactd_as_one_conversation() {
    if installed(Agent::Aider).is_none() {
        return;
    }
    const ROUNDS: usize = 17;
    const LIMIT: usize = 8_000;
    let mut task = Task::default();
    task.windows.insert("mock-aider".into(), LIMIT);
    let api = ModelApi::start(task);
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nopenai_upstream = \"{base}/v1\"\n\n[proxy.models]\n\"mock-aider\" = {LIMIT}\n\"mock-aider-weak\" = {LIMIT}\n",
        base = api.base
    );
    let daemon = crate::common::TestDaemon::start(&config);
    let dir = tempfile::TempDir::new().unwrap();
    let (lib, _) = aider_rounds(&format!("http://127.0.0.1:{port}"), dir.path(), ROUNDS);
    let seen = api.seen();
    let refused = api.refused();
    let sessions = sessions(&daemon);
    eprintln!(
        "aider through compactd: {} requests, refused {refused:?}\nsessions {sessions:?}\ntokens {:?}",
        seen.len(),
        seen.iter().map(|s| s.tokens).collect::<Vec<_>>()
    );
    assert!(refused.is_empty(), "{refused:?}\n{}", daemon.log());
    for k in 1..=ROUNDS {
        assert!(
            lib.contains(&format!("    return {k}\n")) && lib.contains(&format!("def f{k}():")),
            "round {k} missing:\n{lib}"
        );
    }
    let main: Vec<_> = sessions.iter().filter(|s| s.1 == "proxy").collect();
    let side: Vec<_> = sessions.iter().filter(|s| s.1 == "side").collect();
    assert_eq!(main.len(), 1, "one conversation: {sessions:?}");
    assert!(
        side.len() <= 1,
        "at most one more session for side calls: {sessions:?}"
    );
    assert!(main[0].2 >= 1, "the conversation compacted: {sessions:?}");
    for s in &seen {
        assert!(s.tokens <= LIMIT, "a request of {} tokens", s.tokens);
    }
    // After the first compaction, every main call still carries the user's real request,
    // never aider's few-shot example as the task.
    let compacted: Vec<&crate::common::model_api::Seen> = seen
        .iter()
        .filter(|s| {
            s.model() == "mock-aider" && s.body.to_string().contains("## 1. Primary Request")
        })
        .collect();
    assert!(!compacted.is_empty());
    for s in compacted {
        let body = s.body.to_string();
        let asked = s.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str())
            .find_map(|t| {
                t.find("Round ")
                    .map(|at| t[at..].split(':').next().unwrap().to_string())
            });
        assert!(asked.is_some(), "the round's request is gone: {body}");
        assert!(
            !body.contains("Original request: Change the greeting"),
            "a few-shot example taken for the task"
        );
    }
}
