//! Planning a compaction: everything the engine decides before a summarizer is called.
//!
//! The service (and `compactd plan`) hands in the session's active messages, their token
//! estimates, which of them are pinned, and the prior compaction's output; the plan says
//! whether to compact, where the boundary falls, which messages the summary replaces, which
//! files the session touched and what the summarizer will read.

use super::boundary::{Boundary, find_preserve_boundary};
use super::config::CompactionConfig;
use super::constants::PRESERVE_RECENT_OUTPUTS;
use super::estimate::LazyEstimator;
use super::files::{FileLists, track_files};
use super::mask::Masking;
use super::prompt::{PromptInput, build_compaction_prompt};
use super::redact::redact_secrets;
use super::result::summary_message;
use super::trigger::{Trigger, check_trigger};
use crate::message::Message;

/// What a plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// Messages since the last compaction, oldest first.
    pub messages: &'a [Message],
    /// Their token estimates, one per message.
    pub tokens: &'a [usize],
    /// Which of them are pinned (one flag per message; empty when none is).
    pub pinned: &'a [bool],
    /// Tokens of every pinned message of the session, wherever it stands.
    pub pinned_tokens: usize,
    /// The seq of each message (empty: they are numbered from 1). A proxied conversation's
    /// branch need not be consecutive seqs.
    pub seqs: &'a [u64],
    /// The seq of the session's task (its first user instruction), if it has one.
    pub task_seq: Option<u64>,
    pub prior_summary: Option<&'a str>,
    pub prior_files: &'a FileLists,
    pub focus: Option<&'a str>,
    pub context_limit: usize,
    pub config: &'a CompactionConfig,
    pub estimator: LazyEstimator,
    /// Replace credentials in the prompt (and the summary) with `[redacted]`.
    pub redact_secrets: bool,
    /// The session's id, which the summary names for recall (empty offline).
    pub session: &'a str,
}

impl<'a> PlanInput<'a> {
    /// The input for `messages` alone: nothing pinned, no prior compaction, secrets redacted.
    pub fn new(
        messages: &'a [Message],
        tokens: &'a [usize],
        context_limit: usize,
        config: &'a CompactionConfig,
    ) -> PlanInput<'a> {
        static NO_FILES: FileLists = FileLists {
            read: Vec::new(),
            modified: Vec::new(),
            created: Vec::new(),
            deleted: Vec::new(),
        };
        PlanInput {
            messages,
            tokens,
            pinned: &[],
            pinned_tokens: 0,
            seqs: &[],
            task_seq: None,
            prior_summary: None,
            prior_files: &NO_FILES,
            focus: None,
            context_limit,
            config,
            estimator: LazyEstimator::default(),
            redact_secrets: true,
            session: "",
        }
    }

    /// The seq of `messages[index]`.
    pub fn seq_of(&self, index: usize) -> u64 {
        self.seqs.get(index).copied().unwrap_or(index as u64 + 1)
    }

    /// Where the message of `seq` stands in `messages`.
    pub fn index_of(&self, seq: u64) -> Option<usize> {
        match self.seqs.is_empty() {
            true => seq
                .checked_sub(1)
                .map(|i| i as usize)
                .filter(|&i| i < self.messages.len()),
            false => self.seqs.iter().position(|&s| s == seq),
        }
    }

    fn is_pinned(&self, index: usize) -> bool {
        self.pinned.get(index).copied().unwrap_or(false)
    }

    /// Token estimates as the budget sees them: pinned messages are counted once, in
    /// `pinned_tokens`, so here they weigh nothing.
    fn unpinned_tokens(&self) -> Vec<usize> {
        self.tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| if self.is_pinned(i) { 0 } else { t })
            .collect()
    }
}

