//! CompactionResult (SPEC.md 5.6) and the summary message that replaces compacted history.

use crate::message::{Message, Role};
use serde::{Deserialize, Serialize};

/// The outcome of one successful compaction, with the spec's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct CompactionResult {
    pub summary: String,
    pub read_files: Vec<String>,
    pub modified_files: Vec<String>,
    /// Files the session made (first touched by a whole-file write); the spec counts them as
    /// modified.
    #[serde(default)]
    pub created_files: Vec<String>,
    /// Files the session removed.
    #[serde(default)]
    pub deleted_files: Vec<String>,
    /// Estimated context tokens before: pinned messages, the prior summary, every other
    /// active message.
    pub pre_tokens: usize,
    /// Estimated context tokens after: pinned messages, the summary message, the preserved tail.
    pub post_tokens: usize,
    /// 1-based count of this session's compactions.
    pub compaction_num: u32,
}

/// What a summary looks like to the model: the first line says what follows.
const SUMMARY_HEADER: &str =
    "This conversation continues from an earlier part that was compacted. Summary of it:";

/// The user-role message that stands for the compacted history in the context.
/// The summary as the context shows it: the header, how to recall what it leaves out (when
/// the session is known), then the summary.
pub fn summary_message(summary: &str, session: &str) -> Message {
    Message::text(
        Role::User,
        format!(
            "{SUMMARY_HEADER}{}\n\n{}",
            super::origin::recall_note(session),
            summary.trim()
        ),
    )
}

/// A blank summary (empty or whitespace only) is a failed compaction (SPEC.md 5.6).
pub fn is_blank(summary: &str) -> bool {
    summary.trim().is_empty()
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
    fn the_summary_message_says_what_follows() {
        let text = summary_message(" abcd \n", "").joined_text();
        assert!(text.starts_with("This conversation continues from an earlier part"));
        assert!(text.ends_with("\n\nabcd"));
    }
}
