//! OpenAI Chat Completions (`POST /v1/chat/completions`), as its documentation states the
//! rules:
//! - `messages` is non-empty; roles are `system`, `developer`, `user`, `assistant`, `tool`;
//! - a `tool` message answers a `tool_calls` entry of the assistant message before it (only
//!   tool messages between), and an assistant message with `tool_calls` is followed by a tool
//!   message for each of its ids;
//! - a user, system or tool message has content; an assistant message has content or calls;
//! - the prompt fits the model's window, and beside it the completion asked for
//!   (`max_completion_tokens`, or `max_tokens`) (`context_length_exceeded`).

use super::delegation::{self, Turn};
use super::{Action, Shared, Task, sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashSet;

/// What mini-swe-agent's prompt tells the model to print to submit.
const SUBMIT: &str = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT";

fn has_content(m: &Value) -> bool {
    match &m["content"] {
        Value::String(s) => !s.is_empty(),
        Value::Array(parts) => !parts.is_empty(),
        _ => false,
    }
}

pub fn validate(body: &Value) -> Result<(), String> {
    let Some(messages) = body["messages"].as_array().filter(|m| !m.is_empty()) else {
        return Err("[] is too short - 'messages'".into());
    };
    let mut open: Option<(usize, HashSet<String>)> = None;
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        if role != "tool"
            && let Some((at, waiting)) = open.take()
            && !waiting.is_empty()
        {
            let mut ids: Vec<String> = waiting.into_iter().collect();
            ids.sort();
            return Err(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {} (messages[{at}])",
                ids.join(", ")
            ));
        }
        match role {
            "system" | "developer" | "user" => {
                if !has_content(m) {
                    return Err(format!(
                        "Invalid value for 'content': expected a string, got null. (messages[{i}].content)"
                    ));
                }
            }
            "assistant" => {
                let calls: HashSet<String> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["id"].as_str().map(str::to_string))
                    .collect();
                if !has_content(m) && calls.is_empty() {
                    return Err(format!(
                        "Invalid value for 'content': expected a string, got null. (messages[{i}].content)"
                    ));
                }
                open = (!calls.is_empty()).then_some((i, calls));
            }
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                let answers = open.as_mut().is_some_and(|(_, waiting)| waiting.remove(id));
                if !answers {
                    return Err(format!(
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'. (messages[{i}])"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "Invalid value: '{other}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'. (messages[{i}].role)"
                ));
            }
        }
    }
    Ok(())
}

/// The sub-agent this conversation is, if it is one: its first user message (its task)
/// carries the task handed over (opencode's `task` tool). Only the first: a summary of the
/// main conversation may quote the call that handed it.
pub fn sub_agent_of(messages: &[Value]) -> Option<char> {
    let first = messages.iter().find(|m| m["role"] == "user")?;
    delegation::named(&super::text_of(&first["content"]))
}

/// The newest tool output in `messages` that is not a side call's.
pub fn newest_output(messages: &[Value]) -> Option<String> {
    messages
        .iter()
        .rev()
        .filter(|m| m["role"] == "tool")
        .map(|m| super::text_of(&m["content"]))
        .find(|output| !super::is_side_output(output))
}

pub fn answer(
    shared: &Shared,
    task: &Task,
    body: &Value,
    tokens: usize,
    window: usize,
) -> Result<Response, String> {
    validate(body)?;
    if tokens > window {
        return Err(format!(
            "This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens."
        ));
    }
    let completion = body["max_completion_tokens"]
        .as_u64()
        .or(body["max_tokens"].as_u64())
        .unwrap_or(0) as usize;
    if tokens + completion > window {
        return Err(format!(
            "This model's maximum context length is {window} tokens. However, you requested {} tokens ({tokens} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
            tokens + completion
        ));
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == "bash");
    let turn = match shell {
        Some(_) => {
            let newest = newest_output(&messages);
            delegation::next_turn(
                task,
                sub_agent_of(&messages),
                newest.as_deref(),
                true,
                &delegation::reported(body),
            )
        }
        None => Turn::Act(super::aider::answer(&messages)),
    };
    // mini-swe-agent ends a task when a command prints this first (its own protocol).
    let submits = body["messages"].to_string().contains(SUBMIT);
    let turn = match turn {
        Turn::Act(Action::Finish(text)) if submits => Turn::Act(Action::Run {
            step: task.steps + 1,
            command: format!("printf '{SUBMIT}\\n%s\\n' '{text}'"),
        }),
        other => other,
    };
    let id = format!("chatcmpl-{}", shared.next_id());
    let call = |name: &str, arguments: Value| {
        json!({"id": format!("call_{:08}", shared.next_id()), "type": "function",
            "function": {"name": name, "arguments": arguments.to_string()}})
    };
    let bash = |command: &str| call("bash", json!({"command": command}));
    let (content, calls, finish) = match turn {
        Turn::Act(Action::Run { step, command }) => {
            let mut calls = vec![bash(&command)];
            if task.parallel_calls && shell.is_some() {
                calls.push(bash(&super::side_command(step)));
            }
            (format!("Running step {step}."), calls, "tool_calls")
        }
        Turn::Sub { step, command } => (
            format!("Running sub-step {step}."),
            vec![bash(&command)],
            "tool_calls",
        ),
        Turn::Delegate => {
            let calls = delegation::SUB_AGENTS[..task.sub_agents]
                .iter()
                .map(|name| {
                    call(
                        "task",
                        json!({"description": format!("Run sub-steps {name}"),
                        "prompt": delegation::subtask(*name), "subagent_type": "general"}),
                    )
                })
                .collect();
            (
                "Handing the sub-steps to agents.".to_string(),
                calls,
                "tool_calls",
            )
        }
        Turn::Act(Action::Finish(text) | Action::Text(text)) => (text, vec![], "stop"),
    };
    let usage =
        json!({"prompt_tokens": tokens, "completion_tokens": 20, "total_tokens": tokens + 20});
    if body["stream"] != true {
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        return Ok(axum::Json(json!({"id": id, "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})).into_response());
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        (
            None,
            json!({"id": id, "object": "chat.completion.chunk", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": content}),
        None,
    )];
    for (index, call) in calls.iter().enumerate() {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("");
        let (a, b) = arguments.split_at(arguments.len() / 2);
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": a}}]}),
            None,
        ));
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": b}}]}),
            None,
        ));
    }
    events.push(chunk(json!({}), Some(finish)));
    if body["stream_options"]["include_usage"] == true {
        events.push((None, json!({"id": id, "object": "chat.completion.chunk", "created": 1, "model": body["model"], "choices": [], "usage": usage})));
    }
    Ok(sse(events, true))
}
