//! What a shell command does to files, judged by its verbs ([`super::shell_lex`] splits it).
//!
//! | verb                                             | effect                                   |
//! |--------------------------------------------------|------------------------------------------|
//! | `cat` `head` `tail` `grep` `rg` `sed -n` `awk` ... | reads its file arguments                 |
//! | `>` / `>|` / `&>` / `tee`                         | writes the file whole (content known for here-documents) |
//! | `>>`, `tee -a`                                   | edits (appends to) the file              |
//! | `sed -i`, `perl -pi`, `truncate`, `git checkout -- P`, `git restore P` | edits in place    |
//! | `cp A B`                                         | reads A, writes B                        |
//! | `mv A B`, `git mv A B`                           | deletes A, writes B                      |
//! | `rm`, `unlink`, `shred`, `git rm`                | deletes                                  |
//! | `touch`                                          | creates (when new)                       |
//! | `mkdir`, `cd`                                    | names directories (which are not files)  |
//! | `patch [-pN] [-i F] [< F]`, `git apply F`, `patch`/`git apply` with a here-document | applies a patch |
//! | `python F`, `python -c CODE`, `python - <<EOF`   | runs Python (its writes are found in [`super::script`]) |
//! | `bash F`, `sh F`                                 | runs a shell script                      |
//!
//! Wrappers (`sudo`, `env`, `timeout 10`, `nohup`, `VAR=value`) are looked through. Words with
//! globs, variables or substitutions are not files.

use super::shell_lex::{SimpleCommand, simple_commands};

/// One thing a command does to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileEffect {
    Read(String),
    /// Changed in place.
    Edit(String),
    /// Written whole; the content when the command carries it (a here-document).
    Write(String, Option<String>),
    Delete(String),
    /// A directory (a `cd` or `mkdir` target), never a file.
    Directory(String),
    /// A patch applied: its text, or the file holding it; `strip` is `-pN`.
    ApplyPatch {
        body: Option<String>,
        file: Option<String>,
        strip: Option<usize>,
    },
    /// Python code run inline, or a Python file run.
    RunPython {
        code: Option<String>,
        file: Option<String>,
    },
    /// A shell script file run.
    RunShell(String),
}

/// The effects of `command`, in order.
pub fn shell_effects(command: &str) -> Vec<FileEffect> {
    let mut effects = Vec::new();
    for simple in simple_commands(command) {
        effects.extend(simple.read_redirects.iter().cloned().map(FileEffect::Read));
        command_effects(&simple, &mut effects);
        for path in &simple.write_redirects {
            // `cat > f <<EOF`: the here-document is what lands in the file.
            let content = (verb_of(&simple.words) == Some("cat"))
                .then(|| simple.stdin.clone())
                .flatten();
            effects.push(FileEffect::Write(path.clone(), content));
        }
        effects.extend(
            simple
                .append_redirects
                .iter()
                .cloned()
                .map(FileEffect::Edit),
        );
    }
    effects.retain(|e| match e {
        FileEffect::Read(p)
        | FileEffect::Edit(p)
        | FileEffect::Write(p, _)
        | FileEffect::Delete(p)
        | FileEffect::RunShell(p) => plausible_file(p),
        FileEffect::Directory(p) => plausible_file(p.trim_end_matches('/')),
        FileEffect::ApplyPatch { file, .. } | FileEffect::RunPython { file, .. } => {
            file.as_deref().is_none_or(plausible_file)
        }
    });
    effects
}

/// Verbs that only wrap another command.
const WRAPPERS: &[&str] = &[
    "sudo", "env", "time", "nohup", "nice", "exec", "command", "builtin", "stdbuf", "xargs",
];

