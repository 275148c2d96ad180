//! `compactd import` (a transcript into a running daemon) and `compactd replay` (a transcript
//! through an in-process daemon, measuring what compaction keeps and saves).

use super::render::Output;
use crate::client::Client;
use crate::config::Config;
use crate::measure::replay::{ReplayReport, replay};
use crate::message::Part;
use crate::protocol::SessionId;
use crate::transcript::{self, Format, Transcript, session_id_from};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Appends are sent in batches of at most this many bytes (well under the body limit).
const BATCH_BYTES: usize = 2 * 1024 * 1024;

pub async fn import(
    client: &Client,
    path: &Path,
    session: Option<SessionId>,
    format: Option<Format>,
    context_limit: Option<usize>,
    out: Output,
) -> Result<()> {
    let transcript = transcript::load(path, format)?;
    let id = session
        .or_else(|| {
            transcript
                .session_hint
                .clone()
                .and_then(|h| SessionId::parse(h).ok())
        })
        .unwrap_or_else(|| session_id_from(path));
    let mut create = json!({"id": id});
    if let Some(limit) = context_limit {
        create["context_limit"] = json!(limit);
    }
    client
        .post("/session", &create)
        .await
        .with_context(|| format!("cannot create session {id} (pick another with --session)"))?;
    let mut batch: Vec<Value> = Vec::new();
    let mut bytes = 0;
    for message in &transcript.messages {
        let value = serde_json::to_value(message)?;
        let size = value.to_string().len();
        if !batch.is_empty() && bytes + size > BATCH_BYTES {
            send(client, &id, &mut batch).await?;
            bytes = 0;
        }
        bytes += size;
        batch.push(value);
    }
    send(client, &id, &mut batch).await?;
    let session = client.get(&format!("/session/{id}")).await?;
    let (calls, results) = count_tools(&transcript);
    let report = json!({
        "session_id": id,
        "format": transcript.format.name(),
        "messages": transcript.messages.len(),
        "tool_calls": calls,
        "tool_results": results,
        "skipped": transcript.skipped,
        "compactions": session["compaction_count"],
    });
    out.print(&report, |r| {
        let mut s = format!(
            "imported {} messages ({} tool calls, {} tool results) from {} ({}) into session {}; compactions so far: {}\n",
            r["messages"], r["tool_calls"], r["tool_results"], path.display(), transcript.format.name(), id, r["compactions"]
        );
        for (reason, count) in &transcript.skipped {
            s.push_str(&format!("  not imported: {count} {reason}\n"));
        }
        s
    });
    Ok(())
}

async fn send(client: &Client, id: &SessionId, batch: &mut Vec<Value>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    // Waiting for the compactions each batch triggers: an import ends with the session as
    // the agent would have left it, its compactions done.
    client
        .append(id, &json!({"messages": batch, "wait": true}))
        .await?;
    batch.clear();
    Ok(())
}

fn count_tools(transcript: &Transcript) -> (usize, usize) {
    let parts = transcript.messages.iter().flat_map(|m| &m.parts);
    parts.fold((0, 0), |(c, r), p| match p {
        Part::ToolCall { .. } => (c + 1, r),
        Part::ToolResult { .. } => (c, r + 1),
        _ => (c, r),
    })
}

/// `compactd replay FILE...`: one report per file, as a table or JSON.
pub async fn replay_files(
    paths: &[PathBuf],
    format: Option<Format>,
    context_limit: usize,
    config: Option<&Path>,
    model: crate::measure::replay::Model,
    out: Output,
) -> Result<()> {
    let config = match config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let mut reports = Vec::new();
    for path in paths {
        let transcript = match path.to_str().and_then(|p| p.strip_prefix("synthetic:")) {
            Some(name) => synthetic_transcript(name)?,
            None => transcript::load(path, format)?,
        };
        let report = replay(&transcript, context_limit, config.clone(), model)
            .await
            .with_context(|| format!("replaying {}", path.display()))?;
        reports.push((path.clone(), report));
    }
    if out.json {
        let values: Vec<Value> = reports
            .iter()
            .map(|(path, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["transcript"] = json!(path.display().to_string());
                v
            })
            .collect();
        let value = if values.len() == 1 {
            values[0].clone()
        } else {
            json!(values)
        };
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        out!(
            "{}\n{}\n{}",
            replay_table(&reports),
            cost_table(&reports),
            probe_table(&reports)
        );
        if model.preamble_tokens > 0 {
            out!("\n{}", preamble_table(&reports));
        }
    }
    Ok(())
}

