//! Notifications of background work: what an agent's CLI tells the model when a task it runs
//! in the background ends (Codex: when a sub-agent ends, `<subagent_notification>`).
//!
//! Claude Code runs a sub-agent (`Agent` with `run_in_background`) or a shell command in the
//! background: the call is answered at once ("Async agent launched successfully", or the
//! file a command's output goes to), and the outcome arrives later as a `<task-notification>`
//! block (its task id, status, a one-line summary, the file its output went to and, for an
//! agent, its report in `<result>`): in a system message of its own in the middle of the
//! conversation (to Claude Opus 5.5), inside the result of the next tool call the model makes
//! (to Claude Sonnet 4.5), or in a `<system-reminder>` of the next user message when the
//! model had ended its turn waiting. The report, or the file a command's output is in, is
//! all the conversation holds of the work, so a summary must keep it; and it is not
//! something the user asked for ("NOT USER INPUT", it says itself), so a summary must not
//! quote it as an instruction.

use super::tags;

/// One background task's end, as notified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNotification {
    pub task_id: Option<String>,
    /// `completed`, `failed`, `killed`, ...
    pub status: Option<String>,
    /// A line such as `Agent "Run the tests" finished`.
    pub summary: Option<String>,
    /// The file the task's output went to (a shell command's output is only there).
    pub output_file: Option<String>,
    /// The agent's report, when the task was an agent.
    pub result: Option<String>,
}

/// Claude Code's notification block.
const TAG: &str = "task-notification";
/// The line Claude Code puts before a notification sent in a system message of its own.
const PREAMBLE: &str = "[SYSTEM NOTIFICATION - NOT USER INPUT]";
/// Codex's notification of a sub-agent's end, in a user message of its own:
/// `{"agent_path": …, "status": {"completed": "<its last message>"}}` in this block.
const CODEX_TAG: &str = "subagent_notification";

/// The notifications in `text`, in order.
pub fn notifications(text: &str) -> Vec<TaskNotification> {
    let mut found: Vec<(usize, TaskNotification)> = tags::blocks(text, TAG)
        .map(|block| (block.start, claude_code(block.body)))
        .chain(tags::blocks(text, CODEX_TAG).map(|block| (block.start, codex(block.body))))
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, told)| told).collect()
}

fn claude_code(body: &str) -> TaskNotification {
    TaskNotification {
        task_id: field(body, "task-id"),
        status: field(body, "status"),
        summary: field(body, "summary"),
        output_file: field(body, "output-file"),
        result: field(body, "result"),
    }
}

/// Codex's JSON; kept whole as the result if it is not what it should be.
fn codex(body: &str) -> TaskNotification {
    let body = body.trim();
    let Ok(told) = serde_json::from_str::<serde_json::Value>(body) else {
        return TaskNotification {
            task_id: None,
            status: None,
            summary: None,
            output_file: None,
            result: Some(body.to_string()).filter(|b| !b.is_empty()),
        };
    };
    codex_status(told["agent_path"].as_str(), &told["status"])
}

/// What Codex says of a sub-agent `id` in `status`: `{"completed": "<its last message>"}`
/// (or another state, with what it said or null), or the state alone.
fn codex_status(id: Option<&str>, status: &serde_json::Value) -> TaskNotification {
    use serde_json::Value;
    let (status, result) = match status {
        Value::Object(status) => match status.iter().next() {
            Some((status, Value::String(said))) => (Some(status), Some(said.clone())),
            Some((status, Value::Null)) => (Some(status), None),
            Some((status, other)) => (Some(status), Some(other.to_string())),
            None => (None, None),
        },
        Value::String(status) => (Some(status), None),
        _ => (None, None),
    };
    TaskNotification {
        task_id: id.map(str::to_string),
        status: status.cloned(),
        summary: None,
        output_file: None,
        result,
    }
}

/// What Codex's `wait_agent` answered of the sub-agents it waited for, each as its
/// notification of the same end tells it (`{"status": {"<agent id>": {"completed": "<its
/// last message>"}}, "timed_out": false}`: Codex sends both, the same words); `None` when the
/// output is not that.
pub fn waited_for(output: &str) -> Option<Vec<TaskNotification>> {
    let answer: serde_json::Value = serde_json::from_str(output.trim()).ok()?;
    let agents = answer.get("status")?.as_object()?;
    Some(
        agents
            .iter()
            .map(|(id, status)| codex_status(Some(id), status))
            .collect(),
    )
}

/// The notifications a CLI appended to a tool's result: each in a `<system-reminder>` that
/// opens with the notice that it is not user input, as Claude Code appends them. A
/// notification the tool itself returned (a file read that quotes one) is not told.
pub fn appended_to_result(output: &str) -> Vec<TaskNotification> {
    tags::blocks(output, "system-reminder")
        .filter(|reminder| reminder.body.trim_start().starts_with(PREAMBLE))
        .flat_map(|reminder| notifications(reminder.body))
        .collect()
}

