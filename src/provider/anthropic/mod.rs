//! Anthropic Messages: the context for `?format=anthropic` ([`context`]), and a proxied
//! call's request ([`request`]) and answer ([`reply`]).

pub(crate) mod context;
pub(crate) mod reply;
pub(crate) mod request;

pub use context::conversation;
