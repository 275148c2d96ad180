//! The built-in extractive summarizer: offline, deterministic, no model.
//!
//! It fills the nine sections from the conversation itself: the user's messages verbatim
//! (section 6 carries every one forward from the prior summary, so none is ever dropped),
//! the session's files, errors seen in tool results, the latest todo list, and the latest
//! assistant work. Everything but section 6 is bounded, so the summary stays much shorter than
//! what it replaces.

use super::{SummarizeError, Summarizer, SummaryRequest};
use crate::compaction::constants::MAX_TEXT_CHARS;
use crate::compaction::sections::{SUMMARY_SECTIONS, heading, split_sections};
use crate::compaction::truncate::truncate_chars;
use crate::compaction::{FileLists, LazyEstimator};
use crate::message::{Message, Part, Role};
use async_trait::async_trait;
use regex::Regex;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::LazyLock;

/// Files listed per kind in section 3 (all of them stay in the result's file lists).
const FILES_SHOWN: usize = 50;
/// Errors kept in section 4, newest last.
const ERRORS_KEPT: usize = 12;
/// Assistant notes kept in section 5, newest last.
const NOTES_KEPT: usize = 10;
/// Characters of the first user message quoted as the primary request.
const PRIMARY_REQUEST_CHARS: usize = 600;
/// Section 6 entries that are never shortened to meet the summary budget.
const RECENT_USER_MESSAGES_KEPT_WHOLE: usize = 10;

/// The extractive summarizer.
#[derive(Debug, Default, Clone)]
pub struct Extractive;

#[async_trait]
impl Summarizer for Extractive {
    fn name(&self) -> String {
        "extractive".into()
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        Ok(extractive_summary(request))
    }
}

/// Writes the nine-section summary of `request`.
pub fn extractive_summary(request: &SummaryRequest) -> String {
    let prior = request
        .prior_summary
        .as_deref()
        .map(split_sections)
        .unwrap_or_default();
    // A prior summary without our headings (another summarizer's prose) is kept whole.
    let unstructured_prior = request
        .prior_summary
        .as_deref()
        .filter(|p| !p.trim().is_empty() && prior.iter().all(Option::is_none));
    let messages = &request.messages;

    let mut user_messages = UserMessages::carried(prior[5].as_deref());
    for m in messages.iter().filter(|m| m.is_user_text()) {
        user_messages.push(&m.joined_text());
    }

    let bodies = |user_section: String| -> [String; 9] {
        [
            primary_request(prior[0].as_deref(), messages, request.focus.as_deref()),
            key_concepts(prior[1].as_deref(), messages, &request.files),
            files_section(&request.files),
            errors_section(prior[3].as_deref(), messages),
            problem_solving(prior[4].as_deref(), unstructured_prior, messages),
            user_section,
            pending_tasks(prior[6].as_deref(), messages),
            current_work(messages),
            next_step(messages),
        ]
    };
    let estimator = LazyEstimator::default();
    let mut summary = render(&bodies(user_messages.render()));
    if let Some(budget) = request.max_summary_tokens {
        for cut in [500, 200, 80] {
            if estimator.text(&summary) <= budget {
                break;
            }
            user_messages.shorten_older(cut);
            summary = render(&bodies(user_messages.render()));
        }
        // Thousands of user messages: even shortened they would crowd out the conversation.
        // The oldest then stand as a pointer to the stored history, where they remain whole.
        while estimator.text(&summary) > budget && user_messages.collapse_oldest() {
            summary = render(&bodies(user_messages.render()));
        }
    }
    summary
}

fn render(bodies: &[String; 9]) -> String {
    let mut out = String::new();
    for (section, body) in SUMMARY_SECTIONS.iter().zip(bodies) {
        let body = if body.trim().is_empty() {
            "(none)"
        } else {
            body.trim_end()
        };
        let _ = write!(out, "{}\n{}\n\n", heading(section), body);
    }
    out.truncate(out.trim_end().len());
    out
}

fn primary_request(prior: Option<&str>, messages: &[Message], focus: Option<&str>) -> String {
    let mut out = match prior.filter(|p| !p.trim().is_empty() && p.trim() != "(none)") {
        Some(prior) => prior.to_string(),
        None => messages
            .iter()
            .find(|m| m.is_user_text())
            // Section 6 holds it whole; here its opening says what the session is for.
            .map(|m| truncate_chars(m.joined_text().trim(), PRIMARY_REQUEST_CHARS).into_owned())
            .unwrap_or_default(),
    };
    if let Some(focus) = focus.map(str::trim).filter(|f| !f.is_empty()) {
        let _ = write!(out, "\nFocus requested for this compaction: {focus}");
    }
    out
}

