//! FindPreserveBoundary (SPEC.md 5.5): where the verbatim tail starts.
//!
//! Walking from the newest message to the oldest, the tail takes messages while their tokens
//! fit the budget (and, our addition, while it holds at most `max_tail_messages`). Then the
//! pair rule of DESIGN.md: a tool result is never kept without its call, because every model
//! API rejects a conversation with an orphaned result. Rather than overspend the budget to pull
//! a call in, the boundary moves *forward* past the results, so the tail stays within budget.
//!
//! One exception overspends: the current step ([`super::step`]), the newest assistant message
//! and everything after it, is a floor under the boundary. The agent cannot go on without the
//! output it asked for, and results still running would arrive after a compaction had
//! swallowed their call. The budget rule stays the spec's; the floor is on top of it (when the
//! step is too large for the context, the context shortens it, see [`super::step`]).
//!
//! A result in the step answering a call of an *earlier* turn (a client appending it late)
//! pulls that call into the tail only while what lies between fits the budget. Pulled in
//! whatever it cost, everything between came along verbatim, never summarized and never
//! shortened (it is no part of the step): five long user messages between a call and its late
//! result made a context of 56,023 tokens at a 53,372-token limit, "nothing to compact"
//! (found by `tests/it/current_step.rs`). Left out, the call is summarized and the context
//! shows the late result as text naming its call (`service::answered`): no API sees a result
//! without its call, and the agent still sees the output.

use super::step::current_step_start;
use crate::message::Message;
use std::collections::HashMap;

/// The preserve boundary: messages before `index` are compacted, `index..` stay verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    pub index: usize,
    pub preserved_tokens: usize,
}

/// Finds the preserve boundary of `messages`, whose token estimates are `tokens` (same length).
pub fn find_preserve_boundary(
    messages: &[Message],
    tokens: &[usize],
    budget: usize,
    max_tail_messages: usize,
) -> Boundary {
    assert_eq!(
        messages.len(),
        tokens.len(),
        "one token estimate per message"
    );
    let n = messages.len();
    let earliest_ref = earliest_referenced_call(messages);

    // Greedy walk from the newest message.
    let mut index = n;
    let mut spent = 0;
    while index > 0 && n - index < max_tail_messages && spent + tokens[index - 1] <= budget {
        spent += tokens[index - 1];
        index -= 1;
    }
    // Pair rule: move forward until no kept result points before the boundary.
    while earliest_ref[index] < index {
        index += 1;
    }
    // The current step is always kept, with the calls its results answer while what that
    // brings along fits the budget.
    let step = current_step_start(messages);
    if step < index {
        index = step;
        while earliest_ref[index] < index
            && tokens[earliest_ref[index]..step].iter().sum::<usize>() <= budget
        {
            index = earliest_ref[index];
        }
    }
    Boundary {
        index,
        preserved_tokens: tokens[index..].iter().sum(),
    }
}

