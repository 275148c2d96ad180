//! Measuring the daemon, apart from the daemon itself: nothing here runs in `compactd serve`.
//!
//! - `replay`: real agent sessions through the engine, against baselines (EVALUATION.md).
//! - `bench`: latency, throughput and memory of a real daemon process (BENCHMARKS.md).
//! - `torture`: kill -9 cycles under appends, hostile requests, slow clients; every promise
//!   checked.
//! - [`synthetic`] sessions and [`daemon_process`] (a daemon started as a child process),
//!   which those and the integration tests share.

pub mod bench;
pub mod daemon_process;
pub mod replay;
pub mod synthetic;
pub mod torture;