/// The command's words after `VAR=value` prefixes and wrappers such as `sudo` or `timeout 10`.
fn unwrapped(words: &[String]) -> &[String] {
    let mut rest = words;
    loop {
        match rest.first() {
            Some(w) if is_assignment(w) => rest = &rest[1..],
            Some(w) if WRAPPERS.contains(&verb_name(w)) => {
                rest = &rest[1..];
                while rest
                    .first()
                    .is_some_and(|w| w.starts_with('-') || is_assignment(w))
                {
                    rest = &rest[1..];
                }
            }
            Some(w) if verb_name(w) == "timeout" => {
                rest = &rest[1..];
                while rest.first().is_some_and(|w| w.starts_with('-')) {
                    rest = &rest[1..];
                }
                rest = rest.get(1..).unwrap_or(&[]);
            }
            _ => return rest,
        }
    }
}

fn verb_of(words: &[String]) -> Option<&str> {
    unwrapped(words).first().map(|w| verb_name(w))
}

fn command_effects(simple: &SimpleCommand, out: &mut Vec<FileEffect>) {
    let Some((verb, args)) = unwrapped(&simple.words).split_first() else {
        return;
    };
    let each = |paths: Vec<String>, effect: fn(String) -> FileEffect| paths.into_iter().map(effect);
    match verb_name(verb) {
        "cat" | "tac" | "less" | "more" | "nl" | "wc" | "bat" | "diff" | "cmp" | "stat"
        | "file" | "xxd" | "od" | "hexdump" | "strings" => {
            out.extend(each(positionals(args, &[]), FileEffect::Read));
        }
        "head" | "tail" => out.extend(each(positionals(args, &["-n", "-c"]), FileEffect::Read)),
        v @ ("grep" | "egrep" | "fgrep" | "rg" | "ag" | "ack") => grep(v, args, out),
        "sed" => sed(args, out),
        "perl" => perl(args, out),
        "awk" | "gawk" | "mawk" => {
            let mut paths = positionals(args, &["-F", "-v", "-f"]);
            if !args.iter().any(|a| a == "-f") && !paths.is_empty() {
                paths.remove(0);
            }
            out.extend(each(paths, FileEffect::Read));
        }
        "tee" => {
            let append = args.iter().any(|a| a == "-a" || a == "--append");
            for path in positionals(args, &[]) {
                out.push(if append {
                    FileEffect::Edit(path)
                } else {
                    FileEffect::Write(path, None)
                });
            }
        }
        "touch" => out.extend(
            positionals(args, &["-d", "-t", "-r"])
                .into_iter()
                .map(|p| FileEffect::Write(p, None)),
        ),
        "rm" | "unlink" | "shred" => out.extend(each(positionals(args, &[]), FileEffect::Delete)),
        "truncate" => out.extend(each(positionals(args, &["-s", "-r"]), FileEffect::Edit)),
        "mkdir" => out.extend(each(positionals(args, &["-m"]), FileEffect::Directory)),
        "cd" | "pushd" => out.extend(each(positionals(args, &[]), FileEffect::Directory)),
        "cp" => {
            let mut paths = positionals(args, &["-t", "--target-directory"]);
            if let Some(destination) = paths.pop() {
                out.extend(each(paths, FileEffect::Read));
                out.push(FileEffect::Write(destination, None));
            }
        }
        "mv" => moved(positionals(args, &["-t", "--target-directory"]), out),
        "patch" => patch(args, simple, out),
        "git" => git(args, simple, out),
        "python" | "python3" | "python2" | "pypy" | "pypy3" => python(args, simple, out),
        "bash" | "sh" | "zsh" | "dash" => {
            if let Some(script) = positionals(args, &["-o", "-O"]).into_iter().next() {
                out.push(FileEffect::RunShell(script));
            }
        }
        _ => {}
    }
}

