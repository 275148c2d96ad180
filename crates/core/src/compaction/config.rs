//! [`CompactionConfig`]: the spec's knobs (SPEC.md 5.1) plus the two DESIGN.md adds
//! (reserve and breaker threshold), and the arithmetic derived from them.

use super::constants::*;
use serde::{Deserialize, Serialize};

/// How a session is compacted. Every field defaults to the spec's constant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    /// Replace all but the newest tool outputs with a marker in the compaction prompt.
    pub mask_observations: bool,
    /// Floor of the preserve budget, in tokens.
    pub min_preserve: usize,
    /// Ceiling of the preserve budget, in tokens.
    pub max_preserve: usize,
    /// Compact when the active message count exceeds this.
    pub max_messages: usize,
    /// Tokens kept free below the context limit; `None` means min(20000, context_limit / 5).
    pub reserve_tokens: Option<usize>,
    /// Automatic compaction attempts per user turn before the breaker opens.
    pub breaker_threshold: u32,
    /// The context limit of a session created without one.
    pub default_context_limit: usize,
    /// The session's first user instruction (its task) stays verbatim at the start of the
    /// context when it is at most this many tokens; a larger one is kept whole in the
    /// summary's section 6 up to this size. 0 turns task pinning off.
    pub pin_first_user_tokens: usize,
    /// Mask old tool outputs in the context (microcompaction) before summarizing; false is
    /// the spec-literal behaviour (the context holds every output until a summary).
    pub microcompact: bool,
    /// Masking may start once the context holds this many tokens (at most half the trigger).
    pub microcompact_tokens: usize,
    /// A compaction starts in the background, while the agent goes on, once the room the
    /// summary leaves below the trigger is this full (see [`background_threshold`]); 1.0
    /// (and `None`, which the daemon resolves by summarizer) starts compactions only at the
    /// trigger, and contexts wait for every running compaction.
    ///
    /// [`background_threshold`]: CompactionConfig::background_threshold
    pub background_at: Option<f64>,
    /// The longest a context over the trigger waits for a running compaction, in seconds; past
    /// it the extractive summarizer finishes that compaction (recorded as a fallback).
    pub max_wait_s: u64,
    /// The completion the session's client asks room for beside each prompt (a call's
    /// `max_tokens`), as a share of its window: the reserve is never less (see
    /// [`completion_share`]). Not a setting: the daemon sets it per session from what the
    /// client's calls ask. A share, not a count, because one config serves a limit both as
    /// the model counts it and in compactd's estimated tokens (the limit over the model's
    /// rate), and the completion scales with it.
    #[serde(skip)]
    pub completion_share: f64,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            mask_observations: true,
            min_preserve: MIN_PRESERVE_RECENT_TOKENS,
            max_preserve: MAX_PRESERVE_RECENT_TOKENS,
            max_messages: DEFAULT_MAX_MESSAGES,
            reserve_tokens: None,
            breaker_threshold: COMPACTION_CIRCUIT_BREAKER_THRESHOLD,
            default_context_limit: DEFAULT_CONTEXT_LIMIT,
            pin_first_user_tokens: PIN_FIRST_USER_TOKENS,
            microcompact: true,
            microcompact_tokens: MICROCOMPACT_TOKENS,
            background_at: None,
            max_wait_s: MAX_WAIT_S,
            completion_share: 0.0,
        }
    }
}

impl CompactionConfig {
    /// Tokens kept free for the model's answer and the agent's next message: the configured
    /// reserve, or the completion the client asks room for when that is more (a model API
    /// refuses a prompt that leaves the completion asked for no room).
    pub fn reserve(&self, context_limit: usize) -> usize {
        let reserve = self
            .reserve_tokens
            .unwrap_or_else(|| MAX_RESERVE_TOKENS.min(context_limit / RESERVE_DIVISOR));
        // Rounded: at the window the share was taken of, exactly the completion.
        let completion = (context_limit as f64 * self.completion_share).round() as usize;
        reserve.max(completion).min(context_limit)
    }

    /// The token count at which a session compacts: `context_limit - reserve`.
    pub fn token_threshold(&self, context_limit: usize) -> usize {
        context_limit - self.reserve(context_limit)
    }

