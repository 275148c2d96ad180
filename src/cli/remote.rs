//! The CLI commands that talk to a running daemon, through the typed client. Human-readable
//! by default; `--json` prints the daemon's answer as is, for scripts.

use super::render::{Output, duration, full, or_dash, preview, size, table};
use crate::client::Client;
use crate::compaction::config::completion_share;
use crate::message::{BatchError, Message, Role, parse_message_batch};
use crate::protocol::{
    Compaction, CompactionQuery, ContextFormat, ContextMessage, CreateSessionRequest, Event,
    SessionId, SessionView, SummarizeOutcome, SummarizeRequest, UpdateSessionRequest,
};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// `status`: whether the daemon runs, and how.
pub async fn status(client: &Client, out: Output) -> Result<()> {
    let health = client.health().await?;
    // Counting reads the database, which a daemon refusing writes may refuse too.
    let sessions = match client.session_count().await {
        Ok(n) => Some(n),
        Err(_) if health.writes_refused.is_some() => None,
        Err(e) => return Err(e.into()),
    };
    #[derive(Serialize)]
    struct Status {
        #[serde(flatten)]
        health: crate::protocol::Health,
        socket: String,
        sessions: Option<u64>,
    }
    let status = Status {
        health,
        socket: client.socket().display().to_string(),
        sessions,
    };
    out.print(&status, |s| {
        let h = &s.health;
        let config = match (&h.config.error, h.config.exists) {
            (Some(error), _) => format!("REJECTED EDIT (previous config in force): {error}"),
            (None, true) => "in force".into(),
            (None, false) => "no file: built-in defaults".into(),
        };
        let taken = match h.disk.free_bytes {
            Some(free) => format!(
                "{}; {} free on its disk",
                size(h.disk.database_bytes),
                size(free)
            ),
            None => size(h.disk.database_bytes),
        };
        let database = match (&h.writes_refused, h.write_lock_held_elsewhere) {
            (Some(why), _) => format!("{} ({taken}; WRITES REFUSED: {why})", h.database),
            (None, true) => format!(
                "{} ({taken}; WRITE LOCK HELD BY ANOTHER PROCESS: appends wait and fail busy until it lets go)",
                h.database
            ),
            (None, false) => format!("{} ({taken})", h.database),
        };
        format!(
            "compactd {} running on {} (pid {}, up {})\ndatabase:   {database}\nconfig:     {} ({config})\nsummarizer: {}\nproxy:      {} -> {} (OpenAI), {} (Anthropic)\nmemory:     requests {} of {} MiB, compactions {} of {} MiB\nsummaries:  {} running (at most {}), {} waiting\nsessions:   {}\n",
            h.version,
            s.socket,
            h.pid,
            duration(h.uptime_s),
            or_dash(&h.config.path),
            h.summarizer,
            h.proxy
                .listen
                .as_deref()
                .map_or_else(|| "socket".to_string(), |l| format!("socket and http://{l}")),
            h.proxy.openai_upstream,
            h.proxy.anthropic_upstream,
            mib(h.memory.requests_bytes),
            mib(h.memory.request_budget_bytes),
            mib(h.memory.compactions_bytes),
            mib(h.memory.compaction_budget_bytes),
            h.summarizer_calls.running,
            h.summarizer_calls.max_concurrent,
            h.summarizer_calls.waiting,
            s.sessions.map_or_else(|| "-".to_string(), |n| n.to_string()),
        )
    });
    Ok(())
}

