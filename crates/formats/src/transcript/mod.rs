//! Reading agent transcripts into compactd messages: Claude Code session JSONL, OpenAI chat
//! arrays, mini-swe-agent and SWE-agent trajectories.
//!
//! Converters keep what the model saw, and nothing is dropped silently: everything that is
//! not carried over (sub-agent records, CLI notes, demonstrations, images, results whose call
//! is missing) is counted in the [`Transcript::skipped`] report.

mod claude_code;
mod openai;
mod swe;

use crate::message::{Message, Part};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// A transcript format (a `--format` value of the CLI's, with the `clap` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Format {
    ClaudeCode,
    Openai,
    MiniSweAgent,
    SweAgent,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::ClaudeCode => "claude-code",
            Format::Openai => "openai",
            Format::MiniSweAgent => "mini-swe-agent",
            Format::SweAgent => "swe-agent",
        }
    }
}

/// A converted transcript.
#[derive(Debug, Clone)]
pub struct Transcript {
    pub format: Format,
    pub messages: Vec<Message>,
    /// What was not carried over, by reason, with counts.
    pub skipped: BTreeMap<String, usize>,
    /// A session id the transcript carries (Claude Code's sessionId), if any.
    pub session_hint: Option<String>,
    /// The diff a SWE run submitted (`info.submission`), if any: what really changed.
    pub submission: Option<String>,
}

/// What a converter found wrong with a transcript's content (its file is named by the
/// caller, in [`TranscriptError::Format`]).
#[derive(Debug)]
pub struct Malformed(String);

impl From<&str> for Malformed {
    fn from(why: &str) -> Malformed {
        Malformed(why.to_string())
    }
}

impl From<String> for Malformed {
    fn from(why: String) -> Malformed {
        Malformed(why)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
}

/// What a converter produces before the shared clean-up.
#[derive(Default)]
pub struct Draft {
    pub messages: Vec<Message>,
    pub skipped: BTreeMap<String, usize>,
    pub session_hint: Option<String>,
    pub submission: Option<String>,
}

/// One Chat Completions message (a model's answer) as a compactd message.
pub fn openai_message(message: &Value) -> Option<Message> {
    let mut draft = Draft::default();
    openai::convert_message(message, &mut draft);
    draft.messages.pop()
}

/// Anthropic content blocks as compactd's parts (what is read of them; images as a note).
pub fn anthropic_parts(content: &Value) -> Vec<crate::message::Part> {
    claude_code::content_parts(content, &mut Draft::default())
}

/// Anthropic content blocks (a model's answer) as an assistant message.
pub fn anthropic_reply(content: &Value) -> Message {
    Message {
        role: crate::message::Role::Assistant,
        parts: claude_code::content_parts(content, &mut Draft::default()),
    }
}

impl Draft {
    pub fn skip(&mut self, reason: &str) {
        *self.skipped.entry(reason.to_string()).or_default() += 1;
    }
}

/// Loads `path`, detecting its format unless one is given.
pub fn load(path: &Path, format: Option<Format>) -> Result<Transcript, TranscriptError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TranscriptError::Read {
        path: shown.clone(),
        error: source,
    })?;
    let format = match format {
        Some(f) => f,
        None => detect(&text).ok_or_else(|| TranscriptError::Format {
            path: shown.clone(),
            message: "unrecognised transcript format; pass --format".into(),
        })?,
    };
    let draft = match format {
        Format::ClaudeCode => claude_code::convert(&text),
        other => {
            let value: Value =
                serde_json::from_str(&text).map_err(|e| TranscriptError::Format {
                    path: shown.clone(),
                    message: format!("not JSON: {e}"),
                })?;
            match other {
                Format::Openai => openai::convert_list(&value),
                Format::MiniSweAgent => openai::convert_mini_swe_agent(&value),
                _ => swe::convert(&value),
            }
        }
    }
    .map_err(|Malformed(message)| TranscriptError::Format {
        path: shown,
        message,
    })?;
    Ok(finish(format, draft))
}

