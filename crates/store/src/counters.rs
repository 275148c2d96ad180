//! A session's counters, which describe its current branch: recounted from the messages
//! after a compaction, a masking or a reshortening, and computed afresh when a proxied
//! conversation moves to another branch (its client resent an earlier request, or changed
//! something in the middle of what it sends).

use super::Result;
use super::path::Branch;
use super::rows::{SessionRow, shown_tokens};
use super::sessions::NOW;
use rusqlite::{Connection, OptionalExtension, params};

/// Recounts the active messages and their tokens (as the context shows them) over the
/// session's current branch; returns the session after it.
pub(super) fn recount_active(conn: &Connection, session: &SessionRow) -> Result<SessionRow> {
    let branch = Branch::current(conn, session)?;
    let filter = branch.filter();
    Ok(conn
        .prepare_cached(&format!(
            "UPDATE sessions SET
                 active_messages = (SELECT count(*) FROM messages
                                    WHERE session_id = ?1 AND seq >= sessions.active_from_seq AND {filter}),
                 active_tokens = (SELECT coalesce(sum({shown}), 0) FROM messages
                                  WHERE session_id = ?1 AND seq >= sessions.active_from_seq AND pinned = 0 AND {filter}),
                 updated_at = {NOW}
             WHERE id = ?1 RETURNING {}",
            SessionRow::COLUMNS,
            shown = shown_tokens("sessions.masked_through_seq"),
        ))?
        .query_row([session.id.as_str()], SessionRow::from_row)?)
}

