//! One compaction, start to finish: plan it with the engine, have a summarizer write the
//! summary (in chunks when the prompt does not fit the summarizer's window), and build the
//! CompactionResult. The daemon, `compactd summarize` and `compactd replay` all go through here,
//! so they compact identically; storing the outcome is the caller's business.

use crate::compaction::chunk::{block_tokens, chunk_ranges};
use crate::compaction::prompt::{PromptInput, build_compaction_prompt};
use crate::compaction::{Boundary, CompactionPlan, CompactionResult, PlanInput, is_blank};
use crate::summarize::{SYSTEM_PROMPT, SummarizeError, Summarizer, SummaryRequest};

/// Why a compaction did not happen when the whole history fits in the preserved tail.
pub const NOTHING_TO_COMPACT: &str = "nothing to compact: every message fits in the preserved tail";

/// A finished compaction, ready to be stored.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub result: CompactionResult,
    pub boundary: Boundary,
    /// Summarizer calls made (more than one when the prompt was chunked).
    pub chunks: usize,
    /// The summarizer that wrote the summary.
    pub summarizer: String,
}

impl Compacted {
    /// Tokens of the summary message: what the context holds besides the preserved tail.
    pub fn summary_tokens(&self) -> usize {
        self.result.post_tokens - self.boundary.preserved_tokens
    }
}

/// Compacts `input` with `summarizer`. `Ok(None)` when there is nothing before the boundary.
pub async fn compact(
    input: &PlanInput<'_>,
    summarizer: &dyn Summarizer,
    compaction_num: u32,
) -> Result<Option<Compacted>, SummarizeError> {
    let plan = CompactionPlan::new(input);
    if !plan.has_work() {
        return Ok(None);
    }
    let compacted = &input.messages[..plan.boundary.index];
    let ranges = match summarizer.context_window() {
        Some(window) => {
            let fixed = fixed_prompt_tokens(input, &plan, summarizer.max_output_tokens());
            let blocks = block_tokens(compacted, plan.masking, &input.estimator);
            chunk_ranges(&blocks, fixed + summarizer.max_output_tokens(), window)
        }
        None => std::iter::once(0..compacted.len()).collect(),
    };
    let mut summary: Option<String> = input.prior_summary.map(str::to_string);
    for range in &ranges {
        let messages = &compacted[range.clone()];
        let prompt = build_compaction_prompt(&PromptInput {
            messages,
            masking: plan.masking.from_message(range.start),
            prior_summary: summary.as_deref(),
            files: &plan.files,
            focus: input.focus,
        });
        let request = SummaryRequest {
            prompt,
            messages: messages.to_vec(),
            prior_summary: summary.clone(),
            files: plan.files.clone(),
            focus: input.focus.map(str::to_string),
            max_summary_tokens: Some(input.config.summary_budget(input.context_limit)),
        };
        let written = summarizer.summarize(&request).await?;
        if is_blank(&written) {
            return Err(SummarizeError::Blank);
        }
        summary = Some(written.trim().to_string());
    }
    let summary = summary.ok_or(SummarizeError::Blank)?;
    Ok(Some(Compacted {
        result: CompactionResult::new(
            summary,
            plan.files,
            plan.pre_tokens,
            plan.boundary.preserved_tokens,
            compaction_num,
            &input.estimator,
        ),
        boundary: plan.boundary,
        chunks: ranges.len(),
        summarizer: summarizer.name(),
    }))
}

/// Tokens of a prompt's parts other than the conversation: system prompt, task, focus, file
/// lists, and room for a prior summary as long as the summarizer may write.
fn fixed_prompt_tokens(input: &PlanInput, plan: &CompactionPlan, max_output: usize) -> usize {
    let empty = build_compaction_prompt(&PromptInput {
        messages: &[],
        masking: plan.masking,
        prior_summary: None,
        files: &plan.files,
        focus: input.focus,
    });
    let prior = input.prior_summary.map_or(0, |p| input.estimator.text(p));
    input.estimator.text(SYSTEM_PROMPT) + input.estimator.text(&empty) + prior.max(max_output)
}
