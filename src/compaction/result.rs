//! CompactionResult (SPEC.md 5.6) and the summary message that replaces compacted history.

use super::estimate::LazyEstimator;
use super::files::FileLists;
use crate::message::{Message, Role};
use serde::{Deserialize, Serialize};

/// The outcome of one successful compaction, with the spec's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionResult {
    pub summary: String,
    pub read_files: Vec<String>,
    pub modified_files: Vec<String>,
    /// Estimated context tokens before: prior summary plus every active message.
    pub pre_tokens: usize,
    /// Estimated context tokens after: the summary message plus the preserved tail.
    pub post_tokens: usize,
    /// 1-based count of this session's compactions.
    pub compaction_num: u32,
}

/// What a summary looks like to the model: the first line says what follows.
const SUMMARY_HEADER: &str =
    "This conversation continues from an earlier part that was compacted. Summary of it:";

/// The user-role message that stands for the compacted history in the context.
pub fn summary_message(summary: &str) -> Message {
    Message::text(
        Role::User,
        format!("{SUMMARY_HEADER}\n\n{}", summary.trim()),
    )
}

/// A blank summary (empty or whitespace only) is a failed compaction (SPEC.md 5.6).
pub fn is_blank(summary: &str) -> bool {
    summary.trim().is_empty()
}

impl CompactionResult {
    pub fn new(
        summary: String,
        files: FileLists,
        pre_tokens: usize,
        preserved_tokens: usize,
        compaction_num: u32,
        estimator: &LazyEstimator,
    ) -> CompactionResult {
        let post_tokens = estimator.message(&summary_message(&summary)) + preserved_tokens;
        CompactionResult {
            summary,
            read_files: files.read,
            modified_files: files.modified,
            pre_tokens,
            post_tokens,
            compaction_num,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_means_whitespace_only() {
        assert!(is_blank(""));
        assert!(is_blank(" \n\t "));
        assert!(!is_blank(" x "));
    }

    #[test]
    fn post_tokens_count_the_summary_message_and_the_tail() {
        let e = LazyEstimator::default();
        let r = CompactionResult::new("abcd".into(), FileLists::default(), 1000, 100, 1, &e);
        assert_eq!(r.post_tokens, e.message(&summary_message("abcd")) + 100);
        assert!(summary_message("abcd").joined_text().ends_with("\n\nabcd"));
    }
}
