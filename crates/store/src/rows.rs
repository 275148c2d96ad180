//! What the store returns: rows of the tables, typed.

use super::Result;
use crate::compaction::{CompactionResult, Trigger};
use crate::message::Role;
use compactd_core::{SessionId, SessionKind, StoredMessage, TokenSource};
use rusqlite::Row;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// A session and its counters.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRow {
    pub id: SessionId,
    pub model: Option<String>,
    pub context_limit: usize,
    pub overrides: Value,
    pub created_at: String,
    pub updated_at: String,
    pub message_count: u64,
    pub active_from_seq: u64,
    pub active_messages: usize,
    pub active_tokens: usize,
    pub summary_tokens: usize,
    pub compaction_count: u32,
    pub reported_tokens: Option<usize>,
    pub tokens_since_report: usize,
    pub turn_start_seq: u64,
    pub turn_attempts: u32,
    /// Tokens of the pinned messages (system messages and the task).
    pub pinned_tokens: usize,
    /// The seq of the session's first user instruction, once there is one.
    pub task_seq: Option<u64>,
    /// Tool outputs of active messages below this seq are masked in the context.
    pub masked_through_seq: u64,
    /// For sessions the proxy made: a hash of the API key that made them.
    pub owner: Option<String>,
    /// Tool calls of the newest assistant message.
    pub step_calls: usize,
    /// The newest message of the branch the counters describe.
    pub head_seq: u64,
    /// Messages that start a branch.
    pub branch_points: u64,
    /// The compaction the current branch's context starts from (0: none).
    pub summary_num: u32,
    pub kind: SessionKind,
    /// Proxy: the hash of the conversation header the client sent.
    pub conversation: Option<String>,
    /// Proxy: the fingerprint of the conversation's first message.
    pub root_hash: Option<i64>,
    /// Proxy: the fingerprint of its task.
    pub task_hash: Option<i64>,
    /// Proxy: the client's own prefix ends at this seq.
    pub static_seq: u64,
    /// Proxy: tokens of the last call's tools, system and instructions.
    pub overhead_tokens: usize,
    /// Why the context limit is what it is.
    pub limit_source: Option<String>,
    /// Model tokens per estimated token at the last believed usage report, kept when a
    /// compaction drops the report (see [`SessionRow::counted`]).
    pub token_rate: Option<f64>,
    /// The completion the client asks room for beside each prompt (the last proxied call's
    /// `max_tokens` that names one, or what a refusal said it asked), in the model's tokens;
    /// 0: none said.
    pub completion_tokens: usize,
    /// When a model's refusal taught `context_limit` (this session's, or the one it started
    /// from); `None` for a limit no refusal set.
    pub limit_taught_at: Option<String>,
}

/// Which context a usage report measured: a compaction of its branch or a masking since
/// makes the context another, and a report of the one before no longer counts it. The
/// summary the branch starts from, not the session's count of compactions: a compaction of
/// another branch leaves this one's context as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextVersion {
    summary_num: u32,
    masked_through_seq: u64,
}

impl ContextVersion {
    /// Whether the branch's context was compacted since `self` (so a model's count of that
    /// context no longer measures what the branch sends). A masking alone only shrinks it.
    pub fn compacted_since(&self, now: ContextVersion) -> bool {
        self.summary_num != now.summary_num
    }
}

impl SessionRow {
    /// The context this session's current branch serves now (see [`ContextVersion`]).
    pub fn context_version(&self) -> ContextVersion {
        ContextVersion {
            summary_num: self.summary_num,
            masked_through_seq: self.masked_through_seq,
        }
    }

    pub(super) const COLUMNS: &'static str = "id, model, context_limit, overrides, created_at, updated_at, \
        message_count, active_from_seq, active_messages, active_tokens, summary_tokens, compaction_count, \
        reported_tokens, tokens_since_report, turn_start_seq, turn_attempts, pinned_tokens, task_seq, \
        masked_through_seq, owner, step_calls, head_seq, branch_points, summary_num, kind, \
        conversation, root_hash, task_hash, static_seq, overhead_tokens, limit_source, token_rate, \
        completion_tokens, limit_taught_at";
    /// How many columns [`SessionRow::COLUMNS`] names (the index of a column selected after them).
    pub(super) const COUNT: usize = 34;