/// Bytes as MiB with one decimal.
fn mib(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

pub async fn session_list(client: &Client, out: Output) -> Result<()> {
    // All pages; the most recently active first, as people look for them.
    let mut sessions = client.sessions().await?;
    sessions.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(a.id.cmp(&b.id)));
    out.print(&json!({ "sessions": sessions }), |_| {
        let mut rows = vec![
            [
                "ID",
                "KIND",
                "MESSAGES",
                "ACTIVE",
                "TOKENS",
                "LIMIT",
                "LIMIT FROM",
                "BRANCHES",
                "COMPACTIONS",
                "UPDATED",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for s in &sessions {
            rows.push(vec![
                s.id.to_string(),
                s.kind.as_str().to_string(),
                s.message_count.to_string(),
                s.active_messages.to_string(),
                s.tokens.to_string(),
                s.context_limit.to_string(),
                s.limit_source.clone().unwrap_or_else(|| "client".into()),
                s.branches.to_string(),
                s.compaction_count.to_string(),
                s.updated_at.clone(),
            ]);
        }
        table(&rows)
    });
    Ok(())
}

fn session_text(s: &SessionView) -> String {
    let breaker = if s.breaker.open {
        format!(
            "OPEN ({} attempts this turn; manual compaction still works)",
            s.breaker.attempts
        )
    } else {
        format!(
            "closed ({}/{} attempts)",
            s.breaker.attempts, s.breaker.threshold
        )
    };
    let source = serde_json::to_value(s.token_source).unwrap_or_default();
    format!(
        "session:      {} ({}, {} branch{})\nmodel:        {}\ncontext:      {} / {} tokens ({}), compacts at {}{}; limit from {}{}\nmessages:     {} total, {} active (compacts above {})\ncompactions:  {}{}\nbreaker:      {breaker}\noverrides:    {}\ncreated:      {}\nupdated:      {}\n",
        s.id,
        s.kind.as_str(),
        s.branches,
        if s.branches == 1 { "" } else { "es" },
        or_dash(&s.model),
        s.tokens,
        s.context_limit,
        match s.report_rate {
            Some(rate) => format!(
                "{}, the model counting {rate:.2} per estimated token",
                source.as_str().unwrap_or("-")
            ),
            None => source.as_str().unwrap_or("-").to_string(),
        },
        s.token_threshold,
        match s.completion_tokens {
            n if n > 0 && completion_share(s.context_limit, n).is_some() => {
                format!(" (room kept for the client's {n}-token answers)")
            }
            _ => String::new(),
        },
        match (&s.limit_source, &s.limit_taught_at) {
            (Some(source), Some(at)) => format!("{source} at {at}"),
            (Some(source), None) => source.clone(),
            (None, _) => "the client".to_string(),
        },
        if s.overhead_tokens > 0 {
            format!(
                " ({} of them the client's tools and system)",
                s.overhead_tokens
            )
        } else {
            String::new()
        },
        s.message_count,
        s.active_messages,
        s.max_messages,
        s.compaction_count,
        if s.compacting {
            " (one running now)"
        } else {
            ""
        },
        s.config,
        s.created_at,
        s.updated_at,
    )
}

pub async fn session_show(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let session = client.session(id).await?;
    out.print(&session, session_text);
    Ok(())
}

pub async fn session_create(
    client: &Client,
    request: CreateSessionRequest,
    out: Output,
) -> Result<()> {
    let created = client.create_session(&request).await?;
    out.print(&created, |s| {
        format!(
            "created session {} (context limit {})\n",
            s.id, s.context_limit
        )
    });
    Ok(())
}

/// `session update ID [--model M] [--context-limit N] [--config JSON]` (PATCH).
pub async fn session_update(
    client: &Client,
    id: &SessionId,
    request: UpdateSessionRequest,
    out: Output,
) -> Result<()> {
    if request.model.is_none() && request.context_limit.is_none() && request.config.is_none() {
        bail!("nothing to change: give --model, --context-limit or --config");
    }
    let updated = client.update_session(id, &request).await?;
    out.print(&updated, session_text);
    Ok(())
}

pub async fn session_delete(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let answer = client.delete_session(id).await?;
    out.print(&answer, |a| {
        format!(
            "deleted session {} (its history stays in the database)\n",
            a.id
        )
    });
    Ok(())
}

/// `append SESSION`: one message (or a list) as JSON on stdin, or `--role R --text T`.
pub async fn append(
    client: &Client,
    id: &SessionId,
    text: Option<(Role, String)>,
    wait: bool,
    out: Output,
) -> Result<()> {
    let messages = match text {
        Some((role, text)) => vec![Message::text(role, text)],
        None => {
            if std::io::stdin().is_terminal() {
                bail!("give a message as JSON on stdin, or --role and --text");
            }
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("cannot read stdin")?;
            parse_stdin_messages(&input)?
        }
    };
    let answer = client
        .append(id, &json!({"messages": messages, "wait": wait}))
        .await?;
    out.print(&answer, |a| {
        let mut line = format!(
            "appended seq {}..{} to {} ({} tokens, {})",
            a.first_seq,
            a.last_seq,
            a.session_id,
            a.tokens,
            name(&a.token_source)
        );
        if let Some(c) = &a.compaction {
            line.push_str(&format!(
                "; compaction ({}): {}",
                c.trigger.map_or("-", |t| t.as_str()),
                name(&c.status)
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

/// `search SESSION WORDS... [--limit N]`: the best matches over the whole history.
pub async fn search(
    client: &Client,
    id: &SessionId,
    query: &str,
    limit: usize,
    out: Output,
) -> Result<()> {
    let found = client.search(id, query, limit).await?;
    out.print(&found, |f| {
        if f.results.is_empty() {
            return format!("nothing in {} matches {:?}\n", f.session_id, f.query);
        }
        let mut s = String::new();
        for r in &f.results {
            let place = if r.in_context {
                "in context"
            } else {
                "not in context"
            };
            s.push_str(&format!(
                "#{} {} ({place})\n  {}\n",
                r.seq,
                r.role.as_str(),
                r.snippet
            ));
        }
        s.push_str(&format!("(whole: compactd show {} SEQ)\n", f.session_id));
        s
    });
    Ok(())
}

/// `messages SESSION [--after N] [--limit N]`: the stored history, whole.
pub async fn messages(
    client: &Client,
    id: &SessionId,
    after: u64,
    limit: usize,
    out: Output,
) -> Result<()> {
    let page = client.history(id, after, limit).await?;
    // An empty page says where the session ends, so a person does not take it for a gap.
    let last = match page.messages.is_empty() {
        true => Some(client.session(id).await?.message_count),
        false => None,
    };
    out.print(&page, |p| {
        let mut s = whole_messages(p);
        if let Some(next) = p.next_after {
            s.push_str(&format!("(more: --after {next})\n"));
        }
        match last {
            Some(0) => s.push_str("(no messages yet)\n"),
            Some(last) => s.push_str(&format!(
                "(no messages after #{after}: the last is #{last})\n"
            )),
            None => {}
        }
        s
    });
    Ok(())
}

/// `show SESSION SEQ[..SEQ]`: the messages asked for, whole. Asking only for seqs the
/// session does not have is an error that names the seqs it has, where an empty page would
/// look like an empty message.
pub async fn show(
    client: &Client,
    id: &SessionId,
    seqs: super::args::SeqRange,
    out: Output,
) -> Result<()> {
    let count = usize::try_from(seqs.to - seqs.from + 1).unwrap_or(usize::MAX);
    let page = client.history(id, seqs.from - 1, count).await?;
    if page.messages.is_empty() {
        let last = client.session(id).await?.message_count;
        let asked = match seqs.from == seqs.to {
            true => format!("message #{}", seqs.from),
            false => format!("messages #{} to #{}", seqs.from, seqs.to),
        };
        match last {
            0 => bail!("session `{id}` has no {asked}: it has no messages yet"),
            _ => bail!("session `{id}` has no {asked}: its messages are #1 to #{last}"),
        }
    }
    out.print(&page, whole_messages);
    Ok(())
}

/// Each message of a page whole, under a line that says its seq, role, flags, size and time.
fn whole_messages(page: &crate::protocol::HistoryPage) -> String {
    let mut s = String::new();
    for m in &page.messages {
        let parts: Vec<crate::message::Part> =
            serde_json::from_str(m.parts.get()).unwrap_or_default();
        let mut flags = match (m.pinned, m.compacted) {
            (true, _) => " (pinned)",
            (false, true) => " (compacted)",
            _ => "",
        }
        .to_string();
        match m.branches_from {
            Some(0) => flags.push_str(" (starts a new branch)"),
            Some(parent) => flags.push_str(&format!(" (a branch from #{parent})")),
            None => {}
        }
        s.push_str(&format!(
            "── #{} {}{flags} · {} tokens · {}\n{}\n",
            m.seq,
            m.role.as_str(),
            m.tokens,
            m.created_at,
            full(&parts)
        ));
    }
    s
}

/// `context SESSION [--full] [--format F]`: what the agent would send to its model now.
pub async fn context(
    client: &Client,
    id: &SessionId,
    whole: bool,
    format: ContextFormat,
    out: Output,
) -> Result<()> {
    if format != ContextFormat::Compactd {
        // Ready to send: always printed as the JSON a request body takes.
        let ctx = client.provider_context(id, format).await?;
        outln!("{}", serde_json::to_string_pretty(&ctx)?);
        return Ok(());
    }
    let ctx = client.context(id).await?;
    out.print(&ctx, |c| {
        let mut s = format!(
            "context of {}: {} messages, {} / {} tokens, {} compactions\n",
            c.session_id,
            c.messages.len(),
            c.tokens,
            c.context_limit,
            c.compaction_num
        );
        for m in &c.messages {
            let (label, role, parts) = match m {
                ContextMessage::Summary { role, parts, .. } => {
                    ("summary".to_string(), *role, parts.clone())
                }
                ContextMessage::Stored(stored) => {
                    let mut label = format!("#{}", stored.seq);
                    if stored.pinned {
                        label.push_str(" pinned");
                    }
                    if stored.masked {
                        label.push_str(" masked");
                    }
                    let parts: Vec<crate::message::Part> =
                        serde_json::from_str(stored.parts.get()).unwrap_or_default();
                    (label, stored.role, parts)
                }
            };
            if whole {
                s.push_str(&format!(
                    "── [{label}] {}\n{}\n",
                    role.as_str(),
                    full(&parts)
                ));
            } else {
                s.push_str(&format!(
                    "[{label}] {}: {}\n",
                    role.as_str(),
                    preview(&parts)
                ));
            }
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
    let request = SummarizeRequest { focus };
    let call = client.summarize(id, &request);
    tokio::pin!(call);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let progress = std::io::stderr().is_terminal() && !out.json;
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
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
    out.print(&answer, |a| match a {
        SummarizeOutcome::Compacted { compaction: c, .. } => format!(
            "compaction #{} of {id}: {} -> {} tokens; messages before seq {} summarized; {} files read, {} modified ({})\n",
            c.result.compaction_num,
            c.result.pre_tokens,
            c.result.post_tokens,
            c.boundary_seq,
            c.result.read_files.len(),
            c.result.modified_files.len(),
            c.summarizer,
        ),
        SummarizeOutcome::NotCompacted { reason, .. } => format!("not compacted: {reason}\n"),
    });
    Ok(())
}

/// The session's newest `limit` compactions, oldest first.
async fn newest_compactions(
    client: &Client,
    id: &SessionId,
    limit: usize,
) -> Result<(Vec<Compaction>, crate::protocol::CompactionHistory)> {
    let count = client.session(id).await?.compaction_count as usize;
    let page = CompactionQuery {
        after: count.saturating_sub(limit) as u32,
        limit: Some(limit.clamp(1, 100)),
        ..Default::default()
    };
    let history = client.compactions(id, &page).await?;
    Ok((history.compactions.clone(), history))
}

/// `history SESSION [--limit N]`: the newest compactions (and failed attempts, maskings).
pub async fn history(client: &Client, id: &SessionId, limit: usize, out: Output) -> Result<()> {
    let (compactions, history) = newest_compactions(client, id, limit).await?;
    out.print(&history, |h| {
        let mut rows = vec![
            [
                "NUM",
                "WHEN",
                "TRIGGER",
                "TOKENS PRE -> POST",
                "SUMMARIZED",
                "FILES R/M",
                "SUMMARIZER",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for c in &compactions {
            rows.push(vec![
                c.result.compaction_num.to_string(),
                c.finished_at.clone(),
                c.trigger.as_str().into(),
                format!("{} -> {}", c.result.pre_tokens, c.result.post_tokens),
                format!("seq {}..{}", c.first_seq, c.boundary_seq.saturating_sub(1)),
                format!(
                    "{}/{}",
                    c.result.read_files.len(),
                    c.result.modified_files.len()
                ),
                match &c.fallback_reason {
                    Some(_) => format!("{} (fallback)", c.summarizer),
                    None => c.summarizer.clone(),
                },
            ]);
        }
        let mut s = if rows.len() == 1 {
            format!("no compactions of {id} yet\n")
        } else {
            table(&rows)
        };
        if !h.maskings.is_empty() {
            s.push_str(&format!(
                "\n{} maskings of old outputs:\n",
                h.maskings.len()
            ));
            for m in &h.maskings {
                s.push_str(&format!(
                    "  {} {} outputs before seq {}: {} -> {} tokens\n",
                    m.created_at, m.outputs, m.through_seq, m.pre_tokens, m.post_tokens
                ));
            }
        }
        if !h.failures.is_empty() {
            s.push_str(&format!("\n{} failed attempts:\n", h.failures.len()));
            for f in &h.failures {
                s.push_str(&format!(
                    "  {} {}: {}\n",
                    f.finished_at,
                    f.trigger.as_str(),
                    f.reason
                ));
            }
        }
        s
    });
    Ok(())
}

/// `summary SESSION`: the latest summary, whole.
pub async fn summary(client: &Client, id: &SessionId, out: Output) -> Result<()> {
    let (compactions, _) = newest_compactions(client, id, 1).await?;
    let Some(latest) = compactions.into_iter().last() else {
        bail!("session {id} has no compaction yet, so no summary");
    };
    out.print(&latest, |c| {
        format!(
            "compaction #{} of {id} ({}, {}):\n\n{}\n",
            c.result.compaction_num,
            c.finished_at,
            c.summarizer,
            c.result.summary.trim_end()
        )
    });
    Ok(())
}

/// `events`: follows the daemon's events until it stops (then fails: a follower that
/// exits 0 when the daemon dies would hide it).
pub async fn events(client: &Client, out: Output) -> Result<()> {
    let mut stream = client.subscribe().await?;
    eprintln!("following events on {}", client.socket().display());
    while let Some(event) = stream.next_event().await {
        let event = event?;
        if out.json {
            outln!("{}", serde_json::to_string(&event)?);
        } else {
            outln!("{}", event_line(&event));
        }
        let _ = std::io::stdout().flush();
    }
    bail!("the daemon closed the event stream (it stopped or restarted)")
}

/// One line per event: its kind, its session, what happened.
fn event_line(event: &Event) -> String {
    let (session, detail) = match event {
        Event::CompactionStarted {
            session_id,
            trigger,
            background,
        } => (
            session_id.as_str(),
            format!(
                "{}{}",
                trigger.as_str(),
                if *background {
                    ", in the background"
                } else {
                    ""
                }
            ),
        ),
        Event::CompactionFinished {
            session_id,
            trigger,
            compaction_num,
            pre_tokens,
            post_tokens,
            ..
        } => (
            session_id.as_str(),
            format!(
                "#{compaction_num} {pre_tokens} -> {post_tokens} tokens ({})",
                trigger.as_str()
            ),
        ),
        Event::CompactionFailed {
            session_id,
            trigger,
            reason,
        } => (
            session_id.as_str(),
            format!("{}: {reason}", trigger.as_str()),
        ),
        Event::OutputsMasked {
            session_id,
            outputs,
            pre_tokens,
            post_tokens,
            ..
        } => (
            session_id.as_str(),
            format!("{outputs} outputs, {pre_tokens} -> {post_tokens} tokens"),
        ),
        Event::BreakerOpen {
            session_id,
            attempts,
            ..
        } => (
            session_id.as_str(),
            format!("{attempts} attempts this turn; automatic compaction paused"),
        ),
        Event::ConfigReloaded { path } => ("-", format!("{path} is in force")),
        Event::ConfigRejected { path, error } => (
            "-",
            format!("{path} rejected (previous config stays): {error}"),
        ),
        Event::Lagged {} => (
            "-",
            "events were missed (this follower was too slow)".into(),
        ),
    };
    format!("{:<20} {session:<24} {detail}", event.name())
}

/// A unit enum's wire name.
fn name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        _ => "-".into(),
    }
}
