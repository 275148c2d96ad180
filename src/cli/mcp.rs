//! `compactd mcp`: a Model Context Protocol server over stdio (JSON-RPC 2.0, one message per
//! line, protocol version 2025-06-18) that lets the agent itself recall what compaction took
//! out of its context: `search_history` and `read_messages`. It talks to the daemon over its
//! socket like every other command (so the daemon's uid check applies), and holds nothing.
//!
//! Tool failures (no such session, a daemon that is not running, bad arguments) are answered
//! as tool results with `isError: true`, which the model reads; only what is not a tool call
//! at all (an unknown method or tool, a line that is not JSON) is a JSON-RPC error. A batch
//! (an array of requests, as JSON-RPC 2.0 and earlier MCP versions allow) is answered with
//! an array; a request's id is echoed byte for byte (an integer past 2^53 stays exact).

use super::render::full;
use crate::client::{Client, ClientError};
use crate::protocol::SessionId;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The protocol version this server speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// The longest request line taken; longer ones are refused (and read past).
const MAX_LINE_BYTES: usize = 1024 * 1024;
/// What one `read_messages` answer holds at most, in characters (about 15,000 tokens): the
/// rest is one call away (`offset`), so reading back a huge output cannot flood the context.
const MAX_READ_CHARS: usize = 60_000;
/// Messages one `read_messages` call reads from the daemon at most.
const MAX_READ_MESSAGES: u64 = 200;

/// Serves MCP on stdin/stdout until stdin closes. `session` is the default session of the
/// tools (`--session`, or `COMPACTD_SESSION`).
pub async fn serve(client: Client, session: Option<SessionId>) -> anyhow::Result<()> {
    let server = Server { client, session };
    let mut input = BufReader::new(tokio::io::stdin());
    let mut output = tokio::io::stdout();
    while let Some(line) = read_line(&mut input).await? {
        let answer = match line {
            Line::TooLong => Some(error(NULL_ID, -32700, "the message is longer than 1 MiB")),
            Line::Text(text) if text.trim().is_empty() => None,
            Line::Text(text) => server.handle_line(&text).await,
        };
        if let Some(answer) = answer {
            let mut bytes = answer.get().as_bytes().to_vec();
            bytes.push(b'\n');
            output.write_all(&bytes).await?;
            output.flush().await?;
        }
    }
    Ok(())
}

enum Line {
    Text(String),
    TooLong,
}

/// The next line of `input` (without its newline); `None` at the end.
async fn read_line(input: &mut BufReader<tokio::io::Stdin>) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buffer = input.fill_buf().await?;
        if buffer.is_empty() {
            return Ok((!line.is_empty() || too_long).then(|| finish(line, too_long)));
        }
        let newline = buffer.iter().position(|&b| b == b'\n');
        let chunk = &buffer[..newline.unwrap_or(buffer.len())];
        if too_long || line.len() + chunk.len() > MAX_LINE_BYTES {
            too_long = true;
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        let used = newline.map_or(buffer.len(), |n| n + 1);
        input.consume(used);
        if newline.is_some() {
            return Ok(Some(finish(line, too_long)));
        }
    }
}

fn finish(line: Vec<u8>, too_long: bool) -> Line {
    if too_long {
        Line::TooLong
    } else {
        Line::Text(String::from_utf8_lossy(&line).into_owned())
    }
}

/// A JSON-RPC message as read: the id kept as its text.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    method: Option<String>,
    #[serde(default)]
    params: Value,
    #[serde(default)]
    result: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

/// A JSON-RPC answer: its id echoed as the request wrote it.
#[derive(Serialize)]
struct Reply<'a> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// The id of an answer to what had no usable id.
const NULL_ID: &str = "null";

fn reply(id: &str, result: Option<Value>, error: Option<Value>) -> Box<RawValue> {
    let null = RawValue::from_string(NULL_ID.into()).expect("null is JSON");
    let id = RawValue::from_string(id.into()).unwrap_or(null);
    let reply = Reply {
        jsonrpc: "2.0",
        id: &id,
        result,
        error,
    };
    serde_json::value::to_raw_value(&reply).expect("a reply serializes")
}

fn error(id: &str, code: i64, message: &str) -> Box<RawValue> {
    reply(id, None, Some(json!({"code": code, "message": message})))
}

fn answer(id: &str, result: Value) -> Box<RawValue> {
    reply(id, Some(result), None)
}

/// Why a message could not be read: not JSON (a parse error), or not a request's shape.
fn not_read(e: &serde_json::Error) -> Box<RawValue> {
    match e.classify() {
        serde_json::error::Category::Data => error(NULL_ID, -32600, &format!("not a request: {e}")),
        _ => error(NULL_ID, -32700, &format!("not JSON: {e}")),
    }
}

