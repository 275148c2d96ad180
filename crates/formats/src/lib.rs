//! What compactd reads and writes in other programs' formats, pure (no I/O but reading a
//! transcript file): each model API's request, reply, context and stream in one module
//! ([`provider`]: Chat Completions, Anthropic Messages, the Responses API), what their media
//! cost, how an upstream's refusal reads; the agents' session files ([`transcript`]), read
//! with the same parsers; and two formats of compactd's own that must not change between
//! builds ([`fnv`], a stored hash) or must be read before parsing ([`json_shape`]).

#![forbid(unsafe_code)]

pub mod fnv;
pub mod json_shape;
pub mod provider;
pub mod transcript;

// The engine's types, under the paths the modules here use for them.
use compactd_core::{compaction, message};
