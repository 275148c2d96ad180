//! Replaying a transcript through an in-process daemon, as the agent would have run with
//! compactd: append every message, and before every assistant message take the context the
//! agent would send. The report compares what it sends with two baselines:
//!
//! - `raw`: the whole history every time;
//! - `masking_m10`: the whole history with all but the last 10 tool outputs masked
//!   (the observation-masking baseline of Lindenbauer et al. 2025, "The Complexity Trap").
//!
//! It also takes the continuation [`probes`]: what the agent would continue from.

pub(crate) mod cost;
pub(crate) mod probes;

use anyhow::{Context, Result};
use compactd_api::Compaction;
use compactd_api::{ContextView, SessionId};
use compactd_core::compaction::constants::{MASKED_OUTPUT, MAX_TEXT_CHARS};
use compactd_core::compaction::{FileLists, LazyEstimator, track_files};
use compactd_core::message::MessageBatch;
use compactd_core::message::{Message, Part};
use compactd_daemon::Config;
use compactd_daemon::{CreateSession, HistoryRequest, Service};
use compactd_formats::transcript::Transcript;
use compactd_store::Store;
use compactd_store::Synchronous;
use cost::{CacheCost, CacheMeter, content_hash};
use probes::{LatestCompaction, ProbeInput, Probes};
use serde::Serialize;
use std::collections::HashSet;

/// Observations kept verbatim by the masking baseline.
pub(crate) const MASKING_BASELINE_KEEP: usize = 10;

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub session_messages: usize,
    pub assistant_steps: usize,
    pub compactions: usize,
    pub failed_compactions: usize,
    /// Maskings of old tool outputs (microcompaction).
    pub maskings: usize,
    pub context_limit: usize,
    pub peak_context_tokens: usize,
    /// Contexts handed to the agent that were above the limit.
    pub contexts_over_limit: usize,
    /// With a model tokenizer ([`Model::ratio`]): the largest context as it counts it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_counted_tokens: Option<usize>,
    /// With a model tokenizer: contexts above the limit as it counts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_over_limit: Option<usize>,
    pub input_tokens: InputTokens,
    /// Share of the user's text messages present in the final context (their first 2,000
    /// characters, verbatim in the tail or in the summary). `None` without user messages.
    pub user_message_retention: Option<f64>,
    /// Share of the files modified by tool calls (in the messages that existed when the latest
    /// compaction ran) that the latest compaction lists. `None` without compactions or without
    /// modified files.
    pub modified_file_recall: Option<f64>,
    /// Tool results sent without their call, summed over every context.
    pub orphaned_tool_results: usize,
    /// Assistant steps (counted from 1) whose context did not show every result of the step
    /// before, with its call: the output the agent just asked for, whole or as its head and
    /// tail. Each one is a step at which the agent could not see what it had just run.
    pub hidden_result_steps: Vec<usize>,
    /// Assistant steps whose context showed a result of the step before only as its head and
    /// tail (too large for the room the window left it).
    pub shortened_result_steps: usize,
    /// With an agent preamble ([`Model::preamble_tokens`]): assistant steps whose context did
    /// not hold the agent's system prompt whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preamble_missing_steps: Option<usize>,
    /// What the agent continues from, against the transcript's ground truth.
    pub probes: Probes,
    /// What the input costs when the model API caches prompt prefixes.
    pub cached_cost: CachedCosts,
    /// Tokens of each compaction's summary message, in order.
    pub summary_tokens: Vec<usize>,
}

/// Input tokens summed over all assistant steps.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InputTokens {
    pub raw: usize,
    pub masking_m10: usize,
    pub compactd: usize,
}

/// Costs under prompt caching ([`cost`]), summed over all assistant steps.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CachedCosts {
    pub raw: CacheCost,
    pub masking_m10: CacheCost,
    pub compactd: CacheCost,
}

/// The model the replayed agent calls, as far as a replay can know it: how its tokenizer counts
/// against compactd's estimate, and whether the agent reports what it counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Model {
    /// Tokens the model counts per token compactd estimates (the shared transcripts' models
    /// counted 1.2 to 2.0: docs/EVALUATION.md). `None`: not measured.
    pub ratio: Option<f64>,
    /// The agent reports each call's count with the next message (`usage.input_tokens`).
    pub reports_usage: bool,
    /// The agent sends a system prompt of about this many tokens first (its identity, rules
    /// and tools, as the agents people point at local models send 5k to 12k tokens of): 0 for
    /// none but the transcript's own.
    pub preamble_tokens: usize,
}

