//! The compaction trigger (SPEC.md 5.2): too many messages, or too many tokens.

use super::config::CompactionConfig;
use serde::{Deserialize, Serialize};

/// Why a compaction ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
}
