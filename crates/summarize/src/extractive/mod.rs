//! The built-in extractive summarizer: offline, deterministic, no model.
//!
//! It fills the nine sections from the conversation itself, one file per kind of section:
//! [`request`] (1: the original and the current request), [`concepts`] (2), [`files`] (3),
//! [`errors`] (4), [`work`] (5 and 8: notes and [`reports`], the last action and its outcome),
//! [`user_messages`] (6: every instruction, carried from summary to summary), [`todos`] (7) and
//! [`next_step`] (9). Each section is carried forward from the prior summary where the new
//! messages do not replace it.
//!
//! **Shrink order.** A summary must fit its budget. User messages are the last thing shortened:
//! first the other sections shrink to a reduced and then a floor level of detail, in the order
//! notes (5), current work (8), errors (4), files (3), concepts (2), pending tasks (7). What is
//! then still over the budget is user messages, and for them the summary may grow, up to its
//! ceiling (half the usable context). Only past that are older user messages shortened,
//! oldest first (the newest ten stay whole), each pointing to its stored original by seq,
//! and, for sessions with thousands of them, the oldest folded into one line naming their
//! seqs in the stored history.

mod concepts;
mod errors;
mod files;
mod next_step;
mod reports;
mod request;
mod text;
mod todos;
mod user_messages;
mod work;

pub use errors::reports_failure;

use super::{SummarizeError, Summarizer, SummaryRequest};
use crate::compaction::LazyEstimator;
use crate::compaction::sections::{SUMMARY_SECTIONS, heading, split_sections};
use async_trait::async_trait;
use std::fmt::Write;
use user_messages::UserMessages;

/// The extractive summarizer.
#[derive(Debug, Default, Clone)]
pub struct Extractive;

#[async_trait]
impl Summarizer for Extractive {
    fn name(&self) -> String {
        "extractive".into()
    }

    fn is_instant(&self) -> bool {
        true
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        Ok(extractive_summary(request))
    }
}

/// How much a section says. Sections shrink from `Full` to `Floor` to meet the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Detail {
    Full,
    Reduced,
    Floor,
}

/// Sections that shrink before user messages do, first to last (0-based indices).
const SHRINK_ORDER: [usize; 6] = [4, 7, 3, 2, 1, 6];

/// What the sections are written from: the request and the prior summary, split.
pub struct Sources<'a> {
    pub request: &'a SummaryRequest,
    /// The prior summary's sections (all `None` without one, or for a prose summary).
    pub prior: [Option<String>; 9],
    /// A prior summary without our headings (another summarizer's prose), kept whole.
    pub unstructured_prior: Option<&'a str>,
    /// The task list's unfinished items, for sections 7 and 9 ([`todos::pending_tasks`]).
    pending_tasks: Option<Vec<todos::Todo>>,
}

/// Writes the nine-section summary of `request`.
pub fn extractive_summary(request: &SummaryRequest) -> String {
    let prior = request
        .prior_summary
        .as_deref()
        .map(split_sections)
        .unwrap_or_default();
    let unstructured_prior = request
        .prior_summary
        .as_deref()
        .filter(|p| !p.trim().is_empty() && prior.iter().all(Option::is_none));
    let pending_tasks = todos::pending_tasks(prior[6].as_deref(), &request.messages);
    let sources = Sources {
        request,
        prior,
        unstructured_prior,
        pending_tasks,
    };
    let mut users = UserMessages::carried(sources.prior[5].as_deref());
    users.add_all(request);

    let mut details = [Detail::Full; 9];
    let mut summary = render(&sources, &details, &users);
    let Some(budget) = request.max_summary_tokens else {
        return summary;
    };
    let ceiling = request.summary_ceiling_tokens.unwrap_or(budget).max(budget);
    let estimator = LazyEstimator::default();
    let over = |s: &str, limit: usize| estimator.text(s) > limit;
    // About how many characters take `s` past the ceiling (and a margin).
    let excess_chars = |s: &str| {
        let excess_tokens = estimator.text(s).saturating_sub(ceiling);
        (excess_tokens as f64 / estimator.tokens_per_char) as usize + 64
    };
    for level in [Detail::Reduced, Detail::Floor] {
        for section in SHRINK_ORDER {
            if !over(&summary, budget) {
                return summary;
            }
            details[section] = level;
            summary = render(&sources, &details, &users);
        }
    }
    // Every other section is at its floor: what is left over the budget is user messages, and
    // for them the summary may grow up to its ceiling.
    // Past it, the oldest are shortened, to fewer characters each round, each pointing to its
    // stored original by seq.
    for max_chars in [500, 200, 80] {
        if !over(&summary, ceiling) {
            return summary;
        }
        users.shorten_oldest(max_chars, excess_chars(&summary));
        summary = render(&sources, &details, &users);
    }
    // Thousands of user messages: even shortened they would crowd out the conversation.
    // The oldest then stand as one line naming their seqs in the stored history, where they
    // remain whole.
    while over(&summary, ceiling) && users.collapse_oldest() {
        summary = render(&sources, &details, &users);
    }
    // A window too small for the newest ten whole: all but the newest are shortened too.
    for max_chars in [500, 200] {
        if !over(&summary, ceiling) {
            break;
        }
        users.shorten_recent(max_chars, excess_chars(&summary));
        summary = render(&sources, &details, &users);
    }
    summary
}

fn render(sources: &Sources, details: &[Detail; 9], users: &UserMessages) -> String {
    let bodies = [
        request::section(sources),
        concepts::section(sources, details[1]),
        files::section(sources, details[2]),
        errors::section(sources, details[3]),
        work::problem_solving(sources, details[4]),
        users.render(),
        todos::section(sources, details[6]),
        work::current_work(sources, details[7]),
        next_step::section(sources),
    ];
    let mut out = String::new();
    for (section, body) in SUMMARY_SECTIONS.iter().zip(&bodies) {
        let body = if body.trim().is_empty() {
            "(none)"
        } else {
            body.trim_end()
        };
        let _ = write!(out, "{}\n{}\n\n", heading(section), body);
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests;
