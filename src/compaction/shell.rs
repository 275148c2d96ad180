//! Which files a shell command reads and modifies, judged by what the command does.
//!
//! This is a small, forgiving shell lexer, not a shell: it understands quotes, escapes,
//! pipelines and lists (`|`, `&&`, `||`, `;`, newlines), redirections (`>`, `>>`, `<`, `2>&1`)
//! and here-documents (whose bodies are data, not commands). Each simple command is then
//! classified by its verb: `cat`/`head`/`tail`/`grep`/`rg`/`sed` (without `-i`) read their file
//! arguments; redirections, `sed -i`, `tee`, `mv`, `cp` (its destination), `rm`, `touch` and
//! `truncate` modify them. Anything else contributes only its redirections.

/// Files named by one shell command, in the order they appear.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShellFiles {
    pub read: Vec<String>,
    pub modified: Vec<String>,
}

/// Classifies the files of `command`.
pub fn classify_shell_command(command: &str) -> ShellFiles {
    let mut files = ShellFiles::default();
    for simple in split_commands(&lex(command)) {
        files.read.extend(simple.read_redirects.iter().cloned());
        classify_simple(&simple.words, &mut files);
        files
            .modified
            .extend(simple.write_redirects.iter().cloned());
    }
    files.read.retain(|p| plausible_file(p));
    files.modified.retain(|p| plausible_file(p));
    files
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    /// `|`, `||`, `&&`, `;`, `&`, newline, parentheses: the end of a simple command.
    Separator,
    /// `>`, `>>`, `>|`, `&>`: the next word is written.
    WriteTo,
    /// `<`: the next word is read.
    ReadFrom,
    /// `>&N`, `<<<`: the next word is not a file.
    SkipNext,
}

