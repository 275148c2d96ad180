//! OpenAI Chat Completions: the context for `?format=openai` ([`context`]), and a proxied
//! call's request ([`request`]) and answer ([`reply`]). DeepSeek, vLLM, llama.cpp, Ollama and
//! every OpenAI-compatible server take the same shape.

pub(crate) mod context;
pub(crate) mod reply;
pub(crate) mod request;

pub use context::messages;
