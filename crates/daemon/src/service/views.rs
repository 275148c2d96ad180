//! How the service builds its answers from what the store read (the types are the API's,
//! `compactd-api`): conversions at the boundary, so a change of table is not one of the API.

use crate::compaction::{CompactionConfig, summary_message};
use crate::protocol::{
    AppendResponse, BreakerView, Compaction, CompactionFailure, CompactionHistory,
    CompactionStatus, ContextFormat, ContextMessage, ContextView, HistoryMessage, HistoryPage,
    Masking, ProviderContext, SessionView, StoredMessage,
};
use crate::store::{
    AppendOutcome, CompactionRow, ContextSnapshot, FailureRow, MaskingRow, SessionRow,
};

/// A compaction as the API shows it.
pub(super) fn compaction(row: CompactionRow) -> Compaction {
    Compaction {
        result: row.result,
        session_id: row.session_id,
        trigger: row.trigger,
        focus: row.focus,
        first_seq: row.first_seq,
        boundary_seq: row.boundary_seq,
        summarizer: row.summarizer,
        chunks: row.chunks,
        fallback_reason: row.fallback_reason,
        started_at: row.started_at,
        finished_at: row.finished_at,
        duration_ms: row.duration_ms,
    }
}

/// A failed attempt as the API shows it.
fn failure(row: FailureRow) -> CompactionFailure {
    CompactionFailure {
        id: row.id,
        trigger: row.trigger,
        focus: row.focus,
        summarizer: row.summarizer,
        reason: row.reason,
        started_at: row.started_at,
        finished_at: row.finished_at,
        duration_ms: row.duration_ms,
    }
}

/// A masking as the API shows it.
fn masking(row: MaskingRow) -> Masking {
    Masking {
        id: row.id,
        through_seq: row.through_seq,
        outputs: row.outputs,
        pre_tokens: row.pre_tokens,
        post_tokens: row.post_tokens,
        created_at: row.created_at,
    }
}

/// A session as the API shows it.
pub(crate) fn session_view(
    session: SessionRow,
    config: &CompactionConfig,
    compacting: bool,
) -> SessionView {
    let (tokens, token_source) = session.context_tokens();
    let report_rate = session.report_rate().map(|r| (r * 100.0).round() / 100.0);
    SessionView {
        report_rate,
        token_threshold: config.token_threshold(session.context_limit),
        max_messages: config.max_messages,
        breaker: BreakerView {
            attempts: session.turn_attempts,
            threshold: config.breaker_threshold,
            open: session.turn_attempts >= config.breaker_threshold,
        },
        compacting,
        tokens,
        token_source,
        id: session.id,
        model: session.model,
        context_limit: session.context_limit,
        config: session.overrides,
        created_at: session.created_at,
        updated_at: session.updated_at,
        message_count: session.message_count,
        active_messages: session.active_messages,
        compaction_count: session.compaction_count,
        kind: session.kind,
        branches: session.branch_points.max(1),
        limit_source: session.limit_source,
        overhead_tokens: session.overhead_tokens,
        completion_tokens: session.completion_tokens,
        limit_taught_at: session.limit_taught_at,
        unpinned_system_tokens: 0,
    }
}

/// The answer to an append.
pub(crate) fn append_response(
    outcome: AppendOutcome,
    compaction: Option<CompactionStatus>,
) -> AppendResponse {
    let (tokens, token_source) = outcome.session.context_tokens();
    AppendResponse {
        session_id: outcome.session.id,
        first_seq: outcome.first_seq,
        last_seq: outcome.last_seq,
        message_count: outcome.session.message_count,
        tokens,
        token_source,
        created: outcome.created,
        replayed: outcome.replayed,
        compaction,
    }
}

/// A page of history.
pub(crate) fn history_page(session: &SessionRow, messages: Vec<StoredMessage>) -> HistoryPage {
    let next_after = messages
        .last()
        .map(|m| m.seq)
        .filter(|&seq| seq < session.message_count);
    HistoryPage {
        messages: messages
            .into_iter()
            .map(|m| HistoryMessage {
                compacted: m.seq < session.active_from_seq && !m.pinned,
                seq: m.seq,
                role: m.role,
                parts: m.parts,
                tokens: m.tokens,
                created_at: m.created_at,
                pinned: m.pinned,
                branches_from: m.branches_from,
            })
            .collect(),
        next_after,
    }
}

/// A page of compaction history, from the pages as read; `failures` and `maskings` say
/// whether more follow theirs.
pub(crate) fn compaction_history(
    session: &SessionRow,
    compactions: Vec<CompactionRow>,
    (failures, more_failures): (Vec<FailureRow>, bool),
    (maskings, more_maskings): (Vec<MaskingRow>, bool),
) -> CompactionHistory {
    let next_after = compactions
        .last()
        .map(|c| c.result.compaction_num)
        .filter(|&num| num < session.compaction_count);
    CompactionHistory {
        compactions: compactions.into_iter().map(compaction).collect(),
        next_after,
        failures_next_after: failures.last().map(|f| f.id).filter(|_| more_failures),
        failures: failures.into_iter().map(failure).collect(),
        maskings_next_after: maskings.last().map(|m| m.id).filter(|_| more_maskings),
        maskings: maskings.into_iter().map(masking).collect(),
    }
}

/// The context of `snapshot`.
pub(crate) fn context_view(snapshot: ContextSnapshot) -> ContextView {
    context_view_recalling(snapshot, true)
}

