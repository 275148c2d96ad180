//! SPEC.md, item by item: each test pins one row of docs/SPEC-CONFORMANCE.md, whether
//! compactd follows the spec literally there or differs on purpose, so neither can drift
//! silently. The last test checks that every test the document names exists.

use compactd_core::compaction::constants::*;
use compactd_core::compaction::files::{FileLists, track_files};
use compactd_core::compaction::mask::Masking;
use compactd_core::compaction::prompt::{PromptInput, build_compaction_prompt, task_text};
use compactd_core::compaction::sections::{SUMMARY_SECTIONS, heading};
use compactd_core::compaction::step;
use compactd_core::compaction::truncate::truncate_chars;
use compactd_core::compaction::{
    CompactionConfig, CompactionPlan, CompactionResult, LazyEstimator, PlanInput, Trigger,
    check_trigger, estimate_each, find_preserve_boundary, is_blank,
};
use compactd_core::compaction::{Message, Part, Role};
use serde_json::{Value, json};

fn call(id: &str, name: &str, args: Value) -> Message {
    Message {
        role: Role::Assistant,
        parts: vec![Part::ToolCall {
            id: id.into(),
            name: name.into(),
            args,
        }],
    }
}

fn result(id: &str, output: &str, is_error: bool) -> Message {
    Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: id.into(),
            name: None,
            output: output.into(),
            is_error,
        }],
    }
}

fn prompt(messages: &[Message], files: &FileLists) -> String {
    build_compaction_prompt(&PromptInput {
        messages,
        masking: Masking::none(),
        prior_summary: None,
        files,
        focus: None,
    })
}

#[test]
fn spec_constants_have_their_values() {
    assert_eq!(MIN_PRESERVE_RECENT_TOKENS, 2_000);
    assert_eq!(MAX_PRESERVE_RECENT_TOKENS, 15_000);
    assert_eq!(DEFAULT_MAX_MESSAGES, 80);
    assert_eq!(COMPACTION_CIRCUIT_BREAKER_THRESHOLD, 3);
    assert_eq!(MAX_TEXT_CHARS, 2_000);
    assert_eq!(MAX_TOOL_ARGS_CHARS, 500);
    assert_eq!(MAX_TOOL_OUTPUT_CHARS, 2_000);
    assert_eq!(PRESERVE_RECENT_OUTPUTS, 5);
    assert_eq!(DEFAULT_TOKENS_PER_CHAR, 0.25);
    assert_eq!(MASKED_OUTPUT, "[output masked for compaction]");
}

#[test]
fn spec_config_defaults_are_the_constants() {
    let c = CompactionConfig::default();
    assert!(c.mask_observations);
    assert_eq!(
        (c.min_preserve, c.max_preserve, c.max_messages),
        (2_000, 15_000, 80)
    );
    assert_eq!(c.breaker_threshold, 3);
}

#[test]
fn spec_count_trigger_fires_when_the_count_exceeds_max_messages() {
    // The spec's word is "exceeds": 80 messages do not trigger, 81 do (the Go origin uses >=).
    let c = CompactionConfig::default();
    assert_eq!(check_trigger(80, 0, 128_000, &c), None);
    assert_eq!(check_trigger(81, 0, 128_000, &c), Some(Trigger::Messages));
}

#[test]
fn spec_token_trigger_is_the_limit_less_a_reserve() {
    // "Approaches the limit" decided as: tokens >= context_limit - min(20000, limit / 5).
    let c = CompactionConfig::default();
    assert_eq!(c.token_threshold(32_000), 25_600);
    assert_eq!(c.token_threshold(200_000), 180_000);
    assert_eq!(check_trigger(1, 25_599, 32_000, &c), None);
    assert_eq!(check_trigger(1, 25_600, 32_000, &c), Some(Trigger::Tokens));
}

