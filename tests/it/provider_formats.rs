//! Contexts ready to send: `?format=openai` and `?format=anthropic` follow each API's
//! documented rules on every shared transcript, whole and as a daemon serves it between
//! compactions. The rules are checked by validators written from the providers' docs, not by
//! comparing with compactd's own output.

use crate::common::TestDaemon;
use compactd_core::compaction::{Message, Part, Role};
use compactd_formats::provider::anthropic::conversation as anthropic_conversation;
use compactd_formats::provider::chat::messages as openai_messages;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::PathBuf;

fn transcripts() -> Vec<PathBuf> {
    let root = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/transcripts"
    ));
    let mut files = Vec::new();
    for dir in ["claude-code", "mini-swe-agent", "swe-agent"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            eprintln!("SKIP: {} is absent", root.display());
            return vec![];
        };
        files.extend(entries.map(|e| e.unwrap().path()));
    }
    files.sort();
    files
}

fn api_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// OpenAI Chat Completions: roles system/user/assistant/tool; content a string (null allowed
/// on an assistant message with tool_calls); each tool_calls entry a function with a valid
/// name, a JSON-string `arguments` and an id of at most 40 characters; the tool messages right
/// after an assistant message answer each of its calls exactly once, and no tool message
/// appears anywhere else; every call is answered, except in a final assistant message.
fn check_openai(messages: &[Value]) -> Result<(), String> {
    let mut waiting: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().ok_or(format!("{i}: no role"))?;
        if role != "tool" && !waiting.is_empty() {
            return Err(format!(
                "{i}: {role} message while calls {waiting:?} wait for results"
            ));
        }
        match role {
            "system" | "user" => {
                let content = m["content"]
                    .as_str()
                    .ok_or(format!("{i}: content not a string"))?;
                if content.is_empty() {
                    return Err(format!("{i}: empty content"));
                }
            }
            "assistant" => {
                let calls = m["tool_calls"].as_array();
                match (&m["content"], calls) {
                    (Value::String(s), _) if !s.is_empty() => {}
                    (Value::Null, Some(c)) if !c.is_empty() => {}
                    _ => return Err(format!("{i}: assistant without content or calls")),
                }
                for call in calls.into_iter().flatten() {
                    let id = call["id"].as_str().ok_or(format!("{i}: call without id"))?;
                    if id.is_empty() || id.len() > 40 {
                        return Err(format!("{i}: call id {id:?}"));
                    }
                    if call["type"] != "function"
                        || !api_name_ok(call["function"]["name"].as_str().unwrap_or(""))
                    {
                        return Err(format!("{i}: bad call {call}"));
                    }
                    call["function"]["arguments"]
                        .as_str()
                        .ok_or(format!("{i}: arguments not a string"))?;
                    if waiting.contains(&id.to_string()) {
                        return Err(format!("{i}: call id {id} twice"));
                    }
                    waiting.push(id.to_string());
                }
            }
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                let at = waiting.iter().position(|w| w == id).ok_or(format!(
                    "{i}: result for {id:?}, which no call right before waits for"
                ))?;
                waiting.remove(at);
                m["content"]
                    .as_str()
                    .ok_or(format!("{i}: tool content not a string"))?;
            }
            other => return Err(format!("{i}: role {other}")),
        }
    }
    // Calls of a final assistant message may wait: the agent answers them next.
    if !waiting.is_empty() && messages.last().is_some_and(|m| m["role"] != "assistant") {
        return Err(format!("unanswered calls {waiting:?}"));
    }
    Ok(())
}

/// Anthropic Messages: `system` a string if present; messages alternate user/assistant from a
/// user message; content a non-empty array of blocks; text blocks non-empty; tool_use only
/// from the assistant, with an id `^[a-zA-Z0-9_-]+$`, a valid name and an object input; the
/// user message after an assistant message with tool_use starts with a tool_result for each
/// of them (and tool_result blocks appear nowhere else); a final assistant message does not
/// end in whitespace.
fn check_anthropic(body: &Value) -> Result<(), String> {
    if !(body["system"].is_null() || body["system"].is_string()) {
        return Err("system not a string".into());
    }
    let messages = body["messages"].as_array().ok_or("no messages")?;
    let mut expected_role = "user";
    let mut waiting: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        if role != expected_role {
            return Err(format!("{i}: {role} where {expected_role} was due"));
        }
        expected_role = if role == "user" { "assistant" } else { "user" };
        let blocks = m["content"]
            .as_array()
            .ok_or(format!("{i}: content not blocks"))?;
        if blocks.is_empty() {
            return Err(format!("{i}: empty content"));
        }
        let mut answered = HashSet::new();
        let mut past_results = false;
        for (j, b) in blocks.iter().enumerate() {
            match b["type"].as_str().unwrap_or("") {
                "text" => {
                    if b["text"].as_str().is_none_or(|t| t.is_empty()) {
                        return Err(format!("{i}.{j}: empty text"));
                    }
                    past_results = true;
                }
                "tool_use" if role == "assistant" => {
                    let id = b["id"].as_str().unwrap_or("");
                    if id.is_empty()
                        || !id
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    {
                        return Err(format!("{i}.{j}: tool_use id {id:?}"));
                    }
                    if !api_name_ok(b["name"].as_str().unwrap_or("")) || !b["input"].is_object() {
                        return Err(format!("{i}.{j}: bad tool_use {b}"));
                    }
                    waiting.insert(id.to_string());
                }
                "tool_result" if role == "user" => {
                    if past_results {
                        return Err(format!("{i}.{j}: tool_result after text"));
                    }
                    let id = b["tool_use_id"].as_str().unwrap_or("");
                    if !waiting.contains(id) {
                        return Err(format!(
                            "{i}.{j}: result for {id:?}, not a tool_use of the previous message"
                        ));
                    }
                    answered.insert(id.to_string());
                    if b["content"].as_str().is_none_or(str::is_empty) {
                        return Err(format!("{i}.{j}: tool_result content"));
                    }
                }
                other => return Err(format!("{i}.{j}: a {other} block in a {role} message")),
            }
        }
        if role == "user" {
            if answered != waiting {
                return Err(format!(
                    "{i}: tool_use {:?} not answered here",
                    waiting.difference(&answered).collect::<Vec<_>>()
                ));
            }
            waiting.clear();
        }
    }
    let final_text = messages
        .last()
        .filter(|m| m["role"] == "assistant")
        .and_then(|m| m["content"].as_array()?.last()?["text"].as_str());
    if final_text.is_some_and(|t| t.ends_with(char::is_whitespace)) {
        return Err("final assistant text ends in whitespace".into());
    }
    Ok(())
}

