//! What the proxy reads from and writes into a model API's requests and answers, whatever the
//! API: each API's module ([`super::chat`], [`super::anthropic`], [`super::responses`])
//! implements these for its own wire format.
//!
//! A request's messages are read twice over: as compactd's neutral [`Message`]s (what is
//! stored, estimated, summarized and matched against the conversation), and as the client's
//! own JSON for each of them (its *native* form: thinking blocks with their signatures,
//! reasoning items with their encrypted content, cache marks, images, block types compactd
//! does not know). What goes upstream is built from the natives: the messages the context keeps
//! are sent exactly as the client sent them, only their outputs changed where the context
//! masks or shortens them, and the summary stands for the rest. Nothing is forged: reasoning
//! the context no longer holds lives only in the summary.

use crate::compaction::media::Media;
use crate::message::{Message, Part};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::borrow::Cow;

/// A request body the proxy cannot read as its API's conversation (what is wrong, and
/// where); the client is answered 400, as the provider would answer it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnreadableRequest(pub String);

impl From<String> for UnreadableRequest {
    fn from(why: String) -> UnreadableRequest {
        UnreadableRequest(why)
    }
}

impl From<&str> for UnreadableRequest {
    fn from(why: &str) -> UnreadableRequest {
        UnreadableRequest(why.to_string())
    }
}

/// The model API a proxied call speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::Chat => "chat",
            Wire::Anthropic => "messages",
            Wire::Responses => "responses",
        }
    }

    /// The body field that holds the conversation.
    pub fn conversation_field(self) -> &'static str {
        match self {
            Wire::Chat | Wire::Anthropic => "messages",
            Wire::Responses => "input",
        }
    }

    /// Reads a request: `body` is its fields but the conversation ([`split`]), `conversation`
    /// the conversation's JSON text as the client sent it. Each message is parsed on its own
    /// and dropped once read: the request's natives keep the client's text ([`Native`]).
    pub fn parse(
        self,
        body: &Value,
        conversation: Option<&str>,
    ) -> Result<WireRequest, UnreadableRequest> {
        match self {
            Wire::Chat => super::chat::request::parse(body, conversation),
            Wire::Anthropic => super::anthropic::request::parse(body, conversation),
            Wire::Responses => super::responses::request::parse(body, conversation),
        }
    }

    /// [`Wire::parse`] of a body already parsed whole, taking its conversation out of it.
    pub fn parse_value(self, body: &mut Value) -> Result<WireRequest, UnreadableRequest> {
        let taken = body
            .as_object_mut()
            .and_then(|fields| fields.remove(self.conversation_field()));
        let text = taken.map(|value| value.to_string());
        self.parse(body, text.as_deref())
    }

    /// `messages` (compactd's own) in the API's shape, one value per entry it needs.
    pub fn rendered(self, messages: &[Message]) -> Vec<Value> {
        match self {
            Wire::Chat => super::chat::messages(messages),
            Wire::Anthropic => super::anthropic::conversation(messages).messages,
            Wire::Responses => super::responses::context::items(messages),
        }
    }

    /// The body that goes upstream: `body` (as [`Wire::parse`] left it) with `outgoing` as its
    /// conversation, serialized without copying the client's messages once more.
    pub fn render(self, body: &Value, outgoing: &[Outgoing]) -> serde_json::Result<Vec<u8>> {
        let (field, conversation) = match self {
            Wire::Chat => ("messages", super::chat::request::conversation(outgoing)),
            Wire::Anthropic => (
                "messages",
                super::anthropic::request::conversation(outgoing),
            ),
            Wire::Responses => ("input", super::responses::request::conversation(outgoing)),
        };
        serde_json::to_vec(&WithField {
            body,
            field,
            value: &conversation,
        })
    }

    /// [`Wire::render`] read back, for tests.
    #[cfg(test)]
    pub fn render_value(self, body: &Value, outgoing: &[Outgoing]) -> Value {
        serde_json::from_slice(&self.render(body, outgoing).unwrap()).unwrap()
    }

    /// The answer of a non-streamed call.
    pub fn reply(self, body: &[u8]) -> Option<WireReply> {
        let answer: Value = serde_json::from_slice(body).ok()?;
        match self {
            Wire::Chat => super::chat::reply::of(&answer),
            Wire::Anthropic => super::anthropic::reply::of(&answer),
            Wire::Responses => super::responses::reply::of(&answer),
        }
    }

    /// A recorder of a streamed answer, fed the stream's bytes as they pass.
    pub fn recorder(self, max_bytes: usize) -> Recorder {
        Recorder {
            wire: self,
            events: super::sse::Splitter::new(max_bytes),
            assembly: match self {
                Wire::Chat => Assembly::Chat(Default::default()),
                Wire::Anthropic => Assembly::Anthropic(Default::default()),
                Wire::Responses => Assembly::Responses(Default::default()),
            },
            max_bytes,
        }
    }
}

