//! The compaction trigger (SPEC.md 5.2): too many messages, or too many tokens.

use super::config::CompactionConfig;
use serde::{Deserialize, Serialize};

/// Why a compaction ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The active message count exceeded `max_messages`.
    Messages,
    /// The estimated tokens reached `context_limit - reserve`.
    Tokens,
    /// Someone asked (`/compact`, `POST /session/{id}/summarize`).
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Messages => "messages",
            Trigger::Tokens => "tokens",
            Trigger::Manual => "manual",
        }
    }

    pub fn parse(name: &str) -> Option<Trigger> {
        [Trigger::Messages, Trigger::Tokens, Trigger::Manual]
            .into_iter()
            .find(|t| t.as_str() == name)
    }
}

/// Whether a session with `active_messages` messages since its last compaction and an estimated
/// `tokens` in context must compact now. Tokens are checked first: they are what overflows.
pub fn check_trigger(
    active_messages: usize,
    tokens: usize,
    context_limit: usize,
    config: &CompactionConfig,
) -> Option<Trigger> {
    if tokens >= config.token_threshold(context_limit) {
        Some(Trigger::Tokens)
    } else if active_messages > config.max_messages {
        Some(Trigger::Messages)
    } else {
        None
    }
}

/// Where a session stands against its triggers: nothing due, a compaction due that may run in
/// the background while the agent goes on, or a context the agent must not be handed as it
/// is. Only tokens make a context urgent: a message count over `max_messages` never
/// overflows a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    No,
    Background(Trigger),
    Urgent(Trigger),
}

/// A session's [`Due`]: urgent at the trigger, in the background past
/// [`CompactionConfig::background_threshold`] or past `max_messages`.
pub fn check_due(
    active_messages: usize,
    tokens: usize,
    context_limit: usize,
    pinned_tokens: usize,
    summary_tokens: usize,
    config: &CompactionConfig,
) -> Due {
    match check_trigger(active_messages, tokens, context_limit, config) {
        Some(Trigger::Tokens) => Due::Urgent(Trigger::Tokens),
        Some(trigger) => Due::Background(trigger),
        None if tokens
            >= config.background_threshold(context_limit, pinned_tokens, summary_tokens) =>
        {
            Due::Background(Trigger::Tokens)
        }
        None => Due::No,
    }
}

impl Due {
    /// The trigger of a compaction due now, urgent or not.
    pub fn trigger(self) -> Option<Trigger> {
        match self {
            Due::No => None,
            Due::Background(trigger) | Due::Urgent(trigger) => Some(trigger),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serde_names_and_parse_back() {
        for trigger in [Trigger::Messages, Trigger::Tokens, Trigger::Manual] {
            let wire = serde_json::to_value(trigger).unwrap();
            assert_eq!(wire, trigger.as_str());
            assert_eq!(Trigger::parse(trigger.as_str()), Some(trigger));
        }
    }

    #[test]
    fn more_than_max_messages_triggers() {
        let c = CompactionConfig::default();
        assert_eq!(check_trigger(80, 0, 100_000, &c), None);
        assert_eq!(check_trigger(81, 0, 100_000, &c), Some(Trigger::Messages));
    }

    #[test]
    fn reaching_limit_minus_reserve_triggers() {
        let c = CompactionConfig::default();
        // 100k limit: reserve 20k, threshold 80k.
        assert_eq!(check_trigger(1, 79_999, 100_000, &c), None);
        assert_eq!(check_trigger(1, 80_000, 100_000, &c), Some(Trigger::Tokens));
        assert_eq!(
            check_trigger(500, 80_000, 100_000, &c),
            Some(Trigger::Tokens)
        );
    }

    #[test]
    fn a_compaction_is_due_in_the_background_before_the_trigger_and_urgent_at_it() {
        let c = CompactionConfig {
            background_at: Some(0.8),
            ..CompactionConfig::default()
        };
        // 100k: trigger 80,000; 4,000 pinned and a 6,000-token summary leave 70,000 of room,
        // four fifths of it full at 66,000.
        assert_eq!(c.background_threshold(100_000, 4_000, 6_000), 66_000);
        assert_eq!(check_due(10, 65_999, 100_000, 4_000, 6_000, &c), Due::No);
        assert_eq!(
            check_due(10, 66_000, 100_000, 4_000, 6_000, &c),
            Due::Background(Trigger::Tokens)
        );
        assert_eq!(
            check_due(10, 80_000, 100_000, 4_000, 6_000, &c),
            Due::Urgent(Trigger::Tokens)
        );
        // Many messages never overflow: their compaction runs in the background.
        assert_eq!(
            check_due(81, 100, 100_000, 0, 0, &c),
            Due::Background(Trigger::Messages)
        );
        // At 1.0 the background line is the trigger itself.
        let at_trigger = CompactionConfig {
            background_at: Some(1.0),
            ..c
        };
        assert_eq!(
            at_trigger.background_threshold(100_000, 4_000, 6_000),
            80_000
        );
        assert_eq!(
            check_due(10, 79_999, 100_000, 4_000, 6_000, &at_trigger),
            Due::No
        );
    }

    #[test]
    fn the_context_after_a_compaction_stays_under_the_background_line() {
        // What a compaction leaves (pinned, a summary at its ceiling, the preserve budget) is
        // under the line drawn from that summary, at the lowest background_at allowed: a
        // compaction started there does not start the next. (Below 16k the floor of the
        // preserve budget, 2,000 tokens, takes more than the room's share; the trigger's own
        // bound still holds there. A current step larger than the tail may take the room up
        // to near the trigger: the window has room for it, and the next compaction follows.)
        let c = CompactionConfig {
            background_at: Some(super::super::constants::MIN_BACKGROUND_AT),
            ..CompactionConfig::default()
        };
        for limit in [16_000, 32_000, 128_000, 1_000_000] {
            for pinned in [0, c.max_pinned_tokens(limit) / 2] {
                let summary = c.summary_ceiling(limit, pinned);
                let after = pinned + summary + c.preserve_budget(limit, pinned);
                assert!(
                    after < c.background_threshold(limit, pinned, summary),
                    "{limit} {pinned}: {after}"
                );
            }
        }
    }
}