fn grep(verb: &str, args: &[String], out: &mut Vec<FileEffect>) {
    let explicit_pattern = args
        .iter()
        .any(|a| matches!(a.as_str(), "-e" | "-f" | "--regexp" | "--file"));
    let mut paths = positionals(
        args,
        &[
            "-e", "-f", "-A", "-B", "-C", "-m", "-g", "-t", "-T", "-M", "--glob", "--type",
        ],
    );
    if !explicit_pattern && !paths.is_empty() {
        paths.remove(0);
    }
    // rg, ag and ack search directories by default, grep with -r: a path that does not look
    // like a file (no extension) is then a directory.
    let recursive = matches!(verb, "rg" | "ag" | "ack")
        || args.iter().any(|a| {
            a == "--recursive"
                || (a.starts_with('-') && !a.starts_with("--") && a.contains(['r', 'R']))
        });
    for path in paths {
        out.push(if recursive && !has_extension(&path) {
            FileEffect::Directory(path)
        } else {
            FileEffect::Read(path)
        });
    }
}

/// `src/lib.rs` has one; `src`, `./pkg` and `.github` do not.
fn has_extension(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rfind('.')
        .is_some_and(|dot| dot > 0 && dot + 1 < name.len())
}

fn sed(args: &[String], out: &mut Vec<FileEffect>) {
    let in_place = args
        .iter()
        .any(|a| a.starts_with("-i") || a.starts_with("--in-place") || is_short_flag_with(a, 'i'));
    let explicit_script = args.iter().any(|a| a == "-e" || a == "-f");
    let paths = positionals(args, &["-e", "-f"]);
    script_inputs(paths, explicit_script, in_place, out);
}

/// `perl -pi -e SCRIPT FILES`, `perl -i.bak -pe SCRIPT FILES`, `perl prog.pl FILES`.
fn perl(args: &[String], out: &mut Vec<FileEffect>) {
    let mut in_place = false;
    let mut has_script = false;
    let mut paths = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let Some(flags) = arg
            .strip_prefix('-')
            .filter(|f| !f.is_empty() && !f.starts_with('-'))
        else {
            paths.push(arg.clone());
            continue;
        };
        let bundle = flags.chars().all(|c| c.is_ascii_alphabetic());
        in_place |= flags.starts_with('i') || (bundle && flags.contains('i'));
        if bundle && flags.ends_with(['e', 'E']) {
            has_script = true;
            iter.next();
        }
    }
    script_inputs(paths, has_script, in_place, out);
}

/// The files a script runs over (sed's, perl's): the operands, less the first when no `-e`
/// gave the script (then the first operand is it); edited in place or read.
fn script_inputs(
    mut operands: Vec<String>,
    script_given: bool,
    in_place: bool,
    out: &mut Vec<FileEffect>,
) {
    if !script_given && !operands.is_empty() {
        operands.remove(0);
    }
    let effect = if in_place {
        FileEffect::Edit
    } else {
        FileEffect::Read
    };
    out.extend(operands.into_iter().map(effect));
}

fn moved(mut paths: Vec<String>, out: &mut Vec<FileEffect>) {
    if let Some(destination) = paths.pop() {
        out.extend(paths.into_iter().map(FileEffect::Delete));
        out.push(FileEffect::Write(destination, None));
    }
}

/// `patch [-pN] [-i F] [< F] [FILE [PATCHFILE]]`, or a here-document.
fn patch(args: &[String], simple: &SimpleCommand, out: &mut Vec<FileEffect>) {
    let input = option_value(args, &["-i", "--input"]);
    let named = positionals(
        args,
        &[
            "-i",
            "--input",
            "-d",
            "--directory",
            "-o",
            "--output",
            "-D",
            "-B",
            "-F",
            "-V",
            "-z",
            "-r",
            "-p",
        ],
    );
    // `patch FILE PATCHFILE` / `patch FILE < fix.patch`: the file to change is named.
    if let Some(target) = named.first() {
        out.push(FileEffect::Edit(target.clone()));
    }
    out.push(FileEffect::ApplyPatch {
        body: simple.stdin.clone(),
        file: input
            .or_else(|| named.get(1).cloned())
            .or_else(|| simple.read_redirects.first().cloned()),
        strip: strip_level(args),
    });
}