fn key_concepts(prior: Option<&str>, messages: &[Message], files: &FileLists) -> String {
    const TOOLS: &str = "- Tools used: ";
    const TYPES: &str = "- File types touched: ";
    let mut tools: BTreeSet<String> = prior
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix(TOOLS)))
        .map(|l| l.split(", ").map(str::to_string).collect())
        .unwrap_or_default();
    for part in messages.iter().flat_map(|m| &m.parts) {
        if let Part::ToolCall { name, .. } = part {
            tools.insert(name.clone());
        }
    }
    let extensions: BTreeSet<&str> = files
        .read
        .iter()
        .chain(&files.modified)
        .filter_map(|p| p.rsplit('/').next()?.rsplit_once('.').map(|(_, ext)| ext))
        .filter(|ext| !ext.is_empty() && ext.len() <= 10)
        .collect();
    let mut out = String::new();
    if !tools.is_empty() {
        let _ = writeln!(
            out,
            "{TOOLS}{}",
            tools.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    if !extensions.is_empty() {
        let list: Vec<String> = extensions.iter().map(|e| format!(".{e}")).collect();
        let _ = writeln!(out, "{TYPES}{}", list.join(", "));
    }
    out
}

fn files_section(files: &FileLists) -> String {
    let mut out = String::new();
    for (label, list) in [("Modified", &files.modified), ("Read", &files.read)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{label}:");
        for path in list.iter().take(FILES_SHOWN) {
            let _ = writeln!(out, "- {path}");
        }
        if list.len() > FILES_SHOWN {
            let _ = writeln!(out, "- … and {} more", list.len() - FILES_SHOWN);
        }
    }
    out
}

static FAILURE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?m)Traceback \(most recent call last\)|^\s*error(\[E\d+\])?:|\b[A-Z]\w*Error\b|",
        r"\bFAILED\b|panicked at|command not found|No such file or directory|",
        r"<returncode>[1-9]\d*</returncode>|[Ee]xit (code|status):? [1-9]"
    ))
    .expect("valid regex")
});

/// Whether a tool output reports a failure (when the tool did not flag it as an error).
pub fn reports_failure(output: &str) -> bool {
    let head = truncate_chars(output, 4_000);
    FAILURE.is_match(&head)
}

fn errors_section(prior: Option<&str>, messages: &[Message]) -> String {
    let mut entries: Vec<String> = bullet_lines(prior);
    let names = crate::compaction::prompt::call_names(messages);
    for (i, message) in messages.iter().enumerate() {
        for part in &message.parts {
            let Part::ToolResult {
                call_id,
                name,
                output,
                is_error,
            } = part
            else {
                continue;
            };
            if !*is_error && !reports_failure(output) {
                continue;
            }
            let tool = name
                .as_deref()
                .or_else(|| names.get(call_id.as_str()).copied())
                .unwrap_or("tool");
            let line = failure_line(output);
            let mut entry = format!("- {tool}: {}", truncate_chars(&line, 200));
            if let Some(fix) = messages[i + 1..]
                .iter()
                .find(|m| m.role == Role::Assistant && !m.joined_text().trim().is_empty())
            {
                let _ = write!(
                    entry,
                    " → then: {}",
                    truncate_chars(first_line(&fix.joined_text()), 200)
                );
            }
            entries.push(entry);
        }
    }
    keep_last(entries, ERRORS_KEPT)
}

fn failure_line(output: &str) -> String {
    let head = truncate_chars(output, 4_000);
    let line = FAILURE
        .find(&head)
        .map(|m| {
            let start = head[..m.start()].rfind('\n').map_or(0, |i| i + 1);
            let end = head[m.start()..]
                .find('\n')
                .map_or(head.len(), |i| m.start() + i);
            head[start..end].trim().to_string()
        })
        .unwrap_or_else(|| first_line(&head).to_string());
    if line.is_empty() {
        first_line(&head).to_string()
    } else {
        line
    }
}

fn problem_solving(
    prior: Option<&str>,
    unstructured: Option<&str>,
    messages: &[Message],
) -> String {
    let mut entries = bullet_lines(prior);
    if let Some(text) = unstructured {
        entries.insert(0, format!("- Earlier summary: {}", text.trim()));
    }
    for message in messages.iter().filter(|m| m.role == Role::Assistant) {
        let text = message.joined_text();
        let text = text.trim();
        if text.len() >= 40 {
            entries.push(format!("- {}", truncate_chars(&squash(text), 300)));
        }
    }
    keep_last(entries, NOTES_KEPT)
}