/// The engine's decisions for one compaction.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// Why the session should compact now, if it should.
    pub trigger: Option<Trigger>,
    /// Tokens in context now: pinned messages, the prior summary message, every other active
    /// message.
    pub pre_tokens: usize,
    /// Messages before `boundary.index` are compacted; the rest stay verbatim.
    /// `preserved_tokens` counts the tail's unpinned messages.
    pub boundary: Boundary,
    /// Indices of the messages the summary replaces: those before the boundary, unpinned.
    pub summarized: Vec<usize>,
    /// Files of the whole session: the prior lists plus every active message's tool calls.
    pub files: FileLists,
    /// Which tool outputs the prompt masks (positions within `summarized`).
    pub masking: Masking,
    /// How long the summary may be, in tokens.
    pub summary_budget: usize,
    /// How long it may grow to keep every user instruction whole.
    pub summary_ceiling: usize,
    /// Set when the pinned messages alone leave no room for a summary and a tail.
    pub pinned_overflow: Option<PinnedOverflow>,
}

/// The pinned messages of a session take more than it can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "pinned messages (system messages and the task) take {pinned} tokens, more than the {max} this session's context can spare for them (context_limit too small, or lower pin_first_user_tokens)"
)]
pub struct PinnedOverflow {
    pub pinned: usize,
    pub max: usize,
}

impl CompactionPlan {
    /// Plans a compaction of `input`.
    pub fn new(input: &PlanInput) -> CompactionPlan {
        let summary_tokens = input.prior_summary.map_or(0, |s| {
            input.estimator.message(&summary_message(s, input.session))
        });
        let weights = input.unpinned_tokens();
        let pre_tokens = input.pinned_tokens + summary_tokens + weights.iter().sum::<usize>();
        let trigger = check_trigger(
            input.messages.len(),
            pre_tokens,
            input.context_limit,
            input.config,
        );
        let boundary = find_preserve_boundary(
            input.messages,
            &weights,
            input
                .config
                .preserve_budget(input.context_limit, input.pinned_tokens),
            input.config.max_tail_messages(),
        );
        let summarized: Vec<usize> = (0..boundary.index)
            .filter(|&i| !input.is_pinned(i))
            .collect();
        let masking = if input.config.mask_observations {
            let compacted: Vec<&Message> = summarized.iter().map(|&i| &input.messages[i]).collect();
            Masking::keep_recent(&compacted, PRESERVE_RECENT_OUTPUTS)
        } else {
            Masking::none()
        };
        let max = input.config.max_pinned_tokens(input.context_limit);
        let (summary_budget, summary_ceiling) = summary_room(input, &boundary);
        CompactionPlan {
            trigger,
            pre_tokens,
            boundary,
            summarized,
            files: track_files(input.messages, input.prior_files),
            masking,
            summary_budget,
            summary_ceiling,
            pinned_overflow: (input.pinned_tokens > max).then_some(PinnedOverflow {
                pinned: input.pinned_tokens,
                max,
            }),
        }
    }

    /// Whether there is anything before the boundary to summarize (or to move in front of the
    /// summary, for pinned messages).
    pub fn has_work(&self) -> bool {
        self.boundary.index > 0
    }

    /// The messages the summary replaces, with their seqs.
    pub fn summarized_messages(&self, input: &PlanInput) -> (Vec<Message>, Vec<u64>) {
        self.summarized
            .iter()
            .map(|&i| (input.messages[i].clone(), input.seq_of(i)))
            .unzip()
    }

    /// The prompt for summarizing the messages before the boundary, redacted when asked.
    pub fn prompt(&self, input: &PlanInput) -> String {
        let (messages, _) = self.summarized_messages(input);
        let prompt = build_compaction_prompt(&PromptInput {
            messages: &messages,
            masking: self.masking,
            prior_summary: input.prior_summary,
            files: &self.files,
            focus: input.focus,
        });
        if input.redact_secrets {
            redact_secrets(&prompt).into_owned()
        } else {
            prompt
        }
    }

    /// Tokens of the context after a compaction whose summary message takes
    /// `summary_message_tokens`: pinned messages, the summary, the tail.
    pub fn post_tokens(&self, input: &PlanInput, summary_message_tokens: usize) -> usize {
        input.pinned_tokens + summary_message_tokens + self.boundary.preserved_tokens
    }
}