/// A JSON-RPC id: a string, a number or null.
fn valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
}

struct Server {
    client: Client,
    session: Option<SessionId>,
}

/// Requests one batch may hold: each may read the daemon.
const MAX_BATCH: usize = 64;

impl Server {
    /// The answer to one line: a message, or a batch of them answered as an array; `None`
    /// when nothing is owed (notifications, the client's own answers).
    async fn handle_line(&self, line: &str) -> Option<Box<RawValue>> {
        if !line.trim_start().starts_with('[') {
            return self.handle(line).await;
        }
        let items: Vec<&RawValue> = match serde_json::from_str(line) {
            Ok(items) => items,
            Err(e) => return Some(not_read(&e)),
        };
        if items.is_empty() || items.len() > MAX_BATCH {
            let why = format!("a batch holds 1 to {MAX_BATCH} requests");
            return Some(error(NULL_ID, -32600, &why));
        }
        let mut answers = Vec::new();
        for item in items {
            answers.extend(self.handle(item.get()).await);
        }
        (!answers.is_empty()).then(|| serde_json::value::to_raw_value(&answers).ok())?
    }

    /// The answer to one message; `None` for notifications and the client's own answers.
    async fn handle(&self, text: &str) -> Option<Box<RawValue>> {
        let message: Incoming = match serde_json::from_str(text) {
            Ok(message) => message,
            Err(e) => return Some(not_read(&e)),
        };
        let id = message.id.map(RawValue::get);
        if message.id.is_some_and(|id| !valid_id(id)) {
            return Some(error(
                NULL_ID,
                -32600,
                "an id is a string, a number or null",
            ));
        }
        let Some(method) = message.method else {
            // A response to us (we send no requests) or something else: nothing to say,
            // unless it claims to be a request.
            let request = message.result.is_none() && message.error.is_none();
            return id
                .filter(|_| request)
                .map(|id| error(id, -32600, "a request needs a method"));
        };
        let id = id?;
        Some(match method.as_str() {
            "initialize" => answer(id, initialize()),
            "ping" => answer(id, json!({})),
            "tools/list" => answer(id, json!({"tools": tools()})),
            "tools/call" => match self.call(&message.params).await {
                Ok(result) => answer(id, result),
                Err(NoSuchTool(message)) => error(id, -32602, &message),
            },
            other => error(id, -32601, &format!("no method {other:?}")),
        })
    }

    /// A tool call's result; `Err` only for a call naming no tool of ours.
    async fn call(&self, params: &Value) -> Result<Value, NoSuchTool> {
        let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
        let outcome = match params.get("name").and_then(Value::as_str) {
            Some("search_history") => self.search(&arguments).await,
            Some("read_messages") => self.read(&arguments).await,
            Some(other) => {
                return Err(NoSuchTool(format!(
                    "no tool {other:?}: search_history, read_messages"
                )));
            }
            None => return Err(NoSuchTool("tools/call needs params.name".into())),
        };
        Ok(match outcome {
            Ok(text) => json!({"content": [{"type": "text", "text": text}], "isError": false}),
            Err(ToolError(text)) => {
                json!({"content": [{"type": "text", "text": text}], "isError": true})
            }
        })
    }

    fn session(&self, arguments: &Value) -> Result<SessionId, ToolError> {
        match arguments.get("session").and_then(Value::as_str) {
            Some(id) => id
                .parse()
                .map_err(|e| ToolError(format!("session {id:?}: {e}"))),
            None => self.session.clone().ok_or_else(|| {
                "name the session: its id is in the context's masked placeholders and summary header ('session ID'), or run `compactd session list`".into()
            }),
        }
    }

    async fn search(&self, arguments: &Value) -> Result<String, ToolError> {
        let id = self.session(arguments)?;
        let query = arguments
            .get("query")
            .and_then(Value::as_str)
            .ok_or("search_history needs `query`: the words to find")?;
        let limit = arguments
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(5)
            .clamp(1, 50);
        let found = self.client.search(&id, query, limit as usize).await?;
        if found.results.is_empty() {
            return Ok(format!("Nothing in session {id} matches {query:?}."));
        }
        let mut text =
            format!("Best matches in session {id} (read one whole with read_messages):\n");
        for r in &found.results {
            let place = if r.in_context {
                "still in your context"
            } else {
                "no longer in your context"
            };
            text.push_str(&format!(
                "- seq {} ({}, {place}): {}\n",
                r.seq,
                r.role.as_str(),
                r.snippet
            ));
        }
        Ok(text)
    }