/// A model API request as compactd reads it.
#[derive(Debug, Clone, Default)]
pub struct WireRequest {
    /// The conversation, one neutral message per entry of `natives`; shared with the write
    /// that stores what is new of it, so nothing of it is copied.
    pub messages: std::sync::Arc<[Message]>,
    /// Each message as the client sent it (for the Responses API: the list of its items).
    pub natives: Vec<Native>,
    /// What each message's images and documents cost the model (see [`super::media`]),
    /// beside the estimate of its parts, where each is a note of a few tokens.
    pub media: Vec<Media>,
    /// The request's own instructions outside its messages (system, instructions), as text:
    /// what tells a side request (a title, a commit message) from the conversation.
    pub system: String,
    /// Estimated tokens of everything the upstream counts besides the messages: system,
    /// instructions, tool definitions, response format.
    pub overhead_tokens: usize,
    /// The completion the request asks room for beside its prompt (`max_tokens`,
    /// `max_completion_tokens`, `max_output_tokens`), 0 when it names none.
    pub completion_tokens: usize,
    /// The request offers tools.
    pub has_tools: bool,
    pub model: String,
}

impl WireRequest {
    /// What message `index` costs the model: the estimate of its parts, and its media
    /// beside (the parts hold only a note of each).
    pub fn message_tokens(
        &self,
        index: usize,
        estimator: &crate::compaction::LazyEstimator,
    ) -> usize {
        estimator.message(&self.messages[index]) + self.media.get(index).map_or(0, Media::total)
    }
}

/// A message as the client sent it (for the Responses API: the list of its items), held as
/// its JSON text and parsed again only to be patched. A parsed JSON object costs hundreds of
/// bytes (a map node, its keys), and an agent behind the proxy sends its whole history, tens
/// of thousands of messages once it has run for days, with every call: held as text, a
/// message costs its bytes. What goes upstream is the client's own text, byte for byte.
#[derive(Debug, Clone)]
pub struct Native(Box<RawValue>);

impl Native {
    /// Items of the Responses API gathered as one native: a JSON list of their texts.
    pub fn list(items: &[Box<RawValue>]) -> Native {
        let mut text =
            String::with_capacity(items.iter().map(|i| i.get().len() + 1).sum::<usize>() + 2);
        text.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(item.get());
        }
        text.push(']');
        Native(RawValue::from_string(text).expect("a list of JSON values is JSON"))
    }

    pub fn from_raw(raw: Box<RawValue>) -> Native {
        Native(raw)
    }

    /// The client's JSON text.
    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// The message parsed (for patching): it was parsed once already, so it parses again.
    pub fn value(&self) -> Value {
        parsed(&self.0)
    }
}

/// One entry of the conversation that goes upstream: the client's own text, or a value
/// compactd made or patched.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum Sent<'a> {
    Raw(&'a RawValue),
    Value(Cow<'a, Value>),
}

impl<'a> Sent<'a> {
    pub fn owned(value: Value) -> Sent<'a> {
        Sent::Value(Cow::Owned(value))
    }
}

/// The messages of a conversation field (`messages`, or `input` as a list), each as the
/// client's text; `what` names the field's expected shape in the error.
pub fn listed(
    conversation: Option<&str>,
    what: &str,
) -> Result<Vec<Box<RawValue>>, UnreadableRequest> {
    conversation
        .filter(|text| text.starts_with('['))
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| UnreadableRequest(format!("expected {what}")))
}

