//! The nine sections of a summary (SPEC.md 5.4), shared by the prompt that asks for them and
//! the extractive summarizer that writes them.

/// One section of the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub number: usize,
    pub title: &'static str,
    /// What the section holds, as the prompt asks for it.
    pub asks_for: &'static str,
}

pub const SUMMARY_SECTIONS: [Section; 9] = [
    Section {
        number: 1,
        title: "Primary Request and Intent",
        asks_for: "The user's ultimate goal, in full.",
    },
    Section {
        number: 2,
        title: "Key Technical Concepts",
        asks_for: "Architecture, patterns, technologies and decisions that matter.",
    },
    Section {
        number: 3,
        title: "Files and Code Sections",
        asks_for: "Paths, functions and code discussed or modified, with why they matter.",
    },
    Section {
        number: 4,
        title: "Errors and fixes",
        asks_for: "Problems met and how they were solved.",
    },
    Section {
        number: 5,
        title: "Problem Solving",
        asks_for: "Key decisions and their rationale.",
    },
    Section {
        number: 6,
        title: "All user messages",
        asks_for: "Every user instruction, verbatim, in order, including those of the prior summary.",
    },
    Section {
        number: 7,
        title: "Pending Tasks",
        asks_for: "Work that remains.",
    },
    Section {
        number: 8,
        title: "Current Work",
        asks_for: "What was being worked on when the conversation was summarized.",
    },
    Section {
        number: 9,
        title: "Optional Next Step",
        asks_for: "The most logical next action, if there is one.",
    },
];

/// The Markdown heading of section `number` (1-based), e.g. `## 6. All user messages`.
pub fn heading(section: &Section) -> String {
    format!("## {}. {}", section.number, section.title)
}

/// The bodies of the nine sections of `summary`, found by their headings (any heading level,
/// any case, so summaries written by a model are read too). A section that is missing is `None`.
pub fn split_sections(summary: &str) -> [Option<String>; 9] {
    let mut bodies: [Option<String>; 9] = Default::default();
    let mut current: Option<usize> = None;
    // Split on '\n' only: `str::lines` would also eat a '\r', and section 6 quotes the user's
    // messages byte for byte.
    for line in summary.split('\n') {
        if let Some(index) = section_of_heading(line) {
            current = Some(index);
            bodies[index] = Some(String::new());
            continue;
        }
        if let Some(body) = current.and_then(|i| bodies[i].as_mut()) {
            body.push_str(line);
            body.push('\n');
        }
    }
    bodies.map(|b| b.map(|s| s.trim_matches('\n').to_string()))
}

/// The index (0 for section 1) of the section `line` is the heading of, if it is one.
pub(super) fn section_of_heading(line: &str) -> Option<usize> {
    let line = line.trim_end_matches('\r');
    let rest = line
        .trim()
        .strip_prefix('#')?
        .trim_start_matches('#')
        .trim();
    let rest = rest.trim_start_matches("**");
    let (number, title) = rest.split_once('.')?;
    let number: usize = number.trim().parse().ok()?;
    let section = SUMMARY_SECTIONS.get(number.checked_sub(1)?)?;
    title
        .trim()
        .to_lowercase()
        .starts_with(&section.title.to_lowercase())
        .then_some(number - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_found_by_their_headings() {
        let summary = "## 1. Primary Request and Intent\nbuild it\n\n### 6. all user messages\n[#1] hi\n[#2] go\n## 7. Pending Tasks\n- x";
        let s = split_sections(summary);
        assert_eq!(s[0].as_deref(), Some("build it"));
        assert_eq!(s[5].as_deref(), Some("[#1] hi\n[#2] go"));
        assert_eq!(s[6].as_deref(), Some("- x"));
        assert_eq!(s[1], None);
    }

    #[test]
    fn carriage_returns_in_bodies_are_kept() {
        let s = split_sections("## 6. All user messages\r\n[#1] a\r\nb\r\n## 7. Pending Tasks\n");
        assert_eq!(s[5].as_deref(), Some("[#1] a\r\nb\r"));
    }

    #[test]
    fn headings_are_numbered_one_to_nine() {
        assert_eq!(heading(&SUMMARY_SECTIONS[5]), "## 6. All user messages");
        for (i, s) in SUMMARY_SECTIONS.iter().enumerate() {
            assert_eq!(s.number, i + 1);
        }
    }
}
