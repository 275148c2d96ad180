//! A Messages answer, whole or assembled from its streamed events: content blocks by index
//! (text and thinking from their deltas, signatures, tool input JSON joined), and the usage,
//! cached input included (all of it is context).

use crate::provider::wire::{BoundedText, WireReply};
use compactd_core::reported_tokens;
use serde_json::{Value, json};

pub fn of(answer: &Value) -> Option<WireReply> {
    Some(WireReply {
        message: crate::transcript::anthropic_reply(&answer["content"]),
        context_tokens: usage(&answer["usage"], None),
        unrecorded_chars: 0,
    })
}

fn usage(usage: &Value, output: Option<u64>) -> Option<usize> {
    let input = usage["input_tokens"].as_u64()?;
    let cached = ["cache_read_input_tokens", "cache_creation_input_tokens"]
        .iter()
        .map(|k| usage[k].as_u64().unwrap_or(0));
    let output = output.or(usage["output_tokens"].as_u64()).unwrap_or(0);
    reported_tokens([input, output].into_iter().chain(cached))
}

/// The most content blocks of one answer that are recorded.
const MAX_BLOCKS: usize = 128;

#[derive(Default)]
pub struct Assembly {
    blocks: Vec<Block>,
    start_usage: Value,
    output: Option<u64>,
}

#[derive(Default)]
struct Block {
    start: Value,
    /// About the bytes `start` holds.
    start_bytes: usize,
    text: BoundedText,
    json: BoundedText,
}

impl Assembly {
    pub fn event(&mut self, event: &Value, max_bytes: usize) {
        let index = event["index"].as_u64().unwrap_or(0) as usize;
        match event["type"].as_str() {
            Some("message_start") => self.start_usage = event["message"]["usage"].clone(),
            Some("message_delta") => {
                self.output = event["usage"]["output_tokens"].as_u64().or(self.output)
            }
            Some("content_block_start") if index < MAX_BLOCKS => {
                while self.blocks.len() <= index {
                    self.blocks.push(Block::default());
                }
                // Only objects: an upstream answering nonsense must not make indexing panic.
                if event["content_block"].is_object() {
                    let start = event["content_block"].clone();
                    self.blocks[index].start_bytes = crate::provider::wire::json_tokens(&start) * 4;
                    self.blocks[index].start = start;
                }
            }
            Some("content_block_delta") if index < self.blocks.len() => {
                let block = &mut self.blocks[index];
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => block
                        .text
                        .push(delta["text"].as_str().unwrap_or_default(), max_bytes),
                    Some("thinking_delta") => block
                        .text
                        .push(delta["thinking"].as_str().unwrap_or_default(), max_bytes),
                    Some("input_json_delta") => block.json.push(
                        delta["partial_json"].as_str().unwrap_or_default(),
                        max_bytes,
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| b.start_bytes + b.text.len() + b.json.len())
            .sum()
    }

    pub fn finish(self, max_bytes: usize) -> Option<WireReply> {
        let mut unrecorded = 0;
        let blocks: Vec<Value> = self
            .blocks
            .into_iter()
            .filter(|b| b.start.is_object())
            .map(|b| {
                let mut block = b.start;
                match block["type"].as_str() {
                    Some("text") => {
                        let (text, dropped) = b.text.finish_counted(max_bytes);
                        unrecorded += dropped;
                        block["text"] = json!(text)
                    }
                    Some("thinking") => block["thinking"] = json!(b.text.finish(max_bytes)),
                    Some("tool_use") if !b.json.is_empty() => {
                        block["input"] =
                            serde_json::from_str(&b.json.finish(max_bytes)).unwrap_or(Value::Null)
                    }
                    _ => {}
                }
                block
            })
            .collect();
        if blocks.is_empty() {
            return None;
        }
        Some(WireReply {
            message: crate::transcript::anthropic_reply(&Value::Array(blocks)),
            context_tokens: usage(&self.start_usage, self.output),
            unrecorded_chars: unrecorded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Part;

    #[test]
    fn a_nonsense_stream_records_nothing_and_panics_nowhere() {
        let mut a = Assembly::default();
        for event in [
            json!({"type": "content_block_start", "index": 0, "content_block": "text"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}),
            json!({"type": "content_block_delta", "index": 5, "delta": {"type": "input_json_delta", "partial_json": "{"}}),
            json!({"type": "content_block_start", "index": 99999, "content_block": {"type": "text"}}),
        ] {
            a.event(&event, 1 << 20);
        }
        assert!(a.finish(1 << 20).is_none());
    }

    #[test]
    fn thinking_text_and_tool_use_are_assembled() {
        let mut a = Assembly::default();
        for event in [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 90}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "plan"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"command\":"}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"ls\"}"}}),
            json!({"type": "message_delta", "usage": {"output_tokens": 5}}),
        ] {
            a.event(&event, 1 << 20);
        }
        let reply = a.finish(1 << 20).unwrap();
        assert_eq!(reply.context_tokens, Some(105));
        assert!(matches!(&reply.message.parts[0], Part::Reasoning { text } if text == "plan"));
        assert!(
            matches!(&reply.message.parts[1], Part::ToolCall { args, .. } if args["command"] == "ls")
        );
    }
}
