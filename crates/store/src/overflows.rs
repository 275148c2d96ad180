//! A model's refusal of a context as longer than its window, recorded on the session: what
//! the model counted stands as the session's reported usage (so its context is compacted
//! before the call goes again), a window it named under the session's limit becomes the
//! limit, and a completion it says the client asked room for is kept free beside the prompt. The proxy reads the refusal from the upstream's answer itself; an agent on the
//! socket API passes its model's answer on (`POST /session/{id}/overflow`).

use super::rows::{ContextVersion, SessionRow};
use super::sessions::{NOW, get_live};
use super::{Result, Store, StoreError};
use compactd_core::Overflow;
use compactd_core::SessionId;
use rusqlite::params;

/// A session's `limit_source` when a refusal of the upstream's taught its window.
pub(super) const LIMIT_FROM_REFUSAL: &str = "upstream refusal";

/// Which context the refused call was sent with: a refusal of a context the session no
/// longer serves (a compaction of it landed meanwhile) changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentContext {
    /// A proxied call: the context exactly (its compactions and maskings) and the last
    /// message of the call (its branch: the count is that branch's, even when another
    /// branch's call moved the session since).
    Proxied(ContextVersion, u64),
    /// An agent on the socket API: the `compaction_num` of the context it was sent, as its
    /// usage reports name it. The session must be one the socket API writes.
    Served(u32),
}

impl Store {
    /// Records that the model refused the context `sent` as longer than its window: the
    /// prompt's tokens as the model counted them (past the window when it gave no count) stand
    /// as the session's reported usage, so its context is compacted before the call goes
    /// again, and a window under the session's limit that `fits` becomes the session's limit:
    /// the one the model named, else the count it refused (the window is under it), else (the
    /// Responses API's refusal names neither) the session's own count of what was sent, when
    /// the model's reports measure it. A completion the refusal says the client asked room for
    /// becomes the session's ([`SessionRow::completion_tokens`]), so the context is compacted
    /// to leave it free. When the current step's room (`step_budget` of the session) changes
    /// with the window or with the model's count, the step is shortened again for it: a step
    /// shortened for the old window, never compacted, would be refused again as it was (an
    /// output shortened for 128,000 held the context at 24,467 tokens of 16,000). Returns
    /// the session as it is now when it changed; nothing changes when the refused call's
    /// branch was compacted since.
    pub async fn note_overflow(
        &self,
        id: &SessionId,
        sent: SentContext,
        overflow: Overflow,
        fits: impl Fn(usize) -> bool + Send + 'static,
        step_budget: impl Fn(&SessionRow) -> usize + Send + 'static,
    ) -> Result<Option<SessionRow>> {
        let id = id.to_string();
        self.write(move |conn| {
            let mut session = get_live(conn, &id)?;
            if let SentContext::Proxied(_, head) = sent {
                // Another branch's call may have moved the session since (a no-op otherwise).
                session = super::counters::switch_to(conn, &session, head)?;
            }
            let still_served = match sent {
                // A compaction of another branch, or a masking (which only shrinks what was
                // counted), leaves the refused count standing: dropped, the call went again
                // as it was and its second refusal reached the client.
                SentContext::Proxied(version, _) => {
                    !version.compacted_since(session.context_version())
                }
                SentContext::Served(_) if session.owner.is_some() => {
                    return Err(StoreError::Conflict(format!(
                        "session `{id}` is a conversation the proxy records for an API key; the proxy reads its model's refusals itself"
                    )));
                }
                SentContext::Served(num) => session.compaction_count == num,
            };
            if !still_served {
                return Ok(None);
            }
            let learned = overflow
                .window_under(session.context_limit)
                .or_else(|| session.report_rate().map(|_| session.context_tokens().0))
                .filter(|limit| fits(*limit));
            let limit = learned.map_or(session.context_limit, |l| l.min(session.context_limit));
            let tokens = overflow.tokens.unwrap_or(limit + 1);
            let room_before = step_budget(&session);
            let reported = SessionRow {
                reported_tokens: Some(tokens),
                tokens_since_report: 0,
                ..session
            };
            conn.prepare_cached(&format!(
                "UPDATE sessions SET reported_tokens = ?2, tokens_since_report = 0,
                     limit_source = CASE WHEN ?3 < context_limit THEN '{LIMIT_FROM_REFUSAL}' ELSE limit_source END,
                     limit_taught_at = CASE WHEN ?3 < context_limit THEN {NOW} ELSE limit_taught_at END,
                     context_limit = ?3, token_rate = ?4,
                     completion_tokens = coalesce(?5, completion_tokens), updated_at = {NOW}
                 WHERE id = ?1"
            ))?
            .execute(params![
                id,
                tokens as i64,
                limit as i64,
                reported.report_rate(),
                overflow.completion.map(|c| c as i64)
            ])?;
            let noted = get_live(conn, &id)?;
            let room = step_budget(&noted);
            if room == room_before {
                return Ok(Some(noted));
            }
            super::shortened::reshorten_active(conn, &noted, room).map(Some)
        })
        .await
    }
}
