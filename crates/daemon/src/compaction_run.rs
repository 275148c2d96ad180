//! One compaction, start to finish: plan it with the engine, have a summarizer write the
//! summary (in chunks when the prompt does not fit the summarizer's window), redact
//! credentials, and build the CompactionResult. The daemon, `compactd summarize` and
//! `compactd replay` all go through here, so they compact identically; storing the outcome is
//! the caller's business.

use crate::compaction::chunk::{block_tokens, chunk_ranges};
use crate::compaction::instruction::instruction_text;
use crate::compaction::kept_instructions::{Instruction, keep_instructions};
use crate::compaction::prompt::{PromptInput, build_compaction_prompt};
use crate::compaction::redact::redact_secrets;
use crate::compaction::{
    Boundary, CompactionPlan, CompactionResult, PinnedOverflow, PlanInput, is_blank,
    summary_message,
};
use crate::summarize::{SYSTEM_PROMPT, SummarizeError, Summarizer, SummaryRequest, TaskNote};

/// Why a compaction did not happen when the whole history fits in the preserved tail.
pub const NOTHING_TO_COMPACT: &str = "nothing to compact: every message fits in the preserved tail";

/// Why a compaction failed. Either way the session is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    #[error(transparent)]
    Summarizer(#[from] SummarizeError),
    #[error(transparent)]
    PinnedOverflow(#[from] PinnedOverflow),
}

/// A finished compaction, ready to be stored.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub result: CompactionResult,
    pub boundary: Boundary,
    /// Tokens of the summary message.
    pub summary_tokens: usize,
    /// Summarizer calls made (more than one when the prompt was chunked).
    pub chunks: usize,
    /// The summarizer that wrote the summary.
    pub summarizer: String,
}

/// Compacts `input` with `summarizer`. `Ok(None)` when there is nothing before the boundary.
pub async fn compact(
    input: &PlanInput<'_>,
    summarizer: &dyn Summarizer,
    compaction_num: u32,
) -> Result<Option<Compacted>, CompactError> {
    match plan(input)? {
        Some(plan) => run(input, &plan, summarizer, compaction_num)
            .await
            .map(Some),
        None => Ok(None),
    }
}

/// The plan of a compaction of `input`; `None` when there is nothing to compact. Planning a
/// session of thousands of messages takes milliseconds of CPU: off the runtime's worker.
pub(crate) fn plan(input: &PlanInput) -> Result<Option<CompactionPlan>, CompactError> {
    let plan = crate::blocking::off_the_worker(|| CompactionPlan::new(input));
    if let Some(overflow) = plan.pinned_overflow {
        return Err(overflow.into());
    }
    Ok(plan.has_work().then_some(plan))
}

/// Runs a planned compaction with `summarizer`. A panic of the summarizer is a failure like
/// any other, so it is recorded and the session stays as it was. A summarizer that only
/// computes (the built-in one: hundreds of milliseconds for thousands of messages) runs off
/// the runtime's worker, so the daemon's other connections are served meanwhile.
pub(crate) async fn run(
    input: &PlanInput<'_>,
    plan: &CompactionPlan,
    summarizer: &dyn Summarizer,
    compaction_num: u32,
) -> Result<Compacted, CompactError> {
    use futures_util::FutureExt;
    let summarizing =
        std::panic::AssertUnwindSafe(summarize(input, plan, summarizer, compaction_num))
            .catch_unwind();
    let outcome = match summarizer.is_instant() {
        true => crate::blocking::computed_off_the_worker(summarizing).await,
        false => summarizing.await,
    };
    outcome.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(SummarizeError::Internal(format!("the summarizer panicked: {what}")).into())
    })
}

/// How many times a compaction cuts its chunks smaller after the summarizer said the prompt
/// did not fit its window, before it gives up.
const MAX_RECHUNKS: usize = 4;

