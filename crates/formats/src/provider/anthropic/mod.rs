//! Anthropic Messages: the context for `?format=anthropic` ([`context`]), and a proxied
//! call's request ([`request`]) and answer ([`reply`]).

pub mod context;
pub mod reply;
pub mod request;

pub use context::conversation;
