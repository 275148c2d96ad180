//! Full-text search over a session's whole history (SQLite FTS5, `messages_fts` in
//! schema.sql): every message is indexed as it is appended, in the append's own transaction,
//! from its original parts (text, reasoning, tool calls with their arguments, tool outputs),
//! never from the masked or shortened forms a context shows.
//!
//! The index is contentless (the text is stored once, in `messages.parts`); each row carries a
//! token of its session's id, so a search reads only that session's postings. A person's
//! query is never handed to FTS5 as syntax: each word is quoted, so `"`, `*`, `NEAR`, `-`
//! or a lone `(` search for themselves and no query string can fail.

use super::rows::SessionRow;
use super::sessions::get_live;
use super::{Result, Store};
use crate::message::Part;
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};

/// Words of a query beyond this many are ignored (each adds a posting list to merge).
pub const MAX_QUERY_WORDS: usize = 32;

/// One message a search found.
#[derive(Debug, Clone)]
pub struct SearchHit {
    pub seq: u64,
    pub role: String,
    pub parts: Vec<Part>,
    /// bm25 relevance, higher is better.
    pub score: f64,
}

/// What a message is found by: its texts, its calls (tool name and arguments) and its outputs.
pub fn searchable_text(parts: &[Part]) -> String {
    let mut text = String::new();
    for part in parts {
        let piece = match part {
            Part::Text { text } | Part::Reasoning { text } => text.clone(),
            Part::ToolCall { name, args, .. } => format!("{name} {args}"),
            Part::ToolResult { output, .. } => output.clone(),
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&piece);
    }
    text
}

/// The token a session's rows carry: `s` and 16 hex digits of a hash of its id (one token
/// whatever characters the id holds).
fn session_token(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("s{hex}")
}

/// Indexes the message stored as row `rowid` of session `session_id`.
pub(super) fn index_message(
    conn: &Connection,
    rowid: i64,
    session_id: &str,
    parts: &[Part],
) -> Result<()> {
    conn.prepare_cached("INSERT INTO messages_fts (rowid, session, text) VALUES (?1, ?2, ?3)")?
        .execute(params![
            rowid,
            session_token(session_id),
            searchable_text(parts)
        ])?;
    Ok(())
}

/// Indexes every message already stored (the upgrade to the first schema with the index).
pub(super) fn index_existing(conn: &Connection) -> Result<()> {
    let mut rows = conn.prepare("SELECT id, session_id, parts FROM messages ORDER BY id")?;
    let mut rows = rows.query([])?;
    while let Some(row) = rows.next()? {
        let (rowid, session, parts): (i64, String, String) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        let parts: Vec<Part> = serde_json::from_str(&parts).unwrap_or_default();
        index_message(conn, rowid, &session, &parts)?;
    }
    Ok(())
}

/// The words of a person's query, each a quoted FTS5 string (inner quotes doubled); words
/// without a letter or digit are dropped (FTS5 would find nothing in them).
pub fn query_words(query: &str) -> Vec<String> {
    query
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .take(MAX_QUERY_WORDS)
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect()
}

/// The FTS5 expression for `words` in one session: the words as a phrase (a line quoted
/// whole ranks first), or any of them (bm25 ranks messages with more of them higher).
fn match_expression(session_id: &str, words: &[String]) -> String {
    let phrase = words
        .iter()
        .map(|w| w.trim_matches('"').to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let mut any = vec![format!("\"{phrase}\"")];
    if words.len() > 1 {
        any.extend(words.iter().cloned());
    }
    format!(
        "session : {} AND text : ({})",
        session_token(session_id),
        any.join(" OR ")
    )
}

impl Store {
    /// The session's messages that best match `words` (from [`query_words`], not empty),
    /// best first and, among equals, newest first; at most `limit`.
    pub async fn search(
        &self,
        session_id: &str,
        words: Vec<String>,
        limit: usize,
    ) -> Result<(SessionRow, Vec<SearchHit>)> {
        let session_id = session_id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &session_id)?;
            let mut statement = conn.prepare_cached(
                "SELECT m.seq, m.role, m.parts, bm25(messages_fts, 0.0, 1.0) AS rank
                 FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                 WHERE messages_fts MATCH ?1 AND m.session_id = ?2
                 ORDER BY rank, m.seq DESC LIMIT ?3",
            )?;
            let hits = statement
                .query_map(
                    params![match_expression(&session_id, &words), session_id, limit],
                    |row| {
                        let parts: String = row.get(2)?;
                        Ok(SearchHit {
                            seq: row.get(0)?,
                            role: row.get(1)?,
                            parts: serde_json::from_str(&parts).unwrap_or_default(),
                            score: -row.get::<_, f64>(3)?,
                        })
                    },
                )?
                .collect::<rusqlite::Result<_>>()?;
            Ok((session, hits))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_quoted_so_no_query_is_syntax() {
        assert_eq!(query_words("cargo test"), ["\"cargo\"", "\"test\""]);
        assert_eq!(
            query_words("say \"hi\" NEAR(x) -- *"),
            ["\"say\"", "\"\"\"hi\"\"\"", "\"NEAR(x)\""]
        );
        assert!(query_words("  \" ( ) * ").is_empty());
        assert_eq!(query_words(&"w ".repeat(100)).len(), MAX_QUERY_WORDS);
    }

    #[test]
    fn calls_and_outputs_are_searchable() {
        let parts = vec![
            Part::Text {
                text: "Running the tests.".into(),
            },
            Part::ToolCall {
                id: "c1".into(),
                name: "bash".into(),
                args: serde_json::json!({"command": "cargo test"}),
            },
        ];
        let text = searchable_text(&parts);
        assert!(
            text.contains("Running the tests.")
                && text.contains("bash")
                && text.contains("cargo test")
        );
        assert_eq!(session_token("a").len(), 17);
        assert_ne!(session_token("a"), session_token("b"));
    }
}