    pub(super) fn from_row(row: &Row) -> rusqlite::Result<SessionRow> {
        let overrides: String = row.get(3)?;
        Ok(SessionRow {
            id: SessionId::unchecked(row.get(0)?),
            model: row.get(1)?,
            context_limit: row.get(2)?,
            overrides: serde_json::from_str(&overrides)
                .unwrap_or(Value::Object(Default::default())),
            created_at: row.get(4)?,
            updated_at: row.get(5)?,
            message_count: row.get(6)?,
            active_from_seq: row.get(7)?,
            active_messages: row.get(8)?,
            active_tokens: row.get(9)?,
            summary_tokens: row.get(10)?,
            compaction_count: row.get(11)?,
            reported_tokens: row.get(12)?,
            tokens_since_report: row.get(13)?,
            turn_start_seq: row.get(14)?,
            turn_attempts: row.get(15)?,
            pinned_tokens: row.get(16)?,
            task_seq: row.get(17)?,
            masked_through_seq: row.get(18)?,
            owner: row.get(19)?,
            step_calls: row.get(20)?,
            head_seq: row.get(21)?,
            branch_points: row.get(22)?,
            summary_num: row.get(23)?,
            kind: SessionKind::parse(&row.get::<_, String>(24)?),
            conversation: row.get(25)?,
            root_hash: row.get(26)?,
            task_hash: row.get(27)?,
            static_seq: row.get(28)?,
            overhead_tokens: row.get(29)?,
            limit_source: row.get(30)?,
            token_rate: row.get(31)?,
            completion_tokens: row.get(32)?,
            limit_taught_at: row.get(33)?,
        })
    }

    /// The row of a session the proxy would start for a call, before anything of it is
    /// stored (a call the store cannot take: see `service::unrecorded`): its limit, owner and
    /// the client's overhead and completion, every counter at zero.
    pub fn unstored(
        new: &super::NewSession,
        overhead_tokens: usize,
        completion_tokens: usize,
    ) -> SessionRow {
        SessionRow {
            id: new.id.clone(),
            model: new.model.clone(),
            context_limit: new.context_limit,
            overrides: new.overrides.clone(),
            created_at: String::new(),
            updated_at: String::new(),
            message_count: 0,
            active_from_seq: 1,
            active_messages: 0,
            active_tokens: 0,
            summary_tokens: 0,
            compaction_count: 0,
            reported_tokens: None,
            tokens_since_report: 0,
            turn_start_seq: 0,
            turn_attempts: 0,
            pinned_tokens: 0,
            task_seq: None,
            masked_through_seq: 0,
            owner: new.owner.clone(),
            step_calls: 0,
            head_seq: 0,
            branch_points: 0,
            summary_num: 0,
            kind: SessionKind::Proxy,
            conversation: None,
            root_hash: None,
            task_hash: None,
            static_seq: 0,
            overhead_tokens,
            limit_source: new.limit_source.clone(),
            token_rate: None,
            completion_tokens,
            limit_taught_at: None,
        }
    }

    /// What every context of the session holds besides the summary and the active messages:
    /// its pinned messages and, for a proxied one, the tools and system its client sends.
    pub fn fixed_tokens(&self) -> usize {
        self.pinned_tokens + self.overhead_tokens
    }

    /// The tokens the session's context holds now, and where the figure comes from: the
    /// model's last report and the estimate of what came after it, unless that is under a
    /// third of the estimate of the whole context ([`IMPLAUSIBLE_REPORT_DIVISOR`]). What came
    /// after is counted at the rate the model counted what its report measured, against the
    /// estimate of the same messages: models count code at 1.2 to 2.0 times the estimate
    /// (docs/EVALUATION.md), and a large output appended after a report near the trigger
    /// would otherwise reach the model over its window with compactd counting it under.
    /// Without a report (a compaction drops it) the estimate counts at the rate the last one
    /// measured ([`SessionRow::counted`]).
    pub fn context_tokens(&self) -> (usize, TokenSource) {
        match self.believed_report() {
            Some((reported, rate)) => (
                reported + at_rate(self.tokens_since_report, rate),
                TokenSource::Reported,
            ),
            None => (
                self.counted(self.estimated_tokens()),
                TokenSource::Estimated,
            ),
        }
    }

