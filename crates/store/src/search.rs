//! Full-text search over a session's whole history (SQLite FTS5, `messages_fts` in
//! schema.sql): every message is indexed from its original parts (text, reasoning, tool calls
//! with their arguments, tool outputs), never from the masked or shortened forms a context
//! shows.
//!
//! Indexing is not part of an append's transaction: an FTS5 insert writes several pages per
//! commit, which made each single-client append ~70 µs (a third) slower, paid by the agent.
//! The writer indexes what is pending once it has been idle a moment (between agent steps),
//! within a commit batch once [`INDEX_LAG`] messages wait, and before every search (so a
//! search sees every acknowledged message); after a crash the rest is indexed at the next
//! idle moment. What waits is the newest messages, which the context shows anyway.
//!
//! The index is contentless (the text is stored once, in `messages.parts`); each row carries a
//! token of its session's id, so a search reads only that session's postings. A person's
//! query is never handed to FTS5 as syntax: each word is quoted, so `"`, `*`, `NEAR`, `-`
//! or a lone `(` search for themselves, and control characters (a NUL ends FTS5's string)
//! separate words, so no query string can fail.
//!
//! A search's cost is bounded by construction: at most [`MAX_QUERY_WORDS`] words, at most
//! [`MAX_SEARCHES`] at once (each holds a read connection on a blocking thread), and each hit
//! is described where it is read, one message at a time, so a search of megabyte outputs
//! never holds more than one of them.

use super::rows::SessionRow;
use super::sessions::get_live;
use super::{Result, Store};
use crate::message::Part;
use compactd_core::SessionId;
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// Messages waiting for the index past which a commit batch indexes them itself.
pub(super) const INDEX_LAG: i64 = 256;
/// Messages one indexing transaction takes at most (a large backlog goes in steps). A step
/// holds the writer, so every client's next write waits for it: steps of 2,000 messages of
/// ~450 B took 40-55 ms, and another agent's append waited as long while a proxied
/// conversation of 10,000 messages was indexed (`compactd bench`, append beside the proxy).
/// 500 such messages take about 10 ms.
pub(super) const INDEX_STEP: usize = 500;
/// Bytes of stored parts one indexing transaction takes at most (past the first message):
/// large tool outputs take as long to index per byte as small messages, and 500 of 60 KB
/// would hold the writer for most of a second.
const INDEX_STEP_BYTES: usize = 1 << 20;

/// Words of a query beyond this many are ignored (each adds a posting list to merge).
pub(crate) const MAX_QUERY_WORDS: usize = 32;
/// Searches running at once; more wait their turn, so searches never take every read
/// connection from the appends' and contexts' reads.
pub(super) const MAX_SEARCHES: usize = 2;

/// One message a search found.
#[derive(Debug, Clone)]
pub struct SearchHit {
    pub seq: u64,
    pub role: String,
    /// What the caller made of the message's parts as it was read (a snippet).
    pub description: String,
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
    use std::fmt::Write;
    let digest = Sha256::digest(id.as_bytes());
    digest[..8].iter().fold(String::from("s"), |mut token, b| {
        let _ = write!(token, "{b:02x}");
        token
    })
}

/// Indexes the message stored as row `rowid` of the session whose token is `session`.
fn index_message(conn: &Connection, rowid: i64, session: &str, parts: &[Part]) -> Result<()> {
    conn.prepare_cached("INSERT INTO messages_fts (rowid, session, text) VALUES (?1, ?2, ?3)")?
        .execute(params![rowid, session, searchable_text(parts)])?;
    Ok(())
}

/// Messages stored but not yet indexed (messages.id is increasing, and the index takes them
/// in that order, so they are the ones after the index's highest rowid).
pub(super) fn unindexed(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT (SELECT coalesce(max(id), 0) FROM messages)
                  - (SELECT coalesce(max(rowid), 0) FROM messages_fts)",
        )?
        .query_row([], |r| r.get(0))?)
}

/// What one step of indexing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexStep {
    pub indexed: usize,
    /// It stopped at a bound ([`INDEX_STEP`] messages or [`INDEX_STEP_BYTES`]): more may wait.
    pub more: bool,
}

/// Indexes the messages not yet indexed, oldest first: at most `max` of them and
/// [`INDEX_STEP_BYTES`] of their parts. Each is read, indexed and let go before the next, so a
/// step never holds more than one message's text.
pub(super) fn index_pending(conn: &Connection, max: usize) -> Result<IndexStep> {
    let mut select = conn.prepare_cached(
        "SELECT id, session_id, parts FROM messages
         WHERE id > (SELECT coalesce(max(rowid), 0) FROM messages_fts) ORDER BY id LIMIT ?1",
    )?;
    let mut rows = select.query([max])?;
    // A step's messages are mostly of a few sessions: each token is hashed once.
    let mut tokens: HashMap<String, String> = HashMap::new();
    let (mut indexed, mut bytes) = (0, 0);
    while let Some(row) = rows.next()? {
        if bytes >= INDEX_STEP_BYTES {
            return Ok(IndexStep {
                indexed,
                more: true,
            });
        }
        let (rowid, session, parts): (i64, String, String) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        bytes += parts.len();
        let parts: Vec<Part> = serde_json::from_str(&parts).unwrap_or_default();
        let token = tokens
            .entry(session)
            .or_insert_with_key(|s| session_token(s));
        index_message(conn, rowid, token, &parts)?;
        indexed += 1;
    }
    Ok(IndexStep {
        indexed,
        more: indexed == max,
    })
}

