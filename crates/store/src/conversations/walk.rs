//! Where in a session's tree of messages a call stands: the longest prefix of its messages'
//! fingerprints the tree holds, read from the indexes alone.

use super::super::Result;
use super::super::path::Branch;
use super::super::rows::SessionRow;
use rusqlite::{Connection, OptionalExtension, params};

/// The newest child of a node with a given fingerprint. The index by parent is named: left to
/// itself the planner walks the whole session backwards by seq for the ORDER BY, and a
/// 50,000-message resend took minutes of the writer's time.
pub(super) const CHILD_BY_HASH: &str = "SELECT seq FROM messages INDEXED BY messages_by_parent
     WHERE session_id = ?1 AND parent_seq IS ?2 AND hash = ?3 ORDER BY seq DESC LIMIT 1";

/// The fingerprints of a run of a branch, read from the index alone.
pub(super) const HASHES_ALONG: &str =
    "SELECT seq, hash FROM messages INDEXED BY messages_hash_by_seq
     WHERE session_id = ?1 AND hash IS NOT NULL AND seq BETWEEN ?2 AND ?3 ORDER BY seq";

/// How many of a call's messages a session's tree holds (a prefix), and the node the prefix
/// ends at (`None`: not even the first).
pub(super) type Walked = (usize, Option<u64>);

/// The longest prefix of `hashes` the session's tree holds, and the node it ends at.
///
/// A node has at most one child of a fingerprint (a call's messages are stored only past the
/// point where it stops matching, an answer only when no child of its parent is like it), so
/// the prefix is one path down the tree. Most calls follow the session's current branch: its
/// fingerprints are read in one pass (a step down the tree is a lookup of its own, and a client
/// resending 10,000 messages held the writer, and every other client's append, 100 ms), and
/// the walk goes on a step at a time only from where the call leaves the branch.
pub(super) fn walk(conn: &Connection, session: &SessionRow, hashes: &[i64]) -> Result<Walked> {
    let id = session.id.as_str();
    let (along, node) = along_branch(conn, id, &Branch::current(conn, session)?, hashes)?;
    let (further, node) = walk_from(conn, id, node, &hashes[along..])?;
    Ok((along + further, node))
}

/// How many of `hashes` the branch's messages start with, and the last of them.
fn along_branch(
    conn: &Connection,
    id: &str,
    branch: &Branch,
    hashes: &[i64],
) -> Result<(usize, Option<u64>)> {
    let mut run = conn.prepare_cached(HASHES_ALONG)?;
    let (mut matched, mut node) = (0, None);
    for &(first, last) in branch.runs() {
        let mut rows = run.query(params![id, first, last])?;
        let mut expected = first;
        while let Some(row) = rows.next()? {
            let (seq, stored): (u64, i64) = (row.get(0)?, row.get(1)?);
            // A message without a fingerprint (not proxied) is not in the index: the branch
            // stops matching there.
            match hashes.get(matched) {
                Some(&hash) if seq == expected && stored == hash => node = Some(seq),
                _ => return Ok((matched, node)),
            }
            matched += 1;
            expected += 1;
        }
        if expected <= last {
            return Ok((matched, node));
        }
    }
    Ok((matched, node))
}

/// The same, from below `start` (`None`: from the roots).
pub(super) fn walk_from(
    conn: &Connection,
    id: &str,
    start: Option<u64>,
    hashes: &[i64],
) -> Result<Walked> {
    let mut child = conn.prepare_cached(CHILD_BY_HASH)?;
    let mut node: Option<u64> = start;
    for (k, hash) in hashes.iter().enumerate() {
        match child
            .query_row(params![id, node, hash], |r| r.get(0))
            .optional()?
        {
            Some(seq) => node = Some(seq),
            None => return Ok((k, node)),
        }
    }
    Ok((hashes.len(), node))
}