/// A system prompt of about `tokens` estimated tokens: numbered rules of the kind agents
/// send, each line distinct (so no part of it reads as a repeat of another).
pub(crate) fn preamble(tokens: usize) -> String {
    let estimator = LazyEstimator::default();
    let mut text = String::from("You are a coding agent working in the user's repository.\n");
    let mut rule = 0;
    while estimator.text(&text) < tokens {
        rule += 1;
        text.push_str(&format!(
            "Rule {rule}: before you change file number {rule}, read it whole and run its tests.\n"
        ));
    }
    text
}

impl Model {
    /// What the model counts of a context compactd estimates at `tokens`.
    fn counted(&self, tokens: usize) -> Option<usize> {
        self.ratio.map(|r| (tokens as f64 * r).ceil() as usize)
    }
}

/// Replays `transcript` with a session of `context_limit` tokens under `config`, its agent
/// calling `model`.
pub async fn replay(
    transcript: &Transcript,
    context_limit: usize,
    config: Config,
    model: Model,
) -> Result<ReplayReport> {
    let pin_tokens = config.compaction.pin_first_user_tokens;
    let dir = tempfile::TempDir::new().context("cannot create a temp dir for the replay")?;
    let store = Store::open(&dir.path().join("replay.db"), Synchronous::Normal)?;
    let service = Service::new(store.clone(), config)?;
    let id = &SessionId::parse("replay")?;
    service
        .create_session(CreateSession {
            id: Some(id.clone()),
            context_limit: Some(context_limit),
            ..Default::default()
        })
        .await?;

    let mut report = ReplayReport {
        session_messages: transcript.messages.len(),
        context_limit,
        ..Default::default()
    };
    if model.preamble_tokens > 0 {
        let system = Message::text(
            compactd_core::message::Role::System,
            preamble(model.preamble_tokens),
        );
        let request = MessageBatch {
            messages: vec![system],
            input_tokens: None,
            compaction_num: None,
            wait: true,
        };
        service.append(id, request, None).await?;
        report.preamble_missing_steps = Some(0);
    }
    let seen_by_latest = drive(&service, id, transcript, model, &mut report).await?;
    let compactions = count_compactions(&service, id, &mut report).await?;
    let final_context = context_text(&service.context(id, true).await?);
    report.user_message_retention = retention(&transcript.messages, &final_context);
    let summaries: Vec<String> = compactions
        .iter()
        .map(|c| c.result.summary.clone())
        .collect();
    report.probes = Probes::measure(&ProbeInput {
        messages: &transcript.messages,
        submission: transcript.submission.as_deref(),
        context_text: &final_context,
        summaries: &summaries,
        latest: compactions.last().map(|c| LatestCompaction {
            summary: &c.result.summary,
            modified_files: &c.result.modified_files,
            created_files: &c.result.created_files,
        }),
        pin_tokens,
    });
    report.modified_file_recall =
        modified_file_recall(&transcript.messages[..seen_by_latest], compactions.last());
    service.shutdown().await;
    store.close();
    Ok(report)
}

/// Appends the transcript message by message, asking for the context before each assistant
/// step as an agent would, and meters every step's input for compactd and both baselines.
/// Returns how many messages the latest compaction saw.
async fn drive(
    service: &std::sync::Arc<Service>,
    id: &SessionId,
    transcript: &Transcript,
    model: Model,
    report: &mut ReplayReport,
) -> Result<usize> {
    let mut meter = StepMeter::default();
    // Messages that existed when the latest compaction ran: what its file lists can know.
    let mut seen_by_latest = 0;
    if model.ratio.is_some() {
        (report.peak_counted_tokens, report.counted_over_limit) = (Some(0), Some(0));
    }
    for (index, message) in transcript.messages.iter().enumerate() {
        // What the model counted of the call this message answers, and of which context.
        let usage = match message.role == compactd_core::message::Role::Assistant {
            true => meter.call(service, id, &model, report).await?,
            false => None,
        };
        meter.add(message);
        let request = MessageBatch {
            messages: vec![message.clone()],
            input_tokens: usage.map(|(counted, _)| counted as u64),
            compaction_num: usage.map(|(_, num)| num),
            wait: true,
        };
        let answer = service.append(id, request, None).await?;
        if answer
            .compaction
            .as_ref()
            .is_some_and(|c| c.status == compactd_api::CompactionState::Completed)
        {
            seen_by_latest = index + 1;
        }
    }
    report.cached_cost = CachedCosts {
        raw: meter.caches[0].cost(),
        masking_m10: meter.caches[1].cost(),
        compactd: meter.caches[2].cost(),
    };
    Ok(seen_by_latest)
}

