//! The data model every layer shares: a [`Message`] has a [`Role`] and a list of [`Part`]s.
//!
//! The wire shape is `{"role": "...", "parts": [...]}`. As a convenience for clients that only
//! send text, `{"role": "user", "content": "hello"}` is accepted and becomes one text part.
//!
//! Tool results may arrive in two places, because the two big API families disagree:
//! OpenAI-style agents send them in `role:"tool"` messages, Anthropic-style agents inside
//! `role:"user"` messages. Both are accepted and treated the same; [`Message::validate`] only
//! rejects combinations no model API accepts (a tool call from the user, a result from the
//! assistant).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    System,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
            Role::Tool => "tool",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "system" => Some(Role::System),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text written by the user, the assistant or the system.
    Text { text: String },
    /// The model's visible reasoning ("thinking").
    Reasoning { text: String },
    /// A call the assistant makes; `args` is the tool's JSON arguments.
    ToolCall {
        id: String,
        name: String,
        #[serde(default)]
        args: Value,
    },
    /// What a tool returned to the call with id `call_id`.
    ToolResult {
        call_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        output: String,
        #[serde(default, skip_serializing_if = "is_false")]
        is_error: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The output of call `call_id`'s result among `parts`, if they hold one.
pub fn output_of<'a>(parts: &'a [Part], call_id: &str) -> Option<&'a String> {
    parts.iter().find_map(|p| match p {
        Part::ToolResult {
            call_id: id,
            output,
            ..
        } if id == call_id => Some(output),
        _ => None,
    })
}

/// A message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(try_from = "WireMessage")]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// What clients may send: `parts`, or `content` as a shorthand for one text part.
#[derive(Deserialize)]
struct WireMessage {
    role: Role,
    #[serde(default)]
    parts: Option<Vec<Part>>,
    #[serde(default)]
    content: Option<String>,
}

impl TryFrom<WireMessage> for Message {
    type Error = String;

    fn try_from(wire: WireMessage) -> Result<Self, Self::Error> {
        let parts = match (wire.parts, wire.content) {
            (Some(parts), None) => parts,
            (None, Some(text)) => vec![Part::Text { text }],
            (Some(_), Some(_)) => {
                return Err("a message has either `parts` or `content`, not both".into());
            }
            (None, None) => return Err("a message needs `parts` (or `content`)".into()),
        };
        Ok(Message {
            role: wire.role,
            parts,
        })
    }
}

