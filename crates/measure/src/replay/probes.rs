//! Continuation probes: is what the agent continues from after compaction safe to continue
//! from? Each probe is measured against ground truth taken from the transcript itself (the
//! messages the user wrote, the diff a SWE run submitted), never against compactd's own
//! bookkeeping, and read from the final context and the latest compaction.

use compactd_core::compaction::LazyEstimator;
use compactd_core::compaction::constants::MAX_TEXT_CHARS;
use compactd_core::compaction::instruction::{instruction_text, is_substantive};
use compactd_core::compaction::patch::patch_targets;
use compactd_core::compaction::prompt::render_args;
use compactd_core::compaction::redact::find_secrets;
use compactd_core::compaction::sections::split_sections;
use compactd_core::message::{Message, Part, Role};
use serde::Serialize;

/// What the probes found. `None` where a probe does not apply (no system message, no
/// submitted diff, no compaction).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Probes {
    /// Every system message is in the final context, verbatim.
    pub system_messages_kept: Option<bool>,
    /// The first user instruction is in the final context whole (when within the pin size).
    pub first_user_kept: Option<bool>,
    /// Share of user instructions of at most 2,000 characters in the final context whole.
    pub short_user_kept: Option<f64>,
    /// How many of them are not (the figure the share hides in long sessions).
    pub short_user_missing: usize,
    /// The latest substantive user instruction is in the final context (whole, up to 2,000
    /// characters).
    pub latest_user_kept: Option<bool>,
    /// Files of the submitted diff (SWE runs).
    pub diff_files: Option<usize>,
    /// Every file of the submitted diff is in the latest compaction's `modified_files`.
    pub diff_files_listed: Option<bool>,
    /// The latest compaction's `modified_files` per file of the submitted diff.
    pub modified_ratio: Option<f64>,
    /// The same for `modified_files` and `created_files` together (the spec's "modified").
    pub changed_ratio: Option<f64>,
    /// The latest summary's section 9 (next step) says something.
    pub next_step_present: Option<bool>,
    /// Credentials of the transcript found in any summary (values of 8 characters or more).
    pub credentials_leaked: usize,
}

/// The latest compaction, as the probes read it.
pub struct LatestCompaction<'a> {
    pub summary: &'a str,
    pub modified_files: &'a [String],
    pub created_files: &'a [String],
}

/// Everything the probes read.
pub struct ProbeInput<'a> {
    pub messages: &'a [Message],
    /// The diff the run submitted, if it is a SWE run that submitted one.
    pub submission: Option<&'a str>,
    /// All text of the final context.
    pub context_text: &'a str,
    /// Every summary the session's compactions wrote.
    pub summaries: &'a [String],
    pub latest: Option<LatestCompaction<'a>>,
    /// The pin size (`pin_first_user_tokens`) the replay ran with.
    pub pin_tokens: usize,
}

