//! Property tests of the engine's promises over random sessions: the preserve boundary never
//! orphans a tool result and stays within budget, and the extractive summary keeps every user
//! message across repeated compactions.

use compactd_core::compaction::constants::MAX_TEXT_CHARS;
use compactd_core::compaction::sections::{SUMMARY_SECTIONS, heading};
use compactd_core::compaction::step::current_step_start;
use compactd_core::compaction::truncate::truncate_chars;
use compactd_core::compaction::{Boundary, find_preserve_boundary};
use compactd_core::compaction::{Message, Part, Role};
use compactd_summarize::SummaryRequest;
use compactd_summarize::extractive::extractive_summary;
use proptest::prelude::*;
use serde_json::json;
use std::collections::{HashMap, HashSet};

/// A piece of a random session.
#[derive(Debug, Clone)]
enum Step {
    User(usize),
    Assistant(usize),
    /// Parallel calls answered OpenAI style (one tool message per result) or Anthropic style
    /// (one user message carrying every result), with token sizes for the call and each result.
    ToolRound {
        results: Vec<usize>,
        call: usize,
        anthropic: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1usize..3000).prop_map(Step::User),
        (1usize..3000).prop_map(Step::Assistant),
        (
            prop::collection::vec(1usize..6000, 1..4),
            1usize..500,
            any::<bool>()
        )
            .prop_map(|(results, call, anthropic)| Step::ToolRound {
                results,
                call,
                anthropic
            }),
    ]
}

/// Builds messages and their token sizes; `pending` leaves the last round's calls unanswered.
fn session(steps: &[Step], pending: Option<usize>) -> (Vec<Message>, Vec<usize>) {
    let mut messages = Vec::new();
    let mut tokens = Vec::new();
    let mut next_id = 0;
    for step in steps {
        match step {
            Step::User(t) => {
                messages.push(Message::text(Role::User, "u"));
                tokens.push(*t);
            }
            Step::Assistant(t) => {
                messages.push(Message::text(Role::Assistant, "a"));
                tokens.push(*t);
            }
            Step::ToolRound {
                results,
                call,
                anthropic,
            } => {
                let ids: Vec<String> = results
                    .iter()
                    .map(|_| {
                        next_id += 1;
                        format!("c{next_id}")
                    })
                    .collect();
                messages.push(Message {
                    role: Role::Assistant,
                    parts: ids
                        .iter()
                        .map(|id| Part::ToolCall {
                            id: id.clone(),
                            name: "bash".into(),
                            args: json!({}),
                        })
                        .collect(),
                });
                tokens.push(*call);
                let result = |id: &String| Part::ToolResult {
                    call_id: id.clone(),
                    name: None,
                    output: "o".into(),
                    is_error: false,
                };
                if *anthropic {
                    messages.push(Message {
                        role: Role::User,
                        parts: ids.iter().map(result).collect(),
                    });
                    tokens.push(results.iter().sum());
                } else {
                    for (id, t) in ids.iter().zip(results) {
                        messages.push(Message {
                            role: Role::Tool,
                            parts: vec![result(id)],
                        });
                        tokens.push(*t);
                    }
                }
            }
        }
    }
    if let Some(call_tokens) = pending {
        next_id += 1;
        messages.push(Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: format!("c{next_id}"),
                name: "bash".into(),
                args: json!({}),
            }],
        });
        tokens.push(call_tokens);
    }
    (messages, tokens)
}

/// Whether a boundary at `b` keeps a result whose call it compacts.
fn orphans_a_result(messages: &[Message], b: usize) -> bool {
    oldest_orphaned_call(messages, b).is_some()
}

/// The index of the oldest call before `b` whose result lies at or after `b`.
fn oldest_orphaned_call(messages: &[Message], b: usize) -> Option<usize> {
    let mut call_at = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        for id in m.tool_call_ids() {
            call_at.insert(id.to_string(), i);
        }
    }
    messages[b..]
        .iter()
        .flat_map(|m| m.tool_result_ids())
        .filter_map(|id| call_at.get(id).copied().filter(|&c| c < b))
        .min()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn boundary_never_orphans_and_stays_within_budget(
        steps in prop::collection::vec(step(), 0..60),
        pending in prop::option::weighted(0.2, 1usize..20_000),
        budget in 2_000usize..15_000,
        cap in 1usize..60,
    ) {
        let (messages, tokens) = session(&steps, pending);
        let Boundary { index: b, preserved_tokens } = find_preserve_boundary(&messages, &tokens, budget, cap);
        let n = messages.len();
        prop_assert!(b <= n);
        prop_assert_eq!(preserved_tokens, tokens[b..].iter().sum::<usize>());
        // A result is kept without its call only in the current step, when keeping the call
        // would bring more than the budget along (the context shows it as text naming it).
        let step = current_step_start(&messages);
        if let Some(call) = oldest_orphaned_call(&messages, b) {
            prop_assert_eq!(b, step, "orphaned result at boundary {}", b);
            let between: usize = tokens[call..step].iter().sum();
            prop_assert!(between > budget, "a call {} tokens back was left out", between);
        }
        // Every kept call keeps its results: results always follow their call.
        let kept_calls: HashSet<&str> = messages[b..].iter().flat_map(|m| m.tool_call_ids()).collect();
        for m in &messages[..b] {
            for id in m.tool_result_ids() {
                prop_assert!(!kept_calls.contains(id));
            }
        }
        // The current step (the newest assistant message and what follows it, a call still
        // waiting for its result included) is always kept, whatever it costs.
        prop_assert!(b <= step, "boundary {} cuts into the current step at {}", b, step);
        let step_fits = tokens[step..].iter().sum::<usize>() <= budget && n - step <= cap;
        if step_fits {
            // Within budget and cap...
            prop_assert!(preserved_tokens <= budget, "{} > {}", preserved_tokens, budget);
            prop_assert!(n - b <= cap);
            // ...and as long as it can be: no valid earlier boundary also fits.
            for earlier in 0..b {
                let fits = tokens[earlier..].iter().sum::<usize>() <= budget && n - earlier <= cap;
                prop_assert!(!fits || orphans_a_result(&messages, earlier), "boundary {} could be {}", b, earlier);
            }
        } else {
            // Over the budget, the tail is the step and the calls its results answer.
            prop_assert!(b == step || orphans_a_result(&messages, step), "boundary {} for step {}", b, step);
        }
    }

    #[test]
    fn extractive_summaries_keep_every_user_message_across_compactions(
        texts in prop::collection::vec("[a-zé日🦀 \r\n#]{1,40}|[a-z\r\n]{1990,2100}", 1..12),
        split in 0usize..12,
    ) {
        let texts: Vec<String> = texts.into_iter().filter(|t| !t.trim().is_empty()).collect();
        let messages: Vec<Message> = texts.iter().flat_map(|t| [
            Message::text(Role::User, t.clone()),
            Message::text(Role::Assistant, "ok, working on it"),
        ]).collect();
        let split = (split * 2).min(messages.len());
        let first = extractive_summary(&SummaryRequest { messages: messages[..split].to_vec(), ..Default::default() });
        let second = extractive_summary(&SummaryRequest {
            messages: messages[split..].to_vec(),
            prior_summary: Some(first),
            ..Default::default()
        });
        for s in &SUMMARY_SECTIONS {
            prop_assert!(second.contains(&heading(s)));
        }
        for t in &texts {
            let kept = truncate_chars(t.trim(), MAX_TEXT_CHARS);
            prop_assert!(second.contains(kept.trim()), "lost user message {:?}", t);
        }
    }
}
