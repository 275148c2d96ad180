//! trackFiles (SPEC.md 5.4 "File Tracking"): which files the session read and modified.
//!
//! | tool                                   | tracked as | from                          |
//! |----------------------------------------|------------|-------------------------------|
//! | read (and read_file, view, open)       | read       | `file_path` / `path` / `file` |
//! | write, edit, patch, apply_patch (and multiedit, create, insert, ...) | modified | `file_path` / `path` / `file` |
//! | shell, bash (and sh, exec_command, ...)| both       | the command, by what it does ([`super::shell`]) |
//! | apply_patch, patch bodies              | modified   | `*** Update File:`, `+++ b/...` headers |
//!
//! Tool names match case-insensitively, so Claude Code's `Read`/`Edit`/`Bash` count too. Paths are
//! kept as written, deduplicated in first-seen order, and accumulate with the prior lists, so a
//! file read before the last compaction stays listed after it.

use super::shell::classify_shell_command;
use crate::message::{Message, Part};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;

/// The files of a session, as CompactionResult reports them.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLists {
    pub read: Vec<String>,
    pub modified: Vec<String>,
}

const READ_TOOLS: &[&str] = &["read", "read_file", "view", "open", "open_file", "cat"];
const MODIFY_TOOLS: &[&str] = &[
    "write",
    "write_file",
    "edit",
    "edit_file",
    "multiedit",
    "patch",
    "apply_patch",
    "create",
    "create_file",
    "insert",
    "str_replace",
    "notebookedit",
];
const SHELL_TOOLS: &[&str] = &[
    "shell",
    "bash",
    "sh",
    "zsh",
    "terminal",
    "run_shell_command",
    "execute_command",
    "exec_command",
    "local_shell",
];
const PATH_ARGS: &[&str] = &[
    "file_path",
    "path",
    "file",
    "filename",
    "filePath",
    "notebook_path",
];
const PATCH_ARGS: &[&str] = &["input", "patch", "diff"];

/// The prior lists extended with every file the tool calls of `messages` touch.
pub fn track_files(messages: &[Message], prior: &FileLists) -> FileLists {
    let mut tracker = Tracker::from(prior);
    for message in messages {
        for part in &message.parts {
            if let Part::ToolCall { name, args, .. } = part {
                tracker.tool_call(name, args);
            }
        }
    }
    tracker.lists
}

struct Tracker {
    lists: FileLists,
    seen_read: HashSet<String>,
    seen_modified: HashSet<String>,
}

impl Tracker {
    fn from(prior: &FileLists) -> Tracker {
        let mut tracker = Tracker {
            lists: FileLists::default(),
            seen_read: HashSet::new(),
            seen_modified: HashSet::new(),
        };
        prior.read.iter().for_each(|p| tracker.read(p));
        prior.modified.iter().for_each(|p| tracker.modified(p));
        tracker
    }

    fn read(&mut self, path: &str) {
        if !path.is_empty() && self.seen_read.insert(path.to_string()) {
            self.lists.read.push(path.to_string());
        }
    }

    fn modified(&mut self, path: &str) {
        if !path.is_empty() && self.seen_modified.insert(path.to_string()) {
            self.lists.modified.push(path.to_string());
        }
    }

    fn tool_call(&mut self, name: &str, args: &Value) {
        // Some clients forward OpenAI's `arguments` string untouched.
        let parsed;
        let args = match args {
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => {
                    parsed = v;
                    &parsed
                }
                _ => args,
            },
            _ => args,
        };
        let name = name.to_ascii_lowercase();
        let name = name.rsplit(['.', ':']).next().unwrap_or(&name);
        if READ_TOOLS.contains(&name) {
            if let Some(path) = path_arg(args) {
                self.read(path);
            }
        } else if name == "str_replace_editor" || name == "str_replace_based_edit_tool" {
            // One tool, several commands: `view` reads, the rest modify.
            if let Some(path) = path_arg(args) {
                match args.get("command").and_then(Value::as_str) {
                    Some("view") => self.read(path),
                    _ => self.modified(path),
                }
            }
        } else if MODIFY_TOOLS.contains(&name) {
            if let Some(path) = path_arg(args) {
                self.modified(path);
            }
            for key in PATCH_ARGS {
                if let Some(body) = args.get(key).and_then(Value::as_str) {
                    patch_files(body).iter().for_each(|p| self.modified(p));
                }
            }
            if let Value::String(body) = args {
                patch_files(body).iter().for_each(|p| self.modified(p));
            }
        } else if let Some(command) = SHELL_TOOLS
            .contains(&name)
            .then(|| command_arg(args))
            .flatten()
        {
            let files = classify_shell_command(&command);
            files.read.iter().for_each(|p| self.read(p));
            files.modified.iter().for_each(|p| self.modified(p));
            if command.contains("*** Begin Patch") {
                patch_files(&command).iter().for_each(|p| self.modified(p));
            }
        }
    }
}

