//! The files a patch touches, from its headers: unified diffs (`--- a/x` / `+++ b/x`,
//! `diff --git a/x b/x`) and the apply_patch format (`*** Update File: x`).

/// What a patch does to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOp {
    Change,
    Create,
    Delete,
}

/// The files `body` touches, each once, in order. `strip` is patch's `-pN`: without it, the
/// `a/` and `b/` prefixes git writes are removed.
pub fn patch_targets(body: &str, strip: Option<usize>) -> Vec<(PatchOp, String)> {
    let mut out: Vec<(PatchOp, String)> = Vec::new();
    let mut push = |op: PatchOp, path: &str| {
        let path = path.trim();
        if path.is_empty() || path == "/dev/null" {
            return;
        }
        match out.iter_mut().find(|(_, p)| p == path) {
            Some(entry) if op != PatchOp::Change => entry.0 = op,
            Some(_) => {}
            None => out.push((op, path.to_string())),
        }
    };
    let mut old_side: Option<String> = None;
    for line in body.lines() {
        if let Some(path) = line.strip_prefix("*** Update File: ") {
            push(PatchOp::Change, path);
        } else if let Some(path) = line.strip_prefix("*** Add File: ") {
            push(PatchOp::Create, path);
        } else if let Some(path) = line.strip_prefix("*** Delete File: ") {
            push(PatchOp::Delete, path);
        } else if let Some(path) = line.strip_prefix("*** Move to: ") {
            push(PatchOp::Create, path);
        } else if let Some(path) = line.strip_prefix("--- ") {
            old_side = Some(unified_path(path, strip));
        } else if let Some(path) = line.strip_prefix("+++ ") {
            let new_side = unified_path(path, strip);
            match old_side.take() {
                Some(old) if new_side == "/dev/null" => push(PatchOp::Delete, &old),
                Some(old) if old == "/dev/null" => push(PatchOp::Create, &new_side),
                _ => push(PatchOp::Change, &new_side),
            }
        }
    }
    out
}

/// A path of a `---`/`+++` line: the timestamp after a tab dropped, the prefix stripped.
fn unified_path(raw: &str, strip: Option<usize>) -> String {
    let path = raw.split('\t').next().unwrap_or(raw).trim();
    if path == "/dev/null" {
        return path.to_string();
    }
    match strip {
        Some(n) => path.splitn(n + 1, '/').nth(n).unwrap_or(path).to_string(),
        None => path
            .strip_prefix("b/")
            .or_else(|| path.strip_prefix("a/"))
            .unwrap_or(path)
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PatchOp::*;

    fn targets(body: &str) -> Vec<(PatchOp, String)> {
        patch_targets(body, None)
    }

    #[test]
    fn unified_diffs_name_changed_created_and_deleted_files() {
        let diff = "diff --git a/lib/x.py b/lib/x.py\n--- a/lib/x.py\n+++ b/lib/x.py\n@@ -1 +1 @@\n-a\n+b\n--- /dev/null\n+++ b/lib/new.py\n@@\n+x\n--- a/lib/gone.py\n+++ /dev/null\n";
        assert_eq!(
            targets(diff),
            [
                (Change, "lib/x.py".to_string()),
                (Create, "lib/new.py".to_string()),
                (Delete, "lib/gone.py".to_string())
            ]
        );
    }

    #[test]
    fn strip_levels_remove_leading_components() {
        let diff = "--- orig/src/a.c\t2024-01-01\n+++ new/src/a.c\t2024-01-02\n";
        assert_eq!(
            patch_targets(diff, Some(1)),
            [(Change, "src/a.c".to_string())]
        );
        assert_eq!(
            patch_targets(diff, Some(0)),
            [(Change, "new/src/a.c".to_string())]
        );
    }

    #[test]
    fn apply_patch_headers() {
        let body = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n*** Add File: src/b.rs\n+z\n*** Delete File: src/c.rs\n*** End Patch";
        assert_eq!(
            targets(body),
            [
                (Change, "src/a.rs".to_string()),
                (Create, "src/b.rs".to_string()),
                (Delete, "src/c.rs".to_string())
            ]
        );
    }
}