/// The texts a conversation holds (user, system and assistant text, tool outputs), to check
/// that conversion drops nothing but reasoning.
fn texts(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::Text { text } if !text.trim().is_empty() => Some(text.clone()),
            Part::ToolResult { output, .. } if !output.is_empty() => Some(output.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn every_shared_transcript_converts_to_valid_requests_with_nothing_dropped() {
    let files = transcripts();
    for file in &files {
        let transcript = compactd_formats::transcript::load(file, None).unwrap();
        let messages = &transcript.messages;
        let name = file.file_name().unwrap().to_string_lossy();
        // Every prefix an agent could have sent (every 7th, to keep the test fast), and the whole.
        for end in (1..messages.len()).step_by(7).chain([messages.len()]) {
            let part = &messages[..end];
            let o = openai_messages(part);
            check_openai(&o)
                .map_err(|e| format!("{name} [..{end}] openai: {e}"))
                .unwrap();
            let a = serde_json::to_value(anthropic_conversation(part)).unwrap();
            check_anthropic(&a)
                .map_err(|e| format!("{name} [..{end}] anthropic: {e}"))
                .unwrap();
        }
        let o = serde_json::to_string(&openai_messages(messages)).unwrap();
        let a = serde_json::to_string(&anthropic_conversation(messages)).unwrap();
        for text in texts(messages) {
            let encoded = serde_json::to_string(&text).unwrap();
            let encoded = &encoded[1..encoded.len() - 1];
            assert!(o.contains(encoded), "{name}: openai dropped {:.80}", text);
            assert!(
                a.contains(encoded.trim_end()),
                "{name}: anthropic dropped {:.80}",
                text
            );
        }
        let systems = messages.iter().filter(|m| m.role == Role::System).count();
        assert_eq!(
            openai_messages(messages)
                .iter()
                .filter(|m| m["role"] == "system")
                .count(),
            systems
        );
    }
}

#[tokio::test]
async fn the_daemon_serves_valid_provider_contexts_across_compactions() {
    let files = transcripts();
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let mut compacted = 0;
    for (k, file) in files.iter().enumerate() {
        let transcript = compactd_formats::transcript::load(file, None).unwrap();
        let id = format!("p{k}");
        client
            .post("/session", &json!({"id": id, "context_limit": 16000}))
            .await
            .unwrap();
        for (n, chunk) in transcript.messages.chunks(25).enumerate() {
            client
                .append(
                    &compactd_api::SessionId::parse(id.as_str()).unwrap(),
                    &json!({"messages": chunk, "wait": true}),
                )
                .await
                .unwrap();
            let o = client
                .get(&format!("/v1/session/{id}/context?format=openai"))
                .await
                .unwrap();
            assert_eq!(o["format"], "openai");
            check_openai(o["messages"].as_array().unwrap())
                .map_err(|e| format!("{id} after chunk {n}: openai: {e}"))
                .unwrap();
            let a = client
                .get(&format!("/v1/session/{id}/context?format=anthropic"))
                .await
                .unwrap();
            check_anthropic(&a)
                .map_err(|e| format!("{id} after chunk {n}: anthropic: {e}"))
                .unwrap();
            if o["compaction_num"].as_u64() > Some(0) {
                // The summary is a user message in both.
                let summary = |messages: &Value| {
                    messages.as_array().unwrap().iter().any(|m| {
                        m["role"] == "user"
                            && m.to_string().contains("was compacted. Summary of it:")
                    })
                };
                assert!(summary(&o["messages"]) && summary(&a["messages"]), "{id}");
            }
        }
        let last = client.get(&format!("/session/{id}")).await.unwrap();
        compacted += usize::from(last["compaction_count"].as_u64() > Some(0));
    }
    assert!(
        files.is_empty() || compacted >= 5,
        "only {compacted} sessions compacted"
    );
    let bad = client
        .get("/v1/session/x/context?format=gemini")
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("format"), "{bad}");
}