/// `git apply`, `git checkout -- P`, `git restore P`, `git rm P`, `git mv A B`.
fn git(args: &[String], simple: &SimpleCommand, out: &mut Vec<FileEffect>) {
    // Skip global options such as `-C dir` or `--no-pager`.
    let mut rest = args;
    while let Some(first) = rest.first() {
        if first == "-C" || first == "-c" {
            rest = rest.get(2..).unwrap_or(&[]);
        } else if first.starts_with('-') {
            rest = &rest[1..];
        } else {
            break;
        }
    }
    let Some((sub, args)) = rest.split_first() else {
        return;
    };
    match sub.as_str() {
        "apply" | "am" => {
            let files = positionals(args, &["-p", "--directory", "--exclude", "--include"]);
            let strip = strip_level(args).or(Some(1));
            if files.is_empty() {
                out.push(FileEffect::ApplyPatch {
                    body: simple.stdin.clone(),
                    file: simple.read_redirects.first().cloned(),
                    strip,
                });
            }
            for file in files {
                out.push(FileEffect::ApplyPatch {
                    body: None,
                    file: Some(file),
                    strip,
                });
            }
        }
        "checkout" | "restore" => {
            let explicit = args.iter().position(|a| a == "--");
            let paths: Vec<String> = match explicit {
                Some(at) => args[at + 1..].to_vec(),
                None if sub == "restore" => positionals(args, &["-s", "--source"]),
                // `git checkout NAME` may be a branch; only file-looking names are files.
                None => positionals(args, &["-b", "-B"])
                    .into_iter()
                    .filter(|p| p.contains('.') || p.contains('/'))
                    .collect(),
            };
            out.extend(paths.into_iter().map(FileEffect::Edit));
        }
        "rm" => out.extend(positionals(args, &[]).into_iter().map(FileEffect::Delete)),
        "mv" => moved(positionals(args, &[]), out),
        _ => {}
    }
}

/// `python F`, `python -c CODE`, `python - <<EOF` / `python <<EOF`.
fn python(args: &[String], simple: &SimpleCommand, out: &mut Vec<FileEffect>) {
    if let Some(code) = option_value(args, &["-c"]) {
        out.push(FileEffect::RunPython {
            code: Some(code),
            file: None,
        });
        return;
    }
    if args.iter().any(|a| a == "-m") {
        return;
    }
    match positionals(args, &["-W", "-X"]).into_iter().next() {
        Some(file) if file != "-" => out.push(FileEffect::RunPython {
            code: None,
            file: Some(file),
        }),
        _ => {
            if let Some(code) = &simple.stdin {
                out.push(FileEffect::RunPython {
                    code: Some(code.clone()),
                    file: None,
                });
            }
        }
    }
}

/// `-p1`, `-p 1`, `--strip=1`.
fn strip_level(args: &[String]) -> Option<usize> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(n) = arg.strip_prefix("--strip=") {
            return n.parse().ok();
        }
        if arg == "-p" {
            return iter.next().and_then(|n| n.parse().ok());
        }
        if let Some(n) = arg.strip_prefix("-p").filter(|n| !n.is_empty()) {
            return n.parse().ok();
        }
    }
    None
}

/// The value of the first of `names` given as `-x VALUE`, `-xVALUE` or `--name=VALUE`.
fn option_value(args: &[String], names: &[&str]) -> Option<String> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        for name in names {
            if arg == name {
                return iter.next().cloned();
            }
            if name.starts_with("--") {
                if let Some(v) = arg.strip_prefix(&format!("{name}=")) {
                    return Some(v.to_string());
                }
            } else if let Some(v) = arg.strip_prefix(name).filter(|v| !v.is_empty()) {
                return Some(v.to_string());
            }
        }
    }
    None
}

