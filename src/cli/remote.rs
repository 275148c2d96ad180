//! The CLI commands that talk to a running daemon. Human-readable by default; `--json` prints
//! the daemon's answer as is, for scripts.

use crate::client::Client;
use crate::message::{BatchError, Message, Part, Role, parse_message_batch};
use crate::protocol::SessionId;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// How to print.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
}

impl Output {
    pub fn print(&self, value: &Value, human: impl FnOnce(&Value) -> String) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        } else {
            let text = human(value);
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
        }
    }
}

pub async fn status(client: &Client, out: Output) -> Result<()> {
    let health = client.get("/health").await?;
    let sessions = client.get("/session").await?;
    let count = sessions["sessions"].as_array().map_or(0, Vec::len);
    let mut value = health.clone();
    value["sessions"] = json!(count);
    value["socket"] = json!(client.socket().display().to_string());
    out.print(&value, |h| {
        let config = match h["config"]["error"].as_str() {
            Some(error) => format!("REJECTED EDIT (previous config in force): {error}"),
            None => "ok".into(),
        };
        format!(
            "compactd {} running on {} (pid {}, up {})\nsummarizer: {}\nconfig: {} ({config})\nsessions: {count}\n",
            h["version"].as_str().unwrap_or("?"),
            client.socket().display(),
            h["pid"],
            duration(h["uptime_s"].as_u64().unwrap_or(0)),
            h["summarizer"].as_str().unwrap_or("?"),
            h["config"]["path"].as_str().unwrap_or("?"),
        )
    });
    Ok(())
}

pub async fn session_list(client: &Client, out: Output) -> Result<()> {
    let list = client.get("/session").await?;
    out.print(&list, |l| {
        let mut rows = vec![vec![
            "ID".to_string(),
            "MESSAGES".into(),
            "ACTIVE".into(),
            "TOKENS".into(),
            "LIMIT".into(),
            "COMPACTIONS".into(),
            "UPDATED".into(),
        ]];
        for s in l["sessions"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&s["id"]),
                text(&s["message_count"]),
                text(&s["active_messages"]),
                text(&s["tokens"]),
                text(&s["context_limit"]),
                text(&s["compaction_count"]),
                text(&s["updated_at"]),
            ]);
        }
        table(&rows)
    });
    Ok(())
}

pub async fn session_show(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let s = client.get(&format!("/session/{id}")).await?;
    out.print(&s, |s| {
        let breaker = if s["breaker"]["open"] == true {
            format!("OPEN ({} attempts this turn; manual compaction still works)", s["breaker"]["attempts"])
        } else {
            format!("closed ({}/{} attempts)", s["breaker"]["attempts"], s["breaker"]["threshold"])
        };
        format!(
            "session:      {}\nmodel:        {}\ncontext:      {} / {} tokens ({}), compacts at {}\nmessages:     {} total, {} active (compacts above {})\ncompactions:  {}{}\nbreaker:      {breaker}\noverrides:    {}\ncreated:      {}\nupdated:      {}\n",
            text(&s["id"]),
            s["model"].as_str().unwrap_or("-"),
            s["tokens"],
            s["context_limit"],
            text(&s["token_source"]),
            s["token_threshold"],
            s["message_count"],
            s["active_messages"],
            s["max_messages"],
            s["compaction_count"],
            if s["compacting"] == true { " (one running now)" } else { "" },
            s["config"],
            text(&s["created_at"]),
            text(&s["updated_at"]),
        )
    });
    Ok(())
}

pub async fn session_create(
    client: &Client,
    id: Option<SessionId>,
    context_limit: Option<usize>,
    model: Option<String>,
    out: Output,
) -> Result<()> {
    let mut body = json!({});
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    if let Some(limit) = context_limit {
        body["context_limit"] = json!(limit);
    }
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    let created = client.post("/session", &body).await?;
    out.print(&created, |s| {
        format!(
            "created session {} (context limit {})\n",
            text(&s["id"]),
            s["context_limit"]
        )
    });
    Ok(())
}