fn lex(command: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    let mut chars = command.chars().peekable();

    macro_rules! end_word {
        () => {
            if in_word {
                tokens.push(Token::Word(std::mem::take(&mut word)));
                in_word = false;
            }
        };
    }

    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\r' => end_word!(),
            '\n' => {
                end_word!();
                tokens.push(Token::Separator);
                // Here-document bodies follow the line that opened them: skip them.
                for (delimiter, strip_tabs) in heredocs.drain(..) {
                    loop {
                        let mut line = String::new();
                        let mut ended = false;
                        for c in chars.by_ref() {
                            if c == '\n' {
                                ended = true;
                                break;
                            }
                            line.push(c);
                        }
                        let line = if strip_tabs {
                            line.trim_start_matches('\t')
                        } else {
                            &line
                        };
                        if line.trim_end() == delimiter || !ended {
                            break;
                        }
                    }
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(next) = chars.next() {
                                word.push(next);
                            }
                        }
                        _ => word.push(c),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(next) => {
                    in_word = true;
                    word.push(next);
                }
            },
            '#' if !in_word => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            '`' => {
                // Command substitution: kept inside the word, which then is not a file.
                in_word = true;
                word.push('`');
                for c in chars.by_ref() {
                    word.push(c);
                    if c == '`' {
                        break;
                    }
                }
            }
            '(' if word.ends_with('$') => {
                word.push('(');
                let mut depth = 1;
                for c in chars.by_ref() {
                    word.push(c);
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '|' | ';' | '(' | ')' => {
                end_word!();
                if matches!(chars.peek(), Some('|' | '&' | ';')) {
                    chars.next();
                }
                tokens.push(Token::Separator);
            }
            '&' => {
                end_word!();
                if chars.peek() == Some(&'>') {
                    chars.next();
                    if chars.peek() == Some(&'>') {
                        chars.next();
                    }
                    tokens.push(Token::WriteTo);
                } else {
                    if chars.peek() == Some(&'&') {
                        chars.next();
                    }
                    tokens.push(Token::Separator);
                }
            }
            '>' => {
                // `2>file`: the digits before `>` name a descriptor, not a word.
                if in_word && word.chars().all(|c| c.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                }
                end_word!();
                match chars.peek() {
                    Some('&') => {
                        chars.next();
                        tokens.push(Token::SkipNext);
                        // `>&2` has the target glued on; `>& file` is rare and not a file we track.
                    }
                    Some('>') | Some('|') => {
                        chars.next();
                        tokens.push(Token::WriteTo);
                    }
                    _ => tokens.push(Token::WriteTo),
                }
            }
            '<' => {
                if in_word && word.chars().all(|c| c.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                }
                end_word!();
                if chars.peek() == Some(&'<') {
                    chars.next();
                    if chars.peek() == Some(&'<') {
                        chars.next();
                        tokens.push(Token::SkipNext);
                        continue;
                    }
                    let strip_tabs = chars.peek() == Some(&'-');
                    if strip_tabs {
                        chars.next();
                    }
                    while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
                        chars.next();
                    }
                    let mut delimiter = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || matches!(c, ';' | '|' | '&' | '>' | '<' | ')') {
                            break;
                        }
                        chars.next();
                        if c != '\'' && c != '"' && c != '\\' {
                            delimiter.push(c);
                        }
                    }
                    heredocs.push((delimiter, strip_tabs));
                } else {
                    tokens.push(Token::ReadFrom);
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        tokens.push(Token::Word(word));
    }
    tokens
}

/// One simple command: its words, and the files its redirections read and write.
#[derive(Debug, Default)]
struct SimpleCommand {
    words: Vec<String>,
    read_redirects: Vec<String>,
    write_redirects: Vec<String>,
}

fn split_commands(tokens: &[Token]) -> Vec<SimpleCommand> {
    let mut commands = vec![SimpleCommand::default()];
    let mut pending: Option<&Token> = None;
    for token in tokens {
        let current = commands.last_mut().expect("never empty");
        match (token, pending.take()) {
            (Token::Word(w), Some(Token::WriteTo)) => current.write_redirects.push(w.clone()),
            (Token::Word(w), Some(Token::ReadFrom)) => current.read_redirects.push(w.clone()),
            (Token::Word(_), Some(_)) => {}
            (Token::Word(w), None) => current.words.push(w.clone()),
            (Token::Separator, _) => commands.push(SimpleCommand::default()),
            (redirect, _) => pending = Some(redirect),
        }
    }
    commands
}

/// Verbs that only wrap another command.
const WRAPPERS: &[&str] = &[
    "sudo", "env", "time", "nohup", "nice", "exec", "command", "builtin", "stdbuf",
];

fn classify_simple(words: &[String], files: &mut ShellFiles) {
    let mut rest = words;
    // Skip `VAR=value` prefixes and wrappers such as `sudo` or `timeout 10`.
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
            _ => break,
        }
    }
    let Some((verb, args)) = rest.split_first() else {
        return;
    };
    let verb = verb_name(verb);
    match verb {
        "cat" | "tac" | "less" | "more" | "nl" | "wc" | "bat" | "diff" | "cmp" | "stat"
        | "file" | "xxd" | "od" | "hexdump" | "strings" => {
            files.read.extend(positionals(args, &[]));
        }
        "head" | "tail" => files.read.extend(positionals(args, &["-n", "-c"])),
        "grep" | "egrep" | "fgrep" | "rg" | "ag" | "ack" => {
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
            files.read.extend(paths);
        }
        "sed" => {
            let in_place = args.iter().any(|a| {
                a.starts_with("-i") || a.starts_with("--in-place") || is_short_flag_with(a, 'i')
            });
            let explicit_script = args.iter().any(|a| a == "-e" || a == "-f");
            let mut paths = positionals(args, &["-e", "-f"]);
            if !explicit_script && !paths.is_empty() {
                paths.remove(0);
            }
            if in_place {
                files.modified.extend(paths);
            } else {
                files.read.extend(paths);
            }
        }
        "awk" | "gawk" | "mawk" => {
            let mut paths = positionals(args, &["-F", "-v", "-f"]);
            if !args.iter().any(|a| a == "-f") && !paths.is_empty() {
                paths.remove(0);
            }
            files.read.extend(paths);
        }
        "tee" | "mv" | "rm" | "touch" | "shred" | "unlink" => {
            files.modified.extend(positionals(args, &[]));
        }
        "truncate" => files.modified.extend(positionals(args, &["-s", "-r"])),
        "cp" => {
            let mut paths = positionals(args, &["-t", "--target-directory"]);
            if let Some(destination) = paths.pop() {
                files.read.extend(paths);
                files.modified.push(destination);
            }
        }
        _ => {}
    }
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

