//! Section 6, All user messages: every instruction, in order, `[#N, seq S] text`, carried from
//! summary to summary so none is ever dropped.
//!
//! An instruction of at most 2,000 characters is quoted whole; a longer one is cut there with
//! a pointer to its stored original (`seq S`). The session's task, when too large to pin, is
//! kept up to the pin size instead; when pinned, its entry points to the copy at the start of
//! the context. CLI notes and notifications of background tasks are left out (they are not
//! instructions; section 5 keeps what a notification reports) and a pasted summary of
//! earlier work is named, not quoted. The summary grows for them (up to its ceiling) before any
//! is shortened; past that, older entries are shortened, oldest first, each naming its seq, and
//! for sessions with thousands of them the oldest are folded into one line naming their seqs
//! in the stored history. Only a window too small for the newest ten whole shortens them too,
//! all but the newest.

use crate::SummaryRequest;
use crate::compaction::constants::MAX_TEXT_CHARS;
use crate::compaction::instruction::{UserText, classify_user_text, instruction_text, user_blocks};
use crate::compaction::truncate::truncate_chars;
use regex::Regex;
use std::fmt::Write;
use std::sync::LazyLock;

/// Entries never shortened to meet the budget: the newest ones.
const RECENT_KEPT_WHOLE: usize = 10;
/// Starts the line that stands for folded entries: `[#1-#N] earlier user messages ...`.
const COLLAPSED_PREFIX: &str = "[#1-#";

#[derive(Debug, Clone)]
struct Entry {
    number: usize,
    seq: Option<u64>,
    text: String,
}

pub(super) struct UserMessages {
    /// A prior section 6 without our markers, kept as written.
    unstructured: Option<String>,
    /// Entries `[#1]` to `[#collapsed_through]` were folded away to fit the budget.
    collapsed_through: usize,
    /// The seqs of the first and last folded entries, when known.
    collapsed_seqs: Option<(u64, u64)>,
    entries: Vec<Entry>,
}

