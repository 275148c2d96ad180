//! Chunking: when the compaction prompt would not fit the summarizer's own context window,
//! the messages are compacted in chunks, oldest first, each chunk's summary becoming the prior
//! summary of the next (the spec's incremental mechanism, applied within one compaction).

use super::estimate::LazyEstimator;
use super::mask::Masking;
use super::prompt::{call_names, write_message};
use crate::message::Message;
use std::ops::Range;

/// The estimated prompt tokens each message adds (its rendered, truncated, masked block).
pub fn block_tokens(
    messages: &[Message],
    masking: Masking,
    estimator: &LazyEstimator,
) -> Vec<usize> {
    let names = call_names(messages);
    let mut buffer = String::new();
    messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            buffer.clear();
            write_message(&mut buffer, message, index, masking, &names);
            estimator.text(&buffer)
        })
        .collect()
}

/// Splits messages with the given block sizes into consecutive ranges, each of whose blocks
/// plus `fixed_tokens` (task, files, focus and room for the prior summary) fit `window`.
/// A message too large to fit even alone gets a chunk of its own.
pub fn chunk_ranges(
    block_tokens: &[usize],
    fixed_tokens: usize,
    window: usize,
) -> Vec<Range<usize>> {
    let room = window.saturating_sub(fixed_tokens);
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for (i, &tokens) in block_tokens.iter().enumerate() {
        if i > start && used + tokens > room {
            ranges.push(start..i);
            start = i;
            used = 0;
        }
        used += tokens;
    }
    if start < block_tokens.len() {
        ranges.push(start..block_tokens.len());
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_that_fits_is_one_chunk() {
        assert_eq!(chunk_ranges(&[10, 10, 10], 50, 100), vec![0..3]);
        assert_eq!(chunk_ranges(&[], 50, 100), Vec::<Range<usize>>::new());
    }

    #[test]
    fn chunks_fill_the_room_left_by_the_fixed_part_in_order() {
        assert_eq!(
            chunk_ranges(&[10, 10, 10, 10, 10], 75, 100),
            vec![0..2, 2..4, 4..5]
        );
    }

    #[test]
    fn an_oversized_message_stands_alone() {
        assert_eq!(chunk_ranges(&[5, 500, 5], 50, 100), vec![0..1, 1..2, 2..3]);
    }
}