/// One message of a conversation parsed on its own (to be read, then dropped).
pub fn parsed(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// A request body read without parsing its conversation: every other field parsed, and
/// where the conversation field's JSON lies in `bytes` (`None` if absent). A body that is
/// JSON but not an object comes back whole, with no conversation (its API's reader says
/// what it expected); a body that is not JSON is an error.
pub fn split(
    bytes: &[u8],
    field: &str,
) -> serde_json::Result<(Value, Option<std::ops::Range<usize>>)> {
    let fields: std::collections::BTreeMap<String, &RawValue> = match serde_json::from_slice(bytes)
    {
        Ok(fields) => fields,
        Err(_) => return serde_json::from_slice::<Value>(bytes).map(|whole| (whole, None)),
    };
    let mut rest = serde_json::Map::new();
    let mut conversation = None;
    for (key, raw) in fields {
        if key == field {
            let start = raw.get().as_ptr() as usize - bytes.as_ptr() as usize;
            conversation = Some(start..start + raw.get().len());
        } else {
            rest.insert(key, serde_json::from_str(raw.get())?);
        }
    }
    Ok((Value::Object(rest), conversation))
}

/// A JSON object serialized with one field set to `value` (in place of what it held).
struct WithField<'a, T> {
    body: &'a Value,
    field: &'a str,
    value: &'a T,
}

impl<T: serde::Serialize> serde::Serialize for WithField<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        if let Some(fields) = self.body.as_object() {
            for (key, value) in fields.iter().filter(|(k, _)| k.as_str() != self.field) {
                map.serialize_entry(key, value)?;
            }
        }
        map.serialize_entry(self.field, self.value)?;
        map.end()
    }
}

/// The arguments the context shows for call `id` of `shown` (shortened when the call alone
/// was too large for its room: see `compaction::step`).
pub fn shown_args<'a>(shown: &'a Message, id: &str) -> Option<&'a Value> {
    shown.parts.iter().find_map(|p| match p {
        Part::ToolCall { id: call, args, .. } if call == id => Some(args),
        _ => None,
    })
}

/// The output the context shows for call `id` of `shown` (masked or shortened, or as it was).
pub fn shown_output<'a>(shown: &'a Message, id: &str) -> Option<&'a String> {
    crate::message::output_of(&shown.parts, id)
}

/// `message` with call `id`'s arguments as `shown` (as the context shows them once
/// shortened): what the wire formats' tests patch a call with.
#[cfg(test)]
pub fn with_call_args(message: &Message, id: &str, shown: Value) -> Message {
    let mut message = message.clone();
    for part in &mut message.parts {
        if let Part::ToolCall { id: call, args, .. } = part
            && call == id
        {
            *args = shown.clone();
        }
    }
    message
}