#[test]
fn spec_masking_keeps_the_five_newest_outputs_in_the_prompt_only() {
    let mut messages = Vec::new();
    for i in 0..7 {
        messages.push(call(&format!("c{i}"), "bash", json!({"command": "ls"})));
        messages.push(result(&format!("c{i}"), &format!("output {i}"), false));
    }
    let masking = Masking::keep_recent(&messages, PRESERVE_RECENT_OUTPUTS);
    let p = build_compaction_prompt(&PromptInput {
        messages: &messages,
        masking,
        prior_summary: None,
        files: &FileLists::default(),
        focus: None,
    });
    assert_eq!(p.matches("[output masked for compaction]").count(), 2);
    assert!(!p.contains("output 1]") && p.contains("output 2]") && p.contains("output 6]"));
    // The messages themselves are untouched.
    assert!(
        matches!(&messages[1].parts[0], Part::ToolResult { output, .. } if output == "output 0")
    );
}

#[test]
fn spec_prompt_layout_in_order_with_focus_and_deleted_files_added() {
    let files = FileLists {
        read: vec!["a.rs".into()],
        modified: vec!["b.rs".into()],
        created: vec!["c.rs".into()],
        deleted: vec!["d.rs".into()],
    };
    let messages = vec![Message::text(Role::User, "go")];
    let p = build_compaction_prompt(&PromptInput {
        messages: &messages,
        masking: Masking::none(),
        prior_summary: Some("before"),
        files: &files,
        focus: Some("tests"),
    });
    let order = [
        "<task>",
        "</task>",
        "<focus>",
        "<conversation>",
        "<prior-summary>\nbefore\n</prior-summary>",
        "<user>\ngo\n</user>",
        "</conversation>",
        "<read-files>\na.rs\n</read-files>",
        "<modified-files>\nb.rs\nc.rs\n</modified-files>",
        "<deleted-files>\nd.rs\n</deleted-files>",
    ];
    let mut at = 0;
    for piece in order {
        let found = p[at..]
            .find(piece)
            .unwrap_or_else(|| panic!("{piece} out of order"));
        at += found + piece.len();
    }
}

#[test]
fn spec_task_asks_for_nine_sections_under_numbered_headings() {
    let task = task_text();
    for s in &SUMMARY_SECTIONS {
        assert!(task.contains(&format!("## {}. {}", s.number, s.title)));
    }
    assert_eq!(heading(&SUMMARY_SECTIONS[5]), "## 6. All user messages");
    assert!(!task.contains("**Primary Request and Intent**"));
}

#[test]
fn spec_truncation_cuts_characters_and_says_how_much() {
    assert_eq!(
        truncate_chars("héllo wörld", 5),
        "héllo…[truncated 6 chars]"
    );
    let long = "é".repeat(2_100);
    let p = prompt(&[Message::text(Role::User, long)], &FileLists::default());
    assert!(p.contains(&format!("{}…[truncated 100 chars]", "é".repeat(2_000))));
}

#[test]
fn spec_failed_results_are_marked_and_blank_text_is_skipped() {
    let messages = vec![
        Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: "  \n ".into(),
                },
                Part::ToolCall {
                    id: "c".into(),
                    name: "bash".into(),
                    args: json!({"command": "false"}),
                },
            ],
        },
        result("c", "boom", true),
    ];
    let p = prompt(&messages, &FileLists::default());
    assert!(p.contains("<assistant>\n[tool_call: bash("));
    assert!(p.contains("[tool_result: bash (error) = boom]"));
}

#[test]
fn spec_file_blocks_are_written_even_when_empty() {
    let p = prompt(&[Message::text(Role::User, "hi")], &FileLists::default());
    assert!(p.ends_with("<read-files>\n</read-files>\n\n<modified-files>\n</modified-files>\n"));
}

