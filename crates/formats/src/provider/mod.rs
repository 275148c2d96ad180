//! Model APIs' wire formats, each in one module: OpenAI Chat Completions ([`chat`]), the
//! Anthropic Messages API ([`anthropic`]) and the OpenAI Responses API ([`responses`]). Each
//! renders compactd's context in its shape (for `GET /context?format=...`), and reads and
//! writes a proxied call ([`wire`]): the request's conversation, the answer, its stream.
//!
//! compactd stores messages in one neutral shape ([`crate::message::Message`]); an agent
//! that asks for its context "ready to send" gets it converted here, so no plugin has to
//! re-implement the rules each API enforces (and rejects a request for breaking): tool
//! results right after the call that asked for them, every call answered, alternating roles,
//! system text lifted out.
//!
//! Both converters first put the conversation in [`Turns`]: each assistant message with the
//! results of its calls gathered right after it, in call order, wherever they were stored. A
//! call that never got a result (an interrupted tool, say) is answered with
//! [`turns::NO_RESULT`] so the request stays valid, except in the last assistant message, whose
//! results the agent is about to send. Reasoning parts are dropped: both APIs accept only
//! their own signed or provider-specific forms of them.
//!
//! Pure functions: no I/O.

pub mod anthropic;
mod base64_text;
pub mod bounded_json;
pub mod chat;
mod documents;
mod images;
pub mod media;
pub mod models;
pub mod overflow;
pub mod responses;
mod sse;
mod turns;
pub mod wire;

#[cfg(test)]
mod fixtures;

pub use turns::{Turn, Turns};

/// A tool or call name as the APIs accept it (`^[a-zA-Z0-9_-]{1,64}$`): other characters
/// become `_`, and an empty name `tool`.
pub fn api_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "tool".into()
    } else {
        cleaned
    }
}

/// A tool call id both APIs accept: `^[a-zA-Z0-9_-]+$` (Anthropic) and at most 40
/// characters (OpenAI). A longer or odd id becomes `call_` and a hash of it, the same on the
/// call and its result and in every request (so prompt caches still match).
pub fn api_id(id: &str) -> String {
    let acceptable = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !id.is_empty() && id.len() <= MAX_ID_CHARS && id.chars().all(acceptable) {
        return id.to_string();
    }
    format!("call_{:016x}", crate::fnv::Fnv::of(id.as_bytes()))
}

/// OpenAI's limit on a tool call id.
const MAX_ID_CHARS: usize = 40;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_are_made_acceptable() {
        assert_eq!(api_name("str_replace_editor"), "str_replace_editor");
        assert_eq!(api_name("mcp.fs/read file"), "mcp_fs_read_file");
        assert_eq!(api_name(""), "tool");
        assert_eq!(api_name(&"x".repeat(100)).len(), 64);
        assert_eq!(api_id("toolu_01ABC-x_9"), "toolu_01ABC-x_9");
        let odd = api_id("toolu_01:ab.c");
        assert!(odd.starts_with("call_") && odd.len() == 21);
        assert_eq!(odd, api_id("toolu_01:ab.c"), "stable");
        assert_ne!(odd, api_id("toolu_01:ab.d"));
        assert!(api_id(&"a".repeat(41)).len() <= 40);
        assert!(api_id("").starts_with("call_"));
    }
}