    /// Tokens per estimated token the model counts (1 to [`MAX_REPORT_RATE`]): the rate of
    /// its last believed report, else the one kept from an earlier report ([`Self::token_rate`]:
    /// a compaction drops the report, not what it taught), else none known.
    pub fn report_rate(&self) -> Option<f64> {
        self.believed_report()
            .map(|(_, rate)| rate)
            .or(self.token_rate.map(|r| r.clamp(1.0, MAX_REPORT_RATE)))
    }

    /// What the model counts for `estimated` of compactd's tokens, at [`Self::report_rate`].
    pub fn counted(&self, estimated: usize) -> usize {
        at_rate(estimated, self.report_rate().unwrap_or(1.0))
    }

    /// The context limit in compactd's estimated tokens: the limit divided by the model's
    /// rate, rounded up to a quarter. A compaction plans the summary, the tail and the
    /// current step in estimated tokens; planned against the window itself, a summary of
    /// half the usable context took all of it for a model counting twice the estimate (the
    /// chatty replay at 16k: every context after a compaction over the window). Rounded,
    /// so a session's config (fitted to this limit) changes only when the rate moves a step.
    pub fn estimated_limit(&self) -> usize {
        let rate = self.report_rate().unwrap_or(1.0);
        // (2.5001 is 2.5: a report's rate is a ratio of two counts, a hair over a step as often.)
        let stepped = ((rate * RATE_STEPS - RATE_SLACK).ceil() / RATE_STEPS).max(1.0);
        (self.context_limit as f64 / stepped) as usize
    }

    /// The context's estimated tokens: pinned messages and overhead, the summary, the active
    /// messages as the context shows them.
    pub(crate) fn estimated_tokens(&self) -> usize {
        self.fixed_tokens() + self.summary_tokens + self.active_tokens
    }

    /// The last report and its rate, unless it is not believed.
    fn believed_report(&self) -> Option<(usize, f64)> {
        let estimated = self.estimated_tokens();
        let reported = self.reported_tokens?;
        if (reported + self.tokens_since_report) * IMPLAUSIBLE_REPORT_DIVISOR < estimated {
            return None;
        }
        // Appends only add to the estimate between a report and the next reset (a compaction,
        // a masking or a branch switch drops the report): what the report measured is the
        // estimate less what came after it.
        let measured = estimated.saturating_sub(self.tokens_since_report);
        Some((reported, report_rate(reported, measured)))
    }
}

/// The rate of a report of `reported` tokens for what compactd estimated at `measured`:
/// never under the estimate, at most [`MAX_REPORT_RATE`] times it.
fn report_rate(reported: usize, measured: usize) -> f64 {
    match measured {
        0 => 1.0,
        _ => (reported as f64 / measured as f64).clamp(1.0, MAX_REPORT_RATE),
    }
}

/// `estimated` tokens counted at `rate`, rounded up.
fn at_rate(estimated: usize, rate: f64) -> usize {
    (estimated as f64 * rate).ceil() as usize
}

/// [`SessionRow::estimated_limit`] divides by the rate in steps of a quarter, rounded up past
/// a twentieth of a step.
const RATE_STEPS: f64 = 4.0;
const RATE_SLACK: f64 = 0.05;

/// The most a report's rate scales what came after it: a tokenizer at one token a character
/// (text in scripts without spaces between words) counts four times the estimate.
const MAX_REPORT_RATE: f64 = 4.0;

/// A usage report under the estimate divided by this is not believed. The estimate counts
/// only text, at four characters a token, which real tokenizers meet or exceed (code, other
/// scripts, identifiers) but for long runs of one repeated character; a model server that
/// reports a handful of tokens for a long conversation (a constant, a zero, only the uncached
/// part) would otherwise switch compaction off and let the context overflow.
pub const IMPLAUSIBLE_REPORT_DIVISOR: usize = 3;

