//! The model as aider meets it: no tools, edits as whole files. Each of the user's rounds
//! (`Round N: ...`) asks for a function `fN` returning `N` in `lib.py`; the first answer
//! to a round gets it wrong, so aider's test (`check.py`) fails and aider reflects, sending the
//! failure back; the second answer fixes it. Commit messages and aider's own summaries of its
//! history get a line of text.

use super::Action;
use serde_json::Value;

fn text(m: &Value) -> String {
    super::text_of(&m["content"])
}

/// The round a text asks for (`Round N:`).
fn round_of(text: &str) -> Option<usize> {
    let at = text.rfind("Round ")? + 6;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .ok()
        .filter(|_| text[at + digits.len()..].starts_with(':'))
}

/// `lib.py` with `f1` to `fn`, the last one returning `wrong` if given.
fn library(n: usize, wrong: Option<usize>) -> String {
    (1..=n)
        .map(|k| {
            let value = if k == n { wrong.unwrap_or(k) } else { k };
            let doc: String = (0..20)
                .map(|i| format!("    Line {i} of what f{k} does.\n"))
                .collect();
            format!("def f{k}():\n    \"\"\"f{k}.\n\n{doc}    \"\"\"\n    return {value}\n")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn answer(messages: &[Value]) -> Action {
    let system: String = messages
        .iter()
        .filter(|m| m["role"] == "system")
        .map(text)
        .collect();
    if system.contains("commit message") {
        return Action::Text("Add a numbered function to lib.py".into());
    }
    let users: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(text)
        .collect();
    let Some(round) = users.iter().rev().find_map(|u| round_of(u)) else {
        return Action::Text(
            "The user asked for numbered functions in lib.py; each was added.".into(),
        );
    };
    let reflecting = users.last().is_some_and(|u| u.contains("check failed"));
    let wrong = (!reflecting).then_some(round + 1000);
    Action::Text(format!(
        "{} f{round}.\n\nlib.py\n```\n{}```\n",
        if reflecting { "Fixing" } else { "Adding" },
        library(round, wrong)
    ))
}