/// Why a message cannot be accepted, whatever the session holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("a message needs at least one part")]
    NoParts,
    #[error("a {role} message cannot carry a tool_call (only assistant messages call tools)")]
    ToolCallOutsideAssistant { role: &'static str },
    #[error("a {role} message cannot carry a tool_result (results come in user or tool messages)")]
    ToolResultMisplaced { role: &'static str },
    #[error("a tool message carries only tool_result parts")]
    ToolMessageWithoutResults,
    #[error("a tool_call needs a non-empty id and name")]
    EmptyToolCall,
    #[error("a tool_result needs a non-empty call_id")]
    EmptyCallId,
    #[error("tool_call id `{0}` appears twice")]
    DuplicateCallId(String),
}

impl Message {
    /// A message holding one text part.
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// Checks the rules that hold for a message on its own (the session-level rule, that a
    /// result's call exists, is the store's).
    pub fn validate(&self) -> Result<(), MessageError> {
        if self.parts.is_empty() {
            return Err(MessageError::NoParts);
        }
        let role = self.role.as_str();
        let mut ids = std::collections::HashSet::new();
        for part in &self.parts {
            match part {
                Part::ToolCall { id, name, .. } => {
                    if self.role != Role::Assistant {
                        return Err(MessageError::ToolCallOutsideAssistant { role });
                    }
                    if id.is_empty() || name.is_empty() {
                        return Err(MessageError::EmptyToolCall);
                    }
                    if !ids.insert(id.as_str()) {
                        return Err(MessageError::DuplicateCallId(id.clone()));
                    }
                }
                Part::ToolResult { call_id, .. } => {
                    if !matches!(self.role, Role::User | Role::Tool) {
                        return Err(MessageError::ToolResultMisplaced { role });
                    }
                    if call_id.is_empty() {
                        return Err(MessageError::EmptyCallId);
                    }
                }
                Part::Text { .. } | Part::Reasoning { .. } => {
                    if self.role == Role::Tool {
                        return Err(MessageError::ToolMessageWithoutResults);
                    }
                }
            }
        }
        Ok(())
    }

    /// The message's text parts joined by newlines (reasoning excluded).
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            if let Part::Text { text } = part {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
        }
        out
    }

    /// True for a message a person typed: a user message with non-blank text. Tool results
    /// that travel in user messages (Anthropic style) do not count.
    pub fn is_user_text(&self) -> bool {
        self.role == Role::User
            && self
                .parts
                .iter()
                .any(|p| matches!(p, Part::Text { text } if !text.trim().is_empty()))
    }

    /// The ids of the tool calls this message makes.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolCall { id, .. } => Some(id.as_str()),
            _ => None,
        })
    }

    /// The call ids this message answers.
    pub fn tool_result_ids(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
    }

    /// Where a task whose message is `messages[task]` begins: the message before it when the
    /// task answers that message's calls, all of them and no other (Claude Code's fork: the
    /// fork's directive follows, in one user message, the results of the parent's `Agent`
    /// call that made it), for neither may ever stand without the other; else its own.
    pub fn task_start(messages: &[Message], task: usize) -> usize {
        match task.checked_sub(1) {
            Some(call)
                if messages[task].is_user_text()
                    && answers_exactly(
                        messages[task].tool_result_ids(),
                        messages[call].tool_call_ids(),
                    ) =>
            {
                call
            }
            _ => task,
        }
    }
}

/// Whether results of the ids `answers` answer the calls of the ids `calls`, every one and
/// no other (and there are some).
pub fn answers_exactly<'a>(
    answers: impl IntoIterator<Item = &'a str>,
    calls: impl IntoIterator<Item = &'a str>,
) -> bool {
    let answers: std::collections::HashSet<&str> = answers.into_iter().collect();
    let calls: std::collections::HashSet<&str> = calls.into_iter().collect();
    !calls.is_empty() && answers == calls
}

/// An append as the daemon takes it, read once from a body that holds one message, an array
/// of them, or `{"messages": [...], "usage": {"input_tokens": N}, "wait": bool}` (the API's
/// `AppendBody` documents those shapes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageBatch {
    pub messages: Vec<Message>,
    /// The agent's `usage.input_tokens` for its last model call.
    pub input_tokens: Option<u64>,
    /// `usage.compaction_num`: the `compaction_num` of the context that call was sent with.
    pub compaction_num: Option<u32>,
    pub wait: bool,
}

/// Why a body of messages could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("{0}")]
    Shape(String),
    #[error("message {index}: {error}")]
    Message { index: usize, error: String },
}

/// Reads a body of messages (the one parser for the API, the CLI and the offline commands).
/// Each message is parsed straight from its slice of the body: no whole-body JSON tree is
/// built, so a large batch costs about its own size in memory, not several times it.
pub fn parse_message_batch(json: &[u8]) -> Result<MessageBatch, BatchError> {
    use serde_json::value::RawValue;
    let first = json.iter().find(|b| !b.is_ascii_whitespace());
    let items: Vec<&RawValue> = match first {
        Some(b'[') => serde_json::from_slice(json).map_err(|e| BatchError::Json(e.to_string()))?,
        Some(b'{') => {
            let fields: std::collections::BTreeMap<String, &RawValue> =
                serde_json::from_slice(json).map_err(|e| BatchError::Json(e.to_string()))?;
            if !fields.contains_key("messages") {
                let message = serde_json::from_slice(json).map_err(|e| BatchError::Message {
                    index: 0,
                    error: e.to_string(),
                })?;
                return Ok(MessageBatch {
                    messages: vec![message],
                    ..Default::default()
                });
            }
            return batch_object(fields);
        }
        _ => {
            return Err(BatchError::Shape(
                "expected a message, an array of messages, or {\"messages\": [...]}".into(),
            ));
        }
    };
    Ok(MessageBatch {
        messages: parse_items(&items)?,
        ..Default::default()
    })
}