    /// The token count at which a compaction starts in the background: the pinned messages
    /// and the summary, plus `background_at` of the room left between them and the trigger.
    /// Measured from the summary, not from zero, so a large summary (up to half the usable
    /// context) still leaves a compaction started here something to shrink: the context after
    /// one (summary, tail and the current step, at most three quarters of the room) stays
    /// under this line for any `background_at` of at least [`MIN_BACKGROUND_AT`] (in windows of
    /// 16k tokens and more; below, the preserve budget's floor is larger than that share).
    pub fn background_threshold(
        &self,
        context_limit: usize,
        pinned_tokens: usize,
        summary_tokens: usize,
    ) -> usize {
        let threshold = self.token_threshold(context_limit);
        let floor = (pinned_tokens + summary_tokens).min(threshold);
        let room = (threshold - floor) as f64;
        (floor + (room * self.background_share()).ceil() as usize).min(threshold)
    }

    /// `background_at`, 1.0 when unset.
    pub fn background_share(&self) -> f64 {
        self.background_at.unwrap_or(1.0).clamp(0.0, 1.0)
    }

    /// Whether compactions run in the background, the agent served meanwhile.
    pub fn in_background(&self) -> bool {
        self.background_share() < 1.0
    }

    /// What the summary and the tail may share: the threshold less the pinned messages
    /// (system messages and the task), which stay in every context.
    pub fn usable(&self, context_limit: usize, pinned_tokens: usize) -> usize {
        self.token_threshold(context_limit)
            .saturating_sub(pinned_tokens)
    }

    /// The preserve boundary's budget: a sixteenth of the usable context
    /// ([`PRESERVE_DIVISOR`]), clamped to [min_preserve, max_preserve].
    pub fn preserve_budget(&self, context_limit: usize, pinned_tokens: usize) -> usize {
        let share = self.usable(context_limit, pinned_tokens) / PRESERVE_DIVISOR;
        share.clamp(self.min_preserve, self.max_preserve.max(self.min_preserve))
    }

    /// At most this many messages stay verbatim, so a compaction triggered by message count
    /// always brings the count well under `max_messages` (the spec bounds the tail by tokens
    /// only; a tail of 100 tiny messages would re-trigger forever) and a compaction started by
    /// the count buys many steps before the next one.
    pub fn max_tail_messages(&self) -> usize {
        (self.max_messages / TAIL_MESSAGES_DIVISOR).max(1)
    }

    /// How long a summary may be: an eighth of the usable context ([`SUMMARY_DIVISOR`]),
    /// never less than `min_preserve`. A summary is rewritten (written uncached) at every
    /// compaction and read at every step after it, so it is kept to what the agent needs;
    /// the continuation probes pass at this size (docs/EVALUATION.md).
    pub fn summary_budget(&self, context_limit: usize, pinned_tokens: usize) -> usize {
        (self.usable(context_limit, pinned_tokens) / SUMMARY_DIVISOR).max(self.min_preserve)
    }

    /// How long a summary may grow to keep every user instruction whole (section 6): half the
    /// usable context ([`SUMMARY_CEILING_DIVISOR`]). The other sections shrink to their floor
    /// first; only user messages may take the summary past [`summary_budget`](Self::summary_budget).
    pub fn summary_ceiling(&self, context_limit: usize, pinned_tokens: usize) -> usize {
        (self.usable(context_limit, pinned_tokens) / SUMMARY_CEILING_DIVISOR)
            .max(self.summary_budget(context_limit, pinned_tokens))
    }

    /// What the current step (the newest assistant turn and its results, see
    /// [`super::step`]) may take in a context that needs compacting: three quarters of what
    /// the usable context leaves beside the smallest summary (the plan shrinks the summary
    /// to leave it that room). A fixed quarter of the usable context cut outputs the window
    /// had room for, at small windows beside a large preamble; the last quarter stays for
    /// what the estimate may miss of the model's count and for the agent's next message. In
    /// a context that stays under its trigger with the step whole, nothing is shortened (see
    /// `store::messages`).
    pub fn step_budget(&self, context_limit: usize, pinned_tokens: usize) -> usize {
        let usable = self.usable(context_limit, pinned_tokens);
        (usable - self.smallest_summary(usable)) * 3 / 4
    }

    /// The smallest summary a compaction writes beside pinned messages that leave `usable`
    /// tokens: `min_preserve`, or a quarter of that room when it is less (as
    /// [`fitted_beside`](Self::fitted_beside) makes it).
    pub fn smallest_summary(&self, usable: usize) -> usize {
        self.min_preserve.min(usable / ROOM_PER_FLOOR)
    }

