//! The compaction engine: SPEC.md as pure functions over plain data.
//!
//! Nothing here does I/O, reads a clock or touches SQL, so every rule is tested with plain
//! values. The service feeds it a session's messages and stores what it decides.
//!
//! - [`constants`]: the spec's constants; [`config`]: CompactionConfig and what derives from it
//! - [`estimate`]: LazyEstimator; [`trigger`]: when to compact
//! - [`boundary`]: FindPreserveBoundary with the tool-pair rule
//! - [`mask`]: observation masking (in the prompt); [`microcompact`]: masking old outputs in
//!   the context itself, before a summary is needed
//! - [`files`]: trackFiles, with [`shell`] and [`shell_lex`] (what a command line does),
//!   [`patch`] (a patch's headers) and [`script`] (what a Python snippet writes)
//! - [`redact`]: credentials out of summaries and prompts; [`instruction`]: which user
//!   messages are instructions
//! - [`truncate`], [`sections`], [`prompt`]: buildCompactionPrompt
//! - [`pin`]: system messages and the task, never summarized away; [`step`]: the current
//!   step, always in the tail (shortened in the context when too large)
//! - [`plan`]: the decisions of one compaction; [`result`]: CompactionResult
//! - [`chunk`]: splitting a prompt that does not fit the summarizer's window

pub mod boundary;
pub mod chunk;
pub mod config;
pub mod constants;
pub mod estimate;
pub mod files;
pub mod instruction;
pub mod kept_instructions;
pub mod mask;
pub mod media;
pub mod microcompact;
pub mod notification;
pub mod origin;
pub mod patch;
pub mod pin;
pub mod plan;
pub mod prompt;
pub mod redact;
pub mod result;
pub mod script;
pub mod sections;
pub mod shell;
pub mod shell_lex;
pub mod step;
pub mod tags;
pub mod trigger;
pub mod truncate;

/// The engine's input: messages and their parts (kept in `crate::message`, which the store
/// and the wire types share).
pub use crate::message::{Message, MessageError, Part, Role};
pub use boundary::{Boundary, find_preserve_boundary};
pub use config::CompactionConfig;
pub use estimate::{LazyEstimator, counted_chars};
pub use files::{FileLists, track_files};
pub use origin::Origin;
pub use pin::Pins;
pub use plan::{CompactionPlan, PinnedOverflow, PlanInput, estimate_each};
pub use result::{CompactionResult, is_blank, summary_message};
pub use trigger::{Due, Trigger, check_due, check_trigger};
