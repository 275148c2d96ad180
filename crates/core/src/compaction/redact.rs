//! Secret redaction: credentials never leave the store.
//!
//! Stored messages stay verbatim (nothing is ever deleted), but whatever compactd *writes from*
//! them — a summary, a compaction prompt sent to a model — has credentials replaced with
//! `[redacted]`. A summary is carried into every later summary and, with a model summarizer,
//! sent to a third party; one leaked `DB_PASSWORD=...` would otherwise live on forever.
//!
//! What counts as a credential:
//!
//! | form                                   | example                                  |
//! |----------------------------------------|------------------------------------------|
//! | private key blocks                     | `-----BEGIN RSA PRIVATE KEY----- ...`    |
//! | OpenAI / Anthropic keys                | `sk-...`, `sk-proj-...`, `sk-ant-...`    |
//! | GitHub tokens                          | `ghp_...`, `gho_...`, `github_pat_...`   |
//! | Slack tokens                           | `xoxb-...`, `xoxa-...`, `xoxp-...`       |
//! | AWS access key ids                     | `AKIA...`                                |
//! | JSON Web Tokens                        | `eyJ....eyJ....sig`                      |
//! | bearer credentials                     | `Authorization: Bearer ...`              |
//! | assignments to secret-looking names    | `DB_PASSWORD=...`, `"api_key": "..."`, `SECRET_KEY = '...'`, `GITHUB_TOKEN: ...` |
//!
//! Names count as secret-looking when they contain PASSWORD, PASSWD, SECRET, API_KEY (or
//! APIKEY), ACCESS_KEY or PRIVATE_KEY, or end in TOKEN (so `max_tokens = 4096` is left alone).
//! Values that only refer to a secret (`$DB_PASSWORD`, `os.environ[...]`, `None`) are kept.

use regex::{Captures, Regex};
use std::borrow::Cow;
use std::sync::LazyLock;

/// What a redacted credential reads.
pub const REDACTED: &str = "[redacted]";

/// Credentials that stand on their own, whatever surrounds them.
static TOKENS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
        r"|\bsk-[A-Za-z0-9_\-]{16,}",
        r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}",
        r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        r"|\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*",
    ))
    .expect("valid regex")
});

/// `Authorization: Bearer <credential>` (and Basic, Token), in headers, curl flags or code.
static AUTHORIZATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)(\b(?:authorization|proxy-authorization)["']?[ \t]*[:=][ \t]*["']?(?:bearer|basic|token)[ \t]+)([^\s"',;]+)"#)
        .expect("valid regex")
});

/// The words a secret's name holds (see [`is_secret_name`]), in any case: where to look for
/// an assignment of one. Most text has none, and is passed over at the speed of a literal
/// search.
static SECRET_WORDS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)password|passwd|secret|api[_-]?key|access[_-]key|private[_-]key|token")
        .expect("valid regex")
});

/// A character of a name an assignment assigns to.
fn in_name(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')
}

/// `NAME=`, `NAME: `, `"name": `, `name = ` around the name holding `text[word]`: the name
/// (from its first letter or `_`) and where the assigned value starts. Values are not read
/// here, so an assignment inside another's quoted value (a shell command in a JSON argument)
/// is still found.
fn assignment_around(
    text: &str,
    word: std::ops::Range<usize>,
) -> Option<(std::ops::Range<usize>, usize)> {
    let bytes = text.as_bytes();
    let run_start = bytes[..word.start]
        .iter()
        .rposition(|&c| !in_name(c))
        .map_or(0, |i| i + 1);
    let end = word.end
        + bytes[word.end..]
            .iter()
            .position(|&c| !in_name(c))
            .unwrap_or(bytes.len() - word.end);
    let start = run_start
        + bytes[run_start..end]
            .iter()
            .position(|&c| c.is_ascii_alphabetic() || c == b'_')?;
    let mut at = end;
    if matches!(bytes.get(at), Some(b'"' | b'\'')) {
        at += 1;
    }
    let spaces = |from: usize| {
        from + bytes[from..]
            .iter()
            .take_while(|&&c| c == b' ' || c == b'\t')
            .count()
    };
    at = spaces(at);
    if !matches!(bytes.get(at), Some(b':' | b'=')) {
        return None;
    }
    Some((start..end, spaces(at + 1)))
}

/// Where the value starting at `text[start..]` ends: a quoted value at its closing quote
/// (quotes included), a bare one at whitespace or punctuation that ends a value.
fn value_end(text: &str, start: usize) -> usize {
    let rest = &text[start..];
    if rest.starts_with(REDACTED) {
        return start + REDACTED.len();
    }
    match rest.chars().next() {
        Some(q @ ('"' | '\'')) => rest[1..]
            .find([q, '\n'])
            .map_or(text.len(), |end| start + 1 + end + 1),
        _ => {
            start
                + rest
                    .find(|c: char| c.is_whitespace() || "\"',;)}]\\".contains(c))
                    .unwrap_or(rest.len())
        }
    }
}