static ENTRY_HEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[#(\d+)(?:, seq (\d+))?\] ").expect("valid regex"));
static COLLAPSED_SEQS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\(seq (\d+) to (\d+)\)").expect("valid regex"));

impl UserMessages {
    /// The entries of a prior section 6.
    pub(super) fn carried(prior: Option<&str>) -> UserMessages {
        let mut out = UserMessages {
            unstructured: None,
            collapsed_through: 0,
            collapsed_seqs: None,
            entries: Vec::new(),
        };
        for line in prior.unwrap_or_default().split('\n') {
            if let Some(rest) = line.strip_prefix(COLLAPSED_PREFIX) {
                out.collapsed_through = rest
                    .split(']')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                out.collapsed_seqs = COLLAPSED_SEQS
                    .captures(rest)
                    .and_then(|c| Some((c[1].parse().ok()?, c[2].parse().ok()?)));
            } else if let Some(c) = ENTRY_HEADER.captures(line) {
                out.entries.push(Entry {
                    number: c[1].parse().unwrap_or(0),
                    seq: c.get(2).and_then(|s| s.as_str().parse().ok()),
                    text: line[c[0].len()..].to_string(),
                });
            } else if let Some(entry) = out.entries.last_mut() {
                entry.text.push('\n');
                entry.text.push_str(line);
            } else if !line.trim().is_empty() && line.trim() != "(none)" {
                let u = out.unstructured.get_or_insert_with(String::new);
                u.push_str(line);
                u.push('\n');
            }
        }
        out
    }

    fn next_number(&self) -> usize {
        self.entries
            .last()
            .map_or(self.collapsed_through, |e| e.number)
            + 1
    }

    fn has_seq(&self, seq: u64) -> bool {
        self.entries.iter().any(|e| e.seq == Some(seq))
    }

    /// Adds the request's user messages (and the pinned task's pointer, in its place).
    pub(super) fn add_all(&mut self, request: &SummaryRequest) {
        let pinned_task = request
            .task
            .as_ref()
            .filter(|t| t.pinned && !self.has_seq(t.seq));
        let mut task_placed = pinned_task.is_none();
        for (index, message) in request.messages.iter().enumerate() {
            if !message.is_user_text() {
                continue;
            }
            // Requests built by hand may carry no seqs; entries then have none.
            let seq = request.seqs.get(index).copied();
            if let Some(task) =
                pinned_task.filter(|t| !task_placed && seq.is_some_and(|s| t.seq < s))
            {
                self.push_pinned_task(task.seq);
                task_placed = true;
            }
            let max_chars = match &request.task {
                Some(task) if Some(task.seq) == seq => task.max_chars.max(MAX_TEXT_CHARS),
                _ => MAX_TEXT_CHARS,
            };
            // Block by block: a merged message's typed instruction may follow a marker, an
            // echo or a pasted summary (see `compaction::instruction`).
            for (text, kind) in user_blocks(message) {
                if kind == UserText::PastedSummary {
                    self.push(text, seq, max_chars);
                }
            }
            if let Some(text) = instruction_text(message) {
                self.push(&text, seq, max_chars);
            }
        }
        if let Some(task) = pinned_task.filter(|_| !task_placed) {
            self.push_pinned_task(task.seq);
        }
    }

    fn push_pinned_task(&mut self, seq: u64) {
        let number = self.next_number();
        self.entries.push(Entry {
            number,
            seq: Some(seq),
            text: "(the session's task: quoted whole at the start of this context)".into(),
        });
    }

    /// Adds one user message: quoted up to `max_chars`, named if it is a pasted summary, left
    /// out if it is a CLI note.
    pub(super) fn push(&mut self, text: &str, seq: Option<u64>, max_chars: usize) {
        let text = text.trim();
        let shown = match classify_user_text(text) {
            // A notification's report is work done (section 5), not an instruction.
            UserText::Meta | UserText::Notification => return,
            UserText::PastedSummary => format!(
                "(a pasted summary of earlier work, {} characters; not an instruction)",
                text.chars().count()
            ),
            UserText::Instruction => cut(text, max_chars, seq),
        };
        let number = self.next_number();
        self.entries.push(Entry {
            number,
            seq,
            text: shown,
        });
    }

    /// Shortens entries to `max_chars`, oldest first and never the newest ten, until about
    /// `enough` characters are saved.
    pub(super) fn shorten_oldest(&mut self, max_chars: usize, enough: usize) {
        self.shorten(max_chars, enough, RECENT_KEPT_WHOLE);
    }

    /// Shortens the newest ten too, oldest first and never the newest one, until about
    /// `enough` characters are saved: for a window too small to hold ten whole (a small one,
    /// or one its model counts at several times the estimate, where SWE-agent's observations,
    /// sent as user messages of up to 2,000 characters, grew the summary past the window).
    pub(super) fn shorten_recent(&mut self, max_chars: usize, enough: usize) {
        self.shorten(max_chars, enough, 1);
    }

    fn shorten(&mut self, max_chars: usize, enough: usize, keep_whole: usize) {
        let older = self.entries.len().saturating_sub(keep_whole);
        let mut saved = 0;
        for entry in &mut self.entries[..older] {
            if saved >= enough {
                break;
            }
            let before = entry.text.len();
            // The marker takes ~40 characters: only cut what it pays to cut.
            if entry.text.chars().count() > max_chars + 60 {
                entry.text = cut(&entry.text, max_chars, entry.seq);
                saved += before.saturating_sub(entry.text.len());
            }
        }
    }

    /// Folds the oldest tenth of the entries (at least one, never the newest ten) into the
    /// collapsed count; false when nothing is left to fold.
    pub(super) fn collapse_oldest(&mut self) -> bool {
        let foldable = self.entries.len().saturating_sub(RECENT_KEPT_WHOLE);
        if foldable == 0 {
            return false;
        }
        let n = (self.entries.len() / 10).clamp(1, foldable);
        let folded: Vec<Entry> = self.entries.drain(..n).collect();
        let last = folded.last().map_or(0, |e| e.number);
        self.collapsed_through = self.collapsed_through.max(last);
        let seqs = folded.iter().filter_map(|e| e.seq);
        let (first, last) = (seqs.clone().min(), seqs.max());
        if let (Some(first), Some(last)) = (first, last) {
            self.collapsed_seqs = Some(match self.collapsed_seqs {
                Some((earlier, _)) => (earlier.min(first), last),
                None => (first, last),
            });
        }
        true
    }

    pub(super) fn render(&self) -> String {
        let mut out = self.unstructured.clone().unwrap_or_default();
        if self.collapsed_through > 0 {
            let seqs = self
                .collapsed_seqs
                .map(|(first, last)| format!(" (seq {first} to {last})"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{COLLAPSED_PREFIX}{}] earlier user messages{seqs} are not repeated here; they are kept whole in compactd's history (GET /session/{{id}}/message).",
                self.collapsed_through
            );
        }
        for entry in &self.entries {
            match entry.seq {
                Some(seq) => {
                    let _ = writeln!(out, "[#{}, seq {seq}] {}", entry.number, entry.text);
                }
                None => {
                    let _ = writeln!(out, "[#{}] {}", entry.number, entry.text);
                }
            }
        }
        out
    }
}

/// `text` cut to `max_chars`, the cut saying where the whole message is.
fn cut(text: &str, max_chars: usize, seq: Option<u64>) -> String {
    let cut = truncate_chars(text, max_chars);
    match seq {
        Some(seq) if cut.len() < text.len() => format!("{cut} (whole message: seq {seq})"),
        _ => cut.into_owned(),
    }
}
