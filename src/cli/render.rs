//! How the CLI prints: `--json` prints the daemon's answer as is, for scripts; otherwise text
//! for a person (tables, one-line previews).

use crate::message::Part;
use serde::Serialize;

/// How to print.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
}

impl Output {
    pub fn print<T: Serialize>(&self, value: &T, human: impl FnOnce(&T) -> String) {
        if self.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        } else {
            let text = human(value);
            out!("{text}");
            if !text.ends_with('\n') {
                outln!();
            }
        }
    }
}

/// A one-line preview of a message's parts.
pub fn preview(parts: &[Part]) -> String {
    let joined = parts
        .iter()
        .map(|part| match part {
            Part::Text { text } => text.clone(),
            Part::Reasoning { text } => format!("(reasoning) {text}"),
            Part::ToolCall { name, args, .. } => format!("→ {name}({args})"),
            Part::ToolResult { output, .. } => format!("← {output}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    crate::compaction::truncate::truncate_chars(&joined, 100).into_owned()
}

/// A message's parts whole, one block per part.
pub fn full(parts: &[Part]) -> String {
    parts
        .iter()
        .map(|part| match part {
            Part::Text { text } => text.clone(),
            Part::Reasoning { text } => format!("(reasoning)\n{text}"),
            Part::ToolCall { id, name, args } => format!("→ {name} [{id}] {args}"),
            Part::ToolResult {
                call_id,
                output,
                is_error,
                ..
            } => format!(
                "← [{call_id}]{}\n{output}",
                if *is_error { " (error)" } else { "" }
            ),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `3m20s`.
pub fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// Bytes for a person: MiB with one decimal, GiB past 1 GiB.
pub fn size(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    match bytes >> 30 {
        0 => format!("{:.1} MiB", bytes as f64 / MIB),
        _ => format!("{:.1} GiB", bytes as f64 / (1024.0 * MIB)),
    }
}

/// Left-aligned columns.
pub fn table(rows: &[Vec<String>]) -> String {
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

/// An optional value, or `-`.
pub fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), T::to_string)
}
