//! A task handed to sub-agents, as the mock models play it: once step
//! [`Task::delegate_after`] is done, the main conversation hands [`SUB_STEPS`] steps to each of
//! [`Task::sub_agents`] sub-agents (Claude Code's `Agent` tool, Codex's `spawn_agent`). A
//! sub-agent's conversation is the one whose task is [`subtask`]: it runs its steps
//! (`SUBA-k-BEGIN` ... `SUBA-k-END` for the first), then reports; the report ends with the
//! step the main conversation handed over after, so the main conversation goes on from there.
//! The main conversation gives its final answer only while its context still holds every
//! sub-agent's report (a tool's result, a notification, or a summary that kept it), as a
//! model would need it to; otherwise it says it lost one ([`LOST`]), or, its sub-agents
//! running in the background ([`Task::background`]), that it waits for them ([`WAITING`]).

use super::{Action, Task, decide};

/// The task handed to a sub-agent, before the name of its steps.
pub const SUBTASK: &str = "SUBTASK: run the sub-steps the model gives you with your shell tool, one per step, until it says they are done.";
/// How a sub-agent's report begins, which tells the main conversation its steps are done.
pub const SUBTASK_DONE: &str = "SUBTASK-DONE";
/// The sub-agents' names, in the order they are handed their steps.
pub const SUB_AGENTS: [char; 2] = ['A', 'B'];
/// The steps each sub-agent runs.
pub const SUB_STEPS: usize = 8;

/// The task that hands sub-agent `name` its steps.
pub fn subtask(name: char) -> String {
    format!("{SUBTASK} Your steps are named SUB{name}.")
}

/// The sub-agent a text hands its task to, if it is such a task.
pub fn named(text: &str) -> Option<char> {
    let at = text.find(SUBTASK)? + SUBTASK.len();
    let named = text[at..].find("named SUB")? + at + "named SUB".len();
    text[named..].chars().next()
}

/// A sub-agent's next turn.
pub enum SubTurn {
    Run { step: usize, command: String },
    Report(String),
}

/// What sub-agent `name` does next, given the newest output it sees.
pub fn sub_turn(task: &Task, name: char, newest: Option<&str>) -> SubTurn {
    let prefix = format!("SUB{name}-");
    let done = newest
        .and_then(|o| super::last_end(o, &prefix))
        .unwrap_or(0);
    if done >= SUB_STEPS {
        let after = task.delegate_after.unwrap_or(0);
        return SubTurn::Report(format!(
            "{SUBTASK_DONE} {name}: {prefix}{done}-END seen; resume after STEP-{after}-END"
        ));
    }
    let step = done + 1;
    SubTurn::Run {
        step,
        command: format!(
            "echo {prefix}{step}-BEGIN; seq 1 {} | tr 0-9 a-j; echo {prefix}{step}-END",
            task.lines
        ),
    }
}

/// A conversation's next turn where handing steps over is one call per sub-agent and the
/// reports come back as those calls' results (Claude Code's `Agent` tool, opencode's `task`):
/// the task's next step ([`decide`]); once step [`Task::delegate_after`] is done, the calls
/// handing steps over; in a sub-agent's own conversation (`sub_agent`), its sub-steps, then
/// its report.
pub enum Turn {
    Act(Action),
    Delegate,
    Sub { step: usize, command: String },
}

/// How Claude Code answers an `Agent` call run in the background (`run_in_background`): at
/// once, before the sub-agent has done anything; its report comes later, in a notification.
pub const LAUNCHED: &str = "Async agent launched successfully.";
/// What the main conversation says when its own steps are done and a sub-agent running in
/// the background has not reported yet.
pub const WAITING: &str = "Waiting for the sub-agents to report.";
/// What the main conversation says when its own steps are done and a sub-agent's report,
/// which it was given, is nowhere in its context (summarized away).
pub const LOST: &str = "A sub-agent's report is not in my context any more.";

/// The turn of a conversation whose newest tool output is `newest` (see [`Turn`]), the
/// sub-agents whose reports its context holds being `reported` ([`reported`]).
pub fn next_turn(
    task: &Task,
    sub_agent: Option<char>,
    newest: Option<&str>,
    shell: bool,
    reported: &[char],
) -> Turn {
    let Some(after) = task.delegate_after.filter(|_| shell) else {
        return Turn::Act(decide(task, newest, shell));
    };
    if let Some(name) = sub_agent {
        return match sub_turn(task, name, newest) {
            SubTurn::Run { step, command } => Turn::Sub { step, command },
            SubTurn::Report(text) => Turn::Act(Action::Finish(text)),
        };
    }
    // The sub-agents run in the background: the main conversation goes on with its own
    // steps, and ends only once every sub-agent has reported.
    if newest.is_some_and(|o| o.starts_with(LAUNCHED)) {
        return Turn::Act(decide(task, Some(&format!("STEP-{after}-END")), shell));
    }
    let handed = newest.is_some_and(|o| o.contains(SUBTASK_DONE));
    match decide(task, newest, shell) {
        Action::Run { step, .. } if step == after + 1 && !handed => Turn::Delegate,
        action @ Action::Finish(_) => Turn::Act(finish(task, reported, action)),
        action => Turn::Act(action),
    }
}

/// The main conversation's last answer once its own steps are done: its final answer when
/// it can read every sub-agent's report, else that it waits for them (in the background,
/// they may not have reported yet) or that it lost one (a report it was given, summarized
/// away without a trace).
pub fn finish(task: &Task, reported: &[char], done: Action) -> Action {
    match reported.len() >= task.sub_agents {
        true => done,
        false if task.background => Action::Text(WAITING.into()),
        false => Action::Finish(LOST.into()),
    }
}

/// The sub-agents whose reports a request holds anywhere (a tool's result, a notification,
/// a summary quoting them).
pub fn reported(body: &serde_json::Value) -> Vec<char> {
    let text = body.to_string();
    let mut names: Vec<char> = text
        .match_indices(SUBTASK_DONE)
        .filter_map(|(at, _)| text[at + SUBTASK_DONE.len()..].chars().nth(1))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}
