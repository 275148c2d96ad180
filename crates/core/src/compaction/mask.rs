//! Observation masking (SPEC.md 5.3): in the compaction prompt only, all but the newest
//! [`PRESERVE_RECENT_OUTPUTS`](super::constants::PRESERVE_RECENT_OUTPUTS) tool outputs read
//! "[output masked for compaction]". Stored messages are never changed; this module only
//! decides *which* outputs the prompt builder hides.

use crate::message::{Message, Part};
use std::borrow::Borrow;

/// Which tool results of a message list are masked: every result before a cut-off position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masking {
    /// (message index, part index) of the oldest result kept verbatim; results before it are
    /// masked. `None` masks nothing.
    keep_from: Option<(usize, usize)>,
}

impl Masking {
    /// Masks nothing.
    pub fn none() -> Masking {
        Masking { keep_from: None }
    }

    /// Masks all tool results but the `keep_recent` newest.
    pub fn keep_recent<M: Borrow<Message>>(messages: &[M], keep_recent: usize) -> Masking {
        let mut seen = 0;
        for (mi, message) in messages.iter().enumerate().rev() {
            for (pi, part) in message.borrow().parts.iter().enumerate().rev() {
                if matches!(part, Part::ToolResult { .. }) {
                    seen += 1;
                    if seen == keep_recent {
                        return Masking {
                            keep_from: Some((mi, pi)),
                        };
                    }
                }
            }
        }
        // Fewer results than we keep: nothing to mask.
        Masking::none()
    }

    /// The same masking seen from a sub-list that starts at message `start`.
    pub fn from_message(self, start: usize) -> Masking {
        Masking {
            keep_from: self.keep_from.map(|(m, p)| {
                if m >= start {
                    (m - start, p)
                } else {
                    // The cut-off lies before the sub-list: nothing in it is masked.
                    (0, 0)
                }
            }),
        }
    }

    /// Whether the tool result at part `part` of message `message` is masked.
    pub fn is_masked(&self, message: usize, part: usize) -> bool {
        match self.keep_from {
            Some(keep_from) => (message, part) < keep_from,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    fn result(id: &str) -> Part {
        Part::ToolResult {
            call_id: id.into(),
            name: None,
            output: "out".into(),
            is_error: false,
        }
    }

    fn masked_count(messages: &[Message], m: Masking) -> usize {
        let mut n = 0;
        for (mi, msg) in messages.iter().enumerate() {
            for (pi, p) in msg.parts.iter().enumerate() {
                if matches!(p, Part::ToolResult { .. }) && m.is_masked(mi, pi) {
                    n += 1;
                }
            }
        }
        n
    }

    #[test]
    fn exactly_five_results_mask_nothing_and_six_mask_the_oldest() {
        let five: Vec<Message> = (0..5)
            .map(|i| Message {
                role: Role::Tool,
                parts: vec![result(&i.to_string())],
            })
            .collect();
        assert_eq!(masked_count(&five, Masking::keep_recent(&five, 5)), 0);

        let mut six = five.clone();
        six.push(Message {
            role: Role::Tool,
            parts: vec![result("5")],
        });
        let m = Masking::keep_recent(&six, 5);
        assert_eq!(masked_count(&six, m), 1);
        assert!(m.is_masked(0, 0));
        assert!(!m.is_masked(1, 0));
    }

    #[test]
    fn several_results_in_one_message_count_separately() {
        // Anthropic style: one user message answers three parallel calls.
        let msgs = vec![
            Message {
                role: Role::User,
                parts: vec![result("a"), result("b"), result("c")],
            },
            Message {
                role: Role::User,
                parts: vec![result("d"), result("e"), result("f")],
            },
        ];
        let m = Masking::keep_recent(&msgs, 5);
        assert_eq!(masked_count(&msgs, m), 1);
        assert!(m.is_masked(0, 0));
        assert!(!m.is_masked(0, 1));
    }
}