/// The words of a person's query, split at whitespace and control characters, each once:
/// words without a letter or digit are dropped (FTS5 would find nothing in them), and those
/// past [`MAX_QUERY_WORDS`].
pub fn query_words(query: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let split = query.split(|c: char| c.is_whitespace() || c.is_control());
    for word in split.filter(|w| w.chars().any(char::is_alphanumeric)) {
        if words.len() == MAX_QUERY_WORDS {
            break;
        }
        if !words.iter().any(|w| w == word) {
            words.push(word.to_string());
        }
    }
    words
}

/// A word as a quoted FTS5 string (inner quotes doubled).
fn quoted(word: &str) -> String {
    format!("\"{}\"", word.replace('"', "\"\""))
}

/// Matches of one stage scored at most: the newest this many. bm25 costs a few µs per match,
/// so a word in every message of a 100,000-message session would take most of a second to
/// rank whole; a message matching that broadly is no one's distinctive detail, and a rarer
/// one is found by an earlier, narrower stage.
pub(super) const MAX_SCORED: usize = 1_000;

/// A stage's best matches (?1 the FTS5 expression, ?2 the session, ?3 how many): its newest
/// ?4 ([`MAX_SCORED`]) matches ranked by bm25, each read by its rowid. `CROSS JOIN` keeps the
/// matches the outer loop (SQLite's documented way to fix a join's order): with a plain join
/// the bundled SQLite (3.54) chose to walk the session's every message by `(session_id, seq)`
/// and probe the matches for each, so a search of a 100,000-message session cost 7 ms more
/// than its matches, found or not (a word in no message: 7.2 ms against 0.08).
const SEARCH: &str = "SELECT m.seq, m.role, m.parts, found.rank FROM
         (SELECT rowid, bm25(messages_fts, 0.0, 1.0) AS rank FROM messages_fts
          WHERE messages_fts MATCH ?1 ORDER BY rowid DESC LIMIT ?4) AS found
     CROSS JOIN messages m ON m.id = found.rowid
     WHERE m.session_id = ?2
     ORDER BY found.rank, m.seq DESC LIMIT ?3";

/// The stages a search goes through, narrowest first, until it has enough: the words as one
/// phrase (a line quoted whole), then messages with every word, then with any of them.
fn stages(session_id: &str, words: &[String]) -> Vec<String> {
    let mut texts = vec![quoted(&words.join(" "))];
    if words.len() > 1 {
        let quoted: Vec<String> = words.iter().map(|w| quoted(w)).collect();
        texts.push(quoted.join(" AND "));
        texts.push(quoted.join(" OR "));
    }
    let session = session_token(session_id);
    texts
        .into_iter()
        .map(|text| format!("session : {session} AND text : ({text})"))
        .collect()
}

impl Store {
    /// The session's messages that best match `words` (from [`query_words`], not empty): those
    /// of the narrowest stage first (see [`stages`]), each stage's by bm25 and, among equals,
    /// newest first; at most `limit`, each described by `describe` as it is read (its parts
    /// let go before the next is read).
    pub async fn search(
        &self,
        session_id: &SessionId,
        words: Vec<String>,
        limit: usize,
        describe: impl Fn(&[Part]) -> String + Send + 'static,
    ) -> Result<(SessionRow, Vec<SearchHit>)> {
        let _turn = self
            .searches
            .acquire()
            .await
            .map_err(|_| super::StoreError::Closed)?;
        // Everything acknowledged is searchable.
        while self
            .write(|conn| index_pending(conn, INDEX_STEP))
            .await?
            .more
        {}
        let session_id = session_id.to_string();
        self.read(move |conn| {
            let session = get_live(conn, &session_id)?;
            let mut statement = conn.prepare_cached(SEARCH)?;
            let mut hits: Vec<SearchHit> = Vec::new();
            for expression in stages(&session_id, &words) {
                let params = params![expression, session_id, limit, MAX_SCORED];
                let mut rows = statement.query(params).map_err(unsearchable)?;
                while let Some(row) = rows.next().map_err(unsearchable)? {
                    let seq: u64 = row.get(0)?;
                    if hits.len() >= limit || hits.iter().any(|h| h.seq == seq) {
                        continue;
                    }
                    let parts: Vec<Part> =
                        serde_json::from_str(row.get_ref(2)?.as_str().unwrap_or_default())
                            .unwrap_or_default();
                    hits.push(SearchHit {
                        seq,
                        role: row.get(1)?,
                        description: describe(&parts),
                        score: -row.get::<_, f64>(3)?,
                    });
                }
                if hits.len() >= limit {
                    break;
                }
            }
            Ok((session, hits))
        })
        .await
    }
}

