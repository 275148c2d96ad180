use super::*;
use crate::TaskNote;
use crate::compaction::FileLists;
use crate::message::{Message, Part, Role};
use serde_json::json;

/// A request over `messages`, numbered from seq 1.
fn request(messages: Vec<Message>, prior: Option<&str>) -> SummaryRequest {
    SummaryRequest {
        seqs: (1..=messages.len() as u64).collect(),
        messages,
        prior_summary: prior.map(str::to_string),
        ..Default::default()
    }
}

fn sections_of(summary: &str) -> [String; 9] {
    split_sections(summary).map(|s| s.unwrap_or_default())
}

fn bash_call(id: &str, command: &str) -> Message {
    tool_call(id, "bash", json!({ "command": command }))
}

/// An assistant message making one call.
fn tool_call(id: &str, name: &str, args: serde_json::Value) -> Message {
    Message {
        role: Role::Assistant,
        parts: vec![Part::ToolCall {
            id: id.into(),
            name: name.into(),
            args,
        }],
    }
}

fn result(id: &str, output: &str) -> Message {
    Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: id.into(),
            name: None,
            output: output.into(),
            is_error: false,
        }],
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
        result(
            "c1",
            "running 3 tests\nthread 'x' panicked at src/lib.rs:3\ntest result: FAILED",
        ),
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
    assert!(summary.contains("[#1, seq 1] Please make the tests pass."));
    assert!(
        summary.contains("[#2, seq 5] Also keep the public API unchanged.\nIt is used elsewhere.")
    );
}

#[test]
fn sections_are_filled_from_the_conversation() {
    let s = sections_of(&extractive_summary(&request(session(), None)));
    assert_eq!(
        s[0],
        "Original request: Please make the tests pass.\nCurrent request: Also keep the public API unchanged.\nIt is used elsewhere."
    );
    assert!(s[1].contains("- Tools used: TodoWrite, bash"));
    assert_eq!(
        s[3],
        "- thread 'x' panicked at src/lib.rs:3\n  from: bash(cargo test)\n  then: The parser rejects empty input; fixing src/lib.rs."
    );
    assert_eq!(s[6], "- [pending] add a regression test");
    assert!(s[7].contains("Last action: TodoWrite("), "{}", s[7]);
    assert!(s[7].contains("Latest assistant message: The parser rejects empty input"));
    assert!(s[8].starts_with("Answer the latest user request: Also keep"));
}

#[test]
fn user_messages_are_carried_forward_and_numbered_on() {
    let first = extractive_summary(&request(session(), None));
    let second = extractive_summary(&SummaryRequest {
        seqs: vec![9],
        ..request(
            vec![Message::text(Role::User, "Now write the changelog.")],
            Some(&first),
        )
    });
    let s = sections_of(&second);
    assert!(s[5].contains("[#1, seq 1] Please make the tests pass."));
    assert!(
        s[5].contains("[#2, seq 5] Also keep the public API unchanged.\nIt is used elsewhere.")
    );
    assert!(s[5].contains("[#3, seq 9] Now write the changelog."));
    // The original request is kept, the current one moves on; the todo list is carried.
    assert!(s[0].starts_with(
        "Original request: Please make the tests pass.\nCurrent request: Now write the changelog."
    ));
    assert_eq!(s[6], "- [pending] add a regression test");
}

