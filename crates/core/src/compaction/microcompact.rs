//! Microcompaction: masking old tool outputs in the context before a summary is needed.
//!
//! Tool outputs are most of what fills an agent's window, and old ones are rarely read again.
//! When the context passes `microcompact_tokens` (11,000 by default, at most half the
//! trigger), every tool output older than the
//! newest `preserveRecentOutputs` in the active messages (but one no longer than it) is
//! replaced *in the context* by a placeholder that says what was there and where to get it
//! back:
//! `[output of bash masked: 12,480 chars; seq 412 of session demo, read_messages has it]` (the original stays stored; `GET
//! /session/{id}/message?after=411&limit=1` returns it). A summary compaction runs only when
//! masking no longer brings the session under its trigger.
//!
//! Masking moves in batches: it runs only when it would save at least
//! [`MIN_BATCH_SHARE`] of the point where it starts, so the context's prefix stays
//! byte-for-byte stable between two maskings (prompt caches keep working), instead of
//! changing an early message at every step as sliding-window masking does.

use super::config::CompactionConfig;
use super::origin::Origin;
use crate::message::Part;

/// A masking runs only when it saves at least this share of the token count where masking
/// starts: fewer, larger batches keep the prefix stable.
pub const MIN_BATCH_SHARE: f64 = 0.5;

/// What a masked output reads in the context.
pub fn placeholder(tool: &str, chars: usize, at: Origin) -> String {
    format!(
        "[output of {tool} masked: {} chars; {at}]",
        thousands(chars)
    )
}

/// `12480` as `12,480`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The parts of message `seq` with every tool output replaced by its placeholder (but one no
/// longer than it: masking it saves nothing, and the client's own blocks, such as Claude
/// Code's tool references that load its deferred tools, would be lost with it); `None` when
/// no output of the message is replaced. `tool_of` names the tool of a call id.
pub fn masked_parts<'a>(
    parts: &[Part],
    at: Origin,
    tool_of: impl Fn(&str) -> Option<&'a str>,
) -> Option<Vec<Part>> {
    let mut replaced = false;
    let masked = parts
        .iter()
        .map(|part| match part {
            Part::ToolResult {
                call_id,
                name,
                output,
                is_error,
            } => {
                let tool = name
                    .as_deref()
                    .or_else(|| tool_of(call_id))
                    .unwrap_or("tool");
                let chars = output.chars().count();
                let masked = placeholder(tool, chars, at);
                let shorter = chars > masked.chars().count();
                replaced |= shorter;
                Part::ToolResult {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    output: if shorter { masked } else { output.clone() },
                    is_error: *is_error,
                }
            }
            other => other.clone(),
        })
        .collect();
    replaced.then_some(masked)
}

/// Where masking starts for a session, as its config and context limit say, before its
/// pinned messages are counted (those change with appends; the config does not). An append
/// carries it into its own transaction, so deciding after each append whether to mask costs
/// no second write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskingStart {
    floor: usize,
}

impl MaskingStart {
    /// `None` when microcompaction is off.
    pub fn of(config: &CompactionConfig, context_limit: usize) -> Option<MaskingStart> {
        config.microcompact.then(|| MaskingStart {
            floor: config
                .microcompact_tokens
                .min(config.token_threshold(context_limit) / 2),
        })
    }

    /// The token count from which masking may run, and the least it must save when it does:
    /// pinned messages are never masked, so masking starts above them.
    pub fn thresholds(self, pinned_tokens: usize) -> (usize, usize) {
        let start = self.floor.max(pinned_tokens);
        let min_saving = (start as f64 * MIN_BATCH_SHARE) as usize;
        (start, min_saving.max(1))
    }

    /// For a context of `context_tokens` past where masking starts, the least a masking must
    /// save; `None` below it.
    pub fn saving_due(self, context_tokens: usize, pinned_tokens: usize) -> Option<usize> {
        let (start, min_saving) = self.thresholds(pinned_tokens);
        (context_tokens >= start).then_some(min_saving)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placeholder_says_what_was_there_and_where_it_is() {
        let at = |session, seq| Origin { session, seq };
        assert_eq!(
            placeholder("bash", 12_480, at("demo", 412)),
            "[output of bash masked: 12,480 chars; seq 412 of session demo, read_messages has it]"
        );
        assert_eq!(
            placeholder("read", 7, at("", 3)),
            "[output of read masked: 7 chars; seq 3]"
        );
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn outputs_are_masked_and_everything_else_kept() {
        let parts = vec![
            Part::Text { text: "see".into() },
            Part::ToolResult {
                call_id: "c1".into(),
                name: None,
                output: "x".repeat(100),
                is_error: true,
            },
        ];
        let at = Origin {
            session: "",
            seq: 9,
        };
        let masked = masked_parts(&parts, at, |id| (id == "c1").then_some("grep")).unwrap();
        assert_eq!(masked[0], parts[0]);
        assert_eq!(
            masked[1],
            Part::ToolResult {
                call_id: "c1".into(),
                name: None,
                output: "[output of grep masked: 100 chars; seq 9]".into(),
                is_error: true,
            }
        );
        assert!(masked_parts(&[Part::Text { text: "t".into() }], at, |_| None).is_none());
    }

    /// An output no longer than its placeholder stays as it was: a ToolSearch answer of tool
    /// references (read as no text), a short `ok`; a message of only such is not masked.
    #[test]
    fn an_output_no_longer_than_its_placeholder_stays() {
        let result = |id: &str, output: &str| Part::ToolResult {
            call_id: id.into(),
            name: None,
            output: output.into(),
            is_error: false,
        };
        let parts = vec![
            result("s1", ""),
            result("c2", "ok"),
            result("c1", &"x".repeat(200)),
        ];
        let at = Origin {
            session: "demo",
            seq: 9,
        };
        let masked = masked_parts(&parts, at, |_| Some("ToolSearch")).unwrap();
        assert_eq!(masked[..2], parts[..2]);
        assert_ne!(masked[2], parts[2]);
        // A message none of whose outputs would be replaced is not masked at all.
        assert!(masked_parts(&parts[..2], at, |_| Some("ToolSearch")).is_none());
    }

    #[test]
    fn masking_starts_at_a_share_of_the_trigger_and_moves_in_batches() {
        let masking_thresholds = |config: &CompactionConfig, limit, pinned| {
            MaskingStart::of(config, limit).map(|start| start.thresholds(pinned))
        };
        let config = CompactionConfig::default();
        // 32k and 128k: 11,000 tokens, half of it saved at a time.
        for limit in [32_000, 128_000] {
            let (start, saving) = masking_thresholds(&config, limit, 0).unwrap();
            assert_eq!((start, saving), (11_000, 5_500));
        }
        // 16k: trigger 12,800, masking from half of it.
        assert_eq!(masking_thresholds(&config, 16_000, 0), Some((6_400, 3_200)));
        // Pinned messages are never masked, so masking starts above them.
        assert_eq!(
            masking_thresholds(&config, 128_000, 12_000),
            Some((12_000, 6_000))
        );
        let off = CompactionConfig {
            microcompact: false,
            ..config
        };
        assert_eq!(masking_thresholds(&off, 32_000, 0), None);
    }
}