/// A query FTS5 refused is the query's fault, never the daemon's: [`query_words`] leaves
/// nothing FTS5 should refuse, so this is a last guard.
fn unsearchable(e: rusqlite::Error) -> super::StoreError {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(message)) if message.contains("fts5") => {
            super::StoreError::BadQuery(format!("the query cannot be searched: {message}"))
        }
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database of compactd's schema holding `sizes.len()` messages, each of parts of about
    /// that many bytes, none of them indexed yet.
    fn unindexed_messages(sizes: &[usize]) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        super::super::migrate::declare_writer(&conn).unwrap();
        conn.execute_batch(super::super::migrate::SCHEMA).unwrap();
        conn.execute(
            "INSERT INTO sessions (id, context_limit, created_at, updated_at) VALUES ('s', 1000, 'now', 'now')",
            [],
        )
        .unwrap();
        for (i, size) in sizes.iter().enumerate() {
            let parts = serde_json::json!([{"type": "text", "text": format!("word{i} {}", "x".repeat(*size))}]);
            conn.execute(
                "INSERT INTO messages (session_id, seq, role, parts, tokens, created_at) VALUES ('s', ?1, 'user', ?2, 1, 'now')",
                params![i as i64 + 1, parts.to_string()],
            )
            .unwrap();
        }
        conn
    }

    /// Indexing holds the writer (every client's next write waits), so a backlog goes in
    /// steps bounded by messages and by bytes; stepping on until a step says nothing more
    /// waits indexes every message.
    #[test]
    fn a_backlog_is_indexed_in_steps_bounded_by_messages_and_bytes() {
        let small = unindexed_messages(&[100; INDEX_STEP + 1]);
        let steps: Vec<IndexStep> =
            std::iter::repeat_with(|| index_pending(&small, INDEX_STEP).unwrap())
                .take(3)
                .collect();
        assert_eq!(
            steps[0],
            IndexStep {
                indexed: INDEX_STEP,
                more: true
            }
        );
        assert_eq!(
            steps[1],
            IndexStep {
                indexed: 1,
                more: false
            }
        );
        assert_eq!(unindexed(&small).unwrap(), 0);

        // Outputs of 300 KB: four make a step (the fourth passes the byte bound).
        let large = unindexed_messages(&[300_000; 10]);
        let mut sizes = Vec::new();
        loop {
            let step = index_pending(&large, INDEX_STEP).unwrap();
            sizes.push(step.indexed);
            if !step.more {
                break;
            }
        }
        assert_eq!(sizes, [4, 4, 2]);
        assert_eq!(unindexed(&large).unwrap(), 0);
        let found: i64 = large
            .query_row(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'text : word9'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 1);
    }

    /// A search reads its matches' messages by rowid, never the session's every message: its
    /// cost follows its matches (at most [`MAX_SCORED`] a stage), not the session's length.
    #[test]
    fn a_search_reads_only_its_matches_messages() {
        let plan =
            super::super::migrate::query_plan(SEARCH, params!["text : x", "s", 10, MAX_SCORED]);
        let at = |step: &str| plan.iter().position(|p| p.starts_with(step));
        let (scan, lookup) = (at("SCAN found"), at("SEARCH m USING INTEGER PRIMARY KEY"));
        assert!(
            scan.is_some() && scan < lookup && plan.iter().all(|p| !p.contains("session_id=")),
            "{plan:?}"
        );
    }

    /// Databases indexed by earlier builds hold these tokens: they never change.
    #[test]
    fn a_session_token_is_s_and_16_hex_digits_of_its_ids_sha256() {
        assert_eq!(session_token("demo"), "s2a97516c354b6884");
    }

    #[test]
    fn every_word_is_quoted_so_no_query_is_syntax() {
        let quoted_words = |q: &str| query_words(q).iter().map(|w| quoted(w)).collect::<Vec<_>>();
        assert_eq!(quoted_words("cargo test"), ["\"cargo\"", "\"test\""]);
        assert_eq!(
            quoted_words("say \"hi\" NEAR(x) -- *"),
            ["\"say\"", "\"\"\"hi\"\"\"", "\"NEAR(x)\""]
        );
        assert!(query_words("  \" ( ) * ").is_empty());
        assert_eq!(query_words("a\0b c\u{1}d a"), ["a", "b", "c", "d"]);
        let many: String = (0..100).map(|i| format!("w{i} w{i} ")).collect();
        assert_eq!(query_words(&many).len(), MAX_QUERY_WORDS);
    }

    /// Whatever a person types, FTS5 takes every stage of the search: a NUL ended its quoted
    /// string ("unterminated string", a 500).
    #[test]
    fn no_query_fails_in_the_index() {
        let conn = unindexed_messages(&[10]);
        index_pending(&conn, 10).unwrap();
        for query in ["a\0b", "\"\0", "x\u{1}\"y", "(\0)", "NEAR(\0 a)"] {
            for expression in stages("s", &query_words(query)) {
                conn.query_row(
                    "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
                    [&expression],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap_or_else(|e| panic!("{query:?} -> {expression}: {e}"));
            }
        }
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