async fn summarize(
    input: &PlanInput<'_>,
    plan: &CompactionPlan,
    summarizer: &dyn Summarizer,
    compaction_num: u32,
) -> Result<Compacted, CompactError> {
    let (messages, seqs) = plan.summarized_messages(input);
    // Rendered to count tokens only when chunking needs them (a summarizer without a window
    // takes everything in one call).
    let blocks = std::sync::OnceLock::new();
    let blocks = || blocks.get_or_init(|| block_tokens(&messages, plan.masking, &input.estimator));
    let reserved = fixed_prompt_tokens(input, plan, summarizer.max_output_tokens())
        + summarizer.max_output_tokens();
    let mut ranges = match summarizer.context_window() {
        Some(window) => chunk_ranges(blocks(), reserved, window),
        None => std::iter::once(0..messages.len()).collect(),
    };
    let chunks = Chunks {
        input,
        plan,
        summarizer,
        messages: &messages,
        seqs: &seqs,
    };
    let mut rechunks = 0;
    loop {
        match chunks.summarize(&ranges).await {
            Ok(summary) => {
                // A model (or a command) may ignore the length it was given; stored, its
                // summary would put the context over its trigger or its limit. The built-in
                // summarizer shapes its own to the ceiling and passes it only for the recent
                // user messages it keeps whole (failing it would leave nothing to fall back
                // on), and builds its section 6 itself.
                let summary = match summarizer.is_instant() {
                    true => summary,
                    false => {
                        let tokens = input.estimator.text(&summary);
                        if tokens > plan.summary_ceiling {
                            return Err(SummarizeError::TooLong {
                                tokens,
                                ceiling: plan.summary_ceiling,
                            }
                            .into());
                        }
                        with_every_instruction(input, plan, &messages, &seqs, summary, tokens)
                    }
                };
                let chunks = ranges.len();
                return Ok(finish(
                    input,
                    plan,
                    summary,
                    chunks,
                    summarizer,
                    compaction_num,
                ));
            }
            // The model's window is smaller than we were told (or than it says): halve the
            // largest chunk and start over, as long as a chunk can still be split.
            Err(SummarizeError::ContextExceeded(why))
                if rechunks < MAX_RECHUNKS && ranges.iter().any(|r| r.len() > 1) =>
            {
                let largest = ranges
                    .iter()
                    .map(|r| blocks()[r.clone()].iter().sum::<usize>());
                let room = largest.max().unwrap_or(0) / 2;
                ranges = chunk_ranges(blocks(), reserved, reserved + room.max(1));
                rechunks += 1;
                tracing::info!(chunks = ranges.len(), %why, "the summarizer's window was exceeded; compacting in smaller chunks");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The messages a compaction summarizes, and how to turn a chunking of them into one summary.
struct Chunks<'a> {
    input: &'a PlanInput<'a>,
    plan: &'a CompactionPlan,
    summarizer: &'a dyn Summarizer,
    messages: &'a [crate::message::Message],
    seqs: &'a [u64],
}

impl Chunks<'_> {
    /// Summarizes each range in turn, each call refining the summary of the ones before.
    async fn summarize(&self, ranges: &[std::ops::Range<usize>]) -> Result<String, SummarizeError> {
        let (input, plan) = (self.input, self.plan);
        let task = task_note(input, plan);
        let mut summary: Option<String> = input.prior_summary.map(str::to_string);
        for range in ranges {
            let prompt = build_compaction_prompt(&PromptInput {
                messages: &self.messages[range.clone()],
                masking: plan.masking.from_message(range.start),
                prior_summary: summary.as_deref(),
                files: &plan.files,
                focus: input.focus,
            });
            let request = SummaryRequest {
                prompt: redact(input, prompt),
                messages: self.messages[range.clone()].to_vec(),
                seqs: self.seqs[range.clone()].to_vec(),
                prior_summary: summary.clone(),
                files: plan.files.clone(),
                focus: input.focus.map(str::to_string),
                max_summary_tokens: Some(plan.summary_budget),
                summary_ceiling_tokens: Some(plan.summary_ceiling),
                task: task.clone(),
            };
            let written = self.summarizer.summarize(&request).await?;
            if is_blank(&written) {
                return Err(SummarizeError::Blank);
            }
            summary = Some(redact(input, written.trim().to_string()));
        }
        summary.ok_or(SummarizeError::Blank)
    }
}

/// A model's summary with the user instructions its section 6 left out quoted there (see
/// [`keep_instructions`]), in the room its ceiling leaves.
fn with_every_instruction(
    input: &PlanInput,
    plan: &CompactionPlan,
    messages: &[crate::message::Message],
    seqs: &[u64],
    summary: String,
    tokens: usize,
) -> String {
    let texts: Vec<(u64, String)> = messages
        .iter()
        .zip(seqs)
        .filter_map(|(m, &seq)| Some((seq, instruction_text(m)?)))
        .collect();
    let instructions: Vec<Instruction> = texts
        .iter()
        .map(|(seq, text)| Instruction { seq: *seq, text })
        .collect();
    let room_chars = (plan.summary_ceiling.saturating_sub(tokens) as f64
        / input.estimator.tokens_per_char) as usize;
    match keep_instructions(&summary, input.prior_summary, &instructions, room_chars) {
        Some(kept) => {
            tracing::warn!(
                session = input.session,
                quoted = kept.quoted,
                "the summary left out user messages; quoted them in its section 6"
            );
            redact(input, kept.summary)
        }
        None => summary,
    }
}

/// Credentials masked when the session asks for it.
fn redact(input: &PlanInput, text: String) -> String {
    if input.redact_secrets {
        redact_secrets(&text).into_owned()
    } else {
        text
    }
}

/// The compaction's result around a written summary.
fn finish(
    input: &PlanInput,
    plan: &CompactionPlan,
    summary: String,
    chunks: usize,
    summarizer: &dyn Summarizer,
    compaction_num: u32,
) -> Compacted {
    let summary_tokens = input
        .estimator
        .message(&summary_message(&summary, input.session));
    let files = plan.files.clone();
    Compacted {
        result: CompactionResult {
            summary,
            read_files: files.read,
            modified_files: files.modified,
            created_files: files.created,
            deleted_files: files.deleted,
            pre_tokens: plan.pre_tokens,
            post_tokens: input.pinned_tokens + summary_tokens + plan.boundary.preserved_tokens,
            compaction_num,
        },
        boundary: plan.boundary,
        summary_tokens,
        chunks,
        summarizer: summarizer.name(),
    }
}

/// The session's task, when it lies in what this compaction replaces or moves in front.
fn task_note(input: &PlanInput, plan: &CompactionPlan) -> Option<TaskNote> {
    let seq = input.task_seq?;
    let index = input.index_of(seq)?;
    (index < plan.boundary.index).then(|| TaskNote {
        seq,
        text: instruction_text(&input.messages[index])
            .unwrap_or_else(|| input.messages[index].joined_text()),
        pinned: input.pinned.get(index).copied().unwrap_or(false),
        max_chars: (input.config.pin_first_user_tokens as f64 / input.estimator.tokens_per_char)
            as usize,
    })
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