fn batch_object(
    fields: std::collections::BTreeMap<String, &serde_json::value::RawValue>,
) -> Result<MessageBatch, BatchError> {
    let mut batch = MessageBatch::default();
    for (key, value) in fields {
        let text = value.get();
        match key.as_str() {
            "messages" => {
                let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(text)
                    .map_err(|_| BatchError::Shape("messages must be an array".into()))?;
                batch.messages = parse_items(&items)?;
            }
            "usage" if text == "null" => {}
            "usage" => {
                let usage: Value =
                    serde_json::from_str(text).map_err(|e| BatchError::Json(e.to_string()))?;
                batch.input_tokens = Some(
                    usage
                        .get("input_tokens")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| {
                            BatchError::Shape(
                                "usage needs a non-negative integer input_tokens".into(),
                            )
                        })?,
                );
                batch.compaction_num = match usage.get("compaction_num") {
                    None | Some(Value::Null) => None,
                    Some(num) => Some(num.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                        BatchError::Shape(
                            "usage.compaction_num must be the compaction_num of the context the call was sent with (a non-negative integer)".into(),
                        )
                    })?),
                };
            }
            "wait" => {
                batch.wait = match text {
                    "true" => true,
                    "false" | "null" => false,
                    _ => return Err(BatchError::Shape("wait must be true or false".into())),
                }
            }
            other => {
                return Err(BatchError::Shape(format!(
                    "unknown field `{other}` (expected messages, usage, wait)"
                )));
            }
        }
    }
    Ok(batch)
}