    async fn read(&self, arguments: &Value) -> Result<String, ToolError> {
        let id = self.session(arguments)?;
        let seq = |key: &str| {
            arguments
                .get(key)
                .and_then(Value::as_u64)
                .filter(|&n| n >= 1)
        };
        let from = seq("from_seq").ok_or("read_messages needs `from_seq` (1 or more)")?;
        let to = seq("to_seq").unwrap_or(from);
        if to < from {
            return Err(format!("to_seq {to} is before from_seq {from}").into());
        }
        let offset = arguments.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
        let count = (to - from).saturating_add(1).min(MAX_READ_MESSAGES);
        let page = self.client.history(&id, from - 1, count as usize).await?;
        let read: Vec<_> = page.messages.iter().filter(|m| m.seq <= to).collect();
        let mut text = String::new();
        for m in &read {
            let parts: Vec<crate::message::Part> =
                serde_json::from_str(m.parts.get()).unwrap_or_default();
            text.push_str(&format!(
                "── seq {} {}\n{}\n",
                m.seq,
                m.role.as_str(),
                full(&parts)
            ));
        }
        if text.is_empty() {
            return Err(format!("session {id} has no message from seq {from} to {to}").into());
        }
        // The page ended before `to` (at most MAX_READ_MESSAGES, or a page's bytes), and the
        // session goes on: say where the rest is, as a long text says how to read on.
        let last = read.last().map_or(from, |m| m.seq);
        if last < to && page.next_after.is_some() {
            text.push_str(&format!(
                "[… messages after seq {last} not read yet: call read_messages with from_seq={}, to_seq={to}]\n",
                last + 1
            ));
        }
        Ok(page_of(&text, offset, from, to))
    }
}

/// `MAX_READ_CHARS` of `text` from char `offset`, saying how to read on.
fn page_of(text: &str, offset: usize, from: u64, to: u64) -> String {
    let total = text.chars().count();
    let shown: String = text.chars().skip(offset).take(MAX_READ_CHARS).collect();
    let end = offset + shown.chars().count();
    if end >= total {
        return shown;
    }
    format!(
        "{shown}\n[… {} more characters: call read_messages with from_seq={from}, to_seq={to}, offset={end}]",
        total - end
    )
}

/// A tools/call naming no tool of ours: answered as a JSON-RPC invalid-params error.
struct NoSuchTool(String);

/// Why a tool call failed: the model reads it as an `isError` result, in words it can act on.
struct ToolError(String);

impl From<&str> for ToolError {
    fn from(why: &str) -> ToolError {
        ToolError(why.to_string())
    }
}

impl From<String> for ToolError {
    fn from(why: String) -> ToolError {
        ToolError(why)
    }
}

impl From<ClientError> for ToolError {
    fn from(e: ClientError) -> ToolError {
        ToolError(e.to_string())
    }
}

/// The `initialize` result. Whatever version the client asks for, this one is offered (the
/// client decides whether it can speak it).
fn initialize() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "compactd", "title": "compactd history recall", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Your conversation is kept by compactd, which summarizes and masks older parts to fit your context; nothing is deleted. When a detail you need was summarized or masked (a placeholder names its seq), find it with search_history and read it back whole with read_messages.",
    })
}

/// The two tools, described for a model.
fn tools() -> Value {
    json!([
        {
            "name": "search_history",
            "title": "Search conversation history",
            "description": "Full-text search over this session's whole history, including messages that were summarized or masked out of your context (old tool outputs, earlier files and errors). Use it before re-running a command or guessing at a detail you saw earlier. Returns the best matches with their seq and a snippet; read one whole with read_messages.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "session": {"type": "string", "description": "The session id (named in your context's summary header and masked placeholders); optional when the server was started with --session."},
                    "query": {"type": "string", "description": "Plain words to find, e.g. a file name, an error message, a function. No search syntax needed."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "At most this many matches (default 5)."}
                },
                "required": ["query"]
            }
        },
        {
            "name": "read_messages",
            "title": "Read messages back",
            "description": "Reads messages of this session whole, by seq: the original text, tool calls and complete tool outputs, as they were before any masking or summary. Long answers come in pages: follow the offset it gives.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "session": {"type": "string", "description": "The session id; optional when the server was started with --session."},
                    "from_seq": {"type": "integer", "minimum": 1, "description": "The first message to read (its seq)."},
                    "to_seq": {"type": "integer", "minimum": 1, "description": "The last message to read (default: from_seq)."},
                    "offset": {"type": "integer", "minimum": 0, "description": "Characters to skip, to read on where the previous answer stopped."}
                },
                "required": ["from_seq"]
            }
        }
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_read_comes_in_pages_that_say_how_to_go_on() {
        let text = "x".repeat(MAX_READ_CHARS + 10);
        let first = page_of(&text, 0, 3, 4);
        assert!(
            first.ends_with(&format!("offset={MAX_READ_CHARS}]")),
            "{}",
            &first[first.len() - 120..]
        );
        assert_eq!(page_of(&text, MAX_READ_CHARS, 3, 4), "x".repeat(10));
    }
}