const TODO_TOOLS: &[&str] = &[
    "todowrite",
    "todo_write",
    "write_todos",
    "update_plan",
    "todo",
];

fn pending_tasks(prior: Option<&str>, messages: &[Message]) -> String {
    let latest = messages
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter().rev())
        .find_map(|p| match p {
            Part::ToolCall { name, args, .. }
                if TODO_TOOLS.contains(&name.to_ascii_lowercase().as_str()) =>
            {
                Some(args)
            }
            _ => None,
        });
    let Some(args) = latest else {
        return prior.unwrap_or_default().to_string();
    };
    let items = args
        .get("todos")
        .or_else(|| args.get("plan"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = String::new();
    for item in items {
        let status = item
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("pending");
        if status == "completed" || status == "done" {
            continue;
        }
        let task = ["content", "step", "task", "title"]
            .iter()
            .find_map(|k| item.get(k).and_then(Value::as_str))
            .unwrap_or("");
        if !task.is_empty() {
            let _ = writeln!(out, "- [{status}] {}", truncate_chars(task, 300));
        }
    }
    out
}

fn current_work(messages: &[Message]) -> String {
    let mut out = String::new();
    if let Some(text) = last_assistant_text(messages) {
        let _ = writeln!(out, "{}", truncate_chars(text.trim(), 1_000));
    }
    let recent_calls: Vec<String> = messages
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter().rev())
        .filter_map(|p| match p {
            Part::ToolCall { name, args, .. } => {
                let args = match args {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                Some(format!("- {name}({})", truncate_chars(&squash(&args), 150)))
            }
            _ => None,
        })
        .take(3)
        .collect();
    if !recent_calls.is_empty() {
        let _ = writeln!(out, "Latest tool calls (newest first):");
        for call in recent_calls {
            let _ = writeln!(out, "{call}");
        }
    }
    out
}

fn next_step(messages: &[Message]) -> String {
    let last_user = messages.iter().rposition(Message::is_user_text);
    let last_assistant = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant && !m.joined_text().trim().is_empty());
    match (last_user, last_assistant) {
        (Some(u), a) if a.is_none_or(|a| u > a) => format!(
            "Answer the latest user message: {}",
            truncate_chars(&squash(&messages[u].joined_text()), 300)
        ),
        (_, Some(a)) => format!(
            "Continue from the latest assistant message: {}",
            truncate_chars(&squash(&messages[a].joined_text()), 300)
        ),
        _ => String::new(),
    }
}

/// Section 6: every user message, `[#N] text`, carried forward from the prior summary.
struct UserMessages {
    /// A prior section 6 without our `[#N]` markers, kept as written.
    unstructured: Option<String>,
    /// Messages `[#1]` to `[#collapsed_through]` were folded away to fit the budget.
    collapsed_through: usize,
    entries: Vec<(usize, String)>,
}

/// Starts the line that stands for folded user messages: `[#1-#N] earlier user messages ...`.
const COLLAPSED_PREFIX: &str = "[#1-#";

impl UserMessages {
    fn carried(prior: Option<&str>) -> UserMessages {
        let mut entries: Vec<(usize, String)> = Vec::new();
        let mut unstructured = None;
        let mut collapsed_through = 0;
        for line in prior.unwrap_or_default().split('\n') {
            if let Some(rest) = line.strip_prefix(COLLAPSED_PREFIX) {
                collapsed_through = rest
                    .split(']')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            } else if let Some((n, text)) = parse_entry_header(line) {
                entries.push((n, text.to_string()));
            } else if let Some((_, text)) = entries.last_mut() {
                text.push('\n');
                text.push_str(line);
            } else if !line.trim().is_empty() && line.trim() != "(none)" {
                let u: &mut String = unstructured.get_or_insert_with(String::new);
                u.push_str(line);
                u.push('\n');
            }
        }
        UserMessages {
            unstructured,
            collapsed_through,
            entries,
        }
    }

    fn push(&mut self, text: &str) {
        let n = self
            .entries
            .last()
            .map_or(self.collapsed_through, |(n, _)| *n)
            + 1;
        self.entries
            .push((n, truncate_chars(text.trim(), MAX_TEXT_CHARS).into_owned()));
    }

    /// Cuts all but the newest entries to `max_chars`, to keep the summary within budget.
    fn shorten_older(&mut self, max_chars: usize) {
        let keep_whole = self
            .entries
            .len()
            .saturating_sub(RECENT_USER_MESSAGES_KEPT_WHOLE);
        for (_, text) in &mut self.entries[..keep_whole] {
            if text.chars().count() > max_chars + 30 {
                *text = truncate_chars(text, max_chars).into_owned();
            }
        }
    }