/// What a replay measures at each model call, beside compactd's context: the baselines'
/// contexts, the three cache meters (raw, masking at m10, compactd) and the results of the
/// current step (since the newest assistant message), with their output.
#[derive(Default)]
struct StepMeter {
    estimator: LazyEstimator,
    baselines: Baselines,
    caches: [CacheMeter; 3],
    step_results: Vec<(String, String)>,
}

impl StepMeter {
    /// Measures the call an assistant message answers: compactd's context for it against
    /// the window and the baselines; what the model counted of it, and of which compaction,
    /// when it reports usage.
    async fn call(
        &mut self,
        service: &std::sync::Arc<Service>,
        id: &SessionId,
        model: &Model,
        report: &mut ReplayReport,
    ) -> Result<Option<(usize, u32)>> {
        let context_limit = report.context_limit;
        let context = service.context(id, true).await?;
        let mut usage = None;
        if let Some(counted) = model.counted(context.tokens) {
            report.peak_counted_tokens = report.peak_counted_tokens.max(Some(counted));
            *report.counted_over_limit.get_or_insert(0) += usize::from(counted > context_limit);
            usage = Some((counted, context.compaction_num)).filter(|_| model.reports_usage);
        }
        report.assistant_steps += 1;
        let shown: Vec<Shown> = self
            .step_results
            .iter()
            .map(|(call_id, output)| result_shown(&context, call_id, output))
            .collect();
        if shown.contains(&Shown::Hidden) {
            report.hidden_result_steps.push(report.assistant_steps);
        } else if shown.contains(&Shown::Ends) {
            report.shortened_result_steps += 1;
        }
        if model.preamble_tokens > 0 && !holds_preamble(&context, model.preamble_tokens) {
            *report.preamble_missing_steps.get_or_insert(0) += 1;
        }
        self.step_results.clear();
        report.input_tokens.raw += self.baselines.raw;
        report.input_tokens.masking_m10 += self.baselines.masked();
        report.input_tokens.compactd += context.tokens;
        report.peak_context_tokens = report.peak_context_tokens.max(context.tokens);
        report.contexts_over_limit += usize::from(context.tokens > context_limit);
        report.orphaned_tool_results += orphaned_results(&context);
        self.caches[0].call(self.baselines.raw_messages());
        self.caches[1].call(self.baselines.masked_messages());
        self.caches[2].call(context_messages(&context, &self.estimator));
        Ok(usage)
    }

    /// Counts `message` into the baselines, and its results into the current step's.
    fn add(&mut self, message: &Message) {
        for part in &message.parts {
            if let Part::ToolResult {
                call_id, output, ..
            } = part
            {
                self.step_results.push((call_id.clone(), output.clone()));
            }
        }
        self.baselines.add(message, &self.estimator);
    }
}

/// Fills in the report's compaction, failure, masking and summary-size figures; returns the
/// compactions.
async fn count_compactions(
    service: &Service,
    id: &SessionId,
    report: &mut ReplayReport,
) -> Result<Vec<Compaction>> {
    let estimator = LazyEstimator::default();
    let (compactions, failures, maskings) = all_compactions(service, id).await?;
    report.compactions = compactions.len();
    report.summary_tokens = compactions
        .iter()
        .map(|c| {
            estimator.message(&compactd_core::compaction::summary_message(
                &c.result.summary,
                id.as_str(),
            ))
        })
        .collect();
    report.failed_compactions = failures;
    report.maskings = maskings;
    Ok(compactions)
}

