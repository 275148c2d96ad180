//! Recall: what compaction took out of the context, found again. A search runs over the
//! session's whole history (see `store::search`); each hit says whether the context still
//! shows the message whole, so an agent knows what it would read back.

use super::{Service, ServiceError};
use crate::protocol::{Role, SearchResult, SearchResults, SessionId};
use crate::store::{SearchHit, query_words, searchable_text};
use std::collections::HashSet;

/// Characters of text a snippet shows.
const SNIPPET_CHARS: usize = 240;
/// The longest query taken, in bytes.
pub(super) const MAX_QUERY_BYTES: usize = 2_000;

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
        let (_, hits) = self.store.search(id, words, limit).await?;
        let snapshot = self.store.context(id).await?;
        let whole: HashSet<u64> = snapshot
            .pinned
            .iter()
            .chain(&snapshot.tail)
            .filter(|m| !m.masked && !m.shortened)
            .map(|m| m.seq)
            .collect();
        let results = hits
            .into_iter()
            .map(|hit| result(hit, query, &whole))
            .collect();
        Ok(SearchResults {
            session_id: id.clone(),
            query: query.to_string(),
            results,
        })
    }
}

fn result(hit: SearchHit, query: &str, whole: &HashSet<u64>) -> SearchResult {
    SearchResult {
        seq: hit.seq,
        role: Role::parse(&hit.role).unwrap_or(Role::User),
        snippet: snippet(&searchable_text(&hit.parts), query),
        score: hit.score,
        in_context: whole.contains(&hit.seq),
    }
}

/// About [`SNIPPET_CHARS`] of `text` around the first of `query`'s words found in it
/// (case-insensitive), on one line, `…` where it was cut.
pub(super) fn snippet(text: &str, query: &str) -> String {
    let lower = text.to_lowercase();
    // Lowercasing may change byte lengths; positions are found in chars.
    let found = query
        .split_whitespace()
        .filter_map(|w| lower.find(&w.to_lowercase()))
        .min()
        .map_or(0, |byte| lower[..byte].chars().count());
    let chars: Vec<char> = text.chars().collect();
    let start = found.saturating_sub(SNIPPET_CHARS / 3);
    let end = (start + SNIPPET_CHARS).min(chars.len());
    let start = end.saturating_sub(SNIPPET_CHARS).min(start);
    let body: String = chars[start..end].iter().collect();
    let body = body.split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "{}{body}{}",
        if start > 0 { "…" } else { "" },
        if end < chars.len() { "…" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
