//! A session's current branch: the messages from its first to `head_seq`, following
//! `parent_seq`.
//!
//! Sessions made through the socket API are one line (each message's parent is the one before
//! it), and their branch is simply seqs `1..=head_seq`. A conversation the proxy records is a
//! tree: a client that edits or rewrites its history starts a branch where it changed, sharing
//! everything before. A branch is then a few runs of consecutive seqs, one per place it
//! branched off; the messages that start a run (their parent is not the seq before them) are
//! few and indexed (`messages_branch_points`), so a branch is found in as many lookups as it has
//! branch points, whatever its length. Every read of a session's active messages goes through
//! [`Branch::filter`], and every per-branch counter is recounted over it.

use super::Result;
use super::rows::SessionRow;
use rusqlite::{Connection, OptionalExtension, params};

/// Runs of consecutive seqs, oldest first, that make a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    runs: Vec<(u64, u64)>,
    /// The session never branched: the filter is no filter at all.
    linear: bool,
}

impl Branch {
    /// The branch ending at `head` (the session's current one when `head` is its `head_seq`).
    pub(super) fn to(conn: &Connection, session: &SessionRow, head: u64) -> Result<Branch> {
        if session.branch_points == 0 {
            return Ok(Branch {
                runs: if head > 0 { vec![(1, head)] } else { vec![] },
                linear: head == session.message_count,
            });
        }
        let mut find = conn.prepare_cached(
            "SELECT seq, parent_seq FROM messages
             WHERE session_id = ?1 AND seq <= ?2 AND parent_seq IS NOT seq - 1
             ORDER BY seq DESC LIMIT 1",
        )?;
        let mut runs = Vec::new();
        let mut end = head;
        while end > 0 {
            let start: Option<(u64, Option<u64>)> = find
                .query_row(params![session.id.as_str(), end], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            match start {
                Some((start, parent)) => {
                    runs.push((start, end));
                    end = parent.unwrap_or(0);
                }
                None => {
                    runs.push((1, end));
                    end = 0;
                }
            }
        }
        runs.reverse();
        Ok(Branch {
            runs,
            linear: false,
        })
    }

    /// The session's current branch.
    pub(super) fn current(conn: &Connection, session: &SessionRow) -> Result<Branch> {
        Branch::to(conn, session, session.head_seq)
    }

    /// The branch of a session nothing is stored of yet.
    pub fn empty() -> Branch {
        Branch {
            runs: Vec::new(),
            linear: false,
        }
    }

    /// The branch, then `count` messages numbered from `first` (after every stored one): a
    /// call's messages the store could not take, in a context computed in memory.
    pub fn followed_by(&self, first: u64, count: usize) -> Branch {
        let mut runs = self.runs.clone();
        if count > 0 {
            runs.push((first, first + count as u64 - 1));
        }
        Branch {
            runs,
            linear: false,
        }
    }

    /// A SQL condition on `seq` that holds for the branch's messages: `1` for a session
    /// that never branched (every message is on it), else the runs as literal ranges (numbers
    /// only, so nothing from outside enters the SQL).
    pub(super) fn filter(&self) -> String {
        if self.linear {
            return "1".into();
        }
        if self.runs.is_empty() {
            return "0".into();
        }
        let ranges: Vec<String> = self
            .runs
            .iter()
            .map(|(a, b)| format!("seq BETWEEN {a} AND {b}"))
            .collect();
        format!("({})", ranges.join(" OR "))
    }

    /// The runs of consecutive seqs, oldest first.
    pub(super) fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    pub(super) fn contains(&self, seq: u64) -> bool {
        self.runs.iter().any(|&(a, b)| (a..=b).contains(&seq))
    }

    /// Where `seq` stands on the branch (0 for its first message).
    pub fn position(&self, seq: u64) -> Option<usize> {
        let mut before = 0;
        for &(a, b) in &self.runs {
            if (a..=b).contains(&seq) {
                return Some(before + (seq - a) as usize);
            }
            before += (b - a + 1) as usize;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_filters_follow_the_runs() {
        let b = Branch {
            runs: vec![(1, 3), (7, 8), (12, 12)],
            linear: false,
        };
        assert_eq!(b.position(1), Some(0));
        assert_eq!(b.position(7), Some(3));
        assert_eq!(b.position(12), Some(5));
        assert_eq!(b.position(5), None);
        assert!(b.contains(8) && !b.contains(9));
        assert_eq!(
            b.filter(),
            "(seq BETWEEN 1 AND 3 OR seq BETWEEN 7 AND 8 OR seq BETWEEN 12 AND 12)"
        );
    }

    /// A call's messages the store could not take stand after the branch's, numbered after
    /// every stored message: each found at its place in the call.
    #[test]
    fn messages_after_the_branch_stand_at_their_places_in_the_call() {
        let b = Branch {
            runs: vec![(1, 3), (7, 8)],
            linear: true,
        };
        let after = b.followed_by(13, 2);
        assert_eq!(after.position(8), Some(4));
        assert_eq!(after.position(13), Some(5));
        assert_eq!(after.position(14), Some(6));
        assert_eq!(after.position(15), None);
        assert_eq!(
            b.followed_by(13, 0),
            Branch {
                linear: false,
                ..b.clone()
            }
        );
        assert_eq!(Branch::empty().followed_by(1, 3).position(3), Some(2));
    }
}