fn parse_items(items: &[&serde_json::value::RawValue]) -> Result<Vec<Message>, BatchError> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            serde_json::from_str::<Message>(item.get()).map_err(|e| BatchError::Message {
                index,
                error: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task begins at the call its message answers when it answers all of that call's
    /// message and nothing else (Claude Code's fork); otherwise at itself.
    #[test]
    fn a_task_answering_the_calls_before_it_begins_at_them() {
        let calls = |ids: &[&str]| Message {
            role: Role::Assistant,
            parts: ids
                .iter()
                .map(|id| Part::ToolCall {
                    id: id.to_string(),
                    name: "Agent".into(),
                    args: Value::Null,
                })
                .collect(),
        };
        let answer = |ids: &[&str], text: &str| Message {
            role: Role::User,
            parts: ids
                .iter()
                .map(|id| Part::ToolResult {
                    call_id: id.to_string(),
                    name: None,
                    output: "Fork started".into(),
                    is_error: false,
                })
                .chain((!text.is_empty()).then(|| Part::Text { text: text.into() }))
                .collect(),
        };
        let task = Message::text(Role::User, "the task");
        let start =
            |call: Message, answer: Message| Message::task_start(&[task.clone(), call, answer], 2);
        assert_eq!(start(calls(&["a"]), answer(&["a"], "your directive")), 1);
        assert_eq!(
            start(calls(&["a", "b"]), answer(&["b", "a"], "directive")),
            1
        );
        // Results alone are no task; some of the calls, or others, cannot stand apart.
        assert_eq!(start(calls(&["a"]), answer(&["a"], "")), 2);
        assert_eq!(start(calls(&["a", "b"]), answer(&["a"], "directive")), 2);
        assert_eq!(start(calls(&["a"]), answer(&["a", "z"], "directive")), 2);
        assert_eq!(Message::task_start(std::slice::from_ref(&task), 0), 0);
        assert_eq!(start(task.clone(), task.clone()), 2);
    }

    #[test]
    fn role_names_are_the_serde_names_and_parse_back() {
        for role in [Role::User, Role::Assistant, Role::System, Role::Tool] {
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
    }
    use serde_json::json;

    #[test]
    fn parses_every_part_type_and_round_trips() {
        let v = json!({"role": "assistant", "parts": [
            {"type": "text", "text": "hi"},
            {"type": "reasoning", "text": "think"},
            {"type": "tool_call", "id": "c1", "name": "read", "args": {"file_path": "/a"}},
        ]});
        let m: Message = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(m.parts.len(), 3);
        assert_eq!(serde_json::to_value(&m).unwrap(), v);
    }

    #[test]
    fn content_shorthand_becomes_one_text_part() {
        let m: Message =
            serde_json::from_value(json!({"role": "user", "content": "hello"})).unwrap();
        assert_eq!(m, Message::text(Role::User, "hello"));
    }

    #[test]
    fn unknown_role_and_part_type_are_named_in_the_error() {
        let e = serde_json::from_value::<Message>(json!({"role": "robot", "content": "x"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("robot"), "{e}");
        let e = serde_json::from_value::<Message>(
            json!({"role": "user", "parts": [{"type": "image", "url": "x"}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("image"), "{e}");
    }

    #[test]
    fn tool_results_are_accepted_in_tool_and_user_messages() {
        for role in ["tool", "user"] {
            let m: Message = serde_json::from_value(json!({"role": role, "parts": [
                {"type": "tool_result", "call_id": "c1", "output": "ok"}]}))
            .unwrap();
            assert_eq!(m.validate(), Ok(()));
            assert_eq!(m.tool_result_ids().collect::<Vec<_>>(), ["c1"]);
            assert!(!m.is_user_text());
        }
    }

    #[test]
    fn misplaced_parts_are_rejected() {
        let call = Part::ToolCall {
            id: "c".into(),
            name: "bash".into(),
            args: json!({}),
        };
        let user_call = Message {
            role: Role::User,
            parts: vec![call.clone()],
        };
        assert!(matches!(
            user_call.validate(),
            Err(MessageError::ToolCallOutsideAssistant { .. })
        ));
        let result = Part::ToolResult {
            call_id: "c".into(),
            name: None,
            output: "x".into(),
            is_error: false,
        };
        let assistant_result = Message {
            role: Role::Assistant,
            parts: vec![result],
        };
        assert!(matches!(
            assistant_result.validate(),
            Err(MessageError::ToolResultMisplaced { .. })
        ));
        let tool_text = Message::text(Role::Tool, "x");
        assert_eq!(
            tool_text.validate(),
            Err(MessageError::ToolMessageWithoutResults)
        );
        let dup = Message {
            role: Role::Assistant,
            parts: vec![call.clone(), call],
        };
        assert_eq!(
            dup.validate(),
            Err(MessageError::DuplicateCallId("c".into()))
        );
        let empty = Message {
            role: Role::User,
            parts: vec![],
        };
        assert_eq!(empty.validate(), Err(MessageError::NoParts));
    }

    #[test]
    fn message_batches_come_single_bare_or_wrapped() {
        let one = br#"{"role":"user","content":"a"}"#;
        let bare = br#" [{"role":"user","content":"a"}, {"role":"user","content":"b"}]"#;
        let wrapped = br#"{"wait": true, "messages":[{"role":"user","content":"a"}], "usage": {"input_tokens": 7}}"#;
        assert_eq!(parse_message_batch(one).unwrap().messages.len(), 1);
        assert_eq!(parse_message_batch(bare).unwrap().messages.len(), 2);
        let w = parse_message_batch(wrapped).unwrap();
        assert_eq!(
            (w.messages.len(), w.input_tokens, w.wait),
            (1, Some(7), true)
        );
    }

    #[test]
    fn a_bad_batch_says_which_message_or_field() {
        let bad = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","parts":[{"type":"video"}]}]}"#;
        let e = parse_message_batch(bad).unwrap_err();
        assert!(
            matches!(&e, BatchError::Message { index: 1, error } if error.contains("video")),
            "{e}"
        );
        for (body, needle) in [
            (&br#"{"messages":[], "colour": 1}"#[..], "colour"),
            (br#"{"messages": 3}"#, "array"),
            (br#"{"messages":[], "wait": "yes"}"#, "wait"),
            (
                br#"{"messages":[], "usage": {"input_tokens": -1}}"#,
                "input_tokens",
            ),
            (br#"42"#, "expected a message"),
            (br#"{"role":"#, "invalid JSON"),
        ] {
            let e = parse_message_batch(body).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
