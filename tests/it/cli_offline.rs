//! `compactd plan` and `compactd summarize` run as a user runs them: the real binary on files.

use serde_json::{Value, json};
use std::process::Command;
use tempfile::TempDir;

fn compactd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_compactd"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A session of `rounds` bash rounds, each with a user message, in OpenAI style.
fn session(rounds: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for i in 0..rounds {
        messages
            .push(json!({"role": "user", "content": format!("instruction {i}: fix module {i}")}));
        messages.push(json!({"role": "assistant", "parts": [
            {"type": "text", "text": format!("Looking at module {i}.")},
            {"type": "tool_call", "id": format!("c{i}"), "name": "bash",
             "args": {"command": format!("cat src/m{i}.py && sed -i 's/a/b/' src/m{i}.py")}}]}));
        messages.push(json!({"role": "tool", "parts": [
            {"type": "tool_result", "call_id": format!("c{i}"), "output": "x = 1\n".repeat(50)}]}));
    }
    json!(messages)
}

fn write(dir: &TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn plan_reports_the_trigger_boundary_prompt_and_files() {
    let dir = TempDir::new().unwrap();
    let input = write(&dir, "s.json", &session(30).to_string());
    let (code, out, err) = compactd(&["plan", "--input", &input]);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["should_compact"], true);
    assert_eq!(plan["reason"], "messages");
    let boundary = plan["boundary"].as_u64().unwrap();
    assert!(boundary > 0 && boundary < 91, "{boundary}");
    assert_eq!(plan["read_files"][0], "src/m0.py");
    assert_eq!(plan["modified_files"].as_array().unwrap().len(), 30);
    let prompt = plan["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("<task>\n"));
    // The system message and the task are pinned: they stay verbatim, never summarized.
    assert!(!prompt.contains("You are a coding agent."));
    assert!(!prompt.contains("instruction 0: fix module 0"));
    assert!(prompt.contains("instruction 1: fix module 1"));
    assert_eq!(plan["summarized"].as_u64().unwrap(), boundary - 2);
    assert!(prompt.contains("[output masked for compaction]"));

    // A short session does not need compaction; the tokens trigger reports its reason.
    let small = write(
        &dir,
        "small.json",
        &json!({"messages": session(2)}).to_string(),
    );
    let (_, out, _) = compactd(&["plan", "--input", &small]);
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["should_compact"], false);
    assert_eq!(plan["reason"], Value::Null);
    let (_, out, _) = compactd(&["plan", "--input", &small, "--context-limit", "200"]);
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["reason"], "tokens");
}

#[test]
fn plan_includes_prior_summary_and_focus() {
    let dir = TempDir::new().unwrap();
    let input = write(&dir, "s.json", &session(30).to_string());
    let prior = write(
        &dir,
        "prior.md",
        "## 6. All user messages\n[#1] earlier words",
    );
    let (code, out, _) = compactd(&[
        "plan",
        "--input",
        &input,
        "--prior-summary",
        &prior,
        "--focus",
        "the parser",
    ]);
    assert_eq!(code, 0);
    let prompt = serde_json::from_str::<Value>(&out).unwrap()["prompt"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(prompt.contains(
        "<prior-summary>\n## 6. All user messages\n[#1] earlier words\n</prior-summary>"
    ));
    assert!(prompt.contains("<focus>\nthe parser\n</focus>"));
}

#[test]
fn summarize_prints_the_compaction_result() {
    let dir = TempDir::new().unwrap();
    let input = write(&dir, "s.json", &session(30).to_string());
    let (code, out, err) = compactd(&["summarize", "--input", &input]);
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    for key in [
        "summary",
        "read_files",
        "modified_files",
        "pre_tokens",
        "post_tokens",
        "compaction_num",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert_eq!(r["compaction_num"], 1);
    assert!(r["post_tokens"].as_u64() < r["pre_tokens"].as_u64());
    let summary = r["summary"].as_str().unwrap();
    assert!(summary.contains("## 6. All user messages"));
    // Every compacted user message is in the summary.
    let boundary = r["boundary"].as_u64().unwrap() as usize;
    // The task is pinned, so the summary points to it.
    assert!(summary.contains("[#1, seq 2] (the session's task: quoted whole at the start"));
    for i in 1..30 {
        if 1 + 3 * i < boundary {
            assert!(
                summary.contains(&format!("instruction {i}: fix module {i}")),
                "lost instruction {i}"
            );
        }
    }
}

#[test]
fn bad_input_is_a_one_line_error_naming_the_problem() {
    let dir = TempDir::new().unwrap();
    let cases = [
        ("missing.json", None, "cannot read"),
        ("bad.json", Some("{not json"), "not a valid message list"),
        (
            "role.json",
            Some(r#"[{"role":"robot","content":"x"}]"#),
            "robot",
        ),
        (
            "part.json",
            Some(r#"[{"role":"user","parts":[{"type":"video"}]}]"#),
            "video",
        ),
        (
            "misplaced.json",
            Some(r#"[{"role":"user","parts":[{"type":"tool_call","id":"a","name":"b"}]}]"#),
            "message 0",
        ),
    ];
    for (name, content, expected) in cases {
        let path = match content {
            Some(c) => write(&dir, name, c),
            None => dir.path().join(name).to_str().unwrap().to_string(),
        };
        for command in ["plan", "summarize"] {
            let (code, out, err) = compactd(&[command, "--input", &path]);
            assert_ne!(code, 0, "{command} {name}");
            assert!(out.is_empty());
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(err.contains(expected), "{command} {name}: {err}");
        }
    }
}