/// The tokens a message takes in the context, as SQL over a `messages` row: its masked form's
/// when its seq is below `through` (a SQL expression), else its shortened form's, else its own.
/// Every recount of a session's `active_tokens` uses it, so the counter always agrees with
/// what the context holds.
pub(super) fn shown_tokens(through: &str) -> String {
    format!(
        "CASE WHEN {} THEN masked_tokens ELSE coalesce(shortened_tokens, tokens) END",
        shown_masked(through)
    )
}

/// Whether a `messages` row shows masked in the context: it has a masked form and its seq is
/// below `through` (a SQL expression).
fn shown_masked(through: &str) -> String {
    format!("seq < {through} AND masked_parts IS NOT NULL")
}

/// The columns of a message as stored.
pub(super) const MESSAGE_COLUMNS: &str = "seq, role, parts, tokens, created_at, pinned, 0, 0, \
    CASE WHEN seq > 1 AND parent_seq IS NOT seq - 1 THEN coalesce(parent_seq, 0) END";

/// The columns of a message as a context counts it (masked below `?2`, else shortened
/// when too large, else whole, by [`shown_tokens`]); its parts as the context shows them
/// with `shown_parts`, else whole (what a compaction summarizes).
pub(super) fn message_context_columns(shown_parts: bool) -> String {
    let masked = shown_masked("?2");
    let parts = match shown_parts {
        true => format!(
            "CASE WHEN {masked} THEN masked_parts ELSE coalesce(shortened_parts, parts) END"
        ),
        false => "parts".to_string(),
    };
    format!(
        "seq, role, {parts}, {tokens}, created_at, pinned, {masked}, \
         shortened_parts IS NOT NULL AND NOT ({masked}), NULL",
        tokens = shown_tokens("?2")
    )
}

/// A `messages` row read with [`MESSAGE_COLUMNS`] or [`message_context_columns`].
pub(super) fn message_from_row(row: &Row) -> rusqlite::Result<StoredMessage> {
    let role: String = row.get(1)?;
    let parts: String = row.get(2)?;
    Ok(StoredMessage {
        seq: row.get(0)?,
        role: Role::parse(&role).unwrap_or(Role::User),
        parts: RawValue::from_string(parts).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
        })?,
        tokens: row.get(3)?,
        created_at: row.get(4)?,
        pinned: row.get(5)?,
        masked: row.get(6)?,
        shortened: row.get(7)?,
        branches_from: row.get(8)?,
    })
}

/// A successful compaction.
#[derive(Debug, Clone)]
pub struct CompactionRow {
    pub result: CompactionResult,
    pub session_id: SessionId,
    pub trigger: Trigger,
    pub focus: Option<String>,
    pub first_seq: u64,
    pub boundary_seq: u64,
    pub summarizer: String,
    pub chunks: u32,
    pub fallback_reason: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

impl CompactionRow {
    pub(super) const COLUMNS: &'static str = "num, trigger, focus, summary, read_files, modified_files, \
        pre_tokens, post_tokens, first_seq, boundary_seq, summarizer, chunks, fallback_reason, \
        started_at, finished_at, duration_ms, session_id, created_files, deleted_files";

