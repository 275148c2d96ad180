//! Recall: what compaction took out of the context, found again. A search runs over the
//! session's whole history (see `store::search`); each hit says whether the context still
//! shows the message whole, so an agent knows what it would read back.

use super::{Service, ServiceError};
use crate::message::Part;
use crate::protocol::{Role, SearchResult, SearchResults, SessionId};
use crate::store::{SearchHit, query_words, searchable_text};
use std::collections::HashSet;

/// Characters of text a snippet shows.
const SNIPPET_CHARS: usize = 240;
/// The longest query taken, in bytes.
pub(super) const MAX_QUERY_BYTES: usize = 2_000;
/// Bytes of a hit's text looked through for the query's words: a word found past them (in a
/// megabyte output, say) is not shown, the text's start is.
const SNIPPET_SCAN_BYTES: usize = 256 * 1024;

impl Service {
    /// The session's messages that best match `query`, at most `limit`.
    pub async fn search(
        &self,
        id: &SessionId,
        query: &str,
        limit: usize,
    ) -> Result<SearchResults, ServiceError> {
        if query.len() > MAX_QUERY_BYTES {
            return Err(ServiceError::BadRequest(format!(
                "the query is {} bytes; at most {MAX_QUERY_BYTES}",
                query.len()
            )));
        }
        let words = query_words(query);
        if words.is_empty() {
            return Err(ServiceError::BadRequest(
                "the query has no word to search for (q=some words)".into(),
            ));
        }
        let finder = WordFinder::new(&words);
        let describe = move |parts: &[Part]| finder.snippet(&searchable_text(parts));
        let (_, hits) = self.store.search(id, words, limit, describe).await?;
        let snapshot = self.store.context(id).await?;
        let whole: HashSet<u64> = snapshot
            .pinned
            .iter()
            .chain(&snapshot.tail)
            .filter(|m| !m.masked && !m.shortened)
            .map(|m| m.seq)
            .collect();
        let results = hits.into_iter().map(|hit| result(hit, &whole)).collect();
        Ok(SearchResults {
            session_id: id.clone(),
            query: query.to_string(),
            results,
        })
    }
}

fn result(hit: SearchHit, whole: &HashSet<u64>) -> SearchResult {
    SearchResult {
        seq: hit.seq,
        role: Role::parse(&hit.role).unwrap_or(Role::User),
        snippet: hit.description,
        score: hit.score,
        in_context: whole.contains(&hit.seq),
    }
}

/// Finds the first of a query's words in a text, case-insensitively, in one pass over at
/// most [`SNIPPET_SCAN_BYTES`] of it, whatever the number of words.
struct WordFinder(Option<regex::Regex>);

impl WordFinder {
    fn new(words: &[String]) -> WordFinder {
        let pattern: Vec<String> = words.iter().map(|w| regex::escape(w)).collect();
        let finder = regex::RegexBuilder::new(&pattern.join("|"))
            .case_insensitive(true)
            .build();
        WordFinder(finder.ok())
    }

    /// Where the first word is found, in bytes.
    fn first(&self, text: &str) -> Option<usize> {
        let mut scanned = text.len().min(SNIPPET_SCAN_BYTES);
        while !text.is_char_boundary(scanned) {
            scanned -= 1;
        }
        Some(self.0.as_ref()?.find(&text[..scanned])?.start())
    }

    /// About [`SNIPPET_CHARS`] of `text` around the first word found in it, on one line,
    /// `…` where it was cut.
    fn snippet(&self, text: &str) -> String {
        let found = self.first(text).unwrap_or(0);
        let mut start = chars_before(text, found, SNIPPET_CHARS / 3);
        let end = chars_after(text, start, SNIPPET_CHARS);
        if end == text.len() {
            // Near the end: the window reaches back to show as much all the same.
            let shown = text[start..end].chars().count();
            start = chars_before(text, start, SNIPPET_CHARS - shown);
        }
        let body = text[start..end].split_whitespace().collect::<Vec<_>>();
        format!(
            "{}{}{}",
            if start > 0 { "…" } else { "" },
            body.join(" "),
            if end < text.len() { "…" } else { "" }
        )
    }
}

/// The byte `n` characters before byte `at` of `text` (or its start).
fn chars_before(text: &str, at: usize, n: usize) -> usize {
    text[..at]
        .char_indices()
        .rev()
        .take(n)
        .last()
        .map_or(at, |(i, _)| i)
}

/// The byte `n` characters after byte `at` of `text` (or its end).
fn chars_after(text: &str, at: usize, n: usize) -> usize {
    text[at..]
        .char_indices()
        .nth(n)
        .map_or(text.len(), |(i, _)| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snippet(text: &str, query: &str) -> String {
        WordFinder::new(&query_words(query)).snippet(text)
    }

    #[test]
    fn a_snippet_shows_the_first_word_found_on_one_line() {
        let text = format!(
            "{}\nerror: the parser failed at line 7\n{}",
            "x ".repeat(500),
            "y ".repeat(500)
        );
        let s = snippet(&text, "PARSER failed");
        assert!(s.contains("the parser failed at line 7"), "{s}");
        assert!(s.starts_with('…') && s.ends_with('…') && !s.contains('\n'));
        assert!(s.chars().count() <= SNIPPET_CHARS + 2);
        assert_eq!(snippet("short text", "absent"), "short text");
        // Case folding that changes lengths does not misplace the cut.
        assert!(
            snippet(&format!("{}İstanbul target", "ß".repeat(300)), "target").contains("target")
        );
        // Near the end, the window still shows as much.
        let s = snippet(&format!("{} the end", "w ".repeat(400)), "end");
        assert!(
            s.ends_with("the end") && s.chars().count() >= SNIPPET_CHARS / 2,
            "{s}"
        );
    }

    /// A query of a thousand words over a megabyte output: one pass over a bounded window of
    /// it (each word scanned the whole text once, taking seconds a hit), and a word found
    /// only past the window shows the text's start.
    #[test]
    fn a_snippet_looks_through_a_bounded_window_once() {
        let words: String = (0..1000).map(|i| format!("w{i} ")).collect();
        let text = format!("{}needle", "a".repeat(2 << 20));
        let finder = WordFinder::new(&query_words(&format!("needle {words}")));
        let s = finder.snippet(&text);
        assert!(s.starts_with("aaa") && !s.contains("needle"), "{s}");
        let near = format!("{}needle {}", "b ".repeat(1000), "c".repeat(2 << 20));
        assert!(finder.snippet(&near).contains("needle"));
    }
}
