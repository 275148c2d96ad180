//! `compactd plan` and `compactd summarize`: what compaction would do to a file of messages,
//! without a daemon.

use super::read_input;
use crate::compaction::{
    CompactionConfig, CompactionPlan, LazyEstimator, Pins, PlanInput, estimate_each,
};
use crate::compaction_run::{NOTHING_TO_COMPACT, compact};
use crate::message::{Message, parse_message_batch};
use crate::summarize::extractive::Extractive;
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::Path;

/// The inputs both commands share.
pub struct OfflineInput {
    pub messages: Vec<Message>,
    /// The messages' token estimates, as the daemon stores them at append.
    pub tokens: Vec<usize>,
    pub prior_summary: Option<String>,
    pub focus: Option<String>,
    pub context_limit: usize,
    pub config: CompactionConfig,
    /// The file stands for a session from its start: its system messages and task are pinned.
    pins: Pins,
}

impl OfflineInput {
    /// Loads the message file and the optional prior summary, validating every message.
    pub fn load(
        input: &Path,
        prior_summary: Option<&Path>,
        focus: Option<String>,
        context_limit: usize,
        config: CompactionConfig,
    ) -> Result<OfflineInput> {
        let text = read_input(input)?;
        let messages = parse_message_batch(text.as_bytes())
            .with_context(|| format!("{} is not a valid message list", input.display()))?
            .messages;
        for (i, m) in messages.iter().enumerate() {
            m.validate()
                .with_context(|| format!("{}: message {i} is invalid", input.display()))?;
        }
        let prior_summary = prior_summary.map(read_input).transpose()?;
        let tokens = estimate_each(&messages, &LazyEstimator::default());
        Ok(OfflineInput {
            pins: Pins::of(&messages, &tokens, &config),
            tokens,
            messages,
            prior_summary,
            focus,
            context_limit,
            config,
        })
    }
}

/// `compactd plan`: the engine's decisions as JSON.
pub fn plan(input: &OfflineInput) -> Value {
    let plan_input = input.plan_input();
    let plan = CompactionPlan::new(&plan_input);
    json!({
        "should_compact": plan.trigger.is_some(),
        "reason": plan.trigger.map(|t| t.as_str()),
        "pre_tokens": plan.pre_tokens,
        "boundary": plan.boundary.index,
        "preserved_tokens": plan.boundary.preserved_tokens,
        "prompt": plan.prompt(&plan_input),
        "summarized": plan.summarized.len(),
        "read_files": plan.files.read,
        "modified_files": plan.files.modified,
        "created_files": plan.files.created,
        "deleted_files": plan.files.deleted,
    })
}

/// `compactd summarize`: a full compaction with the extractive summarizer.
pub async fn summarize(input: &OfflineInput) -> Result<Value> {
    let compaction_num = if input.prior_summary.is_some() { 2 } else { 1 };
    match compact(&input.plan_input(), &Extractive, compaction_num).await? {
        Some(done) => {
            let mut out = serde_json::to_value(&done.result)?;
            out["compacted"] = json!(true);
            out["boundary"] = json!(done.boundary.index);
            Ok(out)
        }
        None => Ok(json!({
            "compacted": false,
            "reason": NOTHING_TO_COMPACT,
        })),
    }
}

impl OfflineInput {
    fn plan_input(&self) -> PlanInput<'_> {
        PlanInput {
            pinned: &self.pins.flags,
            pinned_tokens: self.pins.tokens,
            task_seq: self.pins.task.map(|i| i as u64 + 1),
            prior_summary: self.prior_summary.as_deref(),
            focus: self.focus.as_deref(),
            ..PlanInput::new(
                &self.messages,
                &self.tokens,
                self.context_limit,
                &self.config,
            )
        }
    }
}