/// `earliest[b]` is the index of the oldest message holding a call answered by a result in
/// `messages[b..]` (or `b` itself if none is older). A boundary at `b` orphans a result exactly
/// when `earliest[b] < b`. The slice has `n + 1` entries; `earliest[n] == n`.
pub fn earliest_referenced_call(messages: &[Message]) -> Vec<usize> {
    let n = messages.len();
    // A result answers the most recent earlier call with its id (some agents reuse ids).
    let mut latest_call: HashMap<&str, usize> = HashMap::new();
    let mut own = Vec::with_capacity(n);
    for (i, m) in messages.iter().enumerate() {
        let oldest = m
            .tool_result_ids()
            .filter_map(|id| latest_call.get(id).copied())
            .min()
            .unwrap_or(i);
        own.push(oldest);
        for id in m.tool_call_ids() {
            latest_call.insert(id, i);
        }
    }
    let mut earliest = vec![n; n + 1];
    for i in (0..n).rev() {
        earliest[i] = own[i].min(earliest[i + 1]);
    }
    earliest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Part, Role};
    use serde_json::json;

    fn text(role: Role) -> Message {
        Message::text(role, "x")
    }
    fn calls(ids: &[&str]) -> Message {
        Message {
            role: Role::Assistant,
            parts: ids
                .iter()
                .map(|id| Part::ToolCall {
                    id: id.to_string(),
                    name: "bash".into(),
                    args: json!({}),
                })
                .collect(),
        }
    }
    fn results(role: Role, ids: &[&str]) -> Message {
        Message {
            role,
            parts: ids
                .iter()
                .map(|id| Part::ToolResult {
                    call_id: id.to_string(),
                    name: None,
                    output: "o".into(),
                    is_error: false,
                })
                .collect(),
        }
    }
    fn boundary(messages: &[Message], tokens: &[usize], budget: usize) -> usize {
        find_preserve_boundary(messages, tokens, budget, usize::MAX).index
    }

    #[test]
    fn empty_session_has_nothing_to_compact() {
        assert_eq!(
            find_preserve_boundary(&[], &[], 2000, 40),
            Boundary {
                index: 0,
                preserved_tokens: 0
            }
        );
    }

    #[test]
    fn takes_newest_messages_while_they_fit() {
        let m = vec![text(Role::User); 5];
        assert_eq!(boundary(&m, &[10, 10, 10, 10, 10], 30), 2);
        assert_eq!(boundary(&m, &[10, 10, 10, 10, 10], 29), 3);
        assert_eq!(boundary(&m, &[10, 10, 10, 10, 10], 100), 0);
    }

    #[test]
    fn a_message_larger_than_the_budget_is_compacted_unless_it_is_the_current_step() {
        let m = vec![
            text(Role::User),
            text(Role::Assistant),
            text(Role::User),
            text(Role::Assistant),
        ];
        let b = find_preserve_boundary(&m, &[10, 20_000, 10, 10], 15_000, 40);
        assert_eq!(b.index, 2);
        assert_eq!(b.preserved_tokens, 20);
        // The newest assistant message is the current step: kept whatever its size.
        let b = find_preserve_boundary(&m[..2], &[10, 20_000], 15_000, 40);
        assert_eq!(b.index, 1);
        assert_eq!(b.preserved_tokens, 20_000);
    }

    #[test]
    fn the_current_step_is_kept_over_the_budget_and_the_message_cap() {
        // An output larger than the whole budget, just returned: it stays, with its call.
        let m = vec![
            text(Role::User),
            calls(&["a"]),
            results(Role::Tool, &["a"]),
            calls(&["b"]),
            results(Role::Tool, &["b"]),
        ];
        let b = find_preserve_boundary(&m, &[1, 10, 10, 10, 50_000], 2_000, 1);
        assert_eq!(b.index, 3);
        // A result answering an older call pulls that call in too...
        let m = vec![
            text(Role::User),
            calls(&["a", "late"]),
            results(Role::Tool, &["a"]),
            calls(&["b"]),
            results(Role::Tool, &["b", "late"]),
        ];
        assert_eq!(
            find_preserve_boundary(&m, &[1, 10, 10, 10, 50_000], 2_000, 1).index,
            1
        );
        // ...unless what lies between is over the budget: the late result is then shown as
        // text naming its call, and what lies between is summarized.
        assert_eq!(
            find_preserve_boundary(&m, &[1, 10, 2_000, 10, 50_000], 2_000, 1).index,
            3
        );
    }

    #[test]
    fn the_tail_never_holds_more_than_max_tail_messages() {
        let m = vec![text(Role::User); 10];
        assert_eq!(find_preserve_boundary(&m, &[1; 10], 1000, 4).index, 6);
    }

    #[test]
    fn openai_placement_boundary_between_call_and_result_moves_forward() {
        // user, assistant(call a), tool(a), assistant
        let m = vec![
            text(Role::User),
            calls(&["a"]),
            results(Role::Tool, &["a"]),
            text(Role::Assistant),
        ];
        // Budget covers the result and the answer but not the call.
        assert_eq!(boundary(&m, &[1, 50, 10, 10], 25), 3);
        // Budget covers the pair: both kept.
        assert_eq!(boundary(&m, &[1, 5, 10, 10], 25), 1);
    }

    #[test]
    fn anthropic_placement_results_in_a_user_message() {
        let m = vec![
            text(Role::User),
            calls(&["a"]),
            results(Role::User, &["a"]),
            text(Role::Assistant),
        ];
        assert_eq!(boundary(&m, &[1, 50, 10, 10], 25), 3);
        assert_eq!(boundary(&m, &[1, 5, 10, 10], 25), 1);
    }

    #[test]
    fn parallel_calls_answered_by_several_messages_stay_together() {
        // assistant calls a, b, c; three tool messages answer them; budget fits only two results.
        let m = vec![
            text(Role::User),
            calls(&["a", "b", "c"]),
            results(Role::Tool, &["a"]),
            results(Role::Tool, &["b"]),
            results(Role::Tool, &["c"]),
            text(Role::Assistant),
        ];
        let tokens = [1, 10, 10, 10, 10, 10];
        assert_eq!(boundary(&m, &tokens, 30), 5);
        assert_eq!(boundary(&m, &tokens, 50), 1);
    }

    #[test]
    fn a_waiting_call_is_kept_even_over_budget() {
        let m = vec![text(Role::User), text(Role::Assistant), calls(&["a"])];
        let b = find_preserve_boundary(&m, &[1, 1, 500], 100, 40);
        assert_eq!(b.index, 2);
        assert_eq!(b.preserved_tokens, 500);
        // Partly answered parallel calls also wait: the answered result comes along.
        let m = vec![
            text(Role::User),
            calls(&["a", "b"]),
            results(Role::Tool, &["a"]),
        ];
        assert_eq!(boundary(&m, &[1, 500, 1], 100), 1);
    }

    #[test]
    fn a_reused_call_id_pairs_with_its_latest_call() {
        // Both rounds use id "a"; the second result belongs to the second call.
        let m = vec![
            calls(&["a"]),
            results(Role::Tool, &["a"]),
            calls(&["a"]),
            results(Role::Tool, &["a"]),
        ];
        assert_eq!(boundary(&m, &[100, 100, 10, 10], 25), 2);
    }

    #[test]
    fn an_abandoned_call_does_not_pin_the_tail() {
        // The call was never answered but the assistant moved on: nothing is waiting.
        let m = vec![
            text(Role::User),
            calls(&["a"]),
            text(Role::Assistant),
            text(Role::User),
        ];
        assert_eq!(boundary(&m, &[1, 500, 1, 1], 10), 2);
    }
}
