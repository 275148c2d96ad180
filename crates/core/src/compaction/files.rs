//! trackFiles (SPEC.md 5.4 "File Tracking"): which files the session read, changed, created
//! and deleted.
//!
//! | tool                                          | tracked as        | from                          |
//! |-----------------------------------------------|-------------------|-------------------------------|
//! | read (read_file, view, open, ...)             | read              | `file_path` / `path` / `file` |
//! | edit, multiedit, str_replace, insert, ...     | modified          | the path argument, else the file last opened (SWE-agent's `edit`) |
//! | write, create (whole-file writes)             | modified, or created when the session had not seen the file | the path argument |
//! | patch, apply_patch                            | by the patch's headers | `input` / `patch` / `diff`  |
//! | str_replace_editor (SWE-agent, OpenHands)     | by its `command`  | `path`                        |
//! | shell, bash, execute_bash, ...                | by what the command does ([`super::shell`]) | the command |
//! | aider SEARCH/REPLACE blocks in assistant text | modified / created | the file name line          |
//!
//! Beyond the spec's two lists (read, modified), compactd keeps two more so the modified list
//! says what changed in the project: **created** files were first touched by a whole-file write
//! (a scratch script, a backup copy, a captured `git diff > patch.txt`), and **deleted** files
//! were removed. A created file that is removed again leaves no trace. The spec's "modified" is
//! `modified ∪ created`.
//!
//! The tracker remembers what the session wrote (here-documents, write tools) so that
//! `patch -p1 < fix.patch`, `git apply fix.patch`, `python fix.py` and `bash run.sh` are
//! credited with the files they change. Directories (`cd` and `mkdir` targets, and any path
//! that is a prefix of another) are never files. Tool names match case-insensitively; lists
//! accumulate with the prior compaction's.