/// Whether a word can name a regular file we should report.
fn plausible_file(word: &str) -> bool {
    !(word.is_empty()
        || word.starts_with('-')
        || word.ends_with('/')
        || matches!(word, "." | ".." | "~")
        || word.starts_with("/dev/")
        || word.starts_with("/proc/")
        || word.contains("://")
        || word.chars().any(|c| {
            matches!(
                c,
                '*' | '?' | '$' | '{' | '}' | '`' | '[' | ']' | '\n' | '\0'
            )
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(cmd: &str) -> Vec<String> {
        classify_shell_command(cmd).read
    }
    fn modified(cmd: &str) -> Vec<String> {
        classify_shell_command(cmd).modified
    }

    #[test]
    fn reading_verbs_read_their_files() {
        assert_eq!(read("cat src/a.rs"), ["src/a.rs"]);
        assert_eq!(read("head -n 20 a.py"), ["a.py"]);
        assert_eq!(read("tail -50 /var/log/x.log"), ["/var/log/x.log"]);
        assert_eq!(
            read("grep -n 'fn main' src/main.rs src/lib.rs"),
            ["src/main.rs", "src/lib.rs"]
        );
        assert_eq!(read("grep -e foo -e bar a.txt"), ["a.txt"]);
        assert_eq!(read("rg -t rust TODO src/x.rs"), ["src/x.rs"]);
        assert_eq!(read("sed -n '1,20p' setup.py"), ["setup.py"]);
        for cmd in [
            "cat a.rs",
            "head -n 3 a.rs",
            "tail a.rs",
            "grep x a.rs",
            "rg x a.rs",
        ] {
            assert!(modified(cmd).is_empty(), "{cmd}");
        }
    }

    #[test]
    fn modifying_verbs_and_redirects_modify() {
        assert_eq!(modified("echo hi > out.txt"), ["out.txt"]);
        assert_eq!(modified("echo hi >> log.txt"), ["log.txt"]);
        assert_eq!(modified("sed -i 's/a/b/' src/x.py"), ["src/x.py"]);
        assert_eq!(modified("sed -i.bak -e 's/a/b/' x.py"), ["x.py"]);
        assert_eq!(modified("ls | tee listing.txt"), ["listing.txt"]);
        assert_eq!(modified("mv old.rs new.rs"), ["old.rs", "new.rs"]);
        let cp = classify_shell_command("cp -r a.txt b.txt");
        assert_eq!(
            (cp.read, cp.modified),
            (vec!["a.txt".to_string()], vec!["b.txt".to_string()])
        );
        assert_eq!(
            modified("rm -f build.log tmp.txt"),
            ["build.log", "tmp.txt"]
        );
        assert_eq!(modified("touch new_file.py"), ["new_file.py"]);
    }

    #[test]
    fn lists_pipelines_and_wrappers_are_split() {
        let f = classify_shell_command(
            "cd /repo && FOO=1 sudo cat a.txt | grep x; timeout 5 sed -i s/x/y/ b.txt 2>&1",
        );
        assert_eq!(f.read, ["a.txt"]);
        assert_eq!(f.modified, ["b.txt"]);
    }

    #[test]
    fn heredoc_bodies_are_data_not_commands() {
        let cmd = "cat <<'EOF' > /repo/fix.py\nimport os\ncat /etc/passwd\nrm -rf notes.txt\nEOF\npython /repo/fix.py";
        let f = classify_shell_command(cmd);
        assert_eq!(f.modified, ["/repo/fix.py"]);
        assert!(f.read.is_empty(), "{:?}", f.read);
    }

    #[test]
    fn descriptors_devices_globs_and_variables_are_not_files() {
        assert!(modified("make 2>&1 > /dev/null").is_empty());
        assert_eq!(modified("cargo build 2> err.txt"), ["err.txt"]);
        assert!(read("cat *.rs $HOME/x").is_empty());
        assert!(read("grep -r foo src/").is_empty());
    }

    #[test]
    fn input_redirects_read() {
        assert_eq!(read("python x.py < input.json"), ["input.json"]);
    }
}