#[test]
fn spec_estimates_count_characters_rounded_up_per_message() {
    let e = LazyEstimator::default();
    // Four ASCII characters a token, as the spec says.
    assert_eq!(e.text("abcdefgh"), 2);
    // Where compactd differs on purpose, characters outside ASCII count for more: an
    // accented or Cyrillic letter two (as many as its bytes, which the origin counts), any
    // other four, a token of its own (the models count 0.5 to 1.8 tokens each; at four
    // characters a token a session in Japanese reached its model at 3.9 times its estimate:
    // `model_count.rs`).
    assert_eq!(e.text("éèêë"), 2);
    assert_eq!(e.text("日本語字"), 4);
    // Digits count two, and a switch between letters and digits two more (tokenizers split
    // numbers into groups of three and never join a digit to a letter: a session reading
    // lockfiles reached its model at 1.9 times its estimate).
    assert_eq!(e.text("12345678"), 4);
    assert_eq!(e.text("a1b2"), 3);
    // A letter or digit after punctuation counts two more, a capital after a small letter
    // four (the tokenizers start a token there: minified code, SVG paths and base64 reached
    // their models at 1.4 to 1.9 times the estimate without these).
    assert_eq!(e.text("a.b(c)"), 3);
    assert_eq!(e.text("getValue"), 3);
    // Rounded up once per message, no per-message minimum.
    assert_eq!(e.message(&Message::text(Role::User, "abcde")), 2);
    assert_eq!(e.message(&Message::text(Role::User, "a")), 1);
}