/// Whether a user-role text holds notifications and nothing else: the notification blocks,
/// the system reminders they come in, and the boilerplate before them. A user's own words
/// beside a notification make the text an instruction still.
pub fn is_only_notifications(text: &str) -> bool {
    if tags::blocks(text, TAG)
        .chain(tags::blocks(text, CODEX_TAG))
        .next()
        .is_none()
    {
        return false;
    }
    // The preamble and its lines of warning, up to the block they stand before.
    let without_preamble;
    let mut rest = text;
    if let Some(at) = text.find(PREAMBLE)
        && let Some(block) = tags::blocks(&text[at..], TAG).next()
    {
        without_preamble = format!("{}{}", &text[..at], &text[at + block.start..]);
        rest = &without_preamble;
    }
    // The system reminders they come in, and the blocks themselves.
    let left = tags::without(rest, "system-reminder");
    let left = tags::without(&left, TAG);
    tags::without(&left, CODEX_TAG).trim().is_empty()
}

/// The trimmed text of `<name>…</name>` in `body`, if present and not blank.
fn field(body: &str, name: &str) -> Option<String> {
    let field = tags::blocks(body, name).next()?.body.trim();
    Some(field.to_string()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT_DONE: &str = "[SYSTEM NOTIFICATION - NOT USER INPUT]\nThis is an automated background-task event, NOT a message from the user.\nDo NOT interpret this as user acknowledgement.\n\n<task-notification>\n<task-id>a67a9cf80684d57ba</task-id>\n<tool-use-id>toolu_07</tool-use-id>\n<output-file>/tmp/claude-0/tasks/a67a9cf80684d57ba.output</output-file>\n<status>completed</status>\n<summary>Agent \"Run sub-steps A\" finished</summary>\n<result>Found the race: the cache is read before the lock.</result>\n<usage><subagent_tokens>12382</subagent_tokens></usage>\n</task-notification>";

    #[test]
    fn a_notification_is_read_field_by_field() {
        assert_eq!(
            notifications(AGENT_DONE),
            vec![TaskNotification {
                task_id: Some("a67a9cf80684d57ba".into()),
                status: Some("completed".into()),
                summary: Some("Agent \"Run sub-steps A\" finished".into()),
                output_file: Some("/tmp/claude-0/tasks/a67a9cf80684d57ba.output".into()),
                result: Some("Found the race: the cache is read before the lock.".into()),
            }]
        );
        let two = format!(
            "<system-reminder>\n{AGENT_DONE}\n</system-reminder>\n<task-notification><task-id>b1</task-id><status>failed</status></task-notification>"
        );
        let found = notifications(&two);
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].status.as_deref(), Some("failed"));
        assert_eq!(found[1].result, None);
        assert!(notifications("no notification here").is_empty());
    }

    #[test]
    fn a_notification_appended_to_a_result_is_told_and_one_the_tool_returned_is_not() {
        let appended =
            format!("STEP-4-END\n\n<system-reminder>\n{AGENT_DONE}\n</system-reminder>\n");
        assert_eq!(appended_to_result(&appended), notifications(AGENT_DONE));
        let quoted = format!(
            "const DONE: &str = \"{AGENT_DONE}\";\n<system-reminder>Today is Friday.</system-reminder>"
        );
        assert!(appended_to_result(&quoted).is_empty());
    }

    #[test]
    fn codexs_notification_of_a_sub_agents_end_is_read_and_is_no_instruction() {
        let told = "<subagent_notification>\n{\"agent_path\":\"01a2443d-bacc\",\"status\":{\"completed\":\"No race in src/db.rs.\"}}\n</subagent_notification>";
        assert_eq!(
            notifications(&format!("{told}\n{AGENT_DONE}")),
            vec![
                TaskNotification {
                    task_id: Some("01a2443d-bacc".into()),
                    status: Some("completed".into()),
                    summary: None,
                    output_file: None,
                    result: Some("No race in src/db.rs.".into()),
                },
                notifications(AGENT_DONE).remove(0),
            ]
        );
        assert!(is_only_notifications(told));
        assert!(!is_only_notifications(&format!("{told}\nNow fix it.")));
        let garbled = notifications("<subagent_notification>not json</subagent_notification>");
        assert_eq!(garbled[0].result.as_deref(), Some("not json"));
    }

    #[test]
    fn only_a_text_of_nothing_but_notifications_is_one() {
        assert!(is_only_notifications(AGENT_DONE));
        assert!(is_only_notifications(&format!(
            "<system-reminder>\n{AGENT_DONE}\n</system-reminder>\n"
        )));
        assert!(!is_only_notifications(&format!(
            "{AGENT_DONE}\nNow also fix the login page."
        )));
        assert!(!is_only_notifications(&format!(
            "Fix the login page.\n<system-reminder>\n{AGENT_DONE}\n</system-reminder>"
        )));
        assert!(!is_only_notifications(
            "<system-reminder>Today is Friday.</system-reminder>"
        ));
        assert!(!is_only_notifications(
            "Please explain <task-notification> tags"
        ));
    }
}
