//! Anthropic Messages (`POST /v1/messages`), as its documentation states the rules:
//! - `messages` is a non-empty list of `user`, `assistant` and (mid-conversation) `system`
//!   messages; the first that is not `system` is a `user` message; consecutive messages of
//!   one role are combined;
//! - content is a non-empty string or a non-empty list of blocks; text blocks are not empty;
//! - every `tool_use` is answered by a `tool_result` in the next user message, and every
//!   `tool_result` answers a `tool_use` of the assistant message right before it; ids unique;
//! - with thinking on, the final assistant message of a tool loop starts with a `thinking` or
//!   `redacted_thinking` block, and every thinking block carries the signature the API gave it;
//! - the prompt fits the model's window, and beside it the completion asked for (`max_tokens`).

use super::delegation::{self, Turn};
use super::{Action, Shared, Task, background_command, sse, task_list};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashSet;

/// A message's content as blocks (a string is one text block).
fn blocks(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// Messages with consecutive same-role ones combined, system messages apart.
fn turns(messages: &[Value]) -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("").to_string();
        if role == "system" {
            continue;
        }
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks(m)),
            _ => out.push((role, blocks(m))),
        }
    }
    out
}

fn thinking_on(body: &Value) -> bool {
    matches!(
        body["thinking"]["type"].as_str(),
        Some("enabled" | "adaptive")
    )
}