/// The share of files the session really modified (up to the latest compaction) that the
/// latest compaction lists as modified; `None` when nothing was modified or nothing compacted.
fn modified_file_recall(seen: &[Message], latest: Option<&Compaction>) -> Option<f64> {
    let modified = track_files(seen, &FileLists::default()).modified;
    latest.and_then(|latest| {
        let listed: HashSet<&String> = latest.result.modified_files.iter().collect();
        (!modified.is_empty()).then(|| {
            modified.iter().filter(|f| listed.contains(f)).count() as f64 / modified.len() as f64
        })
    })
}

/// Every compaction of the session, and the numbers of failed attempts and of maskings,
/// page by page.
async fn all_compactions(
    service: &Service,
    id: &SessionId,
) -> Result<(Vec<Compaction>, usize, usize)> {
    let (mut compactions, mut failures, mut maskings) = (Vec::new(), 0, 0);
    let mut page = HistoryRequest {
        after: 0,
        failures_after: 0,
        maskings_after: 0,
        limit: 100,
    };
    loop {
        let history = service.compaction_history(id, page).await?;
        compactions.extend(history.compactions);
        failures += history.failures.len();
        maskings += history.maskings.len();
        let next = (
            history.next_after,
            history.failures_next_after,
            history.maskings_next_after,
        );
        if next == (None, None, None) {
            return Ok((compactions, failures, maskings));
        }
        page.after = next.0.unwrap_or(u32::MAX);
        page.failures_after = next.1.unwrap_or(u64::MAX);
        page.maskings_after = next.2.unwrap_or(u64::MAX);
    }
}

/// The two baselines' running sizes.
#[derive(Default)]
struct Baselines {
    /// Tokens of the whole history so far.
    raw: usize,
    /// For each tool result so far, in order: tokens saved by masking it.
    savings: Vec<usize>,
    /// Prefix sums of `savings`.
    saved_prefix: Vec<usize>,
    /// Each message so far: content hash, tokens, index of its first tool result, results.
    messages: Vec<(u64, usize, usize, usize)>,
}

impl Baselines {
    fn add(&mut self, message: &Message, estimator: &LazyEstimator) {
        let tokens = estimator.message(message);
        self.raw += tokens;
        let first_result = self.savings.len();
        let marker = estimator.text(MASKED_OUTPUT);
        for part in &message.parts {
            if let Part::ToolResult { output, .. } = part {
                let saving = estimator.text(output).saturating_sub(marker);
                self.savings.push(saving);
                let total = self.saved_prefix.last().copied().unwrap_or(0) + saving;
                self.saved_prefix.push(total);
            }
        }
        let hash = content_hash(
            serde_json::to_string(message)
                .unwrap_or_default()
                .as_bytes(),
        );
        let results = self.savings.len() - first_result;
        self.messages.push((hash, tokens, first_result, results));
    }

    /// The raw history as a cache sees it: (hash, tokens) per message.
    fn raw_messages(&self) -> Vec<(u64, usize)> {
        self.messages.iter().map(|&(h, t, _, _)| (h, t)).collect()
    }

    /// The masked history as a cache sees it: a message changes whenever one more of its
    /// outputs is masked.
    fn masked_messages(&self) -> Vec<(u64, usize)> {
        let masked = self.savings.len().saturating_sub(MASKING_BASELINE_KEEP);
        self.messages
            .iter()
            .map(|&(hash, tokens, first, results)| {
                let hidden = masked.saturating_sub(first).min(results);
                let saved: usize = self.savings[first..first + hidden].iter().sum();
                (
                    hash ^ (hidden as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    tokens - saved,
                )
            })
            .collect()
    }

    /// The history with all but the last 10 tool outputs masked.
    fn masked(&self) -> usize {
        let masked = self.savings.len().saturating_sub(MASKING_BASELINE_KEEP);
        let saved = if masked == 0 {
            0
        } else {
            self.saved_prefix[masked - 1]
        };
        self.raw - saved
    }
}

/// A context as a cache sees it: (hash, tokens) per message, the bytes as sent.
fn context_messages(context: &ContextView, estimator: &LazyEstimator) -> Vec<(u64, usize)> {
    context
        .messages
        .iter()
        .map(|m| {
            let bytes = serde_json::to_vec(m).unwrap_or_default();
            let tokens = match m {
                compactd_api::ContextMessage::Stored(s) => s.tokens,
                summary => estimator.chars(
                    parts_of(summary)
                        .iter()
                        .map(|p| match p {
                            Part::Text { text } => text.chars().count(),
                            _ => 0,
                        })
                        .sum(),
                ),
            };
            (content_hash(&bytes), tokens)
        })
        .collect()
}

/// Characters of an output's head and tail that a shortened form must still show.
const VISIBLE_ENDS: usize = 64;

/// How a context shows a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    Whole,
    /// Its head and its tail (too large for its room).
    Ends,
    Hidden,
}