/// One message of what goes upstream.
#[derive(Debug, Clone)]
pub enum Outgoing<'a> {
    /// A message of the request, sent as the client sent it.
    Native(&'a Native),
    /// A message of the request whose tool outputs (or, for a user message, text) the context
    /// shows otherwise: masked, or shortened to head and tail. `shown` has the parts as shown.
    Patched { native: &'a Native, shown: Message },
    /// The summary of everything the context no longer holds verbatim.
    Summary(&'a str),
    /// A message compactd rendered in the API's shape from its own record.
    Rendered(Value),
}

/// What the upstream answered: the assistant message to record, and the context's size as
/// the upstream counted it (its input, cached parts included, plus the answer), if reported.
#[derive(Debug, Clone)]
pub struct WireReply {
    pub message: Message,
    pub context_tokens: Option<usize>,
    /// Characters of the answer not recorded (over `[proxy] max_recorded_bytes`): they
    /// count in its tokens all the same, since the client sends the whole answer back.
    pub unrecorded_chars: usize,
}

/// Records a streamed answer while it passes to the client, holding at most a bounded amount
/// of it (text beyond the bound keeps its head and its tail).
pub struct Recorder {
    wire: Wire,
    events: super::sse::Splitter,
    assembly: Assembly,
    max_bytes: usize,
}

enum Assembly {
    Chat(super::chat::reply::Assembly),
    Anthropic(super::anthropic::reply::Assembly),
    Responses(super::responses::reply::Assembly),
}

impl Recorder {
    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        for event in self.events.feed(bytes) {
            let Ok(value) = serde_json::from_str::<Value>(&event) else {
                continue;
            };
            match &mut self.assembly {
                Assembly::Chat(a) => a.event(&value, self.max_bytes),
                Assembly::Anthropic(a) => a.event(&value, self.max_bytes),
                Assembly::Responses(a) => a.event(&value, self.max_bytes),
            }
        }
    }

    /// The bytes held: what the events assembled so far keep, and the event being read.
    pub fn held(&self) -> usize {
        self.events.held()
            + match &self.assembly {
                Assembly::Chat(a) => a.held(),
                Assembly::Anthropic(a) => a.held(),
                Assembly::Responses(a) => a.held(),
            }
    }

    /// The answer the stream carried, once it ended.
    pub fn finish(self) -> Option<WireReply> {
        let _ = self.wire;
        match self.assembly {
            Assembly::Chat(a) => a.finish(self.max_bytes),
            Assembly::Anthropic(a) => a.finish(self.max_bytes),
            Assembly::Responses(a) => a.finish(self.max_bytes),
        }
    }
}

/// Text kept within `max_bytes`: once longer, its head and tail with a marker between (the
/// middle is dropped as it arrives, so memory stays bounded whatever the upstream sends).
///
/// Text up to [`BOUND_SLACK`] bytes over the bound is kept whole, so a text cut once is never
/// cut again: [`bounded`] of a recorded answer is the answer, and [`bounded`] of the whole
/// answer a client sends back is what was recorded of it (the two fingerprint the same).
#[derive(Debug, Clone, Default)]
pub struct BoundedText {
    head: String,
    tail: std::collections::VecDeque<char>,
    tail_bytes: usize,
    dropped: usize,
}

/// How far past its bound a text may go before it is cut (more than the marker takes).
pub const BOUND_SLACK: usize = 256;

impl BoundedText {
    pub fn push(&mut self, piece: &str, max_bytes: usize) {
        let half = max_bytes / 2;
        for c in piece.chars() {
            if self.head.len() + c.len_utf8() <= half {
                self.head.push(c);
                continue;
            }
            self.tail.push_back(c);
            self.tail_bytes += c.len_utf8();
            while self.tail_bytes > half + BOUND_SLACK {
                let Some(old) = self.tail.pop_front() else {
                    break;
                };
                self.tail_bytes -= old.len_utf8();
                self.dropped += 1;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty()
    }

    /// The bytes held.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail_bytes
    }

    /// The text, with a marker where its middle was dropped; and how many characters were.
    pub fn finish_counted(mut self, max_bytes: usize) -> (String, usize) {
        if self.dropped > 0 {
            // Cut: the tail keeps half the bound, like the head.
            while self.tail_bytes > max_bytes / 2 {
                let Some(old) = self.tail.pop_front() else {
                    break;
                };
                self.tail_bytes -= old.len_utf8();
                self.dropped += 1;
            }
        }
        let tail: String = self.tail.into_iter().collect();
        if self.dropped == 0 {
            return (self.head + &tail, 0);
        }
        let text = format!(
            "{}\n[… {} characters of this answer were not recorded (over [proxy] max_recorded_bytes) …]\n{tail}",
            self.head,
            crate::compaction::microcompact::thousands(self.dropped)
        );
        (text, self.dropped)
    }

    /// The text, with a marker where its middle was dropped.
    pub fn finish(self, max_bytes: usize) -> String {
        self.finish_counted(max_bytes).0
    }
}

/// `text` as a recording within `max_bytes` keeps it: whole up to [`BOUND_SLACK`] past the
/// bound, else its head and tail around a marker.
pub fn bounded(text: &str, max_bytes: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max_bytes {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut kept = BoundedText::default();
    kept.push(text, max_bytes);
    match kept.dropped {
        0 => std::borrow::Cow::Borrowed(text),
        _ => std::borrow::Cow::Owned(kept.finish(max_bytes)),
    }
}

/// Estimated tokens of a JSON value as a model server counts it: every string, key and
/// number in it (a tool's schema is read whole), about four characters a token (counted as
/// the estimate counts them: [`counted_chars`](crate::compaction::counted_chars)).
pub fn json_tokens(value: &Value) -> usize {
    fn chars(value: &Value) -> usize {
        match value {
            Value::String(s) => crate::compaction::counted_chars(s),
            Value::Array(items) => items.iter().map(chars).sum(),
            Value::Object(map) => map.iter().map(|(k, v)| k.len() + chars(v)).sum(),
            Value::Number(n) => crate::compaction::counted_chars(&n.to_string()),
            Value::Bool(_) | Value::Null => 0,
        }
    }
    chars(value).div_ceil(4)
}

/// Estimated tokens of the body's fields other than `conversation` (`messages` or `input`)
/// and the generation settings that cost nothing.
pub fn overhead_tokens(body: &Value, conversation: &str) -> usize {
    let Some(fields) = body.as_object() else {
        return 0;
    };
    fields
        .iter()
        .filter(|(k, _)| k.as_str() != conversation && COUNTED.contains(&k.as_str()))
        .map(|(_, v)| json_tokens(v))
        .sum()
}

/// The completion a request asks room for: the first of `fields` that is a count (one over
/// [`MAX_REPORTED_TOKENS`] is no window's, and taken as none).
///
/// [`MAX_REPORTED_TOKENS`]: compactd_core::MAX_REPORTED_TOKENS
pub fn completion_tokens(body: &Value, fields: &[&str]) -> usize {
    fields
        .iter()
        .find_map(|field| body[field].as_u64())
        .filter(|&tokens| tokens <= compactd_core::MAX_REPORTED_TOKENS)
        .unwrap_or(0) as usize
}

/// Request fields a model reads (and bills) besides the conversation.
const COUNTED: &[&str] = &[
    "system",
    "instructions",
    "tools",
    "tool_choice",
    "functions",
    "response_format",
    "text",
];

/// The text of `value` if it is a string, or the text blocks of a list joined.
pub fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Content `parts` with `text` in place of their text (in the first text part, of type
/// `kind`; the others go) and every other part as it was.
pub fn with_text(parts: &[Value], text: String, kind: &str) -> Value {
    let mut text = Some(text);
    let mut out = Vec::with_capacity(parts.len() + 1);
    for part in parts {
        if part["type"] != kind {
            out.push(part.clone());
        } else if let Some(text) = text.take() {
            out.push(json!({"type": kind, "text": text}));
        }
    }
    if let Some(text) = text {
        out.insert(0, json!({"type": kind, "text": text}));
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_text_keeps_head_and_tail_of_a_huge_answer() {
        let mut text = BoundedText::default();
        for i in 0..10_000 {
            text.push(&format!("line {i}\n"), 1_000);
        }
        let kept = text.finish(1_000);
        assert!(kept.len() < 1_200, "{}", kept.len());
        assert!(kept.starts_with("line 0\n"));
        assert!(kept.ends_with("line 9999\n"));
        assert!(kept.contains("were not recorded"));
        let mut small = BoundedText::default();
        small.push("héllo", 1_000);
        assert_eq!(small.finish(1_000), "héllo");
    }

    #[test]
    fn a_text_is_cut_once_and_the_whole_text_bounds_to_what_was_recorded() {
        let whole: String = (0..5_000).map(|i| format!("{i} é ")).collect();
        let mut streamed = BoundedText::default();
        for piece in whole
            .as_bytes()
            .chunks(7)
            .map(|c| String::from_utf8_lossy(c).into_owned())
        {
            streamed.push(&piece, 1_000);
        }
        // (chunks(7) may split a character; the same lossy pieces are what both see.)
        let pieces: String = whole
            .as_bytes()
            .chunks(7)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let recorded = streamed.finish(1_000);
        assert_eq!(bounded(&pieces, 1_000), recorded);
        assert_eq!(bounded(&recorded, 1_000), recorded, "never cut twice");
        let near = "x".repeat(1_000 + BOUND_SLACK);
        assert_eq!(bounded(&near, 1_000), near, "kept whole within the slack");
    }
}