pub async fn session_delete(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let answer = client.delete(&format!("/session/{id}")).await?;
    out.print(&answer, |_| {
        format!("deleted session {id} (its history stays in the database)\n")
    });
    Ok(())
}

/// `append SESSION`: one message (or a list) as JSON on stdin, or `--role R --text T`.
pub async fn append(
    client: &Client,
    id: &SessionId,
    role: Option<String>,
    text_arg: Option<String>,
    wait: bool,
    out: Output,
) -> Result<()> {
    let messages = match (role, text_arg) {
        (Some(role), Some(text)) => {
            let role = Role::parse(&role).with_context(|| {
                format!("unknown role `{role}` (user, assistant, system, tool)")
            })?;
            vec![Message::text(role, text)]
        }
        (None, None) => {
            if std::io::stdin().is_terminal() {
                bail!("give a message as JSON on stdin, or --role and --text");
            }
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("cannot read stdin")?;
            parse_stdin_messages(&input)?
        }
        _ => bail!("--role and --text go together"),
    };
    let answer = client
        .append(id, &json!({"messages": messages, "wait": wait}))
        .await?;
    out.print(&answer, |a| {
        let mut line = format!(
            "appended seq {}..{} to {} ({} tokens, {})",
            a["first_seq"],
            a["last_seq"],
            text(&a["session_id"]),
            a["tokens"],
            text(&a["token_source"])
        );
        if let Some(c) = a["compaction"].as_object() {
            line.push_str(&format!(
                "; compaction ({}): {}",
                text(&c["trigger"].clone()),
                text(&c["status"].clone())
            ));
        }
        line
    });
    Ok(())
}

fn parse_stdin_messages(input: &str) -> Result<Vec<Message>> {
    Ok(parse_message_batch(input.as_bytes())
        .map_err(|e| match e {
            BatchError::Json(e) => anyhow::anyhow!("stdin is not valid JSON: {e}"),
            other => anyhow::anyhow!("stdin is not a valid message or message list: {other}"),
        })?
        .messages)
}

pub async fn context(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let ctx = client.get(&format!("/session/{id}/context")).await?;
    out.print(&ctx, |c| {
        let mut s = format!(
            "context of {}: {} messages, {} / {} tokens, {} compactions\n",
            text(&c["session_id"]),
            c["messages"].as_array().map_or(0, Vec::len),
            c["tokens"],
            c["context_limit"],
            c["compaction_num"]
        );
        for m in c["messages"].as_array().into_iter().flatten() {
            let label = match m["seq"].as_u64() {
                Some(seq) => format!("#{seq}"),
                None => "summary".into(),
            };
            s.push_str(&format!(
                "[{label}] {}: {}\n",
                text(&m["role"]),
                preview(&m["parts"])
            ));
        }
        s
    });
    Ok(())
}