/// Whether the context holds the agent's preamble of `tokens`, whole, in a system message.
fn holds_preamble(context: &ContextView, tokens: usize) -> bool {
    let preamble = preamble(tokens);
    context.messages.iter().any(|message| {
        parts_of(message)
            .iter()
            .any(|part| matches!(part, Part::Text { text } if *text == preamble))
    })
}

/// How `context` shows the result of `call_id` after its call: its output whole, its head
/// and tail, or not at all.
fn result_shown(context: &ContextView, call_id: &str, original: &str) -> Shown {
    let head: String = original.chars().take(VISIBLE_ENDS).collect();
    let tail: String = {
        let n = original.chars().count();
        original
            .chars()
            .skip(n.saturating_sub(VISIBLE_ENDS))
            .collect()
    };
    let mut called = false;
    for message in &context.messages {
        for part in parts_of(message) {
            match part {
                Part::ToolCall { id, .. } if id == call_id => called = true,
                Part::ToolResult {
                    call_id: id,
                    output,
                    ..
                } if id == call_id && called => {
                    // Agents reuse call ids: any result of that id may be the one.
                    if output == original {
                        return Shown::Whole;
                    }
                    if output.starts_with(head.trim_end()) && output.ends_with(tail.trim_start()) {
                        return Shown::Ends;
                    }
                }
                _ => {}
            }
        }
    }
    Shown::Hidden
}

/// Results in the context whose call does not come before them in the same context.
fn orphaned_results(context: &ContextView) -> usize {
    let mut calls = HashSet::new();
    let mut orphans = 0;
    for message in &context.messages {
        for part in parts_of(message) {
            match part {
                Part::ToolCall { id, .. } => {
                    calls.insert(id);
                }
                Part::ToolResult { call_id, .. } if !calls.contains(&call_id) => orphans += 1,
                _ => {}
            }
        }
    }
    orphans
}

fn parts_of(message: &compactd_api::ContextMessage) -> Vec<Part> {
    use compactd_api::ContextMessage;
    match message {
        ContextMessage::Summary { parts, .. } => parts.clone(),
        ContextMessage::Stored(stored) => stored.to_message().map(|m| m.parts).unwrap_or_default(),
    }
}

/// All text of a context, one message per line group.
fn context_text(context: &ContextView) -> String {
    let mut out = String::new();
    for message in &context.messages {
        let texts: Vec<String> = parts_of(message)
            .into_iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text),
                _ => None,
            })
            .collect();
        out.push_str(&texts.join("\n"));
        out.push('\n');
    }
    out
}

/// Share of user text messages whose first 2,000 characters appear in `text`.
fn retention(messages: &[Message], text: &str) -> Option<f64> {
    let users: Vec<String> = messages
        .iter()
        .filter(|m| m.is_user_text())
        .map(|m| {
            m.joined_text()
                .trim()
                .chars()
                .take(MAX_TEXT_CHARS)
                .collect()
        })
        .collect();
    (!users.is_empty()).then(|| {
        users.iter().filter(|u| text.contains(u.as_str())).count() as f64 / users.len() as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masking_baseline_masks_all_but_the_last_ten_outputs() {
        let e = LazyEstimator::default();
        let mut b = Baselines::default();
        for i in 0..12 {
            b.add(
                &Message {
                    role: compactd_core::message::Role::Tool,
                    parts: vec![Part::ToolResult {
                        call_id: format!("{i}"),
                        name: None,
                        output: "x".repeat(400),
                        is_error: false,
                    }],
                },
                &e,
            );
        }
        let marker = e.text(MASKED_OUTPUT);
        assert_eq!(b.raw, 12 * 100);
        assert_eq!(b.masked(), 12 * 100 - 2 * (100 - marker));
    }
}
