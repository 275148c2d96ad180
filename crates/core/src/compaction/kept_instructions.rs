//! Every user instruction stays in a model's summary (section 6), or compactd quotes it there.
//!
//! The prompt asks a model to quote every user message in section 6 and to carry the prior
//! summary's forward. A model may still skip one, paraphrase it away, or drop the older ones
//! as the list grows; what the summary leaves out is gone from every later context. So once a
//! model (or a command) has written a summary, each instruction it replaces and each line of
//! the prior section 6 is looked for in the new section 6 by its words (a model may reflow a
//! message, fix a typo or cut a long paste short): one whose words are mostly missing there
//! is quoted at the end of the section, under a line that says compactd put it there, within
//! the room the summary's ceiling leaves. The built-in summarizer builds section 6 itself.

use super::constants::MAX_TEXT_CHARS;
use super::estimate::{byte_at_count, counted_chars};
use super::instruction::is_substantive;
use super::sections::{SUMMARY_SECTIONS, heading, section_of_heading, split_sections};
use super::truncate::truncate_chars;
use std::collections::HashSet;
use std::fmt::Write;

/// A user instruction the summary replaces.
#[derive(Debug, Clone, Copy)]
pub struct Instruction<'a> {
    pub seq: u64,
    pub text: &'a str,
}

/// A text counts as kept when at least this share of its words is in section 6.
const KEPT_SHARE: f64 = 0.6;
/// The words of a text that are looked for (a long paste is judged by its opening).
const WORDS_LOOKED_FOR: usize = 200;
/// A line of the prior section 6 with fewer words is not judged ("- ok", "(none)").
const MIN_WORDS: usize = 3;
/// Instructions with no room left are named by seq, this many at most.
const SEQS_NAMED: usize = 20;
/// The first line of what compactd adds to section 6.
pub const KEPT_NOTE: &str =
    "(quoted by compactd: user messages this summary left out, from the stored conversation)";

/// What [`keep_instructions`] added to a summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub summary: String,
    /// Instructions quoted, and lines of the prior section 6 carried.
    pub quoted: usize,
}

/// `summary` with what its section 6 left out quoted at the section's end: lines of the prior
/// summary's section 6, then `instructions` that say something on their own, in `room_chars`
/// characters at most (an instruction that does not fit is named by its seq, whole in the
/// stored history). `None` when nothing is missing.
pub fn keep_instructions(
    summary: &str,
    prior_summary: Option<&str>,
    instructions: &[Instruction],
    room_chars: usize,
) -> Option<Kept> {
    let [_, _, _, _, _, section, ..] = split_sections(summary);
    let present = words(&section.unwrap_or_default()).collect::<HashSet<_>>();
    let [_, _, _, _, _, prior, ..] = prior_summary.map(split_sections).unwrap_or_default();
    let prior = prior.unwrap_or_default();
    let missing_lines: Vec<&str> = prior
        .split('\n')
        .filter(|line| !line.contains(KEPT_NOTE) && is_missing(line, &present, MIN_WORDS))
        .collect();
    // A bare "ok" or "go on" says nothing without what it answered.
    let missing: Vec<&Instruction> = instructions
        .iter()
        .filter(|i| is_substantive(i.text) && is_missing(i.text, &present, 1))
        .collect();
    if missing_lines.is_empty() && missing.is_empty() {
        return None;
    }
    let block = quoted_block(&missing_lines, &missing, room_chars);
    Some(Kept {
        summary: insert_into_section_6(summary, &block),
        quoted: missing_lines.len() + missing.len(),
    })
}