/// The first of the session's rows `sql` reads (newest first) whose seq lies on `branch`, or
/// names none (it holds for every branch): `read` gives each row's seq and value.
fn newest_on<T>(
    conn: &Connection,
    sql: &str,
    session: &SessionRow,
    read: impl Fn(&rusqlite::Row) -> rusqlite::Result<(Option<u64>, T)>,
    branch: &Branch,
) -> Result<Option<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query([session.id.as_str()])?;
    while let Some(row) = rows.next()? {
        let (seq, value) = read(row)?;
        if seq.is_none_or(|s| branch.contains(s)) {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Makes the branch ending at `head` the session's current one: its latest compaction (the
/// newest whose boundary lies on it), its latest masking, its pinned messages and task, and
/// every counter, as if the session had only ever had this branch. Reported usage is dropped
/// (it measured another branch). Returns the session after it.
pub(super) fn switch_to(conn: &Connection, session: &SessionRow, head: u64) -> Result<SessionRow> {
    if head == session.head_seq {
        return Ok(session.clone());
    }
    let branch = Branch::to(conn, session, head)?;
    let filter = branch.filter();
    // The newest compaction that summarized a prefix of this branch.
    let (summary_num, active_from, summary_tokens) = newest_on(
        conn,
        "SELECT num, boundary_seq, summary_tokens, length(summary) FROM compactions
         WHERE session_id = ?1 ORDER BY num DESC",
        session,
        |r| {
            let (num, boundary, tokens, chars): (u32, u64, Option<usize>, usize) =
                (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            let summary_tokens = tokens.unwrap_or(chars.div_ceil(4) + 16);
            Ok((Some(boundary), (num, boundary, summary_tokens)))
        },
        &branch,
    )?
    .unwrap_or((0, 1, 0));
    // The newest masking of this branch (made while its head was on it): another branch's
    // masks only that branch's outputs, never this one's newest. One made before maskings
    // named their branch masks every branch, as it did.
    let masked_through: u64 = newest_on(
        conn,
        "SELECT through_seq, head_seq FROM maskings WHERE session_id = ?1 ORDER BY id DESC",
        session,
        |r| Ok((r.get(1)?, r.get(0)?)),
        &branch,
    )?
    .unwrap_or(0);
    let task_seq = task_on(conn, session, &filter)?;
    let step_calls = step_calls_on(conn, session, &filter)?;
    conn.prepare_cached(&format!(
        "UPDATE sessions SET
             head_seq = ?2,
             active_from_seq = ?3,
             summary_num = ?4,
             summary_tokens = ?5,
             task_seq = ?6,
             step_calls = ?7,
             pinned_tokens = (SELECT coalesce(sum(tokens), 0) FROM messages
                              WHERE session_id = ?1 AND pinned = 1 AND {filter}),
             turn_start_seq = coalesce((SELECT max(seq) FROM messages
                                        WHERE session_id = ?1 AND role = 'user' AND {filter}), 0),
             turn_attempts = 0,
             reported_tokens = NULL,
             tokens_since_report = 0,
             masked_through_seq = ?8
         WHERE id = ?1"
    ))?
    .execute(params![
        session.id.as_str(),
        head,
        active_from,
        summary_num,
        summary_tokens,
        task_seq,
        step_calls,
        masked_through
    ])?;
    let switched = super::sessions::get_live(conn, session.id.as_str())?;
    recount_active(conn, &switched)
}

/// The task of a proxied conversation on the branch `filter` selects: the first pinned user
/// message past the client's preamble (whose own user messages, few-shot examples, are
/// pinned too). A session of the socket API keeps the one it has.
fn task_on(conn: &Connection, session: &SessionRow, filter: &str) -> Result<Option<u64>> {
    Ok(match session.task_hash {
        Some(_) => conn
            .prepare_cached(&format!(
                "SELECT seq FROM messages WHERE session_id = ?1 AND pinned = 1 AND role = 'user'
                 AND seq > ?2 AND {filter} ORDER BY seq LIMIT 1"
            ))?
            .query_row(params![session.id.as_str(), session.static_seq], |r| {
                r.get(0)
            })
            .optional()?,
        None => session.task_seq,
    })
}

/// The calls of the newest assistant message on the branch `filter` selects: what the
/// current step's results share.
fn step_calls_on(conn: &Connection, session: &SessionRow, filter: &str) -> Result<usize> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT parts FROM messages WHERE session_id = ?1 AND role = 'assistant' AND {filter} ORDER BY seq DESC LIMIT 1"
        ))?
        .query_row([session.id.as_str()], |r| r.get::<_, String>(0))
        .optional()?
        .map_or(0, |parts| parts.matches("\"type\":\"tool_call\"").count()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::microcompact::MaskingStart;
    use crate::message::{Message, Part, Role};
    use crate::{Append, AppendRules, NewMessage, NewSession, Store, Synchronous};
    use compactd_core::SessionId;
    use proptest::prelude::*;
    use serde_json::json;

    /// One message of a generated append.
    #[derive(Debug, Clone)]
    enum Kind {
        Instruction,
        Acknowledgement,
        System,
        /// An assistant message making this many tool calls.
        Calls(usize),
        /// The results of the calls still open.
        Results,
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            2 => Just(Kind::Instruction),
            1 => Just(Kind::Acknowledgement),
            1 => Just(Kind::System),
            3 => (0usize..4).prop_map(Kind::Calls),
            3 => Just(Kind::Results),
        ]
    }

    /// Appends: up to three messages each, with or without a usage report.
    fn appends() -> impl Strategy<Value = Vec<(Vec<Kind>, Option<usize>)>> {
        proptest::collection::vec(
            (
                proptest::collection::vec(kind(), 1..4),
                proptest::option::weighted(0.2, 0usize..50_000),
            ),
            1..40,
        )
    }

    fn message(kind: &Kind, n: usize, open_calls: &mut Vec<String>) -> Message {
        let text = |role, text: String| Message {
            role,
            parts: vec![Part::Text { text }],
        };
        match kind {
            Kind::Instruction => text(
                Role::User,
                format!("please fix the parser bug number {n} in src/lib.rs"),
            ),
            Kind::Acknowledgement => text(Role::User, "ok".into()),
            Kind::System => text(Role::System, format!("reminder {n}")),
            Kind::Calls(k) => Message {
                role: Role::Assistant,
                parts: (0..*k)
                    .map(|i| {
                        let id = format!("c{n}-{i}");
                        open_calls.push(id.clone());
                        Part::ToolCall {
                            id,
                            name: "bash".into(),
                            args: json!({"command": "ls"}),
                        }
                    })
                    .chain([Part::Text {
                        text: format!("step {n}"),
                    }])
                    .collect(),
            },
            Kind::Results => Message {
                role: Role::Tool,
                parts: open_calls
                    .drain(..)
                    .map(|call_id| Part::ToolResult {
                        call_id,
                        name: None,
                        output: "a.rs\n".repeat(n % 300 + 1),
                        is_error: false,
                    })
                    .chain([Part::Text {
                        text: "done".into(),
                    }])
                    .collect(),
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// After every append, the session it returns is the row stored, and its counters are
        /// what the messages themselves give: counted again from the rows, not from the
        /// counters an append keeps.
        #[test]
        fn an_appends_counters_are_what_its_rows_give(appends in appends()) {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            let dir = tempfile::TempDir::new().unwrap();
            let store = Store::open(&dir.path().join("c.db"), Synchronous::Normal).unwrap();
            let id = SessionId::parse("counted").unwrap();
            let rules = |_: &SessionRow| AppendRules {
                task_max_tokens: 40,
                max_pinned_tokens: 100_000,
                step_budget: 2_000,
                step_whole_under: 0,
                lenient: false,
                pin_cap: 0,
                // Masking starts early, so that it runs in some of the cases (a masking drops the
                // usage report, which the checks below must see).
                masking: MaskingStart::of(
                    &crate::compaction::config::CompactionConfig {
                        microcompact_tokens: 500,
                        ..Default::default()
                    },
                    1_000_000,
                ),
                token_trigger: 0,
            };
            let (mut open_calls, mut n) = (Vec::new(), 0);
            let (mut first_instruction, mut last_instruction, mut last_calls) = (None, 0, 0);
            let (mut last_report, mut report_from) = (None, 0);
            runtime.block_on(async {
                for (kinds, reported_tokens) in &appends {
                    let sent: Vec<Message> = kinds
                        .iter()
                        .map(|k| {
                            n += 1;
                            message(k, n, &mut open_calls)
                        })
                        .collect();
                    let messages = sent
                        .iter()
                        .map(|m| NewMessage::new(m, crate::compaction::LazyEstimator::default().message(m)))
                        .collect();
                    let outcome = store
                        .append(
                            Append {
                                session: id.clone(),
                                create: Some(NewSession {
                                    id: id.clone(),
                                    model: None,
                                    context_limit: 1_000_000,
                                    overrides: json!({}),
                                    owner: None,
                                    limit_source: None,
                                }),
                                messages,
                                reported_tokens: *reported_tokens,
                                reported_of: None,
                                idempotency: None,
                            },
                            rules,
                        )
                        .await
                        .unwrap();
                    let returned = outcome.session;
                    let (stored, recounted, rows) = store
                        .write(move |conn| {
                            let stored = super::super::sessions::get_live(conn, "counted")?;
                            let recounted = recount_active(conn, &stored)?;
                            let rows: (u64, usize, u64) = conn.query_row(
                                "SELECT max(seq), coalesce(sum(tokens) FILTER (WHERE pinned), 0),
                                        coalesce(max(seq) FILTER (WHERE role = 'assistant'), 0)
                                 FROM messages WHERE session_id = 'counted'",
                                [],
                                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                            )?;
                            Ok((stored, recounted, rows))
                        })
                        .await
                        .unwrap();
                    let json = |row: &SessionRow| {
                        let mut v = serde_json::to_value(row).unwrap();
                        v.as_object_mut().unwrap().remove("updated_at");
                        v
                    };
                    prop_assert_eq!(serde_json::to_value(&returned).unwrap(), serde_json::to_value(&stored).unwrap());
                    // recount_active sets updated_at anew; every counter must agree.
                    prop_assert_eq!(json(&returned), json(&recounted));
                    let (max_seq, pinned_tokens, last_assistant) = rows;
                    prop_assert_eq!(returned.message_count, max_seq);
                    prop_assert_eq!(returned.head_seq, max_seq);
                    prop_assert_eq!(returned.pinned_tokens, pinned_tokens);
                    prop_assert_eq!(returned.branch_points, 0);
                    // Nothing compacts here: no attempt counts against the turn.
                    prop_assert_eq!(returned.turn_attempts, 0);
                    // What the test itself knows of what it sent.
                    for ((k, m), seq) in kinds.iter().zip(&sent).zip(outcome.first_seq..) {
                        if crate::compaction::instruction::is_instruction(m) {
                            first_instruction.get_or_insert(seq);
                            last_instruction = seq;
                        }
                        if let Kind::Calls(calls) = k {
                            last_calls = *calls;
                        }
                    }
                    if reported_tokens.is_some() {
                        last_report = *reported_tokens;
                        report_from = outcome.first_seq;
                    }
                    if outcome.masking.is_some() {
                        // A masking drops the report (it measured the context before).
                        last_report = None;
                    }
                    prop_assert_eq!(returned.reported_tokens, last_report);
                    if last_report.is_some() {
                        let since: usize = store
                            .read(move |conn| {
                                Ok(conn.query_row(
                                    &format!(
                                        "SELECT sum({}) FROM messages WHERE session_id = 'counted' AND seq >= ?2",
                                        super::shown_tokens("?1")
                                    ),
                                    params![returned.masked_through_seq, report_from],
                                    |r| r.get(0),
                                )?)
                            })
                            .await
                            .unwrap();
                        prop_assert_eq!(returned.tokens_since_report, since);
                    }
                    prop_assert_eq!(returned.task_seq, first_instruction);
                    prop_assert_eq!(returned.turn_start_seq, last_instruction);
                    prop_assert_eq!(returned.step_calls, if last_assistant == 0 { 0 } else { last_calls });
                }
                Ok(())
            })?;
            store.close();
        }
    }
}