    pub(super) fn from_row(row: &Row) -> rusqlite::Result<CompactionRow> {
        let list = |i: usize| -> rusqlite::Result<Vec<String>> {
            let text: String = row.get(i)?;
            Ok(serde_json::from_str(&text).unwrap_or_default())
        };
        Ok(CompactionRow {
            result: CompactionResult {
                compaction_num: row.get(0)?,
                summary: row.get(3)?,
                read_files: list(4)?,
                modified_files: list(5)?,
                created_files: list(17)?,
                deleted_files: list(18)?,
                pre_tokens: row.get(6)?,
                post_tokens: row.get(7)?,
            },
            trigger: trigger_of(&row.get::<_, String>(1)?),
            focus: row.get(2)?,
            first_seq: row.get(8)?,
            boundary_seq: row.get(9)?,
            summarizer: row.get(10)?,
            chunks: row.get(11)?,
            fallback_reason: row.get(12)?,
            started_at: row.get(13)?,
            finished_at: row.get(14)?,
            duration_ms: row.get(15)?,
            session_id: SessionId::unchecked(row.get(16)?),
        })
    }
}

impl CompactionRow {
    /// About how many bytes the row takes in an answer: its summary and file lists.
    pub fn size(&self) -> usize {
        let r = &self.result;
        r.summary.len()
            + [
                &r.read_files,
                &r.modified_files,
                &r.created_files,
                &r.deleted_files,
            ]
            .iter()
            .flat_map(|l| l.iter())
            .map(|p| p.len() + 3)
            .sum::<usize>()
    }
}

/// A failed compaction attempt.
#[derive(Debug, Clone)]
pub struct FailureRow {
    /// Its id, for paging.
    pub id: u64,
    pub trigger: Trigger,
    pub focus: Option<String>,
    pub summarizer: String,
    pub reason: String,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

impl FailureRow {
    pub(super) const COLUMNS: &'static str =
        "trigger, focus, summarizer, reason, started_at, finished_at, duration_ms, id";

    pub(super) fn from_row(row: &Row) -> rusqlite::Result<FailureRow> {
        Ok(FailureRow {
            trigger: trigger_of(&row.get::<_, String>(0)?),
            focus: row.get(1)?,
            summarizer: row.get(2)?,
            reason: row.get(3)?,
            started_at: row.get(4)?,
            finished_at: row.get(5)?,
            duration_ms: row.get(6)?,
            id: row.get(7)?,
        })
    }
}

/// The latest compaction's summary: all a context needs of it.
#[derive(Debug, Clone)]
pub struct LatestSummary {
    pub compaction_num: u32,
    pub summary: String,
}

/// What a session's context is made of, read in one snapshot.
#[derive(Debug, Clone)]
pub struct ContextSnapshot {
    pub session: SessionRow,
    /// Pinned messages before the latest boundary: they come first.
    pub pinned: Vec<StoredMessage>,
    pub latest: Option<LatestSummary>,
    /// Messages from the latest boundary on.
    pub tail: Vec<StoredMessage>,
    /// The current branch (where each seq stands on it).
    pub branch: super::path::Branch,
}

/// A stored trigger name (written by [`Trigger::as_str`]); an unknown one reads as manual.
fn trigger_of(name: &str) -> Trigger {
    Trigger::parse(name).unwrap_or(Trigger::Manual)
}

/// A page of a session's rows of `table` (failures, maskings: tables keyed by `id`) with an
/// id above `after`, oldest first, at most `limit`; and whether more follow. Not found for a
/// missing or deleted session.
pub(super) async fn rows_after<R: Send + 'static>(
    store: &super::Store,
    table: &'static str,
    columns: &'static str,
    from_row: fn(&Row) -> rusqlite::Result<R>,
    (session_id, after, limit): (&str, u64, usize),
) -> Result<(Vec<R>, bool)> {
    let session_id = session_id.to_string();
    store
        .read(move |conn| {
            super::sessions::get_live(conn, &session_id)?;
            let sql = format!(
                "SELECT {columns} FROM {table} WHERE session_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3"
            );
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let fetch = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
            let mut rows = conn
                .prepare_cached(&sql)?
                .query_map(rusqlite::params![session_id, after, fetch], from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let more = rows.len() > limit;
            rows.truncate(limit);
            Ok((rows, more))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::report_rate;

    #[test]
    fn a_reports_rate_is_never_under_the_estimate_nor_over_four() {
        // 7,000 reported for 4,000 estimated: 1.75 a token.
        assert_eq!(report_rate(7_000, 4_000), 1.75);
        // A model counting less than the estimate does not shrink what follows.
        assert_eq!(report_rate(3_000, 4_000), 1.0);
        // Nor does a report of nonsense scale it past a token a character.
        assert_eq!(report_rate(1_000_000, 4_000), 4.0);
        assert_eq!(report_rate(7_000, 0), 1.0);
    }
}