fn path_arg(args: &Value) -> Option<&str> {
    PATH_ARGS
        .iter()
        .find_map(|key| args.get(key).and_then(Value::as_str))
        .filter(|p| !p.trim().is_empty())
}

/// The command of a shell call: a string, or an argv array such as `["bash", "-lc", "..."]`.
fn command_arg(args: &Value) -> Option<String> {
    let command = args.get("command").or_else(|| args.get("cmd"))?;
    match command {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let words: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            match words.as_slice() {
                [shell, flag, script, ..] if shell.ends_with("sh") && flag.starts_with('-') => {
                    Some(script.to_string())
                }
                _ => Some(words.join(" ")),
            }
        }
        _ => None,
    }
}

/// Files named in a patch's headers: `*** Update File: p` (apply_patch) or `+++ b/p` (unified
/// diff). `/dev/null` marks a created or deleted side and is not a file.
pub fn patch_files(body: &str) -> Vec<String> {
    let mut files = Vec::new();
    for line in body.lines() {
        let path = [
            "*** Update File: ",
            "*** Add File: ",
            "*** Delete File: ",
            "*** Move to: ",
        ]
        .iter()
        .find_map(|h| line.strip_prefix(h))
        .or_else(|| {
            ["+++ ", "--- "].iter().find_map(|h| {
                line.strip_prefix(h).map(|p| {
                    let p = p.split('\t').next().unwrap_or(p);
                    p.strip_prefix("b/")
                        .or_else(|| p.strip_prefix("a/"))
                        .unwrap_or(p)
                })
            })
        });
        if let Some(path) = path
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "/dev/null" && !files.iter().any(|f| f == p))
        {
            files.push(path.to_string());
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use serde_json::json;

    fn call(name: &str, args: Value) -> Message {
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: format!("{name}-{args}"),
                name: name.into(),
                args,
            }],
        }
    }

    #[test]
    fn the_spec_table() {
        let messages = vec![
            call("read", json!({"file_path": "/src/a.go"})),
            call("write", json!({"file_path": "/src/b.go", "content": "x"})),
            call("edit", json!({"path": "/src/c.go"})),
            call("patch", json!({"file": "/src/d.go"})),
            call("bash", json!({"command": "cat /src/e.go > /src/f.go"})),
            call(
                "shell",
                json!({"command": ["bash", "-lc", "sed -i s/a/b/ /src/g.go"]}),
            ),
        ];
        let files = track_files(&messages, &FileLists::default());
        assert_eq!(files.read, ["/src/a.go", "/src/e.go"]);
        assert_eq!(
            files.modified,
            [
                "/src/b.go",
                "/src/c.go",
                "/src/d.go",
                "/src/f.go",
                "/src/g.go"
            ]
        );
    }

    #[test]
    fn claude_code_names_and_string_arguments_are_understood() {
        let messages = vec![
            call("Read", json!({"file_path": "/a.rs"})),
            call("MultiEdit", json!({"file_path": "/b.rs", "edits": []})),
            call(
                "bash",
                Value::String(r#"{"command": "touch /c.rs"}"#.into()),
            ),
            call(
                "str_replace_editor",
                json!({"command": "view", "path": "/d.rs"}),
            ),
            call(
                "str_replace_editor",
                json!({"command": "str_replace", "path": "/e.rs"}),
            ),
        ];
        let files = track_files(&messages, &FileLists::default());
        assert_eq!(files.read, ["/a.rs", "/d.rs"]);
        assert_eq!(files.modified, ["/b.rs", "/c.rs", "/e.rs"]);
    }

    #[test]
    fn apply_patch_bodies_name_their_files() {
        let body = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n*** Add File: src/b.rs\n+z\n*** End Patch";
        let files = track_files(
            &[call("apply_patch", json!({"input": body}))],
            &FileLists::default(),
        );
        assert_eq!(files.modified, ["src/a.rs", "src/b.rs"]);
        let diff = "--- a/lib/x.py\n+++ b/lib/x.py\n@@ -1 +1 @@\n--- /dev/null\n+++ b/lib/new.py\n";
        assert_eq!(patch_files(diff), ["lib/x.py", "lib/new.py"]);
        let shell = format!("apply_patch <<'EOF'\n{body}\nEOF");
        let files = track_files(
            &[call("bash", json!({"command": shell}))],
            &FileLists::default(),
        );
        assert_eq!(files.modified, ["src/a.rs", "src/b.rs"]);
    }

    #[test]
    fn paths_are_deduplicated_in_first_seen_order_and_accumulate() {
        let prior = FileLists {
            read: vec!["/old.rs".into()],
            modified: vec!["/m.rs".into()],
        };
        let messages = vec![
            call("read", json!({"file_path": "/new.rs"})),
            call("read", json!({"file_path": "/old.rs"})),
            call("read", json!({"file_path": "/new.rs", "offset": 5})),
            call("edit", json!({"file_path": "/m.rs", "x": 1})),
        ];
        let files = track_files(&messages, &prior);
        assert_eq!(files.read, ["/old.rs", "/new.rs"]);
        assert_eq!(files.modified, ["/m.rs"]);
    }
}