    /// Folds the oldest tenth of the entries (at least one, never the newest ten) into
    /// the collapsed count; false when nothing is left to fold.
    fn collapse_oldest(&mut self) -> bool {
        let foldable = self
            .entries
            .len()
            .saturating_sub(RECENT_USER_MESSAGES_KEPT_WHOLE);
        if foldable == 0 {
            return false;
        }
        let n = (self.entries.len() / 10).clamp(1, foldable);
        let folded: Vec<(usize, String)> = self.entries.drain(..n).collect();
        let last = folded.last().map_or(0, |(k, _)| *k);
        self.collapsed_through = self.collapsed_through.max(last);
        true
    }

    fn render(&self) -> String {
        let mut out = self.unstructured.clone().unwrap_or_default();
        if self.collapsed_through > 0 {
            let _ = writeln!(
                out,
                "{COLLAPSED_PREFIX}{}] earlier user messages are not repeated here; they are kept whole in compactd's history (GET /session/{{id}}/message).",
                self.collapsed_through
            );
        }
        for (n, text) in &self.entries {
            let _ = writeln!(out, "[#{n}] {text}");
        }
        out
    }
}

static ENTRY_HEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[#(\d+)\] ").expect("valid regex"));

fn parse_entry_header(line: &str) -> Option<(usize, &str)> {
    let caps = ENTRY_HEADER.captures(line)?;
    let n = caps[1].parse().ok()?;
    Some((n, &line[caps[0].len()..]))
}

fn bullet_lines(section: Option<&str>) -> Vec<String> {
    section
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("- "))
        .map(str::to_string)
        .collect()
}

fn keep_last(entries: Vec<String>, n: usize) -> String {
    let skip = entries.len().saturating_sub(n);
    let mut out = String::new();
    for entry in entries.into_iter().skip(skip) {
        let _ = writeln!(out, "{entry}");
    }
    out
}

fn last_assistant_text(messages: &[Message]) -> Option<String> {
    messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant)
        .map(Message::joined_text)
        .find(|t| !t.trim().is_empty())
}

fn first_line(text: &str) -> &str {
    text.trim().lines().next().unwrap_or("").trim()
}