/// A synthetic session (`synthetic:NAME`) as a transcript.
fn synthetic_transcript(name: &str) -> Result<Transcript> {
    let messages = crate::measure::synthetic::named(name).with_context(|| {
        format!(
            "no synthetic session {name:?}; there are: {}",
            crate::measure::synthetic::NAMED.join(", ")
        )
    })?;
    Ok(Transcript {
        format: Format::Openai,
        messages,
        skipped: Default::default(),
        session_hint: None,
        submission: None,
    })
}

/// Costs under prompt caching, both price models, per transcript and in total.
pub fn cost_table(reports: &[(PathBuf, ReplayReport)]) -> String {
    let mut s = String::from(
        "| transcript | raw (A) | m10 (A) | compactd (A) | vs raw | vs m10 | raw (O) | m10 (O) | compactd (O) | vs raw | vs m10 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut total = crate::measure::replay::CachedCosts::default();
    let row = |name: &str, c: &crate::measure::replay::CachedCosts| {
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "-".into()
            }
        };
        format!(
            "| {name} | {:.0} | {:.0} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} |\n",
            c.raw.anthropic,
            c.masking_m10.anthropic,
            c.compactd.anthropic,
            ratio(c.compactd.anthropic, c.raw.anthropic),
            ratio(c.compactd.anthropic, c.masking_m10.anthropic),
            c.raw.openai,
            c.masking_m10.openai,
            c.compactd.openai,
            ratio(c.compactd.openai, c.raw.openai),
            ratio(c.compactd.openai, c.masking_m10.openai),
        )
    };
    for (path, r) in reports {
        s.push_str(&row(&short_name(path), &r.cached_cost));
        for (sum, part) in [
            (&mut total.raw, r.cached_cost.raw),
            (&mut total.masking_m10, r.cached_cost.masking_m10),
            (&mut total.compactd, r.cached_cost.compactd),
        ] {
            sum.anthropic += part.anthropic;
            sum.openai += part.openai;
        }
    }
    s.push_str(&row("**total**", &total));
    s
}

/// The continuation probes as a Markdown table: ✓ passed, ✗ failed, n/a does not apply.
pub fn probe_table(reports: &[(PathBuf, ReplayReport)]) -> String {
    let mut s = String::from(
        "| transcript | compactions | system msgs kept | first user msg kept | user msgs ≤2,000 chars kept | latest request kept | diff files listed | modified / diff (with created) | next step | credentials in summaries |\n|---|---:|:-:|:-:|---:|:-:|:-:|---:|:-:|---:|\n",
    );
    let mark = |x: Option<bool>| match x {
        Some(true) => "✓",
        Some(false) => "✗",
        None => "n/a",
    };
    for (path, r) in reports {
        let p = &r.probes;
        let ratio = match (p.modified_ratio, p.changed_ratio) {
            (Some(m), Some(c)) => format!("{m:.1} ({c:.1})"),
            _ => "n/a".into(),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            short_name(path),
            r.compactions,
            mark(p.system_messages_kept),
            mark(p.first_user_kept),
            p.short_user_kept
                .map_or("n/a".into(), |v| match p.short_user_missing {
                    0 => format!("{v:.2}"),
                    n => format!("{v:.2} ({n} missing)"),
                }),
            mark(p.latest_user_kept),
            mark(p.diff_files_listed),
            ratio,
            mark(p.next_step_present),
            p.credentials_leaked,
        ));
    }
    s
}

