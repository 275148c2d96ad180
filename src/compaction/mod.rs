//! The compaction engine: SPEC.md as pure functions over plain data.
//!
//! Nothing here does I/O, reads a clock or touches SQL, so every rule is tested with plain
//! values. The service feeds it a session's messages and stores what it decides.
//!
//! - [`constants`]: the spec's constants; [`config`]: CompactionConfig and what derives from it
//! - [`estimate`]: LazyEstimator; [`trigger`]: when to compact
//! - [`boundary`]: FindPreserveBoundary with the tool-pair rule
//! - [`mask`]: observation masking; [`files`] and [`shell`]: trackFiles
//! - [`truncate`], [`sections`], [`prompt`]: buildCompactionPrompt
//! - [`plan`]: the decisions of one compaction; [`result`]: CompactionResult
//! - [`chunk`]: splitting a prompt that does not fit the summarizer's window

pub mod boundary;
pub mod chunk;
pub mod config;
pub mod constants;
pub mod estimate;
pub mod files;
pub mod mask;
pub mod plan;
pub mod prompt;
pub mod result;
pub mod sections;
pub mod shell;
pub mod trigger;
pub mod truncate;

pub use boundary::{Boundary, find_preserve_boundary};
pub use config::CompactionConfig;
pub use estimate::LazyEstimator;
pub use files::{FileLists, track_files};
pub use plan::{CompactionPlan, PlanInput, estimate_each};
pub use result::{CompactionResult, is_blank, summary_message};
pub use trigger::{Trigger, check_trigger};
