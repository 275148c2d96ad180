//! OpenAI Chat Completions: the context for `?format=openai` ([`context`]), and a proxied
//! call's request ([`request`]) and answer ([`reply`]). DeepSeek, vLLM, llama.cpp, Ollama and
//! every OpenAI-compatible server take the same shape.

pub mod context;
pub mod reply;
pub mod request;

pub use context::messages;
