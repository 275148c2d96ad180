//! The OpenAI Responses API (`POST /v1/responses`), as its documentation states the rules:
//! - `input` is a string or a list of items: messages (`user`, `assistant`, `system`,
//!   `developer`), `function_call` and `function_call_output`, `custom_tool_call` and
//!   `custom_tool_call_output`, `reasoning`, and other item types passed on as they are;
//! - every `*_call_output` answers a call of that `call_id` earlier in the input, and every
//!   call is answered ("No tool output found for function call ...");
//! - a `reasoning` item is followed by the item it preceded, and its `encrypted_content` is
//!   what the API gave out;
//! - message content is not empty; the prompt fits the model's window.

use super::delegation::{self, SubTurn};
use super::{Action, Shared, Task, background_command, decide, sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashSet;

fn is_call(kind: &str) -> bool {
    matches!(
        kind,
        "function_call" | "custom_tool_call" | "local_shell_call"
    )
}

fn is_output(kind: &str) -> bool {
    matches!(
        kind,
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output"
    )
}

pub fn validate(shared: &Shared, body: &Value) -> Result<(), String> {
    let items = match &body["input"] {
        Value::String(s) if !s.is_empty() => return Ok(()),
        Value::Array(items) if !items.is_empty() => items,
        _ if body["previous_response_id"].is_string() => return Ok(()),
        _ => return Err("Missing required parameter: 'input'.".into()),
    };
    let mut calls = HashSet::new();
    let mut answered = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        let call_id = item["call_id"].as_str().unwrap_or("").to_string();
        if is_call(kind) {
            calls.insert(call_id);
        } else if is_output(kind) {
            if !calls.contains(&call_id) {
                return Err(format!(
                    "No tool call found for function call output with call_id {call_id}."
                ));
            }
            answered.insert(call_id);
        } else if kind == "reasoning" {
            if i + 1 == items.len() {
                return Err(format!(
                    "Item '{}' of type 'reasoning' was provided without its required following item.",
                    item["id"].as_str().unwrap_or("")
                ));
            }
            if let Some(encrypted) = item["encrypted_content"].as_str()
                && !shared.issued(encrypted)
            {
                return Err(format!(
                    "The encrypted content for item {} could not be verified.",
                    item["id"].as_str().unwrap_or("")
                ));
            }
        } else if kind == "message" {
            let empty = match &item["content"] {
                Value::String(s) => s.is_empty(),
                Value::Array(parts) => parts.is_empty(),
                _ => true,
            };
            if empty {
                return Err(format!("Invalid 'input[{i}].content': empty content."));
            }
        }
    }
    if let Some(unanswered) = calls.iter().find(|c| !answered.contains(*c)) {
        return Err(format!(
            "No tool output found for function call {unanswered}."
        ));
    }
    Ok(())
}

fn newest_output(items: &[Value]) -> Option<String> {
    items
        .iter()
        .rev()
        .filter(|i| i["type"].as_str().is_some_and(is_output))
        .map(|i| super::text_of(&i["output"]))
        .find(|output| !super::is_side_output(output))
}

/// Codex's model's next turn: the task's next step ([`decide`]); with
/// [`Task::delegate_after`], `spawn_agent` calls once that step is done (one per sub-agent, in
/// one answer), `wait_agent` on those not finished, and in a sub-agent's own thread its
/// sub-steps, then its report ([`delegation`]).
enum Turn {
    Act(Action),
    /// Start the build of [`Task::background_command`].
    StartBuild,
    /// Poll the build's process, of this session, to its end.
    PollBuild(String),
    Spawn,
    Wait(Vec<String>),
    Sub {
        step: usize,
        command: String,
    },
}

/// The sub-agent this thread is, if it is one: a user message of its opening (before any call
/// or output) whose text is the task handed over. A summary that compactd puts among the
/// opening messages starts otherwise, whatever it quotes.
pub fn sub_agent_in(items: &[Value]) -> Option<char> {
    items
        .iter()
        .take_while(|i| i["type"].as_str().is_none_or(|t| t == "message"))
        .filter(|i| i["role"] == "user")
        .map(|i| super::text_of(&i["content"]))
        .filter(|t| t.starts_with(delegation::SUBTASK))
        .find_map(|t| delegation::named(&t))
}

/// The agents the thread spawned (`spawn_agent`'s outputs) and those a `wait_agent` saw
/// finish.
fn spawned_and_finished(items: &[Value]) -> (Vec<String>, HashSet<String>) {
    let outputs = items
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter_map(|i| serde_json::from_str::<Value>(i["output"].as_str()?).ok());
    let (mut spawned, mut finished) = (Vec::new(), HashSet::new());
    for output in outputs {
        if let Some(id) = output["agent_id"].as_str() {
            spawned.push(id.to_string());
        }
        if let Some(status) = output["status"].as_object() {
            finished.extend(status.keys().cloned());
        }
    }
    (spawned, finished)
}