/// How long the summary may be, and may grow to keep every instruction: the config's budget
/// and ceiling, within what the tail leaves of the usable context (a large current step
/// takes what it needs first), never under the smallest summary.
fn summary_room(input: &PlanInput, boundary: &Boundary) -> (usize, usize) {
    let config = input.config;
    let usable = config.usable(input.context_limit, input.pinned_tokens);
    let room = usable
        .saturating_sub(boundary.preserved_tokens)
        .max(config.smallest_summary(usable));
    let budget = config
        .summary_budget(input.context_limit, input.pinned_tokens)
        .min(room);
    let ceiling = config
        .summary_ceiling(input.context_limit, input.pinned_tokens)
        .min(room)
        .max(budget);
    (budget, ceiling)
}

/// Token estimates for `messages`, one per message.
pub fn estimate_each(messages: &[Message], estimator: &LazyEstimator) -> Vec<usize> {
    messages.iter().map(|m| estimator.message(m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    fn alternating(n: usize, chars: usize) -> Vec<Message> {
        (0..n)
            .map(|i| {
                Message::text(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    "x".repeat(chars),
                )
            })
            .collect()
    }

    #[test]
    fn a_long_session_plans_a_compaction_of_its_head() {
        let messages = alternating(100, 400);
        let tokens = estimate_each(&messages, &LazyEstimator::default());
        let config = CompactionConfig::default();
        let input = PlanInput::new(&messages, &tokens, 200_000, &config);
        let plan = CompactionPlan::new(&input);
        assert_eq!(plan.trigger, Some(Trigger::Messages));
        assert_eq!(plan.pre_tokens, 100 * 100);
        // Budget 11,250 tokens would keep 112; the tail is capped at 10 messages (80 / 8).
        assert_eq!(plan.boundary.index, 90);
        assert_eq!(plan.boundary.preserved_tokens, 1000);
        let prompt = plan.prompt(&input);
        assert_eq!(prompt.matches("<user>").count(), 45);
    }

    #[test]
    fn pinned_messages_are_counted_once_and_never_summarized() {
        let mut messages = alternating(100, 400);
        messages[0] = Message::text(Role::System, "s".repeat(400));
        let tokens = estimate_each(&messages, &LazyEstimator::default());
        let config = CompactionConfig::default();
        let pins = super::super::pin::Pins::of(&messages, &tokens, &config);
        assert_eq!(
            pins.flags.iter().filter(|p| **p).count(),
            2,
            "system + task"
        );
        let input = PlanInput {
            pinned: &pins.flags,
            pinned_tokens: pins.tokens,
            ..PlanInput::new(&messages, &tokens, 200_000, &config)
        };
        let plan = CompactionPlan::new(&input);
        assert_eq!(plan.pre_tokens, 100 * 100);
        assert_eq!(plan.boundary.index, 90);
        assert_eq!(plan.summarized.len(), 88);
        // The system message and the task (the first user message, index 2) stay out.
        assert!(!plan.summarized.contains(&0) && !plan.summarized.contains(&2));
        assert!(!plan.prompt(&input).contains(&"s".repeat(400)));
        assert_eq!(plan.post_tokens(&input, 10), 200 + 10 + 1000);
        assert_eq!(plan.pinned_overflow, None);
    }

    #[test]
    fn a_pinned_part_that_cannot_fit_is_reported() {
        let messages = vec![Message::text(Role::System, "s".repeat(100_000))];
        let tokens = estimate_each(&messages, &LazyEstimator::default());
        let config = CompactionConfig::default();
        let input = PlanInput {
            pinned: &[true],
            pinned_tokens: tokens[0],
            ..PlanInput::new(&messages, &tokens, 32_000, &config)
        };
        let overflow = CompactionPlan::new(&input).pinned_overflow.unwrap();
        assert_eq!(overflow.max, 21_600);
        assert!(overflow.to_string().contains("25000 tokens"), "{overflow}");
    }
}
