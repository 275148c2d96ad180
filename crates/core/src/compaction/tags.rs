//! Tagged blocks agents put in texts (`<system-reminder>…</system-reminder>` beside tool
//! results and in user messages, `<task-notification>…</task-notification>`): read past them.

use std::borrow::Cow;

/// One `<tag>…</tag>` block of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block<'a> {
    /// Where its opening tag starts.
    pub start: usize,
    /// Where it ends, its closing tag included (an unclosed one runs to the end of the text).
    pub end: usize,
    /// What it holds, between the tags.
    pub body: &'a str,
}

/// The `<tag>…</tag>` blocks of `text`, in order.
pub fn blocks<'a>(text: &'a str, tag: &str) -> impl Iterator<Item = Block<'a>> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut from = 0;
    std::iter::from_fn(move || {
        let start = from + text[from..].find(&open)?;
        let inner = start + open.len();
        let (body, end) = match text[inner..].find(&close) {
            Some(len) => (&text[inner..inner + len], inner + len + close.len()),
            None => (&text[inner..], text.len()),
        };
        from = end;
        Some(Block { start, end, body })
    })
}

/// `text` without its `<tag>…</tag>` blocks (an unclosed one runs to the end).
pub fn without<'a>(text: &'a str, tag: &str) -> Cow<'a, str> {
    let mut out: Option<String> = None;
    let mut from = 0;
    for block in blocks(text, tag) {
        out.get_or_insert_with(|| String::with_capacity(text.len()))
            .push_str(&text[from..block.start]);
        from = block.end;
    }
    match out {
        Some(mut out) => {
            out.push_str(&text[from..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_in_order_with_where_they_stand() {
        let found: Vec<Block> = blocks("a<r>x</r>b<r>y", "r").collect();
        assert_eq!(
            found,
            [
                Block {
                    start: 1,
                    end: 9,
                    body: "x"
                },
                Block {
                    start: 10,
                    end: 14,
                    body: "y"
                }
            ]
        );
        assert_eq!(blocks("plain", "r").count(), 0);
    }

    #[test]
    fn blocks_are_cut_out_and_an_unclosed_one_runs_to_the_end() {
        assert_eq!(without("a<r>x</r>b<r>y</r>c", "r"), "abc");
        assert_eq!(without("a<r>x", "r"), "a");
        assert!(matches!(without("plain", "r"), Cow::Borrowed("plain")));
    }
}