fn next_turn(task: &Task, items: &[Value], shell: bool, reported: &[char]) -> Turn {
    let newest = newest_output(items);
    if task.background_command && shell {
        let context = serde_json::to_string(items).unwrap_or_default();
        let then = decide(task, newest.as_deref(), shell);
        let told = background_command::told_by_codex(&context);
        return match background_command::next_turn(task, newest.as_deref(), then, told) {
            background_command::Turn::Act(action) => Turn::Act(action),
            background_command::Turn::Start => Turn::StartBuild,
            background_command::Turn::Read(session) => Turn::PollBuild(session),
        };
    }
    let Some(after) = task.delegate_after.filter(|_| shell) else {
        return Turn::Act(decide(task, newest.as_deref(), shell));
    };
    if let Some(name) = sub_agent_in(items) {
        return match delegation::sub_turn(task, name, newest.as_deref()) {
            SubTurn::Run { step, command } => Turn::Sub { step, command },
            SubTurn::Report(text) => Turn::Act(Action::Finish(text)),
        };
    }
    let (spawned, finished) = spawned_and_finished(items);
    let waiting: Vec<String> = spawned
        .iter()
        .filter(|id| !finished.contains(*id))
        .cloned()
        .collect();
    if !waiting.is_empty() {
        return Turn::Wait(waiting);
    }
    match decide(task, newest.as_deref(), shell) {
        Action::Run { step, .. } if step == after + 1 && spawned.is_empty() => Turn::Spawn,
        action @ Action::Finish(_) => Turn::Act(delegation::finish(task, reported, action)),
        action => Turn::Act(action),
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
    if tokens > window {
        return Err(format!(
            "Your input exceeds the context window of this model ({tokens} tokens > {window})."
        ));
    }
    let items = body["input"].as_array().cloned().unwrap_or_default();
    let shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["name"] == "exec_command");
    let turn = next_turn(task, &items, shell, &delegation::reported(body));
    let mut output = Vec::new();
    let wants_reasoning = body["include"]
        .as_array()
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    if wants_reasoning {
        let id = format!("rs_{:08}", shared.next_id());
        output.push(json!({"type": "reasoning", "id": id, "summary": [], "encrypted_content": shared.sign(&id)}));
    }
    let message = |output: &mut Vec<Value>, text: String| {
        output.push(json!({"type": "message", "id": format!("msg_{:08}", shared.next_id()), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}));
    };
    let call = |output: &mut Vec<Value>, name: &str, namespace: Option<&str>, arguments: Value| {
        let mut item = json!({"type": "function_call", "id": format!("fc_{:08}", shared.next_id()), "call_id": format!("call_{:08}", shared.next_id()),
            "name": name, "arguments": arguments.to_string(), "status": "completed"});
        if let Some(namespace) = namespace {
            item["namespace"] = json!(namespace);
        }
        output.push(item);
    };
    match turn {
        Turn::Act(Action::Run { step, command }) => {
            message(&mut output, format!("Running step {step}."));
            call(&mut output, "exec_command", None, json!({"cmd": command}));
            if task.parallel_calls {
                call(
                    &mut output,
                    "exec_command",
                    None,
                    json!({"cmd": super::side_command(step)}),
                );
            }
        }
        Turn::StartBuild => {
            message(&mut output, "Starting the build.".into());
            let yield_time_ms = background_command::CODEX_YIELD_MS;
            let cmd = background_command::CODEX_COMMAND;
            call(
                &mut output,
                "exec_command",
                None,
                json!({"cmd": cmd, "yield_time_ms": yield_time_ms}),
            );
        }
        Turn::PollBuild(session) => {
            message(&mut output, "Reading the build's output.".into());
            let session_id: u64 = session.parse().unwrap_or_default();
            call(
                &mut output,
                "write_stdin",
                None,
                json!({"session_id": session_id, "chars": "", "yield_time_ms": 10_000}),
            );
        }
        Turn::Sub { step, command } => {
            message(&mut output, format!("Running sub-step {step}."));
            call(&mut output, "exec_command", None, json!({"cmd": command}));
        }
        Turn::Spawn => {
            message(&mut output, "Handing the sub-steps to agents.".into());
            for name in &delegation::SUB_AGENTS[..task.sub_agents] {
                call(
                    &mut output,
                    "spawn_agent",
                    Some("multi_agent_v1"),
                    json!({"message": delegation::subtask(*name), "fork_context": task.fork_context}),
                );
            }
        }
        Turn::Wait(targets) => {
            call(
                &mut output,
                "wait_agent",
                Some("multi_agent_v1"),
                json!({"targets": targets, "timeout_ms": 600_000}),
            );
        }
        Turn::Act(Action::Finish(text) | Action::Text(text)) => message(&mut output, text),
    }
    let usage = json!({"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 20});
    let response = json!({"id": format!("resp_{:08}", shared.next_id()), "object": "response", "status": "completed",
        "model": body["model"], "output": output, "usage": usage});
    if body["stream"] != true {
        return Ok(axum::Json(response).into_response());
    }
    let mut in_progress = response.clone();
    in_progress["status"] = json!("in_progress");
    in_progress["output"] = json!([]);
    let mut events = vec![(
        Some("response.created".to_string()),
        json!({"type": "response.created", "response": in_progress}),
    )];
    for (index, item) in output.iter().enumerate() {
        events.push((
            Some("response.output_item.added".into()),
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        ));
        if item["type"] == "message" {
            events.push((
                Some("response.output_text.delta".into()),
                json!({"type": "response.output_text.delta", "output_index": index,
                "content_index": 0, "item_id": item["id"], "delta": item["content"][0]["text"]}),
            ));
        }
        events.push((
            Some("response.output_item.done".into()),
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        ));
    }
    events.push((
        Some("response.completed".into()),
        json!({"type": "response.completed", "response": response}),
    ));
    Ok(sse(events, false))
}
