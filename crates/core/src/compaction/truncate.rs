//! Cutting text to the prompt's limits (SPEC.md 5.1: 2000 / 500 / 2000 characters).
//!
//! Limits count characters (Unicode scalar values), so a cut never falls inside a UTF-8
//! sequence. A cut is visible: the kept prefix is followed by a marker saying how much was
//! left out, so neither the summarizer nor a person reading the prompt mistakes it for the end.

use std::borrow::Cow;

/// `text` cut to at most `max_chars` characters, plus a marker when anything was cut.
pub fn truncate_chars(text: &str, max_chars: usize) -> Cow<'_, str> {
    // No more bytes than the limit: no more characters either (most texts, read at no cost).
    if text.len() <= max_chars {
        return Cow::Borrowed(text);
    }
    // An ASCII start is cut at its byte count; anything else is walked char by char.
    let cut = if text.as_bytes()[..max_chars].is_ascii() {
        Some(max_chars)
    } else {
        text.char_indices().nth(max_chars).map(|(cut, _)| cut)
    };
    match cut {
        None => Cow::Borrowed(text),
        Some(cut) => {
            let dropped = text[cut..].chars().count();
            Cow::Owned(format!("{}…[truncated {dropped} chars]", &text[..cut]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_untouched() {
        assert!(matches!(truncate_chars("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(truncate_chars("", 0), "");
    }

    #[test]
    fn long_text_is_cut_with_a_visible_marker() {
        assert_eq!(truncate_chars("abcdef", 4), "abcd…[truncated 2 chars]");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries_at_every_position() {
        // 1-, 2-, 3- and 4-byte characters mixed, cut at every possible length.
        let text = "aé日🦀bñ語🎉";
        let total = text.chars().count();
        for max in 0..=total + 1 {
            let cut = truncate_chars(text, max);
            let kept: String = text.chars().take(max).collect();
            assert!(cut.starts_with(&kept), "max {max}: {cut}");
            if max >= total {
                assert_eq!(cut, text);
            } else {
                assert_eq!(
                    cut,
                    format!("{kept}…[truncated {} chars]", total - max),
                    "max {max}"
                );
            }
        }
    }
}