/// Guesses the format from the content.
pub fn detect(text: &str) -> Option<Format> {
    let is_claude_record = |v: &Value| {
        v.get("type").is_some()
            && ["sessionId", "leafUuid", "uuid"]
                .iter()
                .any(|k| v.get(k).is_some())
    };
    let Ok(whole) = serde_json::from_str::<Value>(text) else {
        // Not one JSON value: JSON Lines, as Claude Code writes them.
        let first = text.lines().find(|l| !l.trim().is_empty())?;
        let record: Value = serde_json::from_str(first).ok()?;
        return is_claude_record(&record).then_some(Format::ClaudeCode);
    };
    match whole {
        Value::Array(_) => Some(Format::Openai),
        Value::Object(ref map) => {
            if map
                .get("trajectory_format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("mini-swe-agent"))
            {
                Some(Format::MiniSweAgent)
            } else if map.contains_key("history") && map.contains_key("trajectory") {
                Some(Format::SweAgent)
            } else if map.contains_key("messages") {
                Some(Format::Openai)
            } else if is_claude_record(&whole) {
                Some(Format::ClaudeCode)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The clean-up every format shares: a result must follow its call, once, and every message
/// must be one the daemon accepts.
fn finish(format: Format, mut draft: Draft) -> Transcript {
    // Calls made and not answered yet.
    let mut calls: HashSet<String> = HashSet::new();
    let mut messages = Vec::with_capacity(draft.messages.len());
    for mut message in std::mem::take(&mut draft.messages) {
        message.parts.retain(|part| match part {
            Part::ToolResult { call_id, .. } if !calls.remove(call_id) => {
                draft.skip("tool results whose call is not in the transcript, or answered already");
                false
            }
            _ => true,
        });
        if message.parts.is_empty() {
            continue;
        }
        if message.validate().is_err() {
            draft.skip("messages compactd cannot accept");
            continue;
        }
        calls.extend(message.tool_call_ids().map(str::to_string));
        messages.push(message);
    }
    Transcript {
        format,
        messages,
        skipped: draft.skipped,
        session_hint: draft.session_hint,
        submission: draft.submission.filter(|s| !s.trim().is_empty()),
    }
}

/// Text of a content value that may be a string or a list of blocks; images become a
/// placeholder (counted).
pub fn content_text(content: &Value, draft: &mut Draft) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for block in blocks {
                match block["type"].as_str() {
                    Some("text") => {
                        out.push(block["text"].as_str().unwrap_or_default().to_string())
                    }
                    Some("image") | Some("image_url") => {
                        draft.skip("images (replaced by a placeholder)");
                        out.push("[image omitted]".into());
                    }
                    _ => draft.skip("unknown content blocks"),
                }
            }
            Some(out.join("\n"))
        }
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Tool arguments from OpenAI's JSON string (kept as a string if it is not JSON, or if it
/// would unfold past its bounds: see [`unfolds`]).
pub fn parse_arguments(arguments: &Value) -> Value {
    match arguments {
        Value::String(s) if unfolds(s) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        other => other.clone(),
    }
}

/// Objects and arrays one call's arguments may unfold into from a string: more stay the
/// string (a model server's answer may hold 128 calls, each megabytes of brackets).
const MAX_ARGUMENT_CONTAINERS: usize = 1_024;

/// Whether arguments written as a string are parsed: JSON that starts with its bracket (what
/// a request's bounds count, [`crate::json_shape`]), or a plain value, and within
/// [`MAX_ARGUMENT_CONTAINERS`].
fn unfolds(arguments: &str) -> bool {
    let brackets = ['{', '['];
    if !arguments.starts_with(brackets) {
        return !arguments.trim_start().starts_with(brackets);
    }
    crate::json_shape::Shape::of(arguments.as_bytes()).containers <= MAX_ARGUMENT_CONTAINERS
}

/// A session id made from a file name: allowed characters kept, others replaced by `-`.
pub fn session_id_from(path: &Path) -> compactd_core::SessionId {
    let stem = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("imported");
    let stem = stem
        .trim_end_matches(".jsonl")
        .trim_end_matches(".json")
        .trim_end_matches(".traj");
    let id: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    compactd_core::SessionId::parse(id)
        .unwrap_or_else(|_| compactd_core::SessionId::parse("imported").expect("a valid id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_detected_from_content() {
        assert_eq!(
            detect("{\"type\":\"summary\",\"leafUuid\":\"x\"}\n{\"type\":\"user\"}"),
            Some(Format::ClaudeCode)
        );
        assert_eq!(
            detect("[{\"role\":\"user\",\"content\":\"hi\"}]"),
            Some(Format::Openai)
        );
        assert_eq!(
            detect("{\"messages\":[],\"trajectory_format\":\"mini-swe-agent-1.1\"}"),
            Some(Format::MiniSweAgent)
        );
        assert_eq!(
            detect("{\"history\":[],\"trajectory\":[]}"),
            Some(Format::SweAgent)
        );
        assert_eq!(detect("{\"nothing\":1}"), None);
    }

    #[test]
    fn results_without_their_call_or_answering_it_again_are_reported_not_kept() {
        use crate::message::Role;
        let result = |id: &str| Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id.into(),
                name: None,
                output: "x".into(),
                is_error: false,
            }],
        };
        let call = Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "a".into(),
                name: "bash".into(),
                args: serde_json::json!({}),
            }],
        };
        let draft = Draft {
            messages: vec![
                result("ghost"),
                call.clone(),
                result("a"),
                result("a"),
                call,
                result("a"),
            ],
            ..Default::default()
        };
        let t = finish(Format::Openai, draft);
        assert_eq!(t.messages.len(), 4, "each call and its one result");
        assert_eq!(
            t.skipped["tool results whose call is not in the transcript, or answered already"],
            2
        );
    }

    #[test]
    fn session_ids_from_file_names_are_valid() {
        let id = session_id_from(Path::new(
            "/x/deepseek_chat__astropy__astropy-14182.traj.json",
        ));
        assert_eq!(id.as_str(), "deepseek_chat__astropy__astropy-14182");
        assert_eq!(
            session_id_from(Path::new("a b/ü?.jsonl")).as_str(),
            "--.jsonl".replace(".jsonl", "")
        );
        assert_eq!(
            session_id_from(Path::new("x/...jsonl")).as_str(),
            "imported"
        );
    }
}

#[cfg(test)]
mod shared_transcripts {
    use super::*;

    #[test]
    fn every_shared_transcript_converts() {
        let root = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/transcripts"
        ));
        if !root.exists() {
            eprintln!("SKIP: ../shared/transcripts is absent");
            return;
        }
        for dir in ["claude-code", "mini-swe-agent", "swe-agent"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                let t = load(&path, None).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(t.format.name(), dir, "{}", path.display());
                assert!(t.messages.len() > 10, "{}", path.display());
                eprintln!(
                    "{:60} {:5} messages, skipped {:?}",
                    path.file_name().unwrap().to_string_lossy(),
                    t.messages.len(),
                    t.skipped
                );
            }
        }
    }
}
