//! Files a Python snippet writes or removes, found in its text.
//!
//! Agents often edit files with a few lines of Python (`python -c "..."`, a here-document, or a
//! `fix.py` they wrote a moment earlier) rather than with an edit tool. The paths they write are
//! string literals in `open(PATH, "w")` and friends, or names bound to a literal earlier in the
//! snippet (`path = "src/x.py"` ... `open(path, "w")`). Paths built at run time
//! (`os.path.join(tmp, ...)`, f-strings) cannot be known and are not reported.

use regex::Regex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// What a snippet does to files.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScriptFiles {
    pub written: Vec<String>,
    pub deleted: Vec<String>,
}

const LITERAL: &str = r#"[rRbBuU]?(?:"([^"\n]+)"|'([^'\n]+)')"#;

/// `open(ARG, MODE)` with an optional `file=` / `mode=`; also io.open, codecs.open.
static OPEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"\bopen\(\s*(?:file\s*=\s*)?(?:{LITERAL}|([A-Za-z_][A-Za-z0-9_]*))\s*,\s*(?:mode\s*=\s*)?[rRbBuU]?(?:"([^"\n]*)"|'([^'\n]*)')"#
    ))
    .expect("valid regex")
});

/// `Path("p").write_text(...)`, `pathlib.Path('p').write_bytes(...)`, `.touch()`.
static PATH_WRITE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"\bPath\(\s*(?:{LITERAL}|([A-Za-z_][A-Za-z0-9_]*))\s*\)\s*\.\s*(?:write_text|write_bytes|touch)\("#
    ))
    .expect("valid regex")
});

/// `os.remove(p)`, `os.unlink(p)`, `Path(p).unlink()`.
static REMOVE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"\b(?:os\.remove|os\.unlink)\(\s*(?:{LITERAL}|([A-Za-z_][A-Za-z0-9_]*))\s*\)|\bPath\(\s*(?:{LITERAL}|([A-Za-z_][A-Za-z0-9_]*))\s*\)\s*\.\s*unlink\("#
    ))
    .expect("valid regex")
});

/// `name = "literal"` at any indentation.
static ASSIGN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"(?m)^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*{LITERAL}\s*$"#
    ))
    .expect("valid regex")
});

/// The files `code` writes and deletes, in order of appearance.
pub fn python_files(code: &str) -> ScriptFiles {
    let names: HashMap<&str, &str> = ASSIGN
        .captures_iter(code)
        .filter_map(|c| {
            let value = c.get(2).or_else(|| c.get(3))?.as_str();
            Some((c.get(1)?.as_str(), value))
        })
        .collect();
    // The literal of group `lit` (double or single quoted), else the name in `name`, resolved.
    let path_of = |c: &regex::Captures, first: usize| -> Option<String> {
        c.get(first)
            .or_else(|| c.get(first + 1))
            .map(|m| m.as_str().to_string())
            .or_else(|| {
                let name = c.get(first + 2)?.as_str();
                names.get(name).map(|v| v.to_string())
            })
    };
    let mut files = ScriptFiles::default();
    for c in OPEN.captures_iter(code) {
        let mode = c.get(4).or_else(|| c.get(5)).map_or("", |m| m.as_str());
        if mode.contains(['w', 'a', 'x', '+'])
            && let Some(path) = path_of(&c, 1)
        {
            files.written.push(path);
        }
    }
    for c in PATH_WRITE.captures_iter(code) {
        files.written.extend(path_of(&c, 1));
    }
    for c in REMOVE.captures_iter(code) {
        files
            .deleted
            .extend(path_of(&c, 1).or_else(|| path_of(&c, 4)));
    }
    files.written.dedup();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_for_writing_with_a_literal_path() {
        let code = "with open('src/a.py', 'r') as f:\n    s = f.read()\nwith open(\"src/a.py\", \"w\") as f:\n    f.write(s)\nopen('log.txt', mode='a').write('x')";
        assert_eq!(python_files(code).written, ["src/a.py", "log.txt"]);
    }

    #[test]
    fn a_name_bound_to_a_literal_is_resolved() {
        let code = "path = 'django/db/fields.py'\ncontent = open(path).read()\nwith open(path, 'w') as f:\n    f.write(content)";
        assert_eq!(python_files(code).written, ["django/db/fields.py"]);
    }

    #[test]
    fn pathlib_writes_and_removals() {
        let code = "from pathlib import Path\nPath('out/x.txt').write_text('hi')\nos.remove('tmp.py')\nPath(\"old.cfg\").unlink()";
        let files = python_files(code);
        assert_eq!(files.written, ["out/x.txt"]);
        assert_eq!(files.deleted, ["tmp.py", "old.cfg"]);
    }

    #[test]
    fn reads_and_computed_paths_are_not_writes() {
        let code = "open('a.py').read()\nopen('b.py', 'rb')\nwith open(os.path.join(d, 'c.py'), 'w') as f: pass\nopen(f'{d}/x', 'w')";
        assert!(python_files(code).written.is_empty());
    }
}
