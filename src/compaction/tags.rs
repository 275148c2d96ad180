//! Tagged blocks agents put in texts (`<system-reminder>…</system-reminder>` beside tool
//! results and in user messages, `<task-notification>…</task-notification>`): read past them.

use std::borrow::Cow;

/// `text` without its `<tag>…</tag>` blocks (an unclosed one runs to the end).
pub fn without<'a>(text: &'a str, tag: &str) -> Cow<'a, str> {
    let open = format!("<{tag}>");
    if !text.contains(&open) {
        return Cow::Borrowed(text);
    }
    let close = format!("</{tag}>");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find(&close) {
            Some(end) => &rest[start + end + close.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_cut_out_and_an_unclosed_one_runs_to_the_end() {
        assert_eq!(without("a<r>x</r>b<r>y</r>c", "r"), "abc");
        assert_eq!(without("a<r>x", "r"), "a");
        assert!(matches!(without("plain", "r"), Cow::Borrowed("plain")));
    }
}