/// `compact SESSION [--focus TEXT]`: manual compaction, with a progress line while it runs.
pub async fn compact(
    client: &Client,
    id: &SessionId,
    focus: Option<String>,
    out: Output,
) -> Result<()> {
    let body = match &focus {
        Some(f) => json!({"focus": f}),
        None => json!({}),
    };
    let path = format!("/session/{id}/summarize");
    let request = client.post(&path, &body);
    tokio::pin!(request);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let progress = std::io::stderr().is_terminal() && !out.json;
    let answer = loop {
        tokio::select! {
            answer = &mut request => break answer,
            _ = tick.tick() => if progress {
                eprint!("\rcompacting {id}… {:.1} s", started.elapsed().as_secs_f64());
                let _ = std::io::stderr().flush();
            },
        }
    };
    if progress {
        eprintln!(
            "\rcompacting {id}… done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let answer = answer?;
    out.print(&answer, |a| {
        if a["compacted"] == true {
            format!(
                "compaction #{} of {id}: {} -> {} tokens; messages before seq {} summarized; {} files read, {} modified ({})\n",
                a["compaction_num"],
                a["pre_tokens"],
                a["post_tokens"],
                a["boundary_seq"],
                a["read_files"].as_array().map_or(0, Vec::len),
                a["modified_files"].as_array().map_or(0, Vec::len),
                text(&a["summarizer"]),
            )
        } else {
            format!("not compacted: {}\n", text(&a["reason"]))
        }
    });
    Ok(())
}

pub async fn history(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let h = client.get(&format!("/session/{id}/compaction")).await?;
    out.print(&h, |h| {
        let mut rows = vec![vec![
            "NUM".to_string(),
            "WHEN".into(),
            "TRIGGER".into(),
            "TOKENS PRE -> POST".into(),
            "SUMMARIZED".into(),
            "FILES R/M".into(),
            "SUMMARIZER".into(),
        ]];
        for c in h["compactions"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&c["compaction_num"]),
                text(&c["finished_at"]),
                text(&c["trigger"]),
                format!("{} -> {}", c["pre_tokens"], c["post_tokens"]),
                format!(
                    "seq {}..{}",
                    c["first_seq"],
                    c["boundary_seq"].as_u64().unwrap_or(1).saturating_sub(1)
                ),
                format!(
                    "{}/{}",
                    c["read_files"].as_array().map_or(0, Vec::len),
                    c["modified_files"].as_array().map_or(0, Vec::len)
                ),
                match c["fallback_reason"].as_str() {
                    Some(_) => format!("{} (fallback)", text(&c["summarizer"])),
                    None => text(&c["summarizer"]),
                },
            ]);
        }
        let mut s = if rows.len() == 1 {
            format!("no compactions of {id} yet\n")
        } else {
            table(&rows)
        };
        let failures = h["failures"].as_array().cloned().unwrap_or_default();
        if !failures.is_empty() {
            s.push_str(&format!("\n{} failed attempts:\n", failures.len()));
            for f in failures {
                s.push_str(&format!(
                    "  {} {}: {}\n",
                    text(&f["finished_at"]),
                    text(&f["trigger"]),
                    text(&f["reason"])
                ));
            }
        }
        s
    });
    Ok(())
}

pub async fn events(client: &Client, out: Output) -> Result<()> {
    let mut stream = client.events().await?;
    eprintln!("following events on {}", client.socket().display());
    while let Some(event) = stream.next().await {
        let (name, data) = event?;
        if out.json {
            println!("{}", json!({"event": name, "data": data}));
        } else {
            let session = data["session_id"].as_str().unwrap_or("-");
            let detail = match name.as_str() {
                "compaction_finished" => format!(
                    "#{} {} -> {} tokens ({})",
                    data["compaction_num"],
                    data["pre_tokens"],
                    data["post_tokens"],
                    text(&data["trigger"])
                ),
                "compaction_failed" => {
                    format!("{}: {}", text(&data["trigger"]), text(&data["reason"]))
                }
                "compaction_started" => text(&data["trigger"]),
                "breaker_open" => format!("{} attempts this turn", data["attempts"]),
                _ => data.to_string(),
            };
            println!("{name:<20} {session:<24} {detail}");
        }
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

/// A one-line preview of a message's parts.
fn preview(parts: &Value) -> String {
    let parts: Vec<Part> = serde_json::from_value(parts.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for part in &parts {
        out.push(match part {
            Part::Text { text } => text.clone(),
            Part::Reasoning { text } => format!("(reasoning) {text}"),
            Part::ToolCall { name, args, .. } => format!("→ {name}({args})"),
            Part::ToolResult { output, .. } => format!("← {output}"),
        });
    }
    let joined = out
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    crate::compaction::truncate::truncate_chars(&joined, 100).into_owned()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// Left-aligned columns.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
