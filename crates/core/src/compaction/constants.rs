//! The spec's constants (SPEC.md 5.1), under their spec names in Rust's constant case.
//!
//! | spec name                           | here                                  |
//! |-------------------------------------|---------------------------------------|
//! | MinPreserveRecentTokens             | [`MIN_PRESERVE_RECENT_TOKENS`]        |
//! | MaxPreserveRecentTokens             | [`MAX_PRESERVE_RECENT_TOKENS`]        |
//! | defaultMaxMessages                  | [`DEFAULT_MAX_MESSAGES`]              |
//! | compactionCircuitBreakerThreshold   | [`COMPACTION_CIRCUIT_BREAKER_THRESHOLD`] |
//! | maxTextChars                        | [`MAX_TEXT_CHARS`]                    |
//! | maxToolArgsChars                    | [`MAX_TOOL_ARGS_CHARS`]               |
//! | maxToolOutputChars                  | [`MAX_TOOL_OUTPUT_CHARS`]             |
//! | preserveRecentOutputs               | [`PRESERVE_RECENT_OUTPUTS`]           |

/// Floor for the preserve boundary's token budget.
pub const MIN_PRESERVE_RECENT_TOKENS: usize = 2_000;
/// Ceiling for the preserve boundary's token budget.
pub const MAX_PRESERVE_RECENT_TOKENS: usize = 15_000;
/// Compaction triggers when a session's active message count exceeds this.
pub const DEFAULT_MAX_MESSAGES: usize = 80;
/// Automatic compaction attempts allowed per user turn before giving up.
pub const COMPACTION_CIRCUIT_BREAKER_THRESHOLD: u32 = 3;
/// Text and reasoning parts are cut to this many characters in the compaction prompt.
pub const MAX_TEXT_CHARS: usize = 2_000;
/// Tool call arguments are cut to this many characters in the compaction prompt.
pub const MAX_TOOL_ARGS_CHARS: usize = 500;
/// Tool outputs are cut to this many characters in the compaction prompt.
pub const MAX_TOOL_OUTPUT_CHARS: usize = 2_000;
/// Tool results kept verbatim when observations are masked.
pub const PRESERVE_RECENT_OUTPUTS: usize = 5;
/// What a masked tool output reads in the compaction prompt.
pub const MASKED_OUTPUT: &str = "[output masked for compaction]";
/// The LazyEstimator's default: about four characters per token.
pub const DEFAULT_TOKENS_PER_CHAR: f64 = 0.25;
/// A completion a client asks room for (`max_tokens`) is kept free beside its prompts while it
/// takes at most this share of the window; a larger one leaves a compaction nothing to fit.
pub const MAX_COMPLETION_SHARE: f64 = 0.75;
/// The reserve kept free below the context limit is at most this many tokens...
pub const MAX_RESERVE_TOKENS: usize = 20_000;
/// ...and at most this fraction (1/5) of the context limit.
pub const RESERVE_DIVISOR: usize = 5;
/// The preserve budget is this fraction (1/16) of the usable context, before clamping to
/// [MinPreserve, MaxPreserve]. DESIGN.md started at 1/4; every compaction rewrites the tail
/// (written uncached), and measured on the shared transcripts a 1/16 tail costs 0.35x of
/// raw history where 1/4 cost 0.39x, with the continuation probes unchanged
/// (docs/EVALUATION.md, "What a session costs").
pub const PRESERVE_DIVISOR: usize = 16;
/// A summary may take this fraction (1/8) of the usable context (3,200 tokens at 32k).
pub const SUMMARY_DIVISOR: usize = 8;
/// To keep every user instruction whole, a summary may grow to this fraction (1/2) of the
/// usable context; the other sections have shrunk to their floor by then.
pub const SUMMARY_CEILING_DIVISOR: usize = 2;
/// At most `max_messages / TAIL_MESSAGES_DIVISOR` messages stay verbatim (10 of 80).
pub const TAIL_MESSAGES_DIVISOR: usize = 8;
/// The context limit of a session that does not name one (a common window for current models).
pub const DEFAULT_CONTEXT_LIMIT: usize = 128_000;
/// Smaller windows leave no room for a summary and a tail.
pub const MIN_CONTEXT_LIMIT: usize = 1_000;
/// Larger limits than any model has are typos.
pub const MAX_CONTEXT_LIMIT: usize = 100_000_000;
/// A compaction's two floors (the summary's and the tail's) take at most a quarter each of the
/// room pinned messages leave under the threshold (see `CompactionConfig::fitted_beside`).
pub const ROOM_PER_FLOOR: usize = 4;
/// Tokens up to which the session's first user instruction (its task) is pinned verbatim.
pub const PIN_FIRST_USER_TOKENS: usize = 4_000;
/// Microcompaction may start once the context holds this many tokens (or half the trigger,
/// if that is less). A token count, not a share of the window: what an old output costs is
/// paid per token whatever the window, and a share of a 128k trigger (25k and more) let
/// long sessions carry outputs nobody reads again. 11,000 since the estimate began to count
/// punctuation and capitals (the shared transcripts' sums grew 8 to 17%): the 10,000 it was
/// chosen as, counted as the models count, so a short session is not masked just before it
/// ends, which costs more than it saves with a prompt cache (docs/EVALUATION.md).
pub const MICROCOMPACT_TOKENS: usize = 11_000;
/// With a model or command summarizer, a compaction starts in the background once the room
/// between the summary and the trigger is this full, so the model has the rest of that room
/// (several agent steps) to finish before any context needs it (BENCHMARKS.md measures
/// the wait it saves). The extractive summarizer compacts in milliseconds: starting it
/// earlier would only cost the prompt cache more often, so it compacts at the trigger.
pub const BACKGROUND_AT: f64 = 0.8;
/// The lowest `background_at`: below it, the context right after a compaction (summary, tail
/// and the current step) could already be over the line, and compactions would follow each
/// other without the agent moving on.
pub const MIN_BACKGROUND_AT: f64 = 0.7;
/// The longest a context over the trigger waits for a running compaction, in seconds, before
/// the extractive summarizer finishes it instead.
pub const MAX_WAIT_S: u64 = 10;
/// `max_wait_s` is at most an hour.
pub const MAX_WAIT_S_LIMIT: u64 = 3_600;
