//! Planning a compaction: everything the engine decides before a summarizer is called.
//!
//! The service (and `compactd plan`) hands in the session's active messages, their token
//! estimates and the prior compaction's output; the plan says whether to compact, where the
//! boundary falls, which files the session touched and what the summarizer will read.

use super::boundary::{Boundary, find_preserve_boundary};
use super::config::CompactionConfig;
use super::constants::PRESERVE_RECENT_OUTPUTS;
use super::estimate::LazyEstimator;
use super::files::{FileLists, track_files};
use super::mask::Masking;
use super::prompt::{PromptInput, build_compaction_prompt};
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
    pub prior_summary: Option<&'a str>,
    pub prior_files: &'a FileLists,
    pub focus: Option<&'a str>,
    pub context_limit: usize,
    pub config: &'a CompactionConfig,
    pub estimator: LazyEstimator,
}

/// The engine's decisions for one compaction.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// Why the session should compact now, if it should.
    pub trigger: Option<Trigger>,
    /// Tokens in context now: the prior summary message plus every active message.
    pub pre_tokens: usize,
    /// Messages before `boundary.index` are summarized; the rest stay verbatim.
    pub boundary: Boundary,
    /// Files of the whole session: the prior lists plus every active message's tool calls.
    pub files: FileLists,
    /// Which tool outputs the prompt masks.
    pub masking: Masking,
}

impl CompactionPlan {
    /// Plans a compaction of `input`.
    pub fn new(input: &PlanInput) -> CompactionPlan {
        let summary_tokens = input
            .prior_summary
            .map_or(0, |s| input.estimator.message(&summary_message(s)));
        let pre_tokens = summary_tokens + input.tokens.iter().sum::<usize>();
        let trigger = check_trigger(
            input.messages.len(),
            pre_tokens,
            input.context_limit,
            input.config,
        );
        let boundary = find_preserve_boundary(
            input.messages,
            input.tokens,
            input.config.preserve_budget(input.context_limit),
            input.config.max_tail_messages(),
        );
        let compacted = &input.messages[..boundary.index];
        let masking = if input.config.mask_observations {
            Masking::keep_recent(compacted, PRESERVE_RECENT_OUTPUTS)
        } else {
            Masking::none()
        };
        CompactionPlan {
            trigger,
            pre_tokens,
            boundary,
            files: track_files(input.messages, input.prior_files),
            masking,
        }
    }

    /// Whether there is anything before the boundary to summarize.
    pub fn has_work(&self) -> bool {
        self.boundary.index > 0
    }

    /// The prompt for summarizing the messages before the boundary.
    pub fn prompt(&self, input: &PlanInput) -> String {
        build_compaction_prompt(&PromptInput {
            messages: &input.messages[..self.boundary.index],
            masking: self.masking,
            prior_summary: input.prior_summary,
            files: &self.files,
            focus: input.focus,
        })
    }
}

/// Token estimates for `messages`, one per message.
pub fn estimate_each(messages: &[Message], estimator: &LazyEstimator) -> Vec<usize> {
    messages.iter().map(|m| estimator.message(m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    #[test]
    fn a_long_session_plans_a_compaction_of_its_head() {
        let messages: Vec<Message> = (0..100)
            .map(|i| {
                Message::text(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    "x".repeat(400),
                )
            })
            .collect();
        let estimator = LazyEstimator::default();
        let tokens = estimate_each(&messages, &estimator);
        let config = CompactionConfig::default();
        let input = PlanInput {
            messages: &messages,
            tokens: &tokens,
            prior_summary: None,
            prior_files: &FileLists::default(),
            focus: None,
            context_limit: 200_000,
            config: &config,
            estimator,
        };
        let plan = CompactionPlan::new(&input);
        assert_eq!(plan.trigger, Some(Trigger::Messages));
        assert_eq!(plan.pre_tokens, 100 * 100);
        // Budget 15000 tokens would keep all 100; the tail is capped at 40 messages.
        assert_eq!(plan.boundary.index, 60);
        assert_eq!(plan.boundary.preserved_tokens, 4000);
        let prompt = plan.prompt(&input);
        assert_eq!(prompt.matches("<user>").count(), 30);
    }
}
