//! Agents run against a local model of a small window (Ollama, llama.cpp and vLLM serve 8k to
//! 32k), each sending thousands of tokens of system prompt and tools: through compactd, what
//! the agent needs next reaches the model whole whenever it fits.

use super::harness::Agent;
use super::{Model, through_with};
use crate::common::model_api::{Seen, chat, text_of};
use serde_json::Value;

/// The system message of a Chat Completions request, as sent.
fn system_message(seen: &Seen) -> Option<&Value> {
    seen.body["messages"]
        .as_array()?
        .iter()
        .find(|m| m["role"] == "system")
        .map(|m| &m["content"])
}

/// Copilot CLI in its offline mode sends a 22,000-character system message and 6.5k tokens
/// of tools. At a 20,000-token window it reaches the model whole in every request, after
/// each compaction as before the first (it used to be compacted away with the rest once the
/// pinned messages passed a quarter of the window).
#[test]
fn copilot_cli_keeps_its_whole_system_prompt_at_a_20k_window_through_compactd() {
    // As one sets it for a model of a small window (Copilot CLI asks 8,000 otherwise here).
    let model = Model {
        max_output: Some(4_000),
        ..Model::new("local-model", 20_000, 4)
    };
    let seen = through_with(Agent::Copilot, model, |_| {});
    let Some(first) = seen.first() else { return };
    let prompt = system_message(first).expect("Copilot CLI sends a system message");
    assert!(
        text_of(prompt).len() > 15_000,
        "a large system prompt: {} characters",
        text_of(prompt).len()
    );
    for (n, request) in seen.iter().enumerate() {
        assert_eq!(
            system_message(request),
            Some(prompt),
            "request {n} of {} carries the whole system prompt",
            seen.len()
        );
    }
}

/// The lines of the newest step output in a Chat Completions request.
fn newest_output_lines(seen: &Seen) -> Option<usize> {
    let output = chat::newest_output(seen.body["messages"].as_array()?)?;
    let numbers = output
        .lines()
        .filter(|line| !line.is_empty() && line.bytes().all(|b| (b'a'..=b'j').contains(&b)));
    Some(numbers.count())
}

/// opencode at a 20,000-token window, 8,000 of it kept for the completion (its system prompt
/// and tools take about 7.5k tokens): each step prints 1,900 numbers (8,500 characters; opencode
/// itself keeps 2,000 lines of an output), which fits beside the preamble and the smallest
/// summary, so the model sees every output whole (a fixed quarter of the room cut each one
/// to about 820 lines, head and tail, in every request after a compaction).
#[test]
fn opencode_sees_every_output_whole_at_a_20k_window_through_compactd() {
    let lines = 1_900;
    let seen = through_with(
        Agent::Opencode,
        Model::new("local-model", 20_000, 4),
        |task| {
            task.lines = lines;
        },
    );
    if seen.is_empty() {
        return;
    }
    let shown: Vec<usize> = seen.iter().filter_map(newest_output_lines).collect();
    assert!(shown.len() >= 20, "a request after each step: {shown:?}");
    assert!(
        shown.iter().all(|&n| n == lines),
        "every newest output whole ({lines} lines): {shown:?}"
    );
}