/// Arguments that are not options, skipping the values of options listed in `with_value`.
fn positionals(args: &[String], with_value: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_next = false;
    let mut options_done = false;
    for arg in args {
        if skip_next {
            skip_next = false;
            continue;
        }
        if !options_done && arg == "--" {
            options_done = true;
            continue;
        }
        if !options_done && arg.starts_with('-') && arg.len() > 1 {
            skip_next = with_value.contains(&arg.as_str());
            continue;
        }
        out.push(arg.clone());
    }
    out
}

/// `-ni` style bundles of short flags that include `flag`.
fn is_short_flag_with(arg: &str, flag: char) -> bool {
    arg.starts_with('-')
        && !arg.starts_with("--")
        && arg.len() > 1
        && arg[1..].chars().all(|c| c.is_ascii_alphabetic())
        && arg[1..].contains(flag)
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// `/usr/bin/cat` is `cat`.
fn verb_name(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// Whether a word can name a file we should report.
pub fn plausible_file(word: &str) -> bool {
    !(word.is_empty()
        || word.starts_with('-')
        || word.ends_with('/')
        || matches!(word, "." | ".." | "~" | "-")
        || word.starts_with("/dev/")
        || word.starts_with("/proc/")
        || word.contains("://")
        || word.chars().any(|c| {
            matches!(
                c,
                '*' | '?'
                    | '$'
                    | '{'
                    | '}'
                    | '`'
                    | '['
                    | ']'
                    | '\n'
                    | '\0'
                    | '\\'
                    | '"'
                    | '\''
                    | '<'
                    | '>'
                    | '|'
                    | ' '
            )
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use FileEffect::*;

    fn effects(cmd: &str) -> Vec<FileEffect> {
        shell_effects(cmd)
    }
    fn s(x: &str) -> String {
        x.to_string()
    }

    #[test]
    fn reading_verbs_read_their_files() {
        assert_eq!(effects("cat src/a.rs"), [Read(s("src/a.rs"))]);
        assert_eq!(effects("head -n 20 a.py"), [Read(s("a.py"))]);
        assert_eq!(
            effects("tail -50 /var/log/x.log"),
            [Read(s("/var/log/x.log"))]
        );
        assert_eq!(
            effects("grep -n 'fn main' src/main.rs src/lib.rs"),
            [Read(s("src/main.rs")), Read(s("src/lib.rs"))]
        );
        assert_eq!(effects("grep -e foo -e bar a.txt"), [Read(s("a.txt"))]);
        assert_eq!(effects("sed -n '1,20p' setup.py"), [Read(s("setup.py"))]);
        assert_eq!(
            effects("python x.py < input.json")[0],
            Read(s("input.json"))
        );
    }

    #[test]
    fn a_recursive_grep_names_a_directory() {
        assert_eq!(effects("grep -rn foo src"), [Directory(s("src"))]);
        assert_eq!(effects("grep -r X ./pkg"), [Directory(s("./pkg"))]);
    }

    #[test]
    fn writes_edits_and_deletes() {
        assert_eq!(effects("echo hi > out.txt"), [Write(s("out.txt"), None)]);
        assert_eq!(effects("echo hi >> log.txt"), [Edit(s("log.txt"))]);
        assert_eq!(effects("sed -i 's/a/b/' src/x.py"), [Edit(s("src/x.py"))]);
        assert_eq!(effects("sed -i.bak -e 's/a/b/' x.py"), [Edit(s("x.py"))]);
        assert_eq!(
            effects("ls | tee listing.txt"),
            [Write(s("listing.txt"), None)]
        );
        assert_eq!(effects("ls | tee -a listing.txt"), [Edit(s("listing.txt"))]);
        assert_eq!(
            effects("mv old.rs new.rs"),
            [Delete(s("old.rs")), Write(s("new.rs"), None)]
        );
        assert_eq!(
            effects("cp -r a.txt b.txt"),
            [Read(s("a.txt")), Write(s("b.txt"), None)]
        );
        assert_eq!(
            effects("rm -f build.log tmp.txt"),
            [Delete(s("build.log")), Delete(s("tmp.txt"))]
        );
        assert_eq!(
            effects("touch new_file.py"),
            [Write(s("new_file.py"), None)]
        );
        assert_eq!(
            effects("perl -pi -e 's/a/b/' lib/x.pm"),
            [Edit(s("lib/x.pm"))]
        );
        assert_eq!(effects("perl -i -pe 's/a/b/' y.pm"), [Edit(s("y.pm"))]);
    }

    #[test]
    fn heredoc_writes_carry_their_content() {
        assert_eq!(
            effects("cat > /repo/fix.py << 'EOF'\nprint(1)\nEOF"),
            [Write(s("/repo/fix.py"), Some(s("print(1)\n")))]
        );
    }

    #[test]
    fn patches_are_applied_from_files_and_here_documents() {
        assert_eq!(
            effects("patch -p1 < fix.patch"),
            [
                Read(s("fix.patch")),
                ApplyPatch {
                    body: None,
                    file: Some(s("fix.patch")),
                    strip: Some(1)
                }
            ]
        );
        assert_eq!(
            effects("patch -p0 -i fix.diff"),
            [ApplyPatch {
                body: None,
                file: Some(s("fix.diff")),
                strip: Some(0)
            }]
        );
        assert_eq!(
            effects("git apply --reject fix.patch"),
            [ApplyPatch {
                body: None,
                file: Some(s("fix.patch")),
                strip: Some(1)
            }]
        );
        let inline = effects("git apply <<'EOF'\n--- a/x.py\n+++ b/x.py\nEOF");
        assert_eq!(
            inline,
            [ApplyPatch {
                body: Some(s("--- a/x.py\n+++ b/x.py\n")),
                file: None,
                strip: Some(1)
            }]
        );
    }

    #[test]
    fn git_restores_removes_and_moves() {
        assert_eq!(
            effects("git checkout -- a.py b.py"),
            [Edit(s("a.py")), Edit(s("b.py"))]
        );
        assert_eq!(effects("git checkout main"), []);
        assert_eq!(effects("git checkout src/x.rs"), [Edit(s("src/x.rs"))]);
        assert_eq!(
            effects("git restore --staged lib/y.py"),
            [Edit(s("lib/y.py"))]
        );
        assert_eq!(effects("git rm old.py"), [Delete(s("old.py"))]);
        assert_eq!(
            effects("git -C /repo mv a.py b.py"),
            [Delete(s("a.py")), Write(s("b.py"), None)]
        );
    }

    #[test]
    fn python_and_shell_scripts_are_runs() {
        assert_eq!(
            effects("cd /testbed && python fix.py --dry"),
            [
                Directory(s("/testbed")),
                RunPython {
                    code: None,
                    file: Some(s("fix.py"))
                }
            ]
        );
        assert_eq!(
            effects("python3 -c \"open('a.txt','w').write('x')\""),
            [RunPython {
                code: Some(s("open('a.txt','w').write('x')")),
                file: None
            }]
        );
        assert_eq!(
            effects("python3 - <<'EOF'\nprint(2)\nEOF"),
            [RunPython {
                code: Some(s("print(2)\n")),
                file: None
            }]
        );
        assert_eq!(effects("python -m pytest tests/"), []);
        assert_eq!(effects("bash run.sh"), [RunShell(s("run.sh"))]);
    }

    #[test]
    fn directories_wrappers_and_non_files() {
        assert_eq!(effects("mkdir -p a/b"), [Directory(s("a/b"))]);
        assert_eq!(
            effects("FOO=1 sudo cat a.txt | grep x; timeout 5 sed -i s/x/y/ b.txt 2>&1"),
            [Read(s("a.txt")), Edit(s("b.txt"))]
        );
        assert!(effects("make 2>&1 > /dev/null").is_empty());
        assert!(effects("cat *.rs $HOME/x").is_empty());
    }
}
