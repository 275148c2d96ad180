//! Section 4, Errors and fixes: what failed, in the words that matter.
//!
//! A tool result failed when the tool said so (`is_error`), when its exit code is not zero
//! (mini-swe-agent's `<returncode>`), or when its output reads like a failure (a traceback,
//! `error:`, `FAILED`, a panic). Each failure becomes one entry: the call that produced it and
//! its decisive lines — the final exception line and the last frame of a traceback, `error:`
//! and `FAILED` lines, a few at most — then what the assistant did next. Entries are
//! deduplicated by content (a repeat moves to the end) and kept newest last.

use super::text::{
    assistant_texts, bullet_blocks, call_line, calls_by_id, first_line, keep_last, shorten,
};
use super::{Detail, Sources};
use crate::compaction::truncate::truncate_chars;
use crate::message::Part;
use regex::Regex;
use std::fmt::Write;
use std::sync::LazyLock;

/// Output that reads like a failure, for tools that do not say (no `is_error`, no exit code).
/// Only what a failing run prints, not what source code contains: a `cat` of a file that
/// mentions `ValueError` is not a failure.
static FAILURE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?m)Traceback \(most recent call last\)|^\s*error(\[E\d+\])?:|",
        r"\bFAILED\b|panicked at|command not found|No such file or directory|",
        r"<returncode>[1-9]\d*</returncode>|[Ee]xit (code|status):? [1-9]"
    ))
    .expect("valid regex")
});

static RETURN_CODE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<returncode>(-?\d+)</returncode>").expect("valid regex"));

/// Lines worth quoting from a failing output, by kind.
static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$",
    )
    .expect("valid regex")
});
static FRAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"^File "[^"]+", line \d+"#).expect("valid regex"));
static ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:error|fatal)(?:\[\w+\])?:|^FAILED\b|^E\s{2,}\S|panicked at|command not found|No such file or directory|Permission denied")
        .expect("valid regex")
});

/// Whether a tool output reports a failure (when the tool did not flag it as an error).
pub fn reports_failure(output: &str) -> bool {
    let head = truncate_chars(output, 4_000);
    FAILURE.is_match(&head)
}

/// Decisive lines quoted per entry, and entries kept, at each detail.
fn limits(detail: Detail) -> (usize, usize) {
    match detail {
        Detail::Full => (3, 12),
        Detail::Reduced => (2, 6),
        Detail::Floor => (1, 3),
    }
}

pub(super) fn section(sources: &Sources, detail: Detail) -> String {
    let (lines_per_entry, kept) = limits(detail);
    let messages = &sources.request.messages;
    let calls = calls_by_id(messages);
    let mut entries = bullet_blocks(sources.prior[3].as_deref());
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
            let Outcome { exit, body, failed } = Outcome::of(output, *is_error);
            if !failed {
                continue;
            }
            let lines = decisive_lines(body, lines_per_entry);
            if lines.is_empty() {
                // A failure that says nothing (grep finding no match) teaches nothing.
                continue;
            }
            let call = match calls.get(call_id.as_str()) {
                Some((name, args)) => call_line(name, args, 120),
                None => name.clone().unwrap_or_else(|| "tool".into()),
            };
            let exit = exit.map(|c| format!(" (exit {c})")).unwrap_or_default();
            let mut entry = format!("- {}\n  from: {call}{exit}", lines.join(" | "));
            if let Some(next) = assistant_texts(&messages[i + 1..]).next() {
                let _ = write!(entry, "\n  then: {}", shorten(first_line(&next), 160));
            }
            push_deduplicated(&mut entries, entry);
        }
    }
    keep_last(&entries, kept)
}

/// Adds `entry`, first removing an earlier one that reported the same failure (the same
/// decisive lines, whatever the call): the newest stays, last.
fn push_deduplicated(entries: &mut Vec<String>, entry: String) {
    let key = |e: &str| e.lines().next().unwrap_or(e).to_string();
    let new_key = key(&entry);
    entries.retain(|e| key(e) != new_key);
    entries.push(entry);
}

/// What a tool result says about how its call went.
pub(super) struct Outcome<'a> {
    /// The exit code, when the output carries one.
    pub exit: Option<i64>,
    /// The output without its wrapper.
    pub body: &'a str,
    pub failed: bool,
}

