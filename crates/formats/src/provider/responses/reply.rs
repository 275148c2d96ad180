//! A Responses answer, whole or from its streamed events: the output items (complete in each
//! `response.output_item.done`, and all of them in `response.completed`), and the usage.

use super::message_of;
use crate::provider::wire::WireReply;
use compactd_core::reported_tokens;
use serde_json::Value;

pub fn of(answer: &Value) -> Option<WireReply> {
    let items = answer["output"].as_array()?;
    reply(items, &answer["usage"])
}

fn reply(items: &[Value], usage: &Value) -> Option<WireReply> {
    let items: Vec<Value> = items.iter().filter(|i| i.is_object()).cloned().collect();
    if items.is_empty() {
        return None;
    }
    Some(WireReply {
        message: message_of(&items),
        context_tokens: usage["input_tokens"].as_u64().and_then(|input| {
            reported_tokens([input, usage["output_tokens"].as_u64().unwrap_or(0)])
        }),
        unrecorded_chars: 0,
    })
}

/// The most items of one answer that are recorded.
const MAX_ITEMS: usize = 128;

#[derive(Default)]
pub struct Assembly {
    items: Vec<Value>,
    completed: Option<(Vec<Value>, Value)>,
    /// About the bytes held (each event is at most the recording's bound).
    held: usize,
}

impl Assembly {
    pub fn event(&mut self, event: &Value, _max_bytes: usize) {
        match event["type"].as_str() {
            Some("response.output_item.done")
                if self.items.len() < MAX_ITEMS && event["item"].is_object() =>
            {
                self.held += crate::provider::wire::json_tokens(&event["item"]) * 4;
                self.items.push(event["item"].clone());
            }
            Some("response.completed") => {
                let response = &event["response"];
                let output: Vec<Value> = response["output"]
                    .as_array()
                    .map(|o| o.iter().take(MAX_ITEMS).cloned().collect())
                    .unwrap_or_default();
                self.held += crate::provider::wire::json_tokens(response) * 4;
                self.completed = Some((output, response["usage"].clone()));
            }
            _ => {}
        }
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn finish(self, _max_bytes: usize) -> Option<WireReply> {
        match self.completed {
            Some((output, usage)) if !output.is_empty() => reply(&output, &usage),
            Some((_, usage)) => reply(&self.items, &usage),
            None => reply(&self.items, &Value::Null),
        }
    }
}
