//! A small, forgiving shell lexer: enough of sh to find the commands, arguments, redirections
//! and here-documents of an agent's command line. It is not a shell: it expands nothing, and
//! a word holding `$`, backquotes or globs is kept as written (the classifier then ignores it).
//!
//! It understands quotes and escapes, lists and pipelines (`|`, `&&`, `||`, `;`, `&`,
//! newlines, parentheses), redirections (`>`, `>>`, `>|`, `&>`, `<`, `2>&1`, `<<<`) and
//! here-documents, whose bodies are data: they are attached to the command that opened them
//! (`cat > fix.py <<'EOF'` writes the body to `fix.py`; `patch -p1 <<EOF` reads it as input).

use std::iter::Peekable;
use std::str::Chars;

/// One simple command: its words and what its redirections name.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SimpleCommand {
    pub words: Vec<String>,
    /// Files read through `<`.
    pub read_redirects: Vec<String>,
    /// Files written through `>` / `>|` / `&>` (truncated, then written).
    pub write_redirects: Vec<String>,
    /// Files appended to through `>>`.
    pub append_redirects: Vec<String>,
    /// The command's standard input when it comes from a here-document or here-string.
    pub stdin: Option<String>,
}

/// Splits `command` into its simple commands.
pub fn simple_commands(command: &str) -> Vec<SimpleCommand> {
    let (tokens, bodies) = Lexer::new(command).run();
    split(tokens, bodies)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    /// The end of a simple command.
    Separator,
    /// `>`, `>|`, `&>`: the next word is written.
    WriteTo,
    /// `>>`: the next word is appended to.
    AppendTo,
    /// `<`: the next word is read.
    ReadFrom,
    /// `<<<`: the next word is the command's input.
    HereString,
    /// `<<DELIM`: the command's input is here-document number `n`.
    HereDoc(usize),
    /// `>&N`: the next word is a descriptor, not a file.
    SkipNext,
}

struct Lexer<'a> {
    chars: Peekable<Chars<'a>>,
    tokens: Vec<Token>,
    word: String,
    in_word: bool,
    /// Here-documents opened on the current line: (index, delimiter, strip leading tabs).
    pending: Vec<(usize, String, bool)>,
    bodies: Vec<String>,
}