/// What an agent with a preamble (`--preamble-tokens`) needs next, as a Markdown table: at how
/// many steps its system prompt was missing, its newest output shortened or hidden, and its
/// instructions (of at most 2,000 characters) missing at the end; contexts over the window.
pub fn preamble_table(reports: &[(PathBuf, ReplayReport)]) -> String {
    let counted = reports.iter().any(|(_, r)| r.counted_over_limit.is_some());
    let mut s = String::from(
        "| transcript | steps | system prompt missing | newest output shortened | newest output hidden | user msgs ≤2,000 chars missing | contexts over the window |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut totals = [0usize; 6];
    for (path, r) in reports {
        let over = match counted {
            true => r.counted_over_limit.unwrap_or(0),
            false => r.contexts_over_limit,
        };
        let row = [
            r.assistant_steps,
            r.preamble_missing_steps.unwrap_or(0),
            r.shortened_result_steps,
            r.hidden_result_steps.len(),
            r.probes.short_user_missing,
            over,
        ];
        s.push_str(&format!("| {} |", short_name(path)));
        for (total, figure) in totals.iter_mut().zip(row) {
            *total += figure;
            s.push_str(&format!(" {figure} |"));
        }
        s.push('\n');
    }
    s.push_str("| **total** |");
    for total in totals {
        s.push_str(&format!(" {total} |"));
    }
    s.push('\n');
    s
}

/// The replay reports as a Markdown table (readable in a terminal, pasteable into docs).
pub fn replay_table(reports: &[(PathBuf, ReplayReport)]) -> String {
    // With a model tokenizer, each context as the model counts it too.
    let counted = reports.iter().any(|(_, r)| r.peak_counted_tokens.is_some());
    let mut s = String::from(
        "| transcript | msgs | compactions (failed) | maskings | max summary | peak ctx | raw | masking_m10 | compactd | vs raw | vs m10 | user msgs kept | modified files recalled | orphans | hidden results |",
    );
    s.push_str(match counted {
        true => " peak counted | over limit counted |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        false => "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    });
    for (path, r) in reports {
        let t = &r.input_tokens;
        let ratio = |a: usize, b: usize| {
            if b == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", a as f64 / b as f64)
            }
        };
        let share = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        s.push_str(&format!(
            "| {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            short_name(path),
            r.session_messages,
            r.compactions,
            r.failed_compactions,
            r.maskings,
            r.summary_tokens
                .iter()
                .max()
                .map_or("-".into(), |t| t.to_string()),
            r.peak_context_tokens,
            t.raw,
            t.masking_m10,
            t.compactd,
            ratio(t.compactd, t.raw),
            ratio(t.compactd, t.masking_m10),
            share(r.user_message_retention),
            share(r.modified_file_recall),
            r.orphaned_tool_results,
            r.hidden_result_steps.len(),
        ));
        if counted {
            let figure = |x: Option<usize>| x.map_or("-".to_string(), |v| v.to_string());
            s.push_str(&format!(
                " {} | {} |",
                figure(r.peak_counted_tokens),
                figure(r.counted_over_limit)
            ));
        }
        s.push('\n');
    }
    s
}

fn short_name(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    let dir = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    // Cut by characters: a byte cut can fall inside a multibyte name.
    let name = if name.chars().count() > 48 {
        format!("{}…", name.chars().take(47).collect::<String>())
    } else {
        name.to_string()
    };
    if dir.is_empty() {
        name
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_non_ascii_file_names_are_cut_on_characters() {
        let name = format!("{}.jsonl", "日本語のセッション".repeat(10));
        let short = short_name(&Path::new("/x/claude").join(name));
        assert!(short.starts_with("claude/日本語"));
        assert_eq!(short.chars().count(), "claude/".len() + 48);
    }
}