impl<'a> Outcome<'a> {
    pub(super) fn of(output: &'a str, is_error: bool) -> Outcome<'a> {
        let (exit, body) = unwrap_output(output);
        // An exit code is the tool's own verdict; the text is read only without one.
        let failed = is_error
            || match exit {
                Some(code) => code != 0,
                None => reports_failure(body),
            };
        Outcome { exit, body, failed }
    }
}

/// mini-swe-agent wraps outputs as `<returncode>N</returncode>\n<output>...</output>`: the
/// exit code, and the output inside.
fn unwrap_output(output: &str) -> (Option<i64>, &str) {
    let Some(c) = RETURN_CODE.captures(output) else {
        return (None, output);
    };
    let code = c[1].parse().ok();
    let rest = &output[c.get(0).map_or(0, |m| m.end())..];
    let inner = rest
        .find("<output>")
        .map(|at| &rest[at + "<output>".len()..])
        .unwrap_or(rest);
    let inner = inner.rfind("</output>").map_or(inner, |at| &inner[..at]);
    (code, inner)
}

/// The lines that say what went wrong, at most `max`: `error:`/`FAILED` lines first, then the
/// last traceback frame and the final exception line; else the last line of output.
fn decisive_lines(output: &str, max: usize) -> Vec<String> {
    // Without the `<system-reminder>` blocks some agents append to tool results.
    let output = crate::compaction::tags::without(output, "system-reminder");
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut picked: Vec<&str> = Vec::new();
    fn add<'a>(line: &'a str, picked: &mut Vec<&'a str>) {
        if !picked.contains(&line) {
            picked.push(line);
        }
    }
    let exception = lines.iter().rev().find(|l| EXCEPTION.is_match(l)).copied();
    let frame = lines.iter().rev().find(|l| FRAME.is_match(l)).copied();
    for line in lines.iter().filter(|l| ERROR_LINE.is_match(l)).take(max) {
        add(line, &mut picked);
    }
    if let Some(frame) = frame {
        add(frame, &mut picked);
    }
    if let Some(exception) = exception {
        add(exception, &mut picked);
    }
    if picked.is_empty()
        && let Some(last) = lines.last()
    {
        picked.push(last);
    }
    // The exception line matters most: keep it when cutting to `max`.
    if picked.len() > max {
        let keep_exception = exception.filter(|e| picked.contains(e));
        picked.truncate(max);
        if let Some(e) = keep_exception.filter(|e| !picked.contains(e)) {
            picked.pop();
            picked.push(e);
        }
    }
    picked
        .into_iter()
        .map(|l| truncate_chars(l, 200).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_recognised_in_plain_output() {
        assert!(reports_failure("Traceback (most recent call last):\n  x"));
        assert!(reports_failure("<returncode>2</returncode>\n<output>"));
        assert!(reports_failure("error[E0308]: mismatched types"));
        assert!(!reports_failure("<returncode>0</returncode>\nall good"));
        assert!(!reports_failure("test result: ok. 3 passed"));
        // Source code that names an error is not a failing run.
        assert!(!reports_failure("    raise ValueError('bad input')"));
    }

    #[test]
    fn an_exit_code_is_the_verdict() {
        let out = "<returncode>0</returncode>\n<output>\nraise ValueError('x')\nTraceback (most recent call last):\n</output>";
        assert!(!Outcome::of(out, false).failed);
        assert!(Outcome::of("<returncode>2</returncode>\n<output>\n</output>", false).failed);
        assert!(Outcome::of("anything", true).failed);
    }

    #[test]
    fn system_reminders_are_not_decisive() {
        let out = "Error: bad\n<system-reminder>\nWhenever you read a file\n</system-reminder>";
        assert_eq!(decisive_lines(out, 3), ["Error: bad"]);
    }

    #[test]
    fn a_traceback_gives_its_last_frame_and_final_exception() {
        let out = "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    f()\n  File \"b.py\", line 9, in f\n    raise ValueError('bad')\nValueError: bad\n</output>";
        let (code, body) = unwrap_output(out);
        assert_eq!(code, Some(1));
        assert_eq!(
            decisive_lines(body, 3),
            ["File \"b.py\", line 9, in f", "ValueError: bad"]
        );
    }

    #[test]
    fn pytest_and_compiler_errors_give_their_error_lines() {
        let out = "collected 3\nE   AssertionError: 1 != 2\nFAILED tests/t.py::test_a - AssertionError\n1 failed";
        assert_eq!(
            decisive_lines(out, 3),
            [
                "E   AssertionError: 1 != 2",
                "FAILED tests/t.py::test_a - AssertionError"
            ]
        );
        let out =
            "   Compiling x\nerror[E0308]: mismatched types\n --> src/a.rs:3:5\nerror: aborting";
        assert_eq!(decisive_lines(out, 1), ["error[E0308]: mismatched types"]);
    }

    #[test]
    fn output_without_a_decisive_line_gives_its_last_line() {
        assert_eq!(decisive_lines("a\nb\n\n", 3), ["b"]);
        assert!(decisive_lines("  \n", 3).is_empty());
    }
}