impl<'a> Lexer<'a> {
    fn new(command: &'a str) -> Lexer<'a> {
        Lexer {
            chars: command.chars().peekable(),
            tokens: Vec::new(),
            word: String::new(),
            in_word: false,
            pending: Vec::new(),
            bodies: Vec::new(),
        }
    }

    fn run(mut self) -> (Vec<Token>, Vec<String>) {
        while let Some(c) = self.chars.next() {
            match c {
                ' ' | '\t' | '\r' => self.end_word(),
                '\n' => {
                    self.end_word();
                    self.tokens.push(Token::Separator);
                    self.read_heredoc_bodies();
                }
                '\'' => self.single_quoted(),
                '"' => self.double_quoted(),
                '\\' => self.escaped(),
                '#' if !self.in_word => self.comment(),
                '`' => self.backquoted(),
                '(' if self.word.ends_with('$') => self.substitution(),
                '|' | ';' | '(' | ')' => {
                    self.end_word();
                    if matches!(self.chars.peek(), Some('|' | '&' | ';')) {
                        self.chars.next();
                    }
                    self.tokens.push(Token::Separator);
                }
                '&' => self.ampersand(),
                '>' => self.redirect_out(),
                '<' => self.redirect_in(),
                _ => {
                    self.in_word = true;
                    self.word.push(c);
                }
            }
        }
        self.end_word();
        // A here-document whose line never ended has an empty body.
        (self.tokens, self.bodies)
    }

    fn end_word(&mut self) {
        if self.in_word {
            self.tokens
                .push(Token::Word(std::mem::take(&mut self.word)));
            self.in_word = false;
        }
    }

    /// A word of digits right before `>` or `<` names a descriptor (`2>err.txt`).
    fn drop_descriptor(&mut self) {
        if self.in_word && self.word.chars().all(|c| c.is_ascii_digit()) {
            self.word.clear();
            self.in_word = false;
        }
    }

    fn single_quoted(&mut self) {
        self.in_word = true;
        for c in self.chars.by_ref() {
            if c == '\'' {
                break;
            }
            self.word.push(c);
        }
    }

    fn double_quoted(&mut self) {
        self.in_word = true;
        while let Some(c) = self.chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    if let Some(next) = self.chars.next() {
                        if !matches!(next, '"' | '\\' | '$' | '`' | '\n') {
                            self.word.push('\\');
                        }
                        self.word.push(next);
                    }
                }
                _ => self.word.push(c),
            }
        }
    }

    fn escaped(&mut self) {
        match self.chars.next() {
            Some('\n') | None => {}
            Some(next) => {
                self.in_word = true;
                self.word.push(next);
            }
        }
    }

    fn comment(&mut self) {
        while self.chars.peek().is_some_and(|&c| c != '\n') {
            self.chars.next();
        }
    }

    /// Command substitution in backquotes: kept inside the word, which then is not a file.
    fn backquoted(&mut self) {
        self.in_word = true;
        self.word.push('`');
        for c in self.chars.by_ref() {
            self.word.push(c);
            if c == '`' {
                break;
            }
        }
    }

    /// `$( ... )`, kept inside the word.
    fn substitution(&mut self) {
        self.word.push('(');
        let mut depth = 1;
        for c in self.chars.by_ref() {
            self.word.push(c);
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

    fn ampersand(&mut self) {
        self.end_word();
        if self.chars.peek() == Some(&'>') {
            self.chars.next();
            if self.chars.peek() == Some(&'>') {
                self.chars.next();
                self.tokens.push(Token::AppendTo);
            } else {
                self.tokens.push(Token::WriteTo);
            }
        } else {
            if self.chars.peek() == Some(&'&') {
                self.chars.next();
            }
            self.tokens.push(Token::Separator);
        }
    }

    fn redirect_out(&mut self) {
        self.drop_descriptor();
        self.end_word();
        match self.chars.peek() {
            // `>&2`: the target is a descriptor glued on.
            Some('&') => {
                self.chars.next();
                self.tokens.push(Token::SkipNext);
            }
            Some('>') => {
                self.chars.next();
                self.tokens.push(Token::AppendTo);
            }
            Some('|') => {
                self.chars.next();
                self.tokens.push(Token::WriteTo);
            }
            _ => self.tokens.push(Token::WriteTo),
        }
    }

    fn redirect_in(&mut self) {
        self.drop_descriptor();
        self.end_word();
        if self.chars.peek() != Some(&'<') {
            self.tokens.push(Token::ReadFrom);
            return;
        }
        self.chars.next();
        if self.chars.peek() == Some(&'<') {
            self.chars.next();
            self.tokens.push(Token::HereString);
            return;
        }
        let strip_tabs = self.chars.peek() == Some(&'-');
        if strip_tabs {
            self.chars.next();
        }
        while self.chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            self.chars.next();
        }
        let mut delimiter = String::new();
        while let Some(&c) = self.chars.peek() {
            if c.is_whitespace() || matches!(c, ';' | '|' | '&' | '>' | '<' | ')') {
                break;
            }
            self.chars.next();
            if !matches!(c, '\'' | '"' | '\\') {
                delimiter.push(c);
            }
        }
        let index = self.bodies.len();
        self.bodies.push(String::new());
        self.pending.push((index, delimiter, strip_tabs));
        self.tokens.push(Token::HereDoc(index));
    }

    /// Here-document bodies follow the line that opened them, in order.
    fn read_heredoc_bodies(&mut self) {
        for (index, delimiter, strip_tabs) in std::mem::take(&mut self.pending) {
            let mut body = String::new();
            loop {
                let mut line = String::new();
                let mut ended = false;
                for c in self.chars.by_ref() {
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
                if line.trim_end() == delimiter {
                    break;
                }
                body.push_str(line);
                body.push('\n');
                if !ended {
                    break;
                }
            }
            self.bodies[index] = body;
        }
    }
}

fn split(tokens: Vec<Token>, mut bodies: Vec<String>) -> Vec<SimpleCommand> {
    let mut commands = vec![SimpleCommand::default()];
    let mut pending: Option<Token> = None;
    for token in tokens {
        let current = commands.last_mut().expect("never empty");
        match (token, pending.take()) {
            (Token::Word(w), Some(Token::WriteTo)) => current.write_redirects.push(w),
            (Token::Word(w), Some(Token::AppendTo)) => current.append_redirects.push(w),
            (Token::Word(w), Some(Token::ReadFrom)) => current.read_redirects.push(w),
            (Token::Word(w), Some(Token::HereString)) => current.stdin = Some(w),
            (Token::Word(_), Some(_)) => {}
            (Token::Word(w), None) => current.words.push(w),
            (Token::HereDoc(n), _) => {
                current.stdin = Some(std::mem::take(&mut bodies[n]));
            }
            (Token::Separator, _) => commands.push(SimpleCommand::default()),
            (redirect, _) => pending = Some(redirect),
        }
    }
    commands.retain(|c| !c.words.is_empty() || !c.write_redirects.is_empty());
    commands
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_pipelines_and_quotes_split_into_simple_commands() {
        let c = simple_commands(r#"cd /repo && grep -n "a b" x.rs | head -5; echo 'it''s'"#);
        let words: Vec<Vec<&str>> = c
            .iter()
            .map(|c| c.words.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            words,
            [
                vec!["cd", "/repo"],
                vec!["grep", "-n", "a b", "x.rs"],
                vec!["head", "-5"],
                vec!["echo", "its"]
            ]
        );
    }

    #[test]
    fn redirections_are_attached_to_their_command() {
        let c =
            simple_commands("make 2>&1 > out.log; cat < in.txt >> all.txt; cargo build 2> e.txt");
        assert_eq!(c[0].write_redirects, ["out.log"]);
        assert_eq!(c[1].read_redirects, ["in.txt"]);
        assert_eq!(c[1].append_redirects, ["all.txt"]);
        assert_eq!(c[2].write_redirects, ["e.txt"]);
        assert_eq!(c[2].words, ["cargo", "build"]);
    }

    #[test]
    fn heredoc_bodies_become_the_input_of_the_command_that_opened_them() {
        let c = simple_commands(
            "cat <<'EOF' > fix.py\nimport os\nrm -rf x\nEOF\npython fix.py\npatch -p1 <<-END\n\t--- a/x\nEND",
        );
        assert_eq!(c[0].words, ["cat"]);
        assert_eq!(c[0].write_redirects, ["fix.py"]);
        assert_eq!(c[0].stdin.as_deref(), Some("import os\nrm -rf x\n"));
        assert_eq!(c[1].words, ["python", "fix.py"]);
        assert_eq!(c[2].stdin.as_deref(), Some("--- a/x\n"));
        assert_eq!(c.len(), 3, "the body's lines are not commands");
    }

    #[test]
    fn substitutions_and_comments_stay_out_of_the_way() {
        let c = simple_commands("echo $(cat a | wc -l) `date` # rm b\nls");
        assert_eq!(c[0].words, ["echo", "$(cat a | wc -l)", "`date`"]);
        assert_eq!(c[1].words, ["ls"]);
    }
}