/// The byte ranges of values assigned to secret-looking names, in order, not overlapping.
fn secret_assignments(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut name_seen = None;
    for word in SECRET_WORDS.find_iter(text) {
        let Some((name, value_start)) = assignment_around(text, word.range()) else {
            continue;
        };
        // A name holding two of the words is one assignment.
        if name_seen == Some(name.start) {
            continue;
        }
        name_seen = Some(name.start);
        if out.last().is_some_and(|last| name.start < last.end) || !is_secret_name(&text[name]) {
            continue;
        }
        let end = value_end(text, value_start);
        let value = &text[value_start..end];
        if !is_reference(value) && !value.starts_with('=') {
            out.push(value_start..end);
        }
    }
    out
}

/// Whether `name` looks like it holds a credential.
pub fn is_secret_name(name: &str) -> bool {
    // Compared as lower case with `-` read as `_`, without a copy (this runs for every
    // assignment of every prompt).
    let fold = |b: u8| {
        if b == b'-' {
            b'_'
        } else {
            b.to_ascii_lowercase()
        }
    };
    let name = name.as_bytes();
    let has = |word: &str| {
        name.windows(word.len())
            .any(|w| w.iter().zip(word.bytes()).all(|(&a, b)| fold(a) == b))
    };
    [
        "password",
        "passwd",
        "secret",
        "api_key",
        "apikey",
        "access_key",
        "private_key",
    ]
    .iter()
    .any(|word| has(word))
        || (name.len() >= 5
            && name[name.len() - 5..]
                .iter()
                .zip(b"token")
                .all(|(&a, &b)| fold(a) == b))
}

/// Whether an assigned value is a reference to a secret rather than the secret itself.
fn is_reference(value: &str) -> bool {
    let bare = value.trim_matches(|c| c == '"' || c == '\'');
    bare.is_empty()
        || bare.starts_with('$')
        || bare.starts_with('=')
        || bare.starts_with('<')
        || bare.starts_with("{{")
        || bare.starts_with("os.")
        || bare.starts_with("process.env")
        || bare.starts_with("env(")
        || bare.starts_with("getenv")
        || bare == REDACTED
        || bare.chars().all(|c| c == '*' || c == 'x' || c == 'X')
        || matches!(
            bare.to_ascii_lowercase().as_str(),
            "none" | "null" | "nil" | "true" | "false" | "undefined" | "required" | "optional"
        )
}

/// `text` with every credential replaced by `[redacted]`; borrowed when nothing was found.
pub fn redact_secrets(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if TOKENS.is_match(&out) {
        out = Cow::Owned(TOKENS.replace_all(&out, REDACTED).into_owned());
    }
    if AUTHORIZATION.is_match(&out) {
        out = Cow::Owned(
            AUTHORIZATION
                .replace_all(&out, |c: &Captures| format!("{}{REDACTED}", &c[1]))
                .into_owned(),
        );
    }
    let ranges = secret_assignments(&out);
    if !ranges.is_empty() {
        let mut redacted = String::with_capacity(out.len());
        let mut at = 0;
        for range in ranges {
            let value = &out[range.clone()];
            redacted.push_str(&out[at..range.start]);
            match value.chars().next().filter(|q| *q == '"' || *q == '\'') {
                Some(q) => {
                    redacted.push(q);
                    redacted.push_str(REDACTED);
                    redacted.push(q);
                }
                None => redacted.push_str(REDACTED),
            }
            at = range.end;
        }
        redacted.push_str(&out[at..]);
        out = Cow::Owned(redacted);
    }
    out
}

