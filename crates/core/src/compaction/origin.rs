//! Where a message is stored, as the context says it wherever it shows less than the whole
//! message (a masked output, a shortened one, a summary): its seq, its session and the tool
//! that reads it back (compactd's MCP server, `read_messages`), in a few words, so an agent
//! that needs the rest knows how to get it.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The session's id; empty where it is not known (offline plans), and then not said.
    pub session: &'a str,
    pub seq: u64,
}

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.session.is_empty() {
            write!(f, "seq {}", self.seq)
        } else {
            write!(
                f,
                "seq {} of session {}, read_messages has it",
                self.seq, self.session
            )
        }
    }
}

/// What a summary's header says about recalling what it leaves out (nothing offline).
pub fn recall_note(session: &str) -> String {
    if session.is_empty() {
        String::new()
    } else {
        format!(
            "\n(Session {session}: what it leaves out is stored; search_history and read_messages find and read it back.)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_and_the_tool_are_named_when_known() {
        let at = Origin {
            session: "demo",
            seq: 412,
        };
        assert_eq!(
            at.to_string(),
            "seq 412 of session demo, read_messages has it"
        );
        assert_eq!(
            Origin {
                session: "",
                seq: 3
            }
            .to_string(),
            "seq 3"
        );
        assert!(recall_note("demo").contains("search_history"));
        assert_eq!(recall_note(""), "");
    }
}