#[test]
fn spec_string_arguments_are_estimated_as_the_prompt_prints_them() {
    let args = json!(r#"{"command":"ls -la"}"#);
    let message = call("c", "bash", args);
    let p = prompt(std::slice::from_ref(&message), &FileLists::default());
    assert!(p.contains(r#"[tool_call: bash({"command":"ls -la"})]"#));
    // "bash" + the 20 characters printed, not the 26 of the string's JSON form (and two
    // more for each of the three words after punctuation: compactd's own, above).
    assert_eq!(
        LazyEstimator::default().message(&message),
        (4usize + 20 + 6).div_ceil(4)
    );
}

#[test]
fn spec_file_tracking_table_with_directories_left_out() {
    let messages = vec![
        call("1", "read", json!({"file_path": "/r.go"})),
        call("2", "write", json!({"path": "/w.go", "content": "x"})),
        call("3", "edit", json!({"file": "/e.go"})),
        call(
            "4",
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Update File: p.go\n*** End Patch"}),
        ),
        call(
            "5",
            "bash",
            json!({"command": "cat s.go && sed -i s/a/b/ t.go && grep -r x src"}),
        ),
    ];
    let files = track_files(&messages, &FileLists::default());
    assert_eq!(files.read, ["/r.go", "s.go"]);
    assert_eq!(files.modified, ["/e.go", "p.go", "t.go"]);
    // A file the session had not seen, written whole: created (the spec's "modified").
    assert_eq!(files.created, ["/w.go"]);
    assert!(
        !files.read.contains(&"src".to_string()),
        "a searched directory is not a file"
    );
}

#[test]
fn spec_preserve_budget_is_a_sixteenth_of_the_usable_context_clamped() {
    let c = CompactionConfig::default();
    // The origin always spends 15,000: at 32k that tail alone is over half the threshold.
    assert_eq!(c.preserve_budget(32_000, 0), MIN_PRESERVE_RECENT_TOKENS);
    assert_eq!(c.preserve_budget(128_000, 0), 108_000 / 16);
    assert_eq!(c.preserve_budget(8_000, 0), MIN_PRESERVE_RECENT_TOKENS);
    assert_eq!(c.preserve_budget(1_000_000, 0), MAX_PRESERVE_RECENT_TOKENS);
}

#[test]
fn spec_boundary_walks_newest_first_never_orphans_and_caps_messages() {
    let messages = vec![
        Message::text(Role::User, "u"),
        call("a", "bash", json!({})),
        result("a", "o", false),
        Message::text(Role::Assistant, "done"),
    ];
    // The budget reaches the result but not its call: the boundary moves past the result.
    assert_eq!(
        find_preserve_boundary(&messages, &[1, 50, 10, 10], 25, 100).index,
        3
    );
    // Tail capped at max_tail_messages (max_messages / 8 by default).
    let many = vec![Message::text(Role::User, "x"); 10];
    assert_eq!(find_preserve_boundary(&many, &[1; 10], 1_000, 4).index, 6);
}

#[test]
fn spec_the_current_step_is_a_floor_under_the_preserve_boundary() {
    let messages = vec![
        Message::text(Role::User, "u"),
        call("a", "bash", json!({})),
        result("a", "o", false),
        call("b", "bash", json!({})),
        result("b", &"x".repeat(80_000), false),
    ];
    // The budget rule alone would keep nothing: the newest output is larger than it.
    // The current step (call b and its result) stays; the older round is compacted.
    let b = find_preserve_boundary(&messages, &[1, 10, 10, 10, 20_000], 2_000, 100);
    assert_eq!(b.index, 3);
    // In the context it is shortened to its share of the step budget, head and tail kept.
    let shortened = step::shorten_message(
        &messages[4],
        compactd_core::compaction::Origin {
            session: "s",
            seq: 5,
        },
        3_200,
        &LazyEstimator::default(),
    )
    .unwrap();
    let Part::ToolResult { output, .. } = &shortened[0] else {
        panic!("a result")
    };
    assert!(output.starts_with("xxxx") && output.ends_with("xxxx"));
    assert!(
        output.contains("the whole message is seq 5 of session s, read_messages has it"),
        "{output}"
    );
}

#[test]
fn spec_result_fields_with_created_and_deleted_added() {
    let result = CompactionResult {
        summary: "s".into(),
        read_files: vec![],
        modified_files: vec![],
        created_files: vec![],
        deleted_files: vec![],
        pre_tokens: 10,
        post_tokens: 5,
        compaction_num: 1,
    };
    let value = serde_json::to_value(&result).unwrap();
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "compaction_num",
            "created_files",
            "deleted_files",
            "modified_files",
            "post_tokens",
            "pre_tokens",
            "read_files",
            "summary"
        ]
    );
}

#[test]
fn spec_blank_summaries_are_failures() {
    assert!(is_blank(" \n\t"));
    assert!(!is_blank("x"));
}

#[test]
fn spec_pinned_messages_are_never_summarized() {
    let messages = vec![
        Message::text(Role::System, "system rules"),
        Message::text(Role::User, "the task"),
        Message::text(Role::Assistant, "a".repeat(40_000)),
        Message::text(Role::User, "next"),
        Message::text(Role::Assistant, "on it"),
    ];
    let tokens = estimate_each(&messages, &LazyEstimator::default());
    let config = CompactionConfig::default();
    let input = PlanInput {
        pinned: &[true, true, false, false, false],
        pinned_tokens: tokens[0] + tokens[1],
        ..PlanInput::new(&messages, &tokens, 32_000, &config)
    };
    let plan = CompactionPlan::new(&input);
    assert_eq!(plan.summarized, [2]);
    let p = plan.prompt(&input);
    assert!(!p.contains("system rules") && !p.contains("the task"));
}

/// Every test docs/SPEC-CONFORMANCE.md names exists where it says.
#[test]
fn spec_conformance_document_names_existing_tests() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/SPEC-CONFORMANCE.md")).unwrap();
    let mut named = 0;
    for cell in doc.split('`').filter(|c| c.contains("::")) {
        let (file, test) = cell.split_once("::").unwrap();
        if !file.starts_with("tests/") || !file.ends_with(".rs") {
            continue;
        }
        let source = std::fs::read_to_string(format!("{root}/{file}"))
            .unwrap_or_else(|_| panic!("the document names {file}, which does not exist"));
        assert!(
            source.contains(&format!("fn {test}(")),
            "the document names {file}::{test}, which does not exist"
        );
        named += 1;
    }
    assert!(named >= 20, "only {named} tests named");
}