/// The context of `snapshot`; with `recall`, its summary says how to read back what it
/// leaves out (not for a session nothing is stored of).
pub(crate) fn context_view_recalling(snapshot: ContextSnapshot, recall: bool) -> ContextView {
    let mut messages = Vec::with_capacity(snapshot.pinned.len() + 1 + snapshot.tail.len());
    // Estimates were stored at append, and the summary message's with the compaction.
    let mut tokens = snapshot.session.pinned_tokens + snapshot.session.summary_tokens;
    messages.extend(snapshot.pinned.into_iter().map(ContextMessage::Stored));
    if let Some(latest) = &snapshot.latest {
        let session = if recall {
            snapshot.session.id.as_str()
        } else {
            ""
        };
        let message = summary_message(&latest.summary, session);
        messages.push(ContextMessage::Summary {
            role: message.role,
            parts: message.parts,
            summary: true,
            compaction_num: latest.compaction_num,
        });
    }
    // Pinned messages of the tail are in `pinned_tokens` already.
    tokens += snapshot
        .tail
        .iter()
        .filter(|m| !m.pinned)
        .map(|m| m.tokens)
        .sum::<usize>();
    messages.extend(snapshot.tail.into_iter().map(ContextMessage::Stored));
    tokens += super::answered::answer_orphans(&mut messages) * super::answered::NOTE_TOKENS;
    ContextView {
        session_id: snapshot.session.id,
        messages,
        tokens,
        context_limit: snapshot.session.context_limit,
        compaction_num: snapshot.session.compaction_count,
    }
}

/// `view` in `format` (not [`ContextFormat::Compactd`], which is `view` itself).
pub(crate) fn provider_context(view: &ContextView, format: ContextFormat) -> ProviderContext {
    let messages = view.to_messages();
    let (system, messages) = match format {
        ContextFormat::Anthropic => {
            let c = crate::provider::anthropic::conversation(&messages);
            (c.system, c.messages)
        }
        _ => (None, crate::provider::chat::messages(&messages)),
    };
    ProviderContext {
        session_id: view.session_id.clone(),
        format,
        system,
        messages,
        tokens: view.tokens,
        context_limit: view.context_limit,
        compaction_num: view.compaction_num,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::{CompactionResult, Trigger};
    use compactd_core::SessionId;
    use serde_json::json;

    /// Every column of a stored compaction reaches the API under its documented name: the
    /// conversion is written field by field, where a swapped or dropped field would compile.
    #[test]
    fn a_compaction_row_reaches_the_api_field_for_field() {
        let row = CompactionRow {
            result: CompactionResult {
                compaction_num: 4,
                summary: "the summary".into(),
                read_files: vec!["read.rs".into()],
                modified_files: vec!["modified.rs".into()],
                created_files: vec!["created.rs".into()],
                deleted_files: vec!["deleted.rs".into()],
                pre_tokens: 9_000,
                post_tokens: 1_200,
            },
            session_id: SessionId::unchecked("s1".into()),
            trigger: Trigger::Tokens,
            focus: Some("the tests".into()),
            first_seq: 3,
            boundary_seq: 41,
            summarizer: "extractive".into(),
            chunks: 2,
            fallback_reason: Some("model timed out".into()),
            started_at: "2026-12-08T01:00:00Z".into(),
            finished_at: "2026-12-08T01:00:02Z".into(),
            duration_ms: 2_000,
        };
        let shown = serde_json::to_value(compaction(row)).unwrap();
        assert_eq!(
            shown,
            json!({
                "compaction_num": 4, "summary": "the summary",
                "read_files": ["read.rs"], "modified_files": ["modified.rs"],
                "created_files": ["created.rs"], "deleted_files": ["deleted.rs"],
                "pre_tokens": 9_000, "post_tokens": 1_200,
                "session_id": "s1", "trigger": "tokens", "focus": "the tests",
                "first_seq": 3, "boundary_seq": 41, "summarizer": "extractive", "chunks": 2,
                "fallback_reason": "model timed out",
                "started_at": "2026-12-08T01:00:00Z", "finished_at": "2026-12-08T01:00:02Z",
                "duration_ms": 2_000
            })
        );
    }

    /// The same for a failed attempt and a masking, which the history pages carry.
    #[test]
    fn failures_and_maskings_reach_the_api_field_for_field() {
        let failure = failure(FailureRow {
            id: 7,
            trigger: Trigger::Manual,
            focus: None,
            summarizer: "openai".into(),
            reason: "HTTP 500".into(),
            started_at: "a".into(),
            finished_at: "b".into(),
            duration_ms: 30,
        });
        assert_eq!(
            serde_json::to_value(failure).unwrap(),
            json!({"id": 7, "trigger": "manual", "focus": null, "summarizer": "openai",
                   "reason": "HTTP 500", "started_at": "a", "finished_at": "b", "duration_ms": 30})
        );
        let masking = masking(MaskingRow {
            id: 2,
            through_seq: 60,
            outputs: 5,
            pre_tokens: 12_000,
            post_tokens: 4_000,
            created_at: "c".into(),
        });
        assert_eq!(
            serde_json::to_value(masking).unwrap(),
            json!({"id": 2, "through_seq": 60, "outputs": 5, "pre_tokens": 12_000,
                   "post_tokens": 4_000, "created_at": "c"})
        );
    }
}
