//! A Chat Completions answer, whole or assembled from its streamed deltas: content, reasoning
//! and tool calls by index, with the usage when the upstream reports it.

use crate::provider::wire::{BoundedText, WireReply};
use compactd_core::reported_tokens;
use serde_json::{Value, json};

/// The answer of a non-streamed call.
pub fn of(answer: &Value) -> Option<WireReply> {
    let message = &answer["choices"][0]["message"];
    let message = crate::transcript::openai_message(message.is_object().then_some(message)?)?;
    Some(WireReply {
        message,
        context_tokens: usage(&answer["usage"]),
        unrecorded_chars: 0,
    })
}

/// Input plus output: the context after the answer, as the upstream counts it.
fn usage(usage: &Value) -> Option<usize> {
    let prompt = usage["prompt_tokens"].as_u64()?;
    reported_tokens([prompt, usage["completion_tokens"].as_u64().unwrap_or(0)])
}

/// The most tool calls of one answer that are recorded.
const MAX_CALLS: usize = 128;

/// A streamed answer being put together.
#[derive(Default)]
pub struct Assembly {
    content: BoundedText,
    reasoning: BoundedText,
    calls: Vec<Call>,
    tokens: Option<usize>,
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: BoundedText,
}

impl Assembly {
    pub fn event(&mut self, chunk: &Value, max_bytes: usize) {
        self.tokens = usage(&chunk["usage"]).or(self.tokens);
        let delta = &chunk["choices"][0]["delta"];
        if let Some(piece) = delta["content"].as_str() {
            self.content.push(piece, max_bytes);
        }
        if let Some(piece) = delta["reasoning_content"].as_str() {
            self.reasoning.push(piece, max_bytes);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let Some(index) = call["index"]
                .as_u64()
                .map(|i| i as usize)
                .filter(|i| *i < MAX_CALLS)
            else {
                continue;
            };
            while self.calls.len() <= index {
                self.calls.push(Call::default());
            }
            let slot = &mut self.calls[index];
            if let Some(id) = call["id"].as_str() {
                slot.id = id.chars().take(256).collect();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                slot.name
                    .push_str(&name.chars().take(256).collect::<String>());
            }
            if let Some(piece) = call["function"]["arguments"].as_str() {
                slot.arguments.push(piece, max_bytes);
            }
        }
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.content.len()
            + self.reasoning.len()
            + self
                .calls
                .iter()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                .sum::<usize>()
    }

    pub fn finish(self, max_bytes: usize) -> Option<WireReply> {
        if self.content.is_empty() && self.calls.is_empty() && self.reasoning.is_empty() {
            return None;
        }
        let (content, unrecorded) = self.content.finish_counted(max_bytes);
        let mut message = json!({"role": "assistant", "content": content});
        let reasoning = self.reasoning.finish(max_bytes);
        if !reasoning.is_empty() {
            message["reasoning_content"] = Value::String(reasoning);
        }
        if !self.calls.is_empty() {
            message["tool_calls"] = self
                .calls
                .into_iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.finish(max_bytes)}}))
                .collect();
        }
        Some(WireReply {
            message: crate::transcript::openai_message(&message)?,
            context_tokens: self.tokens,
            unrecorded_chars: unrecorded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Part;

    #[test]
    fn a_streamed_answer_is_assembled_from_its_deltas() {
        let mut a = Assembly::default();
        for chunk in [
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"look."}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"comm"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\": \"ls\"}"}}]}}]}),
            json!({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7}}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1e9}]}}]}),
        ] {
            a.event(&chunk, 1 << 20);
        }
        let reply = a.finish(1 << 20).unwrap();
        assert_eq!(reply.context_tokens, Some(107));
        assert_eq!(reply.message.joined_text(), "Let me look.");
        assert!(
            matches!(&reply.message.parts[1], Part::ToolCall { id, name, args }
            if id == "call_1" && name == "bash" && args["command"] == "ls")
        );
        assert!(Assembly::default().finish(1 << 20).is_none());
    }
}