/// The request's rule breaks, as the API words them.
pub fn validate(shared: &Shared, body: &Value) -> Result<(), String> {
    let Some(messages) = body["messages"].as_array().filter(|m| !m.is_empty()) else {
        return Err("messages: at least one message is required".into());
    };
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        if !matches!(role, "user" | "assistant" | "system") {
            return Err(format!(
                "messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
            ));
        }
        let content = blocks(m);
        let last = i + 1 == messages.len();
        if content.is_empty() && !(last && role == "assistant") {
            return Err(format!(
                "messages.{i}: all messages must have non-empty content except for the optional final assistant message"
            ));
        }
        for b in &content {
            if b["type"] == "text" && b["text"].as_str().is_none_or(|t| t.trim().is_empty()) {
                return Err(format!(
                    "messages.{i}: text content blocks must contain non-whitespace text"
                ));
            }
            if b["type"] == "thinking" && !b["signature"].as_str().is_some_and(|s| shared.issued(s))
            {
                return Err(format!(
                    "messages.{i}.content: Invalid `signature` in `thinking` block"
                ));
            }
            if b["type"] == "redacted_thinking"
                && !b["data"].as_str().is_some_and(|s| shared.issued(s))
            {
                return Err(format!(
                    "messages.{i}.content: Invalid `data` in `redacted_thinking` block"
                ));
            }
        }
    }
    let turns = turns(messages);
    if turns.first().is_some_and(|(role, _)| role != "user") {
        return Err("messages: the first message must use the \"user\" role".into());
    }
    let mut ids = HashSet::new();
    for (t, (role, content)) in turns.iter().enumerate() {
        let uses: Vec<&str> = content
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str())
            .collect();
        for id in &uses {
            if !ids.insert(id.to_string()) {
                return Err(format!("messages: `tool_use` ids must be unique: {id}"));
            }
        }
        if role == "user" {
            let previous: HashSet<&str> = t
                .checked_sub(1)
                .map(|p| {
                    turns[p]
                        .1
                        .iter()
                        .filter(|b| b["type"] == "tool_use")
                        .filter_map(|b| b["id"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            for b in content.iter().filter(|b| b["type"] == "tool_result") {
                let id = b["tool_use_id"].as_str().unwrap_or("");
                if !previous.contains(id) {
                    return Err(format!(
                        "messages.{t}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
            }
        }
        if role == "assistant" && !uses.is_empty() {
            let answered: HashSet<&str> = turns
                .get(t + 1)
                .map(|(_, next)| {
                    next.iter()
                        .filter(|b| b["type"] == "tool_result")
                        .filter_map(|b| b["tool_use_id"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            let last = t + 1 == turns.len();
            let missing: Vec<&&str> = uses.iter().filter(|u| !answered.contains(**u)).collect();
            if !missing.is_empty() && !last {
                return Err(format!(
                    "messages.{t}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    missing
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    if thinking_on(body)
        && let Some(((_, last), (_, before))) = turns
            .last()
            .zip(turns.len().checked_sub(2).map(|i| &turns[i]))
        && last.iter().any(|b| b["type"] == "tool_result")
        && !before
            .first()
            .is_some_and(|b| matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
    {
        let found = before
            .first()
            .and_then(|b| b["type"].as_str())
            .unwrap_or("nothing");
        return Err(format!(
            "messages.{}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks).",
            turns.len() - 2
        ));
    }
    if body["system"].as_array().is_some_and(|s| {
        s.iter()
            .any(|b| b["text"].as_str().is_some_and(|t| t.is_empty()))
    }) {
        return Err("system: text content blocks must be non-empty".into());
    }
    Ok(())
}

/// The newest tool output of the request, as text (not a side call's: see
/// [`Task::parallel_calls`]).
fn newest_output(messages: &[Value]) -> Option<String> {
    messages
        .iter()
        .rev()
        .flat_map(|m| blocks(m).into_iter().rev())
        .filter(|b| b["type"] == "tool_result" && !is_media_result(b))
        .map(|b| super::text_of(&b["content"]))
        .find(|output| !super::is_side_output(output))
}

/// The last action a compacted context's summary names, if the request has one.
fn summarized_last_action(messages: &[Value]) -> Option<String> {
    let summary = messages
        .iter()
        .map(|m| super::text_of(&m["content"]))
        .find(|text| text.starts_with("This conversation continues from an earlier part"))?;
    let line = summary.lines().find(|l| l.starts_with("Last action:"))?;
    Some(line.to_string())
}

/// A tool result that holds an image or a PDF (Claude Code's `Read` of one).
fn is_media_result(block: &Value) -> bool {
    block["content"].as_array().is_some_and(|parts| {
        parts
            .iter()
            .any(|p| p["type"] == "image" || p["type"] == "document")
    })
}

/// Whether the request's newest tool result is a step's output, not the file read after it.
fn newest_result_is_output(messages: &[Value]) -> bool {
    let newest = messages
        .iter()
        .rev()
        .flat_map(|m| blocks(m).into_iter().rev())
        .find(|b| b["type"] == "tool_result");
    newest.is_some_and(|b| !is_media_result(&b))
}

/// The sub-agent this conversation is, if it is one: its first user message (its task,
/// which compactd keeps pinned) carries the task handed over. Only the first: a summary of
/// the main conversation may quote the call that handed it. A Claude Code fork's first user
/// message is its parent's: a fork is known by a user text that opens with its directive's
/// boilerplate ([`FORK_DIRECTIVE`]), which only a fork's conversation holds.
pub fn sub_agent_of(messages: &[Value]) -> Option<char> {
    let first = messages.iter().find(|m| m["role"] == "user")?;
    let texts = |m: &Value| -> Vec<String> {
        blocks(m)
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str().map(str::to_string))
            .collect()
    };
    texts(first)
        .iter()
        .find_map(|t| delegation::named(t))
        .or_else(|| {
            messages
                .iter()
                .filter(|m| m["role"] == "user")
                .flat_map(texts)
                .filter(|t| t.starts_with(FORK_DIRECTIVE))
                .find_map(|t| delegation::named(&t))
        })
}

/// How Claude Code opens a fork's directive: the fork's conversation is its parent's, then
/// the `Agent` call that forked it answered "Fork started", and this text.
pub const FORK_DIRECTIVE: &str = "<fork-boilerplate>";

/// The Messages API's refusal of a request of `tokens` for a model of `window`, if it refuses
/// it: a prompt past the window, or one that leaves the completion asked for (`max_tokens`)
/// no room beside it.
pub fn length_refusal(body: &Value, tokens: usize, window: usize) -> Option<String> {
    let reserved = body["max_tokens"].as_u64().unwrap_or(0) as usize;
    if tokens > window {
        Some(format!(
            "prompt is too long: {tokens} tokens > {window} maximum"
        ))
    } else if tokens + reserved > window {
        Some(format!(
            "input length and `max_tokens` exceed context limit: {tokens} + {reserved} > {window}, decrease input length or `max_tokens` and try again"
        ))
    } else {
        None
    }
}

pub fn answer(
    shared: &Shared,
    task: &Task,
    body: &Value,
    tokens: usize,
    window: usize,
) -> Result<Response, String> {
    validate(shared, body)?;
    if let Some(why) = length_refusal(body, tokens, window) {
        return Err(why);
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["name"] == "Bash");
    let newest = newest_output(&messages).or_else(|| {
        // Reading a file after each step, the model's step output can be in the summary
        // before the file's result alone (a PDF larger than the kept tail): it goes on from
        // the step the summary's last action ran, as a model reading it would.
        task.read_after_step
            .as_ref()
            .and_then(|_| summarized_last_action(&messages))
    });
    let turn = delegation::next_turn(
        task,
        sub_agent_of(&messages),
        newest.as_deref(),
        shell,
        &delegation::reported(body),
    );
    // A call of the model's own beside the task's steps (a build run in the background, the
    // task list), which the answer makes in place of the turn.
    let mut own_call: Option<(&str, Value)> = None;
    let turn = match turn {
        Turn::Act(then) if task.background_command && shell => {
            let told = background_command::told_by_claude_code(&body.to_string());
            match background_command::next_turn(task, newest.as_deref(), then, told) {
                background_command::Turn::Act(action) => Turn::Act(action),
                background_command::Turn::Start => {
                    own_call = Some((
                        "Bash",
                        json!({"command": background_command::COMMAND, "description": "Build", "run_in_background": true}),
                    ));
                    Turn::Act(Action::Text(String::new()))
                }
                background_command::Turn::Read(file) => {
                    own_call = Some((
                        "Bash",
                        json!({"command": format!("cat {file}"), "description": "Read the build's output"}),
                    ));
                    Turn::Act(Action::Text(String::new()))
                }
            }
        }
        Turn::Act(then) if task.stopped_command && shell => {
            let context = body.to_string();
            match background_command::stopping_turn(newest.as_deref(), then, &context) {
                background_command::Stopping::Start => {
                    own_call = Some((
                        "Bash",
                        json!({"command": background_command::LONG_COMMAND, "description": "Build", "run_in_background": true}),
                    ));
                    Turn::Act(Action::Text(String::new()))
                }
                background_command::Stopping::Stop(id) => {
                    own_call = Some(("TaskStop", json!({"task_id": id})));
                    Turn::Act(Action::Text(String::new()))
                }
                background_command::Stopping::Act(action) => Turn::Act(action),
            }
        }
        Turn::Act(then) if task.task_list && shell => {
            match task_list::next_turn(task, newest.as_deref(), then, &messages) {
                task_list::Turn::Act(action) => Turn::Act(action),
                task_list::Turn::Call(name, input) => {
                    own_call = Some((name, input));
                    Turn::Act(Action::Text(String::new()))
                }
            }
        }
        Turn::Act(_)
            if let Some(file) = &task.read_after_step
                && shell
                && newest_result_is_output(&messages) =>
        {
            own_call = Some(("Read", json!({"file_path": file})));
            Turn::Act(Action::Text(String::new()))
        }
        turn => turn,
    };
    let mut content = Vec::new();
    if thinking_on(body) {
        let thought = match &turn {
            Turn::Act(Action::Run { step, .. }) => format!("Step {step} next."),
            Turn::Sub { step, .. } => format!("Sub-step {step} next."),
            Turn::Delegate => "Handing the sub-steps over.".into(),
            _ if let Some((name, _)) = &own_call => format!("{name} next."),
            _ => "Done.".into(),
        };
        let shown = if body["thinking"]["display"] == "omitted" {
            String::new()
        } else {
            thought.clone()
        };
        content.push(
            json!({"type": "thinking", "thinking": shown, "signature": shared.sign(&thought)}),
        );
    }
    let call = |content: &mut Vec<Value>, text: String, name: &str, input: Value| {
        content.push(json!({"type": "text", "text": text}));
        content.push(json!({"type": "tool_use", "id": format!("toolu_{:08}", shared.next_id()), "name": name, "input": input}));
        "tool_use"
    };
    let stop = match turn {
        _ if let Some((name, input)) = own_call => {
            call(&mut content, format!("{name} next."), name, input)
        }
        Turn::Act(Action::Run { step, command }) => {
            let stop = call(
                &mut content,
                format!("Running step {step}."),
                "Bash",
                json!({"command": command, "description": format!("Run step {step}")}),
            );
            if task.parallel_calls {
                content.push(json!({"type": "tool_use", "id": format!("toolu_{:08}", shared.next_id()), "name": "Bash",
                    "input": {"command": super::side_command(step), "description": format!("Side of step {step}")}}));
            }
            stop
        }
        Turn::Sub { step, command } => call(
            &mut content,
            format!("Running sub-step {step}."),
            "Bash",
            json!({"command": command, "description": format!("Run sub-step {step}")}),
        ),
        Turn::Delegate => {
            content.push(json!({"type": "text", "text": "Handing the sub-steps to agents."}));
            for name in &delegation::SUB_AGENTS[..task.sub_agents] {
                content.push(json!({"type": "tool_use", "id": format!("toolu_{:08}", shared.next_id()), "name": "Agent",
                    "input": {"description": format!("Run sub-steps {name}"), "prompt": delegation::subtask(*name),
                        "subagent_type": if task.fork_context { "fork" } else { "general-purpose" }, "run_in_background": task.background}}));
            }
            "tool_use"
        }
        Turn::Act(Action::Finish(text) | Action::Text(text)) => {
            content.push(json!({"type": "text", "text": text}));
            "end_turn"
        }
    };
    let id = format!("msg_{:08}", shared.next_id());
    let model = body["model"].clone();
    let usage = json!({"input_tokens": tokens, "output_tokens": 20, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
    if body["stream"] != true {
        return Ok(axum::Json(
            json!({"id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage}),
        )
        .into_response());
    }
    let mut events = vec![(
        Some("message_start".to_string()),
        json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": tokens, "output_tokens": 1, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}}),
    )];
    for (index, block) in content.iter().enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match block["type"].as_str() {
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            Some("tool_use") => {
                let input = block["input"].to_string();
                let (a, b) = input.split_at(input.len() / 2);
                (
                    json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                    vec![
                        json!({"type": "input_json_delta", "partial_json": a}),
                        json!({"type": "input_json_delta", "partial_json": b}),
                    ],
                )
            }
            _ => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
        };
        events.push((
            Some("content_block_start".into()),
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            events.push((
                Some("content_block_delta".into()),
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push((
            Some("content_block_stop".into()),
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push((Some("message_delta".into()), json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 20}})));
    events.push((Some("message_stop".into()), json!({"type": "message_stop"})));
    Ok(sse(events, false))
}