/// The lines compactd adds: the note, prior lines, then the instructions, cut to the room.
fn quoted_block(lines: &[&str], instructions: &[&Instruction], room_chars: usize) -> String {
    let mut block = String::from(KEPT_NOTE);
    let mut room = room_chars.saturating_sub(block.len());
    for line in lines {
        let takes = counted_chars(line) + 1;
        if takes > room {
            break;
        }
        room -= takes;
        block.push('\n');
        block.push_str(line);
    }
    let mut unquoted = Vec::new();
    for (n, instruction) in instructions.iter().enumerate() {
        // What is left shared among the instructions still to quote, a message at most.
        let share = (room / (instructions.len() - n)).min(MAX_TEXT_CHARS);
        let header = format!("[seq {}] ", instruction.seq);
        if share < header.len() + 40 {
            unquoted.push(instruction.seq);
            continue;
        }
        let text = instruction.text.trim();
        // The share counts as the estimate does; the cut, in characters as they are.
        let fits = text[..byte_at_count(text, share - header.len() - 30)]
            .chars()
            .count();
        let text = truncate_chars(text, fits);
        let entry = format!("\n{header}{text}");
        room = room.saturating_sub(counted_chars(&entry));
        block.push_str(&entry);
    }
    if !unquoted.is_empty() {
        let named: Vec<String> = unquoted
            .iter()
            .take(SEQS_NAMED)
            .map(u64::to_string)
            .collect();
        let more = match unquoted.len().saturating_sub(SEQS_NAMED) {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        let _ = write!(
            block,
            "\n(and the user messages at seq {}{more}: whole in the stored history)",
            named.join(", ")
        );
    }
    block
}

/// Whether most of the words of `text` (when it has at least `min_words`) are not in `present`.
fn is_missing(text: &str, present: &HashSet<String>, min_words: usize) -> bool {
    let looked_for: HashSet<String> = words(text).take(WORDS_LOOKED_FOR).collect();
    if looked_for.len() < min_words {
        return false;
    }
    let kept = looked_for.iter().filter(|w| present.contains(*w)).count();
    (kept as f64) < KEPT_SHARE * looked_for.len() as f64
}

/// Lowercased runs of letters and digits.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// `summary` with `block` at the end of section 6 (a section 6 made, before the first later
/// section or at the end, when the summary has none).
fn insert_into_section_6(summary: &str, block: &str) -> String {
    let mut offset = 0;
    let (mut six, mut cut) = (false, None);
    for line in summary.split('\n') {
        match section_of_heading(line) {
            Some(5) => six = true,
            Some(index) if six || index > 5 => {
                cut = Some(offset);
                break;
            }
            _ => {}
        }
        offset += line.len() + 1;
    }
    let cut = cut.unwrap_or(summary.len());
    let head = summary[..cut].trim_end_matches('\n');
    let mut out = String::with_capacity(summary.len() + block.len() + 64);
    out.push_str(head);
    if !six {
        if !head.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&heading(&SUMMARY_SECTIONS[5]));
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(block);
    if cut < summary.len() {
        out.push_str("\n\n");
        out.push_str(&summary[cut..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nine-section summary with `six` as section 6.
    fn summary(six: &str) -> String {
        SUMMARY_SECTIONS
            .iter()
            .map(|s| {
                let body = if s.number == 6 { six } else { "-" };
                format!("{}\n{body}", heading(s))
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    fn ask(seq: u64, text: &str) -> Instruction<'_> {
        Instruction { seq, text }
    }

    #[test]
    fn a_section_6_that_quotes_or_reflows_every_instruction_is_left_alone() {
        let written = summary(
            "- \"Fix the parser so that nested lists parse\"\n- Then run the tests, and commit (the user said: commit only when green)",
        );
        let asked = [
            ask(3, "Fix the parser so that nested lists parse."),
            ask(9, "then run the tests and commit only when green"),
            ask(12, "ok"),
        ];
        assert_eq!(keep_instructions(&written, None, &asked, 10_000), None);
    }

    #[test]
    fn an_instruction_the_summary_left_out_is_quoted_at_the_end_of_section_6() {
        let written = summary("- Fix the parser so that nested lists parse");
        let asked = [
            ask(3, "Fix the parser so that nested lists parse"),
            ask(9, "Never touch the migrations directory; the DBA owns it."),
        ];
        let kept = keep_instructions(&written, None, &asked, 10_000).unwrap();
        assert_eq!(kept.quoted, 1);
        let sections = split_sections(&kept.summary);
        assert_eq!(
            sections[5].as_deref().unwrap(),
            format!(
                "- Fix the parser so that nested lists parse\n{KEPT_NOTE}\n[seq 9] Never touch the migrations directory; the DBA owns it."
            )
        );
        // Every other section is as the model wrote it.
        for (i, section) in sections.iter().enumerate().filter(|(i, _)| *i != 5) {
            assert_eq!(section.as_deref(), Some("-"), "section {}", i + 1);
        }
    }

    #[test]
    fn lines_of_the_prior_section_6_the_new_summary_dropped_are_carried() {
        let prior = summary(
            "[#1, seq 1] Build a CSV importer for the billing tables\n[#2, seq 7] Keep the public API unchanged",
        );
        let written = summary("[#2, seq 7] Keep the public API unchanged\n[#3, seq 20] add tests");
        let kept =
            keep_instructions(&written, Some(&prior), &[ask(20, "add tests")], 10_000).unwrap();
        assert_eq!(kept.quoted, 1);
        assert!(
            kept.summary.contains(&format!(
                "[#3, seq 20] add tests\n{KEPT_NOTE}\n[#1, seq 1] Build a CSV importer for the billing tables"
            )),
            "{}",
            kept.summary
        );
        // The next compaction carries the quoted line as any other.
        let later = summary("[#2, seq 7] Keep the public API unchanged\n[#3, seq 20] add tests");
        let again = keep_instructions(&later, Some(&kept.summary), &[], 10_000).unwrap();
        assert!(again.summary.contains("Build a CSV importer"));
        assert_eq!(again.summary.matches(KEPT_NOTE).count(), 1);
    }

    #[test]
    fn a_summary_without_section_6_gets_one_before_section_7() {
        let written = "## 1. Primary Request and Intent\nparse\n\n## 7. Pending Tasks\n- x";
        let kept =
            keep_instructions(written, None, &[ask(4, "use the streaming reader")], 1_000).unwrap();
        assert_eq!(
            kept.summary,
            format!(
                "## 1. Primary Request and Intent\nparse\n\n## 6. All user messages\n{KEPT_NOTE}\n[seq 4] use the streaming reader\n\n## 7. Pending Tasks\n- x"
            )
        );
        let bare = keep_instructions(
            "free text",
            None,
            &[ask(4, "use the streaming reader")],
            1_000,
        )
        .unwrap();
        assert_eq!(
            bare.summary,
            format!(
                "free text\n\n## 6. All user messages\n{KEPT_NOTE}\n[seq 4] use the streaming reader"
            )
        );
    }

    #[test]
    fn quotes_stay_within_the_room_and_name_what_did_not_fit() {
        let long = "rewrite the scheduler ".repeat(500);
        let asked = [
            ask(5, &long),
            ask(6, "also document the retry policy"),
            ask(8, "and bump the version"),
        ];
        let kept = keep_instructions(&summary("(none)"), None, &asked, 600).unwrap();
        let six = split_sections(&kept.summary)[5].clone().unwrap();
        assert!(six.chars().count() <= 600 + "(none)\n".len(), "{six}");
        assert!(six.contains("[seq 5] rewrite the scheduler"), "{six}");
        assert!(six.contains("…[truncated"), "{six}");
        let many: Vec<String> = (0..500)
            .map(|i| format!("instruction number {i} to follow"))
            .collect();
        let many: Vec<Instruction> = many
            .iter()
            .enumerate()
            .map(|(i, t)| ask(i as u64, t))
            .collect();
        let none = keep_instructions(&summary("(none)"), None, &many, 0).unwrap();
        assert!(
            none.summary
                .contains("18, 19 and 480 more: whole in the stored history)\n"),
            "{}",
            none.summary
        );
        let tiny = keep_instructions(&summary("(none)"), None, &asked, 150).unwrap();
        assert!(
            tiny.summary.contains(
                "[seq 8] and bump the version\n(and the user messages at seq 5, 6: whole in the stored history)"
            ),
            "{}",
            tiny.summary
        );
    }
}