/// Text on one line: newlines and runs of spaces become single spaces.
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(messages: Vec<Message>, prior: Option<&str>) -> SummaryRequest {
        SummaryRequest {
            messages,
            prior_summary: prior.map(str::to_string),
            ..Default::default()
        }
    }

    fn session() -> Vec<Message> {
        vec![
            Message::text(Role::User, "Please make the tests pass."),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text {
                        text: "I will run the tests first to see what fails.".into(),
                    },
                    Part::ToolCall {
                        id: "c1".into(),
                        name: "bash".into(),
                        args: json!({"command": "cargo test"}),
                    },
                ],
            },
            Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: "c1".into(),
                    name: None,
                    output:
                        "running 3 tests\nthread 'x' panicked at src/lib.rs:3\ntest result: FAILED"
                            .into(),
                    is_error: false,
                }],
            },
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text {
                        text: "The parser rejects empty input; fixing src/lib.rs.".into(),
                    },
                    Part::ToolCall {
                        id: "c2".into(),
                        name: "TodoWrite".into(),
                        args: json!({"todos": [
                            {"content": "fix parser", "status": "completed"},
                            {"content": "add a regression test", "status": "pending"}]}),
                    },
                ],
            },
            Message::text(
                Role::User,
                "Also keep the public API unchanged.\nIt is used elsewhere.",
            ),
        ]
    }

    #[test]
    fn every_section_heading_and_every_user_message_is_present() {
        let summary = extractive_summary(&request(session(), None));
        for s in &SUMMARY_SECTIONS {
            assert!(summary.contains(&heading(s)), "missing {}", s.title);
        }
        assert!(summary.contains("[#1] Please make the tests pass."));
        assert!(
            summary.contains("[#2] Also keep the public API unchanged.\nIt is used elsewhere.")
        );
    }

    #[test]
    fn sections_are_filled_from_the_conversation() {
        let s = split_sections(&extractive_summary(&request(session(), None)));
        assert_eq!(s[0].as_deref(), Some("Please make the tests pass."));
        assert!(
            s[1].as_deref()
                .unwrap()
                .contains("- Tools used: TodoWrite, bash")
        );
        assert!(
            s[3].as_deref()
                .unwrap()
                .contains("panicked at src/lib.rs:3"),
            "{:?}",
            s[3]
        );
        assert!(
            s[3].as_deref()
                .unwrap()
                .contains("then: The parser rejects empty input")
        );
        assert_eq!(s[6].as_deref(), Some("- [pending] add a regression test"));
        assert!(
            s[7].as_deref()
                .unwrap()
                .contains("The parser rejects empty input")
        );
        assert!(
            s[8].as_deref()
                .unwrap()
                .starts_with("Answer the latest user message: Also keep")
        );
    }

    #[test]
    fn user_messages_are_carried_forward_and_numbered_on() {
        let first = extractive_summary(&request(session(), None));
        let second = extractive_summary(&request(
            vec![Message::text(Role::User, "Now write the changelog.")],
            Some(&first),
        ));
        let s = split_sections(&second);
        let users = s[5].as_deref().unwrap();
        assert!(users.contains("[#1] Please make the tests pass."));
        assert!(users.contains("[#2] Also keep the public API unchanged.\nIt is used elsewhere."));
        assert!(users.contains("[#3] Now write the changelog."));
        // The primary request is kept, the todo list carried.
        assert_eq!(s[0].as_deref(), Some("Please make the tests pass."));
        assert_eq!(s[6].as_deref(), Some("- [pending] add a regression test"));
    }

    #[test]
    fn a_prose_prior_summary_is_kept() {
        let out = extractive_summary(&request(
            vec![Message::text(Role::User, "next")],
            Some("The user wants a parser. They said: use nom."),
        ));
        assert!(out.contains("The user wants a parser. They said: use nom."));
    }

    #[test]
    fn the_summary_is_much_shorter_than_a_long_input() {
        let mut messages = session();
        for i in 0..200 {
            messages.push(Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall {
                    id: format!("r{i}"),
                    name: "read".into(),
                    args: json!({"file_path": format!("/src/f{i}.rs")}),
                }],
            });
            messages.push(Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: format!("r{i}"),
                    name: None,
                    output: "fn x() {}\n".repeat(200),
                    is_error: false,
                }],
            });
        }
        let input: usize = messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap().len())
            .sum();
        let summary = extractive_summary(&request(messages, None));
        assert!(summary.len() * 20 < input, "{} vs {}", summary.len(), input);
    }

    #[test]
    fn a_summary_over_budget_shortens_old_user_messages_but_keeps_them() {
        let messages: Vec<Message> = (0..40)
            .map(|i| Message::text(Role::User, format!("{i}: {}", "w".repeat(1500))))
            .collect();
        let mut req = request(messages, None);
        let unbounded = extractive_summary(&req);
        req.max_summary_tokens = Some(8_000);
        let bounded = extractive_summary(&req);
        assert!(bounded.len() < unbounded.len() / 2);
        for i in 0..40 {
            assert!(
                bounded.contains(&format!("[#{}] {i}: www", i + 1)),
                "message {i}"
            );
        }
    }

    #[test]
    fn thousands_of_user_messages_fold_into_a_pointer_and_numbering_goes_on() {
        let messages: Vec<Message> = (0..3000)
            .map(|i| Message::text(Role::User, format!("instruction {i}: {}", "w".repeat(100))))
            .collect();
        let mut req = request(messages, None);
        req.max_summary_tokens = Some(20_000);
        let first = extractive_summary(&req);
        let estimator = LazyEstimator::default();
        assert!(
            estimator.text(&first) <= 20_000,
            "{} tokens",
            estimator.text(&first)
        );
        let folded_line = first
            .lines()
            .find(|l| l.starts_with(COLLAPSED_PREFIX))
            .expect("a pointer line");
        assert!(folded_line.contains("kept whole in compactd's history"));
        // The newest are verbatim; numbering continues across compactions.
        assert!(first.contains("[#3000] instruction 2999: www"));
        let second = extractive_summary(&SummaryRequest {
            messages: vec![Message::text(Role::User, "one more")],
            prior_summary: Some(first.clone()),
            max_summary_tokens: Some(20_000),
            ..Default::default()
        });
        assert!(
            second.contains("[#3001] one more"),
            "{}",
            &second[second.len().saturating_sub(300)..]
        );
        assert!(second.lines().any(|l| l.starts_with(COLLAPSED_PREFIX)));
    }

    #[test]
    fn failures_are_recognised_in_plain_output() {
        assert!(reports_failure("Traceback (most recent call last):\n  x"));
        assert!(reports_failure("<returncode>2</returncode>\n<output>"));
        assert!(reports_failure("error[E0308]: mismatched types"));
        assert!(!reports_failure("<returncode>0</returncode>\nall good"));
        assert!(!reports_failure("test result: ok. 3 passed"));
    }
}