impl Probes {
    pub fn measure(input: &ProbeInput) -> Probes {
        let kept = |text: &str| input.context_text.contains(text.trim());
        let systems: Vec<String> = input
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(Message::joined_text)
            .filter(|t| !t.trim().is_empty())
            .collect();
        let instructions: Vec<String> = input
            .messages
            .iter()
            .filter_map(instruction_text)
            .map(|text| text.trim().to_string())
            .collect();
        let short: Vec<&String> = instructions
            .iter()
            .filter(|t| t.chars().count() <= MAX_TEXT_CHARS)
            .collect();
        let estimator = LazyEstimator::default();
        let diff_files = input.submission.map(diff_files).filter(|f| !f.is_empty());
        let listed = |path: &str, list: &[String]| {
            list.iter()
                .any(|l| l == path || l.ends_with(&format!("/{path}")))
        };
        let latest = input.latest.as_ref();
        Probes {
            system_messages_kept: (!systems.is_empty()).then(|| systems.iter().all(|s| kept(s))),
            first_user_kept: instructions
                .first()
                .filter(|t| estimator.text(t) <= input.pin_tokens)
                .map(|t| kept(t)),
            short_user_kept: (!short.is_empty())
                .then(|| short.iter().filter(|t| kept(t)).count() as f64 / short.len() as f64),
            short_user_missing: short.iter().filter(|t| !kept(t)).count(),
            latest_user_kept: instructions
                .iter()
                .rev()
                .find(|t| is_substantive(t))
                .map(|t| kept(&t.chars().take(MAX_TEXT_CHARS).collect::<String>())),
            diff_files: diff_files.as_ref().map(Vec::len),
            diff_files_listed: diff_files
                .as_ref()
                .zip(latest)
                .map(|(files, latest)| files.iter().all(|f| listed(f, latest.modified_files))),
            modified_ratio: diff_files
                .as_ref()
                .zip(latest)
                .map(|(files, latest)| latest.modified_files.len() as f64 / files.len() as f64),
            changed_ratio: diff_files.as_ref().zip(latest).map(|(files, latest)| {
                (latest.modified_files.len() + latest.created_files.len()) as f64
                    / files.len() as f64
            }),
            next_step_present: latest.map(|l| {
                split_sections(l.summary)[8]
                    .as_deref()
                    .is_some_and(|s| !s.trim().is_empty() && s.trim() != "(none)")
            }),
            credentials_leaked: credentials(input.messages)
                .iter()
                .filter(|c| input.summaries.iter().any(|s| s.contains(c.as_str())))
                .count(),
        }
    }
}

/// The files a submitted diff changes, created or deleted, as the diff names them.
pub(crate) fn diff_files(submission: &str) -> Vec<String> {
    patch_targets(submission, None)
        .into_iter()
        .map(|(_, path)| path)
        .collect()
}

/// Credential values in the transcript, 8 characters or more (shorter ones match too much
/// ordinary text to count as a leak when found).
fn credentials(messages: &[Message]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for part in messages.iter().flat_map(|m| &m.parts) {
        let text = match part {
            Part::Text { text } | Part::Reasoning { text } => text.clone(),
            Part::ToolCall { args, .. } => render_args(args).into_owned(),
            Part::ToolResult { output, .. } => output.clone(),
        };
        found.extend(
            find_secrets(&text)
                .into_iter()
                .filter(|s| s.chars().count() >= 8),
        );
    }
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_read_the_final_context_and_the_latest_compaction() {
        let messages = vec![
            Message::text(Role::System, "You are a careful agent."),
            Message::text(Role::User, "Fix the parser so it keeps CR bytes"),
            Message::text(Role::User, "ok"),
            Message::text(Role::User, "export DB_PASSWORD=hunter2hunter2"),
        ];
        let summary = "## 9. Optional Next Step\nrun tests\n## 6. All user messages\nDB_PASSWORD=hunter2hunter2";
        let probes = Probes::measure(&ProbeInput {
            messages: &messages,
            submission: Some("diff --git a/src/p.rs b/src/p.rs\n--- a/src/p.rs\n+++ b/src/p.rs\n"),
            context_text: "You are a careful agent.\nFix the parser so it keeps CR bytes\n",
            summaries: &[summary.to_string()],
            latest: Some(LatestCompaction {
                summary,
                modified_files: &["/repo/src/p.rs".to_string(), "notes.txt".to_string()],
                created_files: &["t.py".to_string()],
            }),
            pin_tokens: 4_000,
        });
        assert_eq!(probes.system_messages_kept, Some(true));
        assert_eq!(probes.first_user_kept, Some(true));
        assert_eq!(probes.short_user_kept, Some(1.0 / 3.0));
        assert_eq!(probes.latest_user_kept, Some(false));
        assert_eq!(probes.diff_files, Some(1));
        assert_eq!(probes.diff_files_listed, Some(true));
        assert_eq!(probes.modified_ratio, Some(2.0));
        assert_eq!(probes.changed_ratio, Some(3.0));
        assert_eq!(probes.next_step_present, Some(true));
        assert_eq!(probes.credentials_leaked, 1);
    }
}