    /// The most tokens pinned messages may take: what leaves room for the smallest summary
    /// and tail below the threshold. A session whose pinned part is larger cannot fit.
    pub fn max_pinned_tokens(&self, context_limit: usize) -> usize {
        self.token_threshold(context_limit)
            .saturating_sub(2 * self.min_preserve)
    }

    /// Checks that a session of `context_limit` tokens can compact under this config: its
    /// threshold must leave room for the smallest summary and tail (2 × min_preserve) and some
    /// for pinned messages.
    pub fn check_context_limit(&self, context_limit: usize) -> Result<(), InvalidSetting> {
        if !(MIN_CONTEXT_LIMIT..=MAX_CONTEXT_LIMIT).contains(&context_limit) {
            return Err(InvalidSetting::new(
                "context_limit",
                format!(
                    "{context_limit} is out of range ({MIN_CONTEXT_LIMIT} to {MAX_CONTEXT_LIMIT} tokens)"
                ),
            ));
        }
        let threshold = self.token_threshold(context_limit);
        if threshold <= 2 * self.min_preserve {
            return Err(InvalidSetting::new(
                "context_limit",
                format!(
                    "{context_limit} is too small for min_preserve {}: its compaction threshold ({threshold} tokens) must exceed 2 × min_preserve ({}); raise context_limit or lower min_preserve",
                    self.min_preserve,
                    2 * self.min_preserve
                ),
            ));
        }
        Ok(())
    }

    /// This config made to fit a session of `context_limit` tokens, and why it had to change:
    /// `min_preserve` (and `max_preserve` with it) lowered to a quarter of the threshold,
    /// which leaves half of it for pinned messages. A session keeps its limit whatever the global config says later (a config edit
    /// is refused when it would not fit a live session, but one made while the daemon was
    /// stopped is only found at the next start): compacting with less preserved beats
    /// serving a context over its limit.
    pub fn fitted_to(mut self, context_limit: usize) -> (CompactionConfig, Option<String>) {
        if self.check_context_limit(context_limit).is_ok() {
            return (self, None);
        }
        let threshold = self.token_threshold(context_limit);
        let fitted = threshold / 4;
        let why = format!(
            "min_preserve {} does not fit context_limit {context_limit} (threshold {threshold}); compacting with min_preserve {fitted}",
            self.min_preserve
        );
        self.min_preserve = fitted;
        self.max_preserve = self.max_preserve.max(fitted);
        (self, Some(why))
    }

    /// This config made to leave room for the agent's next steps beside `pinned_tokens` of
    /// pinned messages: `min_preserve` (the floor of both the summary's budget and the
    /// tail's) at most a quarter of the room they leave under the threshold, so a compaction
    /// leaves at least half of it free. In a window of 16k and more, counted by the
    /// estimate, the floor is under that already; a model counting 2.5 times the estimate
    /// makes the same window 6,400 estimated tokens, where two floors of 2,000 beside a
    /// 1,440-token task filled all the room: every compaction left the context at the
    /// trigger, the next step passed it, and the circuit breaker took three such compactions
    /// for a loop and stopped compacting for the rest of the turn. Pinned messages past the
    /// threshold still do not fit.
    pub fn fitted_beside(mut self, context_limit: usize, pinned_tokens: usize) -> CompactionConfig {
        self.min_preserve = self.smallest_summary(self.usable(context_limit, pinned_tokens));
        self
    }

    /// Checks values that would make compaction meaningless.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let at_least_1 = |key, value: usize| match value {
            0 => Err(InvalidSetting::new(key, "must be at least 1")),
            _ => Ok(()),
        };
        at_least_1("max_messages", self.max_messages)?;
        if self.min_preserve > self.max_preserve {
            return Err(InvalidSetting::new(
                "min_preserve",
                format!(
                    "({}) must not exceed max_preserve ({})",
                    self.min_preserve, self.max_preserve
                ),
            ));
        }
        self.check_context_limit(self.default_context_limit)
            .map_err(|e| InvalidSetting::new("default_context_limit", e.reason))?;
        at_least_1("breaker_threshold", self.breaker_threshold as usize)?;
        at_least_1("microcompact_tokens", self.microcompact_tokens)?;
        if let Some(share) = self.background_at
            && !(MIN_BACKGROUND_AT..=1.0).contains(&share)
        {
            return Err(InvalidSetting::new(
                "background_at",
                format!(
                    "({share}) must be between {MIN_BACKGROUND_AT} and 1.0 (1.0: compact only at the trigger)"
                ),
            ));
        }
        if !(1..=MAX_WAIT_S_LIMIT).contains(&self.max_wait_s) {
            return Err(InvalidSetting::new(
                "max_wait_s",
                format!(
                    "({}) must be between 1 and {MAX_WAIT_S_LIMIT} seconds",
                    self.max_wait_s
                ),
            ));
        }
        Ok(())
    }
}

