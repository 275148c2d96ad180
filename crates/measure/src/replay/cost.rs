//! What a strategy's contexts cost under prompt caching.
//!
//! Model APIs bill a prompt prefix they have seen before at a fraction of the price. The
//! model here: each call's context is a list of messages; the longest run of leading messages
//! identical to the previous call's is the cached prefix; the rest is new. Two price models:
//!
//! | model | cached prefix | the rest |
//! |---|---|---|
//! | Anthropic-style (explicit cache breakpoints, 5-minute lifetime) | read at 0.1x | written at 1.25x |
//! | OpenAI-style (automatic prefix caching, also DeepSeek) | 0.5x | 1x, no write premium |
//!
//! The assumption: every step comes within the cache's lifetime (agents call the model every
//! few seconds), and the cache holds the previous call's prefix. Costs are in token
//! equivalents: a figure of 1,000 is what 1,000 uncached input tokens cost.

use serde::Serialize;

/// Running costs of one strategy's calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct CacheMeter {
    /// The previous call's messages: (content hash, tokens).
    previous: Vec<(u64, usize)>,
    cost: CacheCost,
}

/// Costs under the two price models.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct CacheCost {
    pub anthropic: f64,
    pub openai: f64,
    /// Tokens sent that were a prefix of the previous call (cache hits).
    pub cached_tokens: usize,
    /// Tokens sent that were not.
    pub fresh_tokens: usize,
}

/// Anthropic-style prices of cached and newly written tokens.
const ANTHROPIC_READ: f64 = 0.1;
const ANTHROPIC_WRITE: f64 = 1.25;
/// OpenAI-style price of cached tokens (new ones cost 1).
const OPENAI_CACHED: f64 = 0.5;

impl CacheMeter {
    /// Counts one call whose context is `messages` (hash, tokens), oldest first.
    pub(crate) fn call(&mut self, messages: Vec<(u64, usize)>) {
        let shared = self
            .previous
            .iter()
            .zip(&messages)
            .take_while(|(a, b)| a.0 == b.0)
            .count();
        let cached: usize = messages[..shared].iter().map(|m| m.1).sum();
        let total: usize = messages.iter().map(|m| m.1).sum();
        let fresh = (total - cached) as f64;
        self.cost.anthropic += cached as f64 * ANTHROPIC_READ + fresh * ANTHROPIC_WRITE;
        self.cost.openai += cached as f64 * OPENAI_CACHED + fresh;
        self.cost.cached_tokens += cached;
        self.cost.fresh_tokens += total - cached;
        self.previous = messages;
    }

    pub(crate) fn cost(&self) -> CacheCost {
        self.cost
    }
}

/// A stable 64-bit hash of bytes (FNV-1a): message identity for prefix matching.
pub(crate) fn content_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_context_pays_for_its_prefix_at_the_cached_price() {
        let mut meter = CacheMeter::default();
        meter.call(vec![(1, 100)]);
        meter.call(vec![(1, 100), (2, 50)]);
        let c = meter.cost();
        // First call: 100 written. Second: 100 read, 50 written.
        assert!((c.anthropic - (125.0 + 10.0 + 62.5)).abs() < 1e-9);
        assert!((c.openai - (100.0 + 50.0 + 50.0)).abs() < 1e-9);
    }

    #[test]
    fn a_changed_early_message_loses_the_cache_after_it() {
        let mut meter = CacheMeter::default();
        meter.call(vec![(1, 100), (2, 100), (3, 100)]);
        let first = meter.cost();
        meter.call(vec![(1, 100), (9, 10), (3, 100)]);
        let second = meter.cost().anthropic - first.anthropic;
        assert!((second - (10.0 + 110.0 * 1.25)).abs() < 1e-9);
    }
}