use super::patch::{PatchOp, patch_targets};
use super::script::python_files;
use super::shell::{FileEffect, plausible_file, shell_effects};
use crate::message::{Message, Part, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The files of a session, as CompactionResult reports them.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLists {
    pub read: Vec<String>,
    /// Files that existed and were changed.
    pub modified: Vec<String>,
    /// Files the session made (first touched by a whole-file write).
    #[serde(default)]
    pub created: Vec<String>,
    /// Files the session removed.
    #[serde(default)]
    pub deleted: Vec<String>,
}

impl FileLists {
    /// The spec's "modified files": changed or created.
    pub fn changed(&self) -> impl Iterator<Item = &String> {
        self.modified.iter().chain(&self.created)
    }
}

const READ_TOOLS: &[&str] = &[
    "read",
    "read_file",
    "view",
    "view_file",
    "open",
    "open_file",
    "cat",
];
const WRITE_TOOLS: &[&str] = &["write", "write_file", "create", "create_file"];
const EDIT_TOOLS: &[&str] = &[
    "edit",
    "edit_file",
    "multiedit",
    "str_replace",
    "insert",
    "notebookedit",
    "replace",
    "search_replace",
];
const PATCH_TOOLS: &[&str] = &["patch", "apply_patch", "apply_diff"];
const EDITOR_TOOLS: &[&str] = &["str_replace_editor", "str_replace_based_edit_tool"];
const SHELL_TOOLS: &[&str] = &[
    "shell",
    "bash",
    "sh",
    "zsh",
    "terminal",
    "run_shell_command",
    "execute_command",
    "exec_command",
    "execute_bash",
    "run_command",
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
const CONTENT_ARGS: &[&str] = &["content", "file_text", "text", "contents"];
const PATCH_ARGS: &[&str] = &["input", "patch", "diff"];

/// The prior lists extended with every file the tool calls of `messages` touch.
pub fn track_files(messages: &[Message], prior: &FileLists) -> FileLists {
    let mut tracker = Tracker::from(prior);
    tracker.messages(messages);
    tracker.finish()
}

/// The files `messages` changed or created, most relevant first: the most recently changed
/// first, more changes first among equals. Section 3 of a summary lists them in this order.
pub fn recently_changed(messages: &[Message]) -> Vec<String> {
    let mut tracker = Tracker::from(&FileLists::default());
    tracker.messages(messages);
    let mut activity: Vec<(String, (usize, usize))> = tracker.activity.drain().collect();
    activity.sort_by(|(pa, (ca, la)), (pb, (cb, lb))| lb.cmp(la).then(cb.cmp(ca)).then(pa.cmp(pb)));
    activity.into_iter().map(|(path, _)| path).collect()
}

/// A list that keeps first-seen order and answers membership fast.
#[derive(Default)]
struct OrderedSet {
    items: Vec<String>,
    set: HashSet<String>,
}

impl OrderedSet {
    fn insert(&mut self, path: &str) {
        if self.set.insert(path.to_string()) {
            self.items.push(path.to_string());
        }
    }
    fn remove(&mut self, path: &str) -> bool {
        let removed = self.set.remove(path);
        if removed {
            self.items.retain(|p| p != path);
        }
        removed
    }
    fn contains(&self, path: &str) -> bool {
        self.set.contains(path)
    }
}

/// Written file contents kept so a later `patch < f` or `python f` can be read: at most this
/// many files...
const REMEMBERED_FILES: usize = 64;
/// ...of at most this many bytes each.
const REMEMBERED_BYTES: usize = 256 * 1024;

struct Tracker {
    read: OrderedSet,
    modified: OrderedSet,
    created: OrderedSet,
    deleted: OrderedSet,
    directories: HashSet<String>,
    /// Contents the session wrote, by path.
    written: HashMap<String, String>,
    /// The file SWE-agent's `open`/`create` made current; its `edit` has no path.
    current: Option<String>,
    /// Changes per path in these messages: (count, time of the latest).
    activity: HashMap<String, (usize, usize)>,
    clock: usize,
}

impl Tracker {
    fn from(prior: &FileLists) -> Tracker {
        let seed = |list: &[String]| {
            let mut set = OrderedSet::default();
            list.iter().for_each(|p| set.insert(p));
            set
        };
        Tracker {
            read: seed(&prior.read),
            modified: seed(&prior.modified),
            created: seed(&prior.created),
            deleted: seed(&prior.deleted),
            directories: HashSet::new(),
            written: HashMap::new(),
            current: None,
            activity: HashMap::new(),
            clock: 0,
        }
    }

    fn messages(&mut self, messages: &[Message]) {
        for message in messages {
            for part in &message.parts {
                match part {
                    Part::ToolCall { name, args, .. } => self.tool_call(name, args),
                    Part::Text { text } if message.role == Role::Assistant => {
                        self.edit_blocks(text)
                    }
                    _ => {}
                }
            }
        }
    }

    fn seen(&self, path: &str) -> bool {
        self.read.contains(path)
            || self.modified.contains(path)
            || self.created.contains(path)
            || self.deleted.contains(path)
    }

    fn touch_activity(&mut self, path: &str) {
        self.clock += 1;
        let entry = self.activity.entry(path.to_string()).or_default();
        entry.0 += 1;
        entry.1 = self.clock;
    }

    fn read(&mut self, path: &str) {
        if let Some(path) = normalized(path) {
            self.read.insert(&path);
        }
    }

    fn edit(&mut self, path: &str) {
        let Some(path) = normalized(path) else { return };
        if !self.created.contains(&path) {
            self.deleted.remove(&path);
            self.modified.insert(&path);
        }
        self.touch_activity(&path);
    }

    fn write(&mut self, path: &str, content: Option<&str>) {
        let Some(path) = normalized(path) else { return };
        if !self.created.contains(&path) && !self.modified.contains(&path) {
            if self.seen(&path) {
                self.deleted.remove(&path);
                self.modified.insert(&path);
            } else {
                self.created.insert(&path);
            }
        }
        self.remember(&path, content);
        self.touch_activity(&path);
    }

    fn delete(&mut self, path: &str) {
        let Some(path) = normalized(path) else { return };
        self.written.remove(&path);
        self.activity.remove(&path);
        if self.created.remove(&path) {
            return;
        }
        self.modified.remove(&path);
        self.deleted.insert(&path);
    }

    fn remember(&mut self, path: &str, content: Option<&str>) {
        match content.filter(|c| c.len() <= REMEMBERED_BYTES) {
            Some(content)
                if self.written.len() < REMEMBERED_FILES || self.written.contains_key(path) =>
            {
                self.written.insert(path.to_string(), content.to_string());
            }
            _ => {
                self.written.remove(path);
            }
        }
    }

    /// What the session wrote to `path`, matching `fix.py` with `/repo/fix.py` and back.
    fn recall(&self, path: &str) -> Option<String> {
        let path = normalized(path)?;
        if let Some(content) = self.written.get(&path) {
            return Some(content.clone());
        }
        self.written
            .iter()
            .find(|(k, _)| k.ends_with(&format!("/{path}")) || path.ends_with(&format!("/{k}")))
            .map(|(_, v)| v.clone())
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
        let path = path_arg(args).map(str::to_string);
        if READ_TOOLS.contains(&name) {
            if let Some(path) = path {
                self.read(&path);
                self.current = Some(path);
            }
        } else if EDITOR_TOOLS.contains(&name) {
            let Some(path) = path else { return };
            match args.get("command").and_then(Value::as_str) {
                Some("view") => self.read(&path),
                Some("create") => self.write(&path, content_arg(args)),
                _ => self.edit(&path),
            }
            self.current = Some(path);
        } else if WRITE_TOOLS.contains(&name) {
            if let Some(path) = path {
                self.write(&path, content_arg(args));
                self.current = Some(path);
            }
        } else if EDIT_TOOLS.contains(&name) {
            if let Some(path) = path.or_else(|| self.current.clone()) {
                self.edit(&path);
            }
        } else if PATCH_TOOLS.contains(&name) {
            if let Some(path) = path {
                self.edit(&path);
            }
            for key in PATCH_ARGS {
                if let Some(body) = args.get(key).and_then(Value::as_str) {
                    self.apply_patch(body, None);
                }
            }
            if let Value::String(body) = args {
                self.apply_patch(body, None);
            }
        } else if SHELL_TOOLS.contains(&name)
            && let Some(command) = command_arg(args)
        {
            self.shell(&command, 0);
        }
    }

    fn shell(&mut self, command: &str, depth: usize) {
        for effect in shell_effects(command) {
            self.effect(effect, depth);
        }
        // apply_patch invoked as a shell command carries its patch inline.
        if command.contains("*** Begin Patch") {
            self.apply_patch(command, None);
        }
    }

    fn effect(&mut self, effect: FileEffect, depth: usize) {
        match effect {
            FileEffect::Read(p) => self.read(&p),
            FileEffect::Edit(p) => self.edit(&p),
            FileEffect::Write(p, content) => self.write(&p, content.as_deref()),
            FileEffect::Delete(p) => self.delete(&p),
            FileEffect::Directory(p) => {
                if let Some(p) = normalized(p.trim_end_matches('/')) {
                    self.directories.insert(p);
                }
            }
            FileEffect::ApplyPatch { body, file, strip } => {
                let body = body.or_else(|| file.as_deref().and_then(|f| self.recall(f)));
                if let Some(body) = body {
                    self.apply_patch(&body, strip);
                }
            }
            FileEffect::RunPython { code, file } => {
                let code = code.or_else(|| file.as_deref().and_then(|f| self.recall(f)));
                if let Some(code) = code {
                    let files = python_files(&code);
                    files.written.iter().for_each(|p| self.write(p, None));
                    files.deleted.iter().for_each(|p| self.delete(p));
                }
            }
            FileEffect::RunShell(file) => {
                // A script the session wrote runs like its commands (one level deep).
                if depth == 0
                    && let Some(script) = self.recall(&file)
                {
                    self.shell(&script, depth + 1);
                }
            }
        }
    }

    fn apply_patch(&mut self, body: &str, strip: Option<usize>) {
        for (op, path) in patch_targets(body, strip) {
            match op {
                PatchOp::Change => self.edit(&path),
                PatchOp::Create => self.write(&path, None),
                PatchOp::Delete => self.delete(&path),
            }
        }
    }

    /// aider's edit blocks: a file name line, an optional fence, then `<<<<<<< SEARCH`.
    fn edit_blocks(&mut self, text: &str) {
        if !text.contains("<<<<<<< SEARCH") {
            return;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "<<<<<<< SEARCH" {
                continue;
            }
            let name = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .find(|l| !l.is_empty() && !l.starts_with("```"))
                .map(|l| l.trim_matches(|c| c == '`' || c == '*').trim());
            let empty_search = lines.get(i + 1).is_some_and(|l| l.trim() == "=======");
            if let Some(name) = name.filter(|n| plausible_file(n)) {
                if empty_search {
                    self.write(name, None);
                } else {
                    self.edit(name);
                }
            }
        }
    }

    fn finish(mut self) -> FileLists {
        self.tidy();
        FileLists {
            read: self.read.items,
            modified: self.modified.items,
            created: self.created.items,
            deleted: self.deleted.items,
        }
    }

    /// Drops directories (named as such, or a prefix of another path) and relative spellings
    /// of a path the same list holds absolutely.
    fn tidy(&mut self) {
        let mut all: Vec<&str> = [&self.read, &self.modified, &self.created, &self.deleted]
            .iter()
            .flat_map(|l| l.items.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        let is_directory = |path: &str| {
            if self.directories.contains(path) {
                return true;
            }
            let prefix = format!("{path}/");
            let at = all.partition_point(|p| *p < prefix.as_str());
            all.get(at).is_some_and(|p| p.starts_with(&prefix))
        };
        let directories: Vec<String> = all
            .iter()
            .filter(|p| is_directory(p))
            .map(|p| p.to_string())
            .collect();
        for list in [
            &mut self.read,
            &mut self.modified,
            &mut self.created,
            &mut self.deleted,
        ] {
            for dir in &directories {
                list.remove(dir);
            }
            let absolute: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.starts_with('/'))
                .cloned()
                .collect();
            let duplicates: Vec<String> = list
                .items
                .iter()
                .filter(|p| !p.starts_with('/'))
                .filter(|p| absolute.iter().any(|a| a.ends_with(&format!("/{p}"))))
                .cloned()
                .collect();
            for duplicate in duplicates {
                list.remove(&duplicate);
            }
        }
    }
}

/// `./a//b` is `a/b`; implausible words are no path at all.
fn normalized(path: &str) -> Option<String> {
    let mut p = path.trim().to_string();
    while let Some(rest) = p.strip_prefix("./") {
        p = rest.to_string();
    }
    while p.contains("//") {
        p = p.replace("//", "/");
    }
    let p = if p.len() > 1 {
        p.trim_end_matches('/').to_string()
    } else {
        p
    };
    plausible_file(&p).then_some(p)
}

fn path_arg(args: &Value) -> Option<&str> {
    PATH_ARGS
        .iter()
        .find_map(|key| args.get(key).and_then(Value::as_str))
        .filter(|p| !p.trim().is_empty())
}

fn content_arg(args: &Value) -> Option<&str> {
    CONTENT_ARGS
        .iter()
        .find_map(|key| args.get(key).and_then(Value::as_str))
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

#[cfg(test)]
mod tests {
    use super::*;
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
    fn bash(command: &str) -> Message {
        call("bash", json!({ "command": command }))
    }
    fn track(messages: &[Message]) -> FileLists {
        track_files(messages, &FileLists::default())
    }

    #[test]
    fn the_spec_table() {
        let messages = vec![
            call("read", json!({"file_path": "/src/a.go"})),
            call("read", json!({"file_path": "/src/b.go"})),
            call("write", json!({"file_path": "/src/b.go", "content": "x"})),
            call("edit", json!({"path": "/src/c.go"})),
            call("patch", json!({"file": "/src/d.go"})),
            bash("cat /src/e.go > /src/f.go"),
            call(
                "shell",
                json!({"command": ["bash", "-lc", "sed -i s/a/b/ /src/g.go"]}),
            ),
        ];
        let files = track(&messages);
        assert_eq!(files.read, ["/src/a.go", "/src/b.go", "/src/e.go"]);
        assert_eq!(
            files.modified,
            ["/src/b.go", "/src/c.go", "/src/d.go", "/src/g.go"]
        );
        // Never seen before its whole-file write: made by the session.
        assert_eq!(files.created, ["/src/f.go"]);
        assert_eq!(
            files.changed().count(),
            5,
            "the spec's modified list is modified + created"
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
            call(
                "str_replace_editor",
                json!({"command": "create", "path": "/f.rs", "file_text": "x"}),
            ),
        ];
        let files = track(&messages);
        assert_eq!(files.read, ["/a.rs", "/d.rs"]);
        assert_eq!(files.modified, ["/b.rs", "/e.rs"]);
        assert_eq!(files.created, ["/c.rs", "/f.rs"]);
    }

    #[test]
    fn swe_agent_edit_changes_the_open_file() {
        let messages = vec![
            call(
                "open",
                json!({"path": "src/marshmallow/fields.py", "line_number": 1}),
            ),
            call("edit", json!({"search": "a", "replace": "b"})),
            call("create", json!({"filename": "reproduce.py"})),
            call("insert", json!({"text": "print(1)"})),
        ];
        let files = track(&messages);
        assert_eq!(files.modified, ["src/marshmallow/fields.py"]);
        assert_eq!(files.created, ["reproduce.py"]);
    }

    #[test]
    fn openhands_tools_are_understood() {
        let files = track(&[
            call("execute_bash", json!({"command": "cat README.md"})),
            call(
                "str_replace_editor",
                json!({"command": "view", "path": "/workspace/app.py"}),
            ),
            call(
                "str_replace_editor",
                json!({"command": "insert", "path": "/workspace/app.py", "insert_line": 3}),
            ),
            call(
                "edit_file",
                json!({"path": "/workspace/util.py", "content": "..."}),
            ),
        ]);
        assert_eq!(files.read, ["README.md", "/workspace/app.py"]);
        assert_eq!(files.modified, ["/workspace/app.py", "/workspace/util.py"]);
    }

    #[test]
    fn a_patch_written_in_the_session_and_applied_names_its_files() {
        let diff = "--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-x\n+y\n";
        let files = track(&[
            call("read", json!({"file_path": "pkg/core.py"})),
            bash(&format!("cat > fix.patch <<'EOF'\n{diff}EOF")),
            bash("patch -p1 < fix.patch"),
        ]);
        assert_eq!(files.modified, ["pkg/core.py"]);
        assert_eq!(files.created, ["fix.patch"]);
        // The write tool and git apply, with the patch file named by another spelling.
        let files = track(&[
            call(
                "Write",
                json!({"file_path": "/repo/fix.diff", "content": diff}),
            ),
            bash("cd /repo && git apply fix.diff"),
        ]);
        assert_eq!(files.modified, ["pkg/core.py"]);
        // A patch fed by a here-document.
        let files = track(&[bash(&format!("patch -p1 <<'EOF'\n{diff}EOF"))]);
        assert_eq!(files.modified, ["pkg/core.py"]);
    }

    #[test]
    fn python_that_writes_a_file_modifies_it() {
        let fix = "with open('django/db/fields.py') as f:\n    s = f.read()\nwith open('django/db/fields.py', 'w') as f:\n    f.write(s.replace('a', 'b'))\n";
        let files = track(&[
            bash("grep -n x django/db/fields.py"),
            bash(&format!("cat > apply_fix.py << 'EOF'\n{fix}EOF")),
            bash("python apply_fix.py"),
        ]);
        assert_eq!(files.modified, ["django/db/fields.py"]);
        assert_eq!(files.created, ["apply_fix.py"]);
        let files = track(&[bash(&format!("python3 -c \"{fix}\""))]);
        assert_eq!(files.created, ["django/db/fields.py"]);
        let files = track(&[bash(&format!("python3 - <<'EOF'\n{fix}EOF"))]);
        assert_eq!(files.created, ["django/db/fields.py"]);
    }

    #[test]
    fn a_shell_script_written_in_the_session_runs_its_commands() {
        let files = track(&[
            bash("cat > run.sh <<'EOF'\nsed -i 's/a/b/' lib/x.py\nEOF"),
            bash("bash run.sh"),
        ]);
        assert_eq!(files.modified, ["lib/x.py"]);
    }

    #[test]
    fn git_checkout_restore_and_perl_edit() {
        let files = track(&[
            bash("git checkout -- a.py"),
            bash("git restore b.py"),
            bash("perl -pi -e 's/x/y/' c.pl"),
        ]);
        assert_eq!(files.modified, ["a.py", "b.py", "c.pl"]);
    }

    #[test]
    fn aider_edit_blocks_name_their_files() {
        let text = "Here is the fix:\n\nsrc/app.py\n```python\n<<<<<<< SEARCH\nold\n=======\nnew\n>>>>>>> REPLACE\n```\n\nnew_mod.py\n```python\n<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n```";
        let files = track(&[Message::text(Role::Assistant, text)]);
        assert_eq!(files.modified, ["src/app.py"]);
        assert_eq!(files.created, ["new_mod.py"]);
    }

    #[test]
    fn removed_files_are_deleted_not_modified_and_scratch_files_vanish() {
        let files = track(&[
            bash("cat old_notes.md"),
            bash("sed -i s/a/b/ old_notes.md"),
            bash("echo x > scratch.txt"),
            bash("rm old_notes.md scratch.txt legacy.cfg"),
        ]);
        assert!(files.modified.is_empty(), "{files:?}");
        assert!(files.created.is_empty(), "{files:?}");
        assert_eq!(files.deleted, ["old_notes.md", "legacy.cfg"]);
        // Written again after removal: changed, no longer deleted.
        let files = track_files(&[bash("echo y > legacy.cfg")], &files);
        assert_eq!(files.modified, ["legacy.cfg"]);
        assert_eq!(files.deleted, ["old_notes.md"]);
    }

    #[test]
    fn directories_are_not_files() {
        let files = track(&[
            bash("mkdir -p build/out && cd build && touch build/out/a.o"),
            bash("grep -r TODO src"),
            call("read", json!({"file_path": "docs"})),
            call("read", json!({"file_path": "docs/intro.md"})),
        ]);
        assert_eq!(files.read, ["docs/intro.md"]);
        assert_eq!(files.created, ["build/out/a.o"]);
    }

    #[test]
    fn relative_spellings_of_an_absolute_path_are_one_file() {
        let files = track(&[
            bash("cd /testbed && sed -i s/a/b/ ./pkg/x.py"),
            call(
                "str_replace_editor",
                json!({"command": "str_replace", "path": "/testbed/pkg/x.py"}),
            ),
        ]);
        assert_eq!(files.modified, ["/testbed/pkg/x.py"]);
    }

    #[test]
    fn paths_accumulate_with_the_prior_lists() {
        let prior = FileLists {
            read: vec!["/old.rs".into()],
            modified: vec!["/m.rs".into()],
            created: vec!["/new_tool.py".into()],
            deleted: vec![],
        };
        let files = track_files(
            &[
                call("read", json!({"file_path": "/new.rs"})),
                call("read", json!({"file_path": "/old.rs"})),
                call("edit", json!({"file_path": "/m.rs"})),
                bash("rm /new_tool.py"),
            ],
            &prior,
        );
        assert_eq!(files.read, ["/old.rs", "/new.rs"]);
        assert_eq!(files.modified, ["/m.rs"]);
        assert!(files.created.is_empty() && files.deleted.is_empty());
    }

    #[test]
    fn recently_changed_ranks_by_recency_then_frequency() {
        let messages = vec![
            bash("sed -i s/a/b/ a.py"),
            bash("sed -i s/a/b/ a.py"),
            bash("sed -i s/a/b/ b.py"),
            bash("echo > c.txt"),
        ];
        assert_eq!(recently_changed(&messages), ["c.txt", "b.py", "a.py"]);
    }
}