/// The share of a window of `context_limit` tokens that a completion of `completion` tokens
/// takes, for [`CompactionConfig::completion_share`]; `None` for one that takes more than
/// [`MAX_COMPLETION_SHARE`] of it: no compaction makes room beside it, and the model's refusal
/// reaches the client as it came.
pub fn completion_share(context_limit: usize, completion: usize) -> Option<f64> {
    let share = completion as f64 / context_limit.max(1) as f64;
    (share <= MAX_COMPLETION_SHARE).then_some(share)
}

/// A setting that cannot work, naming its key (`max_wait_s`, `[proxy] listen`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} {reason}")]
pub struct InvalidSetting {
    pub key: String,
    pub reason: String,
}

impl InvalidSetting {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> InvalidSetting {
        InvalidSetting {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same, its key named within a config file's `section` (`[compaction]`).
    pub fn in_section(self, section: &str) -> InvalidSetting {
        InvalidSetting {
            key: format!("{section} {}", self.key),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client asking room for a completion larger than the reserve (Claude Code asks 32,000
    /// tokens of a 200,000-token model): the trigger leaves it free, at the window as the model
    /// counts it and at the same window in estimated tokens for a model counting twice the
    /// estimate alike. A smaller one changes nothing; one that takes most of the window is
    /// not kept free.
    #[test]
    fn the_completion_a_client_asks_room_for_is_kept_free() {
        let asking = |completion| CompactionConfig {
            completion_share: completion_share(200_000, completion).unwrap(),
            ..CompactionConfig::default()
        };
        assert_eq!(asking(32_000).token_threshold(200_000), 168_000);
        assert_eq!(asking(64_000).token_threshold(100_000), 68_000);
        assert_eq!(asking(64_000).token_threshold(200_000), 136_000);
        assert_eq!(asking(8_000).token_threshold(200_000), 180_000);
        assert_eq!(asking(0), CompactionConfig::default());
        assert_eq!(completion_share(48_000, 36_000), Some(0.75));
        assert_eq!(completion_share(48_000, 40_000), None);
        assert_eq!(completion_share(48_000, 128_000), None);
    }

    #[test]
    fn a_config_too_large_for_a_session_is_fitted_to_it() {
        let c = CompactionConfig {
            min_preserve: 7_000,
            ..CompactionConfig::default()
        };
        assert!(c.check_context_limit(16_000).is_err());
        let (fitted, why) = c.clone().fitted_to(16_000);
        assert!(fitted.check_context_limit(16_000).is_ok());
        assert!(fitted.max_pinned_tokens(16_000) > 0);
        assert!(why.unwrap().contains("min_preserve 7000"));
        assert_eq!(c.clone().fitted_to(200_000), (c, None), "it fits already");
    }

    /// 16,000 tokens for a model counting twice the estimate: 8,000 estimated, threshold
    /// 6,400. A task of 3,000 pinned when the rate was not known leaves 3,400, under the
    /// 4,000 two floors of 2,000 need: they shrink to leave half of it for the next steps,
    /// not fail every compaction.
    #[test]
    fn pinned_messages_leave_the_summary_and_the_tail_half_the_room_remaining() {
        let c = CompactionConfig::default();
        assert_eq!(c.max_pinned_tokens(8_000), 2_400);
        let fitted = c.clone().fitted_beside(8_000, 3_000);
        assert_eq!(fitted.min_preserve, 850);
        assert!(fitted.max_pinned_tokens(8_000) >= 3_000);
        let budgets = fitted.summary_budget(8_000, 3_000) + fitted.preserve_budget(8_000, 3_000);
        assert!(
            3_000 + budgets <= c.token_threshold(8_000) - 3_400 / 2,
            "{budgets}"
        );
        // A window with room for four floors keeps them.
        assert_eq!(c.clone().fitted_beside(16_000, 1_440), c);
        assert_eq!(c.clone().fitted_beside(128_000, 20_000), c);
        // Past the threshold nothing fits: still an overflow.
        let full = c.clone().fitted_beside(8_000, 7_000);
        assert!(full.max_pinned_tokens(8_000) < 7_000);
    }

    #[test]
    fn reserve_is_the_smaller_of_20000_and_a_fifth() {
        let c = CompactionConfig::default();
        assert_eq!(c.reserve(200_000), 20_000);
        assert_eq!(c.reserve(32_000), 6_400);
        assert_eq!(c.token_threshold(32_000), 25_600);
        let fixed = CompactionConfig {
            reserve_tokens: Some(1_000),
            ..c
        };
        assert_eq!(fixed.token_threshold(32_000), 31_000);
    }

    #[test]
    fn preserve_budget_is_clamped_to_the_spec_range() {
        let c = CompactionConfig::default();
        assert_eq!(c.preserve_budget(4_000, 0), MIN_PRESERVE_RECENT_TOKENS);
        // 32k: threshold 25,600, a sixteenth is 1,600, clamped up to 2,000.
        assert_eq!(c.preserve_budget(32_000, 0), MIN_PRESERVE_RECENT_TOKENS);
        // 128k: threshold 108,000, a sixteenth is 6,750.
        assert_eq!(c.preserve_budget(128_000, 0), 6_750);
        assert_eq!(c.preserve_budget(1_000_000, 0), MAX_PRESERVE_RECENT_TOKENS);
    }

    #[test]
    fn pinned_messages_come_out_of_the_usable_context() {
        let c = CompactionConfig::default();
        // 128k: threshold 108,000; 12,000 pinned leaves 96,000 for summary and tail.
        assert_eq!(c.usable(128_000, 12_000), 96_000);
        assert_eq!(c.preserve_budget(128_000, 12_000), 6_000);
        assert_eq!(c.summary_budget(128_000, 12_000), 12_000);
        assert_eq!(c.max_pinned_tokens(32_000), 21_600);
    }

    #[test]
    fn the_summary_may_grow_to_half_and_the_step_take_most_of_what_the_smallest_summary_leaves() {
        let c = CompactionConfig::default();
        // 16k: threshold 12,800; the smallest summary is min_preserve (2,000).
        assert_eq!(c.summary_budget(16_000, 0), 2_000);
        assert_eq!(c.summary_ceiling(16_000, 0), 6_400);
        assert_eq!(c.step_budget(16_000, 0), 8_100);
        // Whatever is pinned, the summary at its ceiling beside the preserve budget, and the
        // step beside the smallest summary, fit under the trigger.
        for limit in [6_000, 16_000, 32_000, 128_000, 1_000_000] {
            for pinned in [
                0,
                c.max_pinned_tokens(limit) / 2,
                c.max_pinned_tokens(limit),
            ] {
                let usable = c.usable(limit, pinned);
                let with_tail =
                    pinned + c.summary_ceiling(limit, pinned) + c.preserve_budget(limit, pinned);
                let with_step = pinned + c.smallest_summary(usable) + c.step_budget(limit, pinned);
                for after in [with_tail, with_step] {
                    assert!(
                        after <= c.token_threshold(limit),
                        "{limit} {pinned}: {after}"
                    );
                }
            }
        }
    }

    #[test]
    fn nonsense_values_are_rejected() {
        let c = CompactionConfig {
            min_preserve: 10,
            max_preserve: 5,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "min_preserve");
        let c = CompactionConfig {
            max_messages: 0,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let c = CompactionConfig {
            default_context_limit: 1_000_000_000,
            ..Default::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "default_context_limit");
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    #[test]
    fn a_context_limit_must_leave_room_to_compact() {
        let c = CompactionConfig::default();
        let e = c.check_context_limit(1_000).unwrap_err();
        assert!(
            e.to_string().contains("too small for min_preserve 2000"),
            "{e}"
        );
        assert!(c.check_context_limit(5_000).is_err());
        assert!(c.check_context_limit(6_000).is_ok());
        let small = CompactionConfig {
            min_preserve: 200,
            max_preserve: 1_000,
            ..c
        };
        assert!(small.check_context_limit(1_000).is_ok());
    }
}