/// The credentials in `text`, as [`redact_secrets`] would replace them (the secret values, not
/// the names around them). Used to check that none reaches a summary.
pub fn find_secrets(text: &str) -> Vec<String> {
    let mut found: Vec<String> = TOKENS
        .find_iter(text)
        .map(|m| m.as_str().to_string())
        .collect();
    found.extend(AUTHORIZATION.captures_iter(text).map(|c| c[2].to_string()));
    found.extend(
        secret_assignments(text)
            .into_iter()
            .map(|r| text[r].trim_matches(|q| q == '"' || q == '\'').to_string()),
    );
    found.retain(|s| !s.is_empty());
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn redacted(text: &str) -> String {
        redact_secrets(text).into_owned()
    }

    /// The assignments as every name followed by `:` or `=` gives them, one regex match at a
    /// time (how they were found before the scan started from the secret words).
    fn assignments_by_regex(text: &str) -> Vec<std::ops::Range<usize>> {
        let assignment =
            Regex::new(r#"([A-Za-z_][A-Za-z0-9_.\-]*)["']?[ \t]*(?::|=)[ \t]*"#).unwrap();
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for c in assignment.captures_iter(text) {
            let whole = c.get(0).unwrap();
            if out.last().is_some_and(|last| whole.start() < last.end) || !is_secret_name(&c[1]) {
                continue;
            }
            let end = value_end(text, whole.end());
            let value = &text[whole.end()..end];
            if !is_reference(value) && !value.starts_with('=') {
                out.push(whole.end()..end);
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Starting from the secret words finds what matching every assignment found.
        #[test]
        fn the_scan_from_secret_words_finds_what_every_assignment_gave(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "password", "PassWord", "passwd", "Api-Key", "api_key", "APIKEY", "access-key",
                "private_key", "token", "TOKEN", "my_token", "tokens", "secret", "x", "9", "_",
                ".", "-", "=", ":", " ", "\t", "\"", "'", "\n", "$HOME", "abc123", "null", ",",
                "é", "==", "[redacted]", "{", ")",
            ]), 0..24)
        ) {
            let text: String = pieces.concat();
            prop_assert_eq!(secret_assignments(&text), assignments_by_regex(&text), "{:?}", text);
        }
    }

    #[test]
    fn private_key_blocks_are_redacted_whole_even_when_cut_off() {
        let key =
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nabc\n-----END RSA PRIVATE KEY-----";
        assert_eq!(
            redacted(&format!("key:\n{key}\nok")),
            "key:\n[redacted]\nok"
        );
        let cut = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA";
        assert_eq!(redacted(&format!("x {cut}")), "x [redacted]");
    }

    #[test]
    fn provider_keys_are_redacted() {
        for key in [
            "sk-abcdefghijklmnopqrstuvwx",
            "sk-proj-AbCdEf0123456789_-xyzXYZ",
            "sk-ant-api03-abcdefghijklmnopqrstu",
        ] {
            assert_eq!(redacted(&format!("use {key} now")), "use [redacted] now");
        }
        // Short look-alikes are not keys.
        assert_eq!(redacted("a sk-learn model"), "a sk-learn model");
    }

    #[test]
    fn github_slack_and_aws_tokens_are_redacted() {
        assert_eq!(
            redacted("ghp_0123456789abcdefghijABCDEFGHIJ012345"),
            "[redacted]"
        );
        assert_eq!(
            redacted("github_pat_11ABCDEFG0123456789_abcdefghij"),
            "[redacted]"
        );
        assert_eq!(
            redacted("token xoxb-1234567890-abcdefghij"),
            "token [redacted]"
        );
        assert_eq!(
            redacted("aws AKIAIOSFODNN7EXAMPLE key"),
            "aws [redacted] key"
        );
    }

    #[test]
    fn json_web_tokens_are_redacted() {
        let jwt =
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_eq!(redacted(&format!("jwt={jwt};")), "jwt=[redacted];");
    }

    #[test]
    fn bearer_credentials_keep_their_header() {
        assert_eq!(
            redacted("curl -H 'Authorization: Bearer abc.def-123' https://x"),
            "curl -H 'Authorization: Bearer [redacted]' https://x"
        );
        assert_eq!(
            redacted(r#"{"authorization": "Basic dXNlcjpwYXNz"}"#),
            r#"{"authorization": "Basic [redacted]"}"#
        );
    }

    #[test]
    fn assignments_to_secret_names_are_redacted() {
        assert_eq!(
            redacted("export DB_PASSWORD=hunter2 && psql"),
            "export DB_PASSWORD=[redacted] && psql"
        );
        assert_eq!(
            redacted("SECRET_KEY = 'test-secret-key'"),
            "SECRET_KEY = '[redacted]'"
        );
        assert_eq!(
            redacted(r#"{"api_key": "abc123", "model": "x"}"#),
            r#"{"api_key": "[redacted]", "model": "x"}"#
        );
        assert_eq!(
            redacted("GITHUB_TOKEN: abcdef\nnext"),
            "GITHUB_TOKEN: [redacted]\nnext"
        );
        assert_eq!(redacted("password: hunter2"), "password: [redacted]");
        // Inside another value: a shell command in a JSON tool argument.
        assert_eq!(
            redacted(r#"bash({"command":"export DB_PASSWORD=hunter2 && ./deploy.sh"})"#),
            r#"bash({"command":"export DB_PASSWORD=[redacted] && ./deploy.sh"})"#
        );
    }

    #[test]
    fn look_alikes_and_references_are_left_alone() {
        for text in [
            "max_tokens = 4096",
            "input_tokens: 12",
            "password = os.environ['DB_PASSWORD']",
            "API_KEY=$OPENAI_API_KEY",
            "if password == other:",
            "token: null",
            "Note: nothing secret here",
        ] {
            assert_eq!(redacted(text), text);
            assert!(find_secrets(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn redaction_is_idempotent_and_finds_what_it_replaces() {
        let text = "DB_PASSWORD=hunter2 sk-abcdefghijklmnopqrstuvwx";
        let once = redacted(text);
        assert_eq!(redacted(&once), once);
        assert_eq!(
            find_secrets(text),
            ["hunter2", "sk-abcdefghijklmnopqrstuvwx"]
        );
        assert!(find_secrets(&once).is_empty());
    }
}