#[test]
fn a_summary_of_an_older_version_is_read() {
    let old = "## 1. Primary Request and Intent\nBuild it.\n\n## 6. All user messages\n[#1] Build it.\n[#2] Use nom.";
    let s = sections_of(&extractive_summary(&request(
        vec![Message::text(Role::User, "and document the parser")],
        Some(old),
    )));
    assert!(
        s[0].starts_with("Original request: Build it.\nCurrent request: and document the parser")
    );
    assert!(s[5].starts_with("[#1] Build it.\n[#2] Use nom.\n[#3, seq 1] and document"));
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
fn cli_notes_are_not_instructions_and_pasted_summaries_are_named() {
    let pasted = "This session is being continued from a previous conversation that ran out of context. Long story.";
    let messages = vec![
        Message::text(
            Role::User,
            "Caveat: The messages below were generated by the user while running local commands.",
        ),
        Message::text(Role::User, "<command-name>/clear</command-name>"),
        Message::text(Role::User, pasted),
        Message::text(Role::User, "Fix the login form validation"),
        Message::text(Role::User, "[Request interrupted by user]"),
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert_eq!(
        s[5],
        format!(
            "[#1, seq 3] (a pasted summary of earlier work, {} characters; not an instruction)\n[#2, seq 4] Fix the login form validation",
            pasted.len()
        )
    );
    assert_eq!(s[0], "Original request: Fix the login form validation");
}

/// Claude Code's merged user messages: what the person typed after an interruption marker, a
/// command echo or a pasted summary, in the same message, is an instruction (it was left out,
/// the message judged by its first block).
#[test]
fn a_typed_instruction_after_a_marker_in_one_message_is_quoted() {
    let pasted = "This session is being continued from a previous conversation that ran out of context. Long story.";
    let merged = |first: &str, typed: &str| Message {
        role: Role::User,
        parts: vec![
            Part::Text { text: first.into() },
            Part::Text { text: typed.into() },
        ],
    };
    let messages = vec![
        merged(pasted, "Now add retries to the uploader"),
        Message::text(Role::Assistant, "Adding them."),
        merged(
            "[Request interrupted by user for tool use]",
            "Stop, use exponential backoff",
        ),
        Message::text(Role::Assistant, "Switching."),
        merged(
            "<command-message>compact</command-message>\n<command-name>/compact</command-name>",
            "Cap the backoff at thirty seconds",
        ),
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert_eq!(
        s[5],
        format!(
            "[#1, seq 1] (a pasted summary of earlier work, {} characters; not an instruction)\n\
             [#2, seq 1] Now add retries to the uploader\n\
             [#3, seq 3] Stop, use exponential backoff\n\
             [#4, seq 5] Cap the backoff at thirty seconds",
            pasted.len()
        )
    );
    assert!(
        s[0].contains("Current request: Cap the backoff at thirty seconds"),
        "{}",
        s[0]
    );
}

#[test]
fn a_long_instruction_points_to_its_original_and_the_task_keeps_more() {
    let long = format!("start {}", "w".repeat(5_000));
    let messages = vec![
        Message::text(Role::User, long.clone()),
        Message::text(Role::Assistant, "ok"),
        Message::text(Role::User, long.clone()),
    ];
    let s = sections_of(&extractive_summary(&SummaryRequest {
        task: Some(TaskNote {
            seq: 1,
            text: long.clone(),
            pinned: false,
            max_chars: 16_000,
        }),
        ..request(messages, None)
    }));
    assert!(
        s[5].contains(&format!("[#1, seq 1] {long}\n")),
        "the task is kept whole up to the pin size"
    );
    assert!(
        s[5].contains("…[truncated 3006 chars] (whole message: seq 3)"),
        "{}",
        &s[5][s[5].len() - 200..]
    );
}

#[test]
fn a_pinned_task_is_pointed_to_in_its_place() {
    let messages = vec![
        Message::text(Role::Assistant, "looking"),
        Message::text(Role::User, "also run the linter"),
    ];
    let s = sections_of(&extractive_summary(&SummaryRequest {
        seqs: vec![3, 4],
        task: Some(TaskNote {
            seq: 2,
            text: "build the parser".into(),
            pinned: true,
            max_chars: 16_000,
        }),
        ..request(messages, None)
    }));
    assert_eq!(
        s[5],
        "[#1, seq 2] (the session's task: quoted whole at the start of this context)\n[#2, seq 4] also run the linter"
    );
    assert_eq!(
        s[0],
        "Original request: build the parser\nCurrent request: also run the linter"
    );
}

#[test]
fn next_step_names_the_stated_intent_or_the_first_unfinished_todo() {
    let messages = vec![
        Message::text(Role::User, "Please make the tests pass."),
        Message::text(
            Role::Assistant,
            "The parser drops CR. Next, I'll patch parse_line to keep it. Then rerun.",
        ),
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert_eq!(
        s[8],
        "Continue as stated last: Next, I'll patch parse_line to keep it."
    );
    let messages = vec![
        Message::text(Role::User, "Please make the tests pass."),
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "t".into(),
                name: "TodoWrite".into(),
                args: json!({"todos": [
                    {"content": "fix parser", "status": "completed"},
                    {"content": "write docs", "status": "pending"},
                    {"content": "add a test", "status": "in_progress"}]}),
            }],
        },
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert_eq!(s[8], "Work on the first unfinished task: add a test");
}

#[test]
fn current_work_names_the_last_action_and_its_outcome() {
    let messages = vec![
        Message::text(Role::User, "fix it"),
        bash_call("c1", "python -m pytest tests/test_a.py"),
        result(
            "c1",
            "<returncode>1</returncode>\n<output>\nE   AssertionError: 1 != 2\nFAILED tests/test_a.py::test_x\n</output>",
        ),
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert!(
        s[7].starts_with("Last action: bash(python -m pytest tests/test_a.py) → failed (exit 1): E   AssertionError: 1 != 2"),
        "{}",
        s[7]
    );
}

#[test]
fn errors_are_deduplicated_paired_with_their_call_and_bare_exit_codes_skipped() {
    let tb = "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"t.py\", line 4, in <module>\nKeyError: 'x'\n</output>";
    let messages = vec![
        bash_call("a", "python t.py"),
        result("a", tb),
        bash_call("b", "grep -n nothing src/x.py"),
        result("b", "<returncode>1</returncode>\n<output>\n</output>"),
        bash_call("c", "python t.py --again"),
        result("c", tb),
    ];
    let s = sections_of(&extractive_summary(&request(messages, None)));
    assert_eq!(
        s[3],
        "- File \"t.py\", line 4, in <module> | KeyError: 'x'\n  from: bash(python t.py --again) (exit 1)"
    );
}

#[test]
fn files_are_ranked_by_recent_change_and_capped() {
    let mut messages: Vec<Message> = (0..30)
        .map(|i| bash_call(&format!("c{i}"), &format!("echo x > scratch_{i}.py")))
        .collect();
    messages.push(bash_call("r", "cat src/core.py"));
    messages.push(bash_call("e", "sed -i s/a/b/ src/core.py"));
    let files = crate::compaction::track_files(&messages, &FileLists::default());
    let s = sections_of(&extractive_summary(&SummaryRequest {
        files,
        ..request(messages, None)
    }));
    assert!(
        s[2].starts_with("Modified:\n- src/core.py\nCreated:\n- scratch_29.py\n"),
        "{}",
        s[2]
    );
    assert!(s[2].contains("- … and 20 more"));
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
        messages.push(result(&format!("r{i}"), &"fn x() {}\n".repeat(200)));
    }
    let input: usize = messages
        .iter()
        .map(|m| serde_json::to_string(m).unwrap().len())
        .sum();
    let summary = extractive_summary(&request(messages, None));
    assert!(summary.len() * 20 < input, "{} vs {}", summary.len(), input);
}

#[test]
fn other_sections_shrink_before_any_user_message_is_shortened() {
    // 20 instructions of 1,500 characters and a lot of assistant work.
    let mut messages = Vec::new();
    for i in 0..20 {
        messages.push(Message::text(
            Role::User,
            format!("{i}: {}", "w".repeat(1_500)),
        ));
        for j in 0..10 {
            messages.push(Message::text(
                Role::Assistant,
                format!("note {i}.{j}: {}", "thinking ".repeat(60)),
            ));
        }
    }
    let req = request(messages, None);
    let unbounded = extractive_summary(&req);
    let full = LazyEstimator::default().text(&unbounded);
    // A budget the user messages fit in once the other sections are at their floors.
    let bounded = extractive_summary(&SummaryRequest {
        max_summary_tokens: Some(full - 400),
        ..req.clone()
    });
    let s = sections_of(&bounded);
    for i in 0..20 {
        assert!(
            s[5].contains(&format!("{i}: {}", "w".repeat(1_500))),
            "message {i} shortened"
        );
    }
    assert!(s[4].lines().count() < 10, "notes shrank first: {}", s[4]);
    // A budget that forces user messages to shrink: the oldest go first, the newest stay whole.
    let tight = extractive_summary(&SummaryRequest {
        max_summary_tokens: Some(5_400),
        ..req
    });
    let s = sections_of(&tight);
    assert!(LazyEstimator::default().text(&tight) <= 5_400);
    assert!(s[5].contains("[#1, seq 1] 0: www") && s[5].contains("(whole message: seq 1)"));
    for i in 10..20 {
        assert!(
            s[5].contains(&format!("{i}: {}", "w".repeat(1_500))),
            "newest {i} whole"
        );
    }
}

/// Ten user messages of 1,900 characters (SWE-agent's observations, sent as user messages)
/// take about 4,800 tokens whole, more than a summary may take in a small window (here 2,000
/// tokens; 16k for a model counting 2.5 times the estimate allows about 1,800). All but the
/// newest are shortened, each pointing to its stored original; the newest stays whole.
#[test]
fn a_window_too_small_for_the_newest_ten_whole_shortens_all_but_the_newest() {
    let messages: Vec<Message> = (0..12)
        .map(|i| Message::text(Role::User, format!("{i}: {}", "o".repeat(1_900))))
        .collect();
    let req = SummaryRequest {
        max_summary_tokens: Some(1_000),
        summary_ceiling_tokens: Some(2_000),
        ..request(messages, None)
    };
    let summary = extractive_summary(&req);
    assert!(
        LazyEstimator::default().text(&summary) <= 2_000,
        "{summary}"
    );
    let s = sections_of(&summary);
    assert!(
        s[5].contains(&format!("11: {}", "o".repeat(1_900))),
        "the newest whole"
    );
    for seq in 3..=11 {
        assert!(
            s[5].contains(&format!("(whole message: seq {seq})")),
            "seq {seq} points to its original: {}",
            s[5]
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
        .find(|l| l.starts_with("[#1-#"))
        .expect("a pointer line");
    assert!(folded_line.contains("kept whole in compactd's history"));
    // The newest are verbatim; numbering continues across compactions.
    assert!(first.contains("[#3000, seq 3000] instruction 2999: www"));
    let second = extractive_summary(&SummaryRequest {
        messages: vec![Message::text(Role::User, "one more")],
        seqs: vec![3001],
        prior_summary: Some(first.clone()),
        max_summary_tokens: Some(20_000),
        ..Default::default()
    });
    assert!(second.contains("[#3001, seq 3001] one more"));
    assert!(second.lines().any(|l| l.starts_with("[#1-#")));
}

/// A background sub-agent's report (Claude Code's `<task-notification>`, in a system message
/// mid-conversation or in the reminder of a user message) is the delegated work's only
/// outcome in the conversation: the summary keeps it in section 5, through the next
/// compaction too, and does not quote it as something the user asked for.
#[test]
fn a_background_tasks_report_is_kept_as_work_done_not_as_an_instruction() {
    let told = |id: &str, report: &str| {
        format!(
            "[SYSTEM NOTIFICATION - NOT USER INPUT]\nThis is an automated background-task event, NOT a message from the user.\n\n<task-notification>\n<task-id>{id}</task-id>\n<status>completed</status>\n<summary>Agent \"Find the race\" finished</summary>\n<result>{report}</result>\n</task-notification>"
        )
    };
    let long_report = format!("The race is in the cache: {}", "details ".repeat(80));
    let messages = vec![
        Message::text(Role::User, "Find and fix the flaky test."),
        bash_call("c1", "cargo test"),
        result("c1", "test result: ok"),
        Message::text(Role::System, told("a1", &long_report)),
        bash_call("c2", "cargo test"),
        result("c2", "test result: ok"),
        Message::text(
            Role::User,
            format!(
                "<system-reminder>\n{}\n</system-reminder>",
                told("a2", "No other race found.")
            ),
        ),
    ];
    let first = extractive_summary(&request(messages, None));
    let sections = sections_of(&first);
    assert!(
        sections[4].contains("Background task a1 completed (Agent \"Find the race\" finished): The race is in the cache:"),
        "{}",
        sections[4]
    );
    assert!(
        sections[4].contains(&"details ".repeat(80).trim_end().to_string()),
        "whole, under 1,000 characters"
    );
    assert!(sections[4].contains("a2 completed") && sections[4].contains("No other race found."));
    assert!(
        !sections[5].contains("task-notification") && !sections[5].contains("No other race"),
        "{}",
        sections[5]
    );
    assert!(sections[5].contains("Find and fix the flaky test."));

    // The next compaction carries both reports whole.
    let second = extractive_summary(&request(
        vec![
            bash_call("c3", "cargo test"),
            result("c3", "test result: ok"),
        ],
        Some(&first),
    ));
    let sections = sections_of(&second);
    assert!(
        sections[4].contains(&"details ".repeat(80).trim_end().to_string()),
        "{}",
        sections[4]
    );
    assert!(sections[4].contains("No other race found."));
}

/// A sub-agent's report (the result of Claude Code's `Agent` call, opencode's `task`,
/// Codex's `wait_agent`) is kept in section 5 though it was not the last action, and a day of
/// notes after it does not push it out; the answer to a call run in the background (its
/// launch) is not a report, but says the task was started.
#[test]
fn a_sub_agents_report_outlives_the_notes_after_it() {
    let delegate = |id: &str, name: &str, description: &str| Message {
        role: Role::Assistant,
        parts: vec![Part::ToolCall {
            id: id.into(),
            name: name.into(),
            args: json!({"description": description, "prompt": "Look for the race."}),
        }],
    };
    let mut messages = vec![
        Message::text(Role::User, "Find and fix the flaky test."),
        delegate("a1", "Agent", "Find the race"),
        result("a1", "The race is in src/cache.rs: read before the lock."),
        delegate("a2", "multi_agent_v1.wait_agent", "Wait"),
        result(
            "a2",
            r#"{"status":{"t1":{"completed":"No race in src/db.rs."}}}"#,
        ),
        delegate("a3", "Agent", "Watch the logs"),
        result("a3", "Async agent launched successfully.\nagentId: a9"),
    ];
    for n in 0..12 {
        messages.push(Message::text(
            Role::Assistant,
            format!("Note {n}: looking at the next part of the cache code now."),
        ));
    }
    let summary = extractive_summary(&request(messages, None));
    let sections = sections_of(&summary);
    assert!(
        sections[4].contains(
            "- Sub-agent report (Find the race): The race is in src/cache.rs: read before the lock."
        ),
        "{}",
        sections[4]
    );
    assert!(sections[4].contains("No race in src/db.rs."));
    assert!(
        sections[4].contains(
            "- Background task started (Watch the logs): Async agent launched successfully. agentId: a9"
        ),
        "{}",
        sections[4]
    );
    assert!(!sections[4].contains("Sub-agent report (Watch the logs)"));
    assert!(sections[4].contains("Note 11") && !sections[4].contains("Note 1:"));
}

/// A shell command run in the background (Claude Code's `Bash` with `run_in_background`):
/// its output is in a file, which the call's answer names and its end's notification names
/// again. Section 5 says the task was started and where its output goes; once the end is
/// told (here inside the result of an unrelated step, as Claude Code tells Claude Sonnet
/// 4.5), it says it ended, with the file, and no longer that it was started.
#[test]
fn a_background_commands_start_and_end_keep_the_file_its_output_is_in() {
    let file = "/tmp/claude-0/work/tasks/b7x.output";
    let start = tool_call(
        "c1",
        "Bash",
        json!({"command": "make", "description": "Build", "run_in_background": true}),
    );
    let first = extractive_summary(&request(
        vec![
            Message::text(Role::User, "Build it and fix what fails."),
            start,
            result(
                "c1",
                &format!(
                    "Command running in background with ID: b7x. Output is being written to: {file}. You will be notified when it completes.\n\n<system-reminder>\nIgnore me.\n</system-reminder>"
                ),
            ),
        ],
        None,
    ));
    let sections = sections_of(&first);
    assert!(
        sections[4].contains(&format!("- Background task started (Build): Command running in background with ID: b7x. Output is being written to: {file}.")),
        "{}",
        sections[4]
    );
    assert!(!sections[4].contains("Ignore me"));

    let told = format!(
        "STEP-2-END\n\n<system-reminder>\n[SYSTEM NOTIFICATION - NOT USER INPUT]\n\n<task-notification>\n<task-id>b7x</task-id>\n<output-file>{file}</output-file>\n<status>completed</status>\n<summary>Background command \"Build\" completed (exit code 0)</summary>\n</task-notification>\n</system-reminder>"
    );
    let second = extractive_summary(&request(
        vec![
            bash_call("c2", "echo STEP-2-END"),
            result("c2", &told),
            bash_call("c3", "echo STEP-3-END"),
            result("c3", "STEP-3-END"),
        ],
        Some(&first),
    ));
    let sections = sections_of(&second);
    assert!(
        sections[4].contains(&format!("- Background task b7x completed (Background command \"Build\" completed (exit code 0)), output in {file}")),
        "{}",
        sections[4]
    );
    assert!(
        !sections[4].contains("Background task started"),
        "{}",
        sections[4]
    );
    // Carried on whole.
    let third = extractive_summary(&request(
        vec![
            bash_call("c4", "echo STEP-4-END"),
            result("c4", "STEP-4-END"),
        ],
        Some(&second),
    ));
    assert!(sections_of(&third)[4].contains(&format!("output in {file}")));
}

/// Codex leaves a command that outlives its call's wait running and answers with its session,
/// which the model polls (`write_stdin`): section 5 keeps the session while the process runs
/// (a poll that finds it running again is not another start), and once a poll sees it exit,
/// says so instead.
#[test]
fn a_process_left_running_keeps_its_session_until_a_poll_sees_it_end() {
    let running = |id: &str| {
        result(
            id,
            "Chunk ID: 0f1f83\nWall time: 0.2509 seconds\nProcess running with session ID 10691\nOriginal token count: 0\nOutput:\n",
        )
    };
    let first = extractive_summary(&request(
        vec![
            Message::text(Role::User, "Build it while you fix the docs."),
            tool_call(
                "c1",
                "exec_command",
                json!({"cmd": "make -j8", "yield_time_ms": 250}),
            ),
            running("c1"),
            tool_call(
                "c2",
                "write_stdin",
                json!({"session_id": 10691, "chars": ""}),
            ),
            running("c2"),
            bash_call("c3", "sed -i s/a/b/ README.md"),
            result("c3", ""),
        ],
        None,
    ));
    let sections = sections_of(&first);
    assert_eq!(
        sections[4].matches("Background task started").count(),
        1,
        "{}",
        sections[4]
    );
    assert!(
        sections[4].contains("- Background task started (make -j8): Chunk ID: 0f1f83 Wall time: 0.2509 seconds Process running with session ID 10691"),
        "{}",
        sections[4]
    );
    let second = extractive_summary(&request(
        vec![
            tool_call(
                "c4",
                "write_stdin",
                json!({"session_id": 10691, "chars": ""}),
            ),
            result(
                "c4",
                "Chunk ID: 1a2b3c\nWall time: 2.7 seconds\nProcess exited with code 2\nOutput:\nmake: *** [all] Error 2\n",
            ),
        ],
        Some(&first),
    ));
    let sections = sections_of(&second);
    assert!(
        sections[4].contains("- Background task 10691 exited with code 2"),
        "{}",
        sections[4]
    );
    assert!(
        !sections[4].contains("Background task started"),
        "{}",
        sections[4]
    );
}

/// Codex tells the main thread of a sub-agent's end in a user message of its own
/// (`<subagent_notification>`): it is the sub-agent's report, kept in section 5, and not the
/// user's current request (section 1) nor a message of theirs (section 6).
#[test]
fn codexs_sub_agent_notification_is_a_report_not_the_current_request() {
    let told = "<subagent_notification>\n{\"agent_path\":\"01a2443d-bacc\",\"status\":{\"completed\":\"SUBTASK-DONE A: no race in src/db.rs\"}}\n</subagent_notification>";
    let messages = vec![
        Message::text(
            Role::User,
            "Find and fix the flaky test in the cache module.",
        ),
        bash_call("c1", "cargo test"),
        result("c1", "test result: ok"),
        Message::text(Role::User, told),
        bash_call("c2", "cargo test"),
        result("c2", "test result: ok"),
    ];
    let sections = sections_of(&extractive_summary(&request(messages, None)));
    assert!(
        !sections[0].contains("subagent_notification"),
        "{}",
        sections[0]
    );
    assert!(
        sections[0].contains("Find and fix the flaky test in the cache module."),
        "{}",
        sections[0]
    );
    assert!(
        sections[4].contains(
            "- Background task 01a2443d-bacc completed: SUBTASK-DONE A: no race in src/db.rs"
        ),
        "{}",
        sections[4]
    );
    assert!(!sections[5].contains("SUBTASK-DONE"), "{}", sections[5]);
}

/// A background task the model stopped (Claude Code 2.1.332's `TaskStop`, answered as below;
/// no notification comes after it) is over: section 5 says it was stopped, no longer that it
/// was started (a model told a build runs waits for it). A stop that failed leaves it started.
#[test]
fn a_background_task_the_model_stopped_is_told_stopped_not_started() {
    let start = tool_call(
        "c1",
        "Bash",
        json!({"command": "sleep 300", "description": "Build", "run_in_background": true}),
    );
    let started = result(
        "c1",
        "Command running in background with ID: byj1paxam. Output is being written to: /tmp/claude-0/w/tasks/byj1paxam.output. You will be notified when it completes.",
    );
    let stop = tool_call("c2", "TaskStop", json!({"task_id": "byj1paxam"}));
    let stopped = result(
        "c2",
        r#"{"message":"Successfully stopped task: byj1paxam (sleep 300)","task_id":"byj1paxam","task_type":"local_bash","command":"sleep 300"}"#,
    );
    let messages = vec![
        Message::text(Role::User, "Build it, then run the steps."),
        start.clone(),
        started.clone(),
        stop.clone(),
        stopped,
        bash_call("c3", "echo STEP-1"),
        result("c3", "STEP-1"),
    ];
    let sections = sections_of(&extractive_summary(&request(messages, None)));
    assert!(
        sections[4].contains(
            "- Background task byj1paxam stopped: Successfully stopped task: byj1paxam (sleep 300)"
        ),
        "{}",
        sections[4]
    );
    assert!(
        !sections[4].contains("Background task started"),
        "{}",
        sections[4]
    );
    let failed = Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: "c2".into(),
            name: None,
            output: "No task found with ID: byj1paxam".into(),
            is_error: true,
        }],
    };
    let messages = vec![
        Message::text(Role::User, "Build it, then run the steps."),
        start,
        started,
        stop,
        failed,
    ];
    let sections = sections_of(&extractive_summary(&request(messages, None)));
    assert!(
        sections[4].contains("Background task started (Build)"),
        "{}",
        sections[4]
    );
    assert!(!sections[4].contains("stopped"), "{}", sections[4]);
}

/// Codex 0.171.0 tells each sub-agent's end twice, in the same words: in its `wait_agent`
/// answer and in a `<subagent_notification>` (as the real CLI sent them, the ids shortened).
/// Section 5 keeps each report once, where it was first told, also when the two are compacted
/// apart (the first in the prior summary): each told twice took two of the few places kept
/// for reports, and pushed out an older sub-agent's.
#[test]
fn codex_tells_a_sub_agents_end_twice_and_it_is_kept_once() {
    let wait = |id: &str, target: &str| {
        tool_call(
            id,
            "wait_agent",
            json!({"targets": [target], "timeout_ms": 600000}),
        )
    };
    let ended = |agent: &str, said: &str| {
        format!("{{\"status\":{{\"{agent}\":{{\"completed\":\"{said}\"}}}},\"timed_out\":false}}")
    };
    let told = |agent: &str, said: &str| {
        format!(
            "<subagent_notification>\n{{\"agent_path\":\"{agent}\",\"status\":{{\"completed\":\"{said}\"}}}}\n</subagent_notification>"
        )
    };
    let (a, b) = (
        "SUBTASK-DONE A: SUBA-8-END seen",
        "SUBTASK-DONE B: SUBB-8-END seen",
    );
    let first = vec![
        Message::text(Role::User, "Hand steps 11 to 18 to two sub-agents."),
        wait("w1", "01a244ce-3e7f"),
        result("w1", &ended("01a244ce-3e7f", a)),
        Message::text(Role::User, told("01a244ce-3e7f", a)),
    ];
    let prior = extractive_summary(&request(first, None));
    let sections = sections_of(&prior);
    assert_eq!(sections[4].matches(a).count(), 1, "{}", sections[4]);
    assert!(
        sections[4].contains(&format!("- Background task 01a244ce-3e7f completed: {a}")),
        "{}",
        sections[4]
    );
    let then = vec![
        Message::text(Role::User, told("01a244ce-3e90", b)),
        wait("w2", "01a244ce-3e90"),
        result("w2", &ended("01a244ce-3e90", b)),
        Message::text(Role::User, told("01a244ce-3e7f", a)),
    ];
    let sections = sections_of(&extractive_summary(&request(then, Some(&prior))));
    assert_eq!(sections[4].matches(a).count(), 1, "{}", sections[4]);
    assert_eq!(sections[4].matches(b).count(), 1, "{}", sections[4]);
    // A wait that timed out says nothing of any sub-agent: no report.
    let timed_out = vec![
        Message::text(Role::User, "Hand steps 11 to 18 to a sub-agent."),
        wait("w3", "01a244ce-3e7f"),
        result("w3", r#"{"status":{},"timed_out":true}"#),
    ];
    let sections = sections_of(&extractive_summary(&request(timed_out, None)));
    assert!(!sections[4].contains("Sub-agent report"), "{}", sections[4]);
}

/// Claude Code 2.1 keeps its task list one task at a time (TaskCreate, answered `Task #N
/// created successfully`; TaskUpdate by that id; TaskList answers the whole list; the words
/// are Claude Code 2.1.332's, with `CLAUDE_CODE_ENABLE_TODO_TOOLS=1`): section 7 sums the calls
/// up, keeps each task's id, and the next compaction applies later updates to the tasks the
/// prior summary kept. Before, a list kept that way was not in the summary at all.
#[test]
fn tasks_made_and_updated_one_at_a_time_are_pending_tasks_across_compactions() {
    let failed = Message {
        role: Role::User,
        parts: vec![Part::ToolResult {
            call_id: "t3".into(),
            name: None,
            output: "<tool_use_error>Error: No such tool available: TaskCreate</tool_use_error>"
                .into(),
            is_error: true,
        }],
    };
    let first = extractive_summary(&request(
        vec![
            Message::text(Role::User, "Add a config parser, with tests."),
            tool_call(
                "t1",
                "TaskCreate",
                json!({"subject": "Write the parser", "description": "Parse the config"}),
            ),
            result("t1", "Task #1 created successfully: Write the parser"),
            tool_call("t2", "TaskCreate", json!({"subject": "Test the parser"})),
            result("t2", "Task #2 created successfully: Test the parser"),
            tool_call("t3", "TaskCreate", json!({"subject": "Never made"})),
            failed,
            tool_call(
                "t4",
                "TaskUpdate",
                json!({"taskId": "1", "status": "in_progress"}),
            ),
            result("t4", "Updated task #1 status"),
            Message::text(Role::Assistant, "Writing the parser now."),
        ],
        None,
    ));
    let sections = sections_of(&first);
    assert_eq!(
        sections[6].trim(),
        "- [in_progress] #1 Write the parser\n- [pending] #2 Test the parser",
        "{}",
        sections[6]
    );
    let second = extractive_summary(&request(
        vec![
            tool_call(
                "t5",
                "TaskUpdate",
                json!({"taskId": "1", "status": "completed"}),
            ),
            result("t5", "Updated task #1 status"),
            tool_call(
                "t6",
                "TaskUpdate",
                json!({"taskId": "2", "subject": "Test the parser on bad input"}),
            ),
            result("t6", "Updated task #2 subject"),
            tool_call(
                "t7",
                "TaskCreate",
                json!({"subject": "Document the format"}),
            ),
        ],
        Some(&first),
    ));
    let sections = sections_of(&second);
    assert_eq!(
        sections[6].trim(),
        "- [pending] #2 Test the parser on bad input\n- [pending] Document the format",
        "{}",
        sections[6]
    );
    assert!(
        sections[8].contains("Work on the first unfinished task: Test the parser on bad input"),
        "{}",
        sections[8]
    );
    // TaskList answers the whole list (Claude Code's own words), which stands for it.
    let third = extractive_summary(&request(
        vec![
            tool_call("t8", "TaskList", json!({})),
            result(
                "t8",
                "#2 [in_progress] Test the parser on bad input\n#3 [pending] Document the format\n#4 [completed] Tidy up",
            ),
        ],
        Some(&second),
    ));
    assert_eq!(
        sections_of(&third)[6].trim(),
        "- [in_progress] #2 Test the parser on bad input\n- [pending] #3 Document the format"
    );
}
