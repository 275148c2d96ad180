//! The `compactd` command: parses arguments and runs them (`cli`). The daemon, the API's
//! client and the measurements are crates of the workspace (ARCHITECTURE.md); the commands
//! use them under the short names below.

mod cli;

use clap::Parser;
use cli::args::Cli;
use compactd_api as protocol;
use compactd_api::{client, paths};
use compactd_core::{compaction, message};
use compactd_daemon::{compaction_run, config};
use compactd_formats::transcript;
use compactd_measure as measure;
use compactd_store as store;
use compactd_summarize as summarize;
use std::process::ExitCode;

fn main() -> ExitCode {
    limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("compactd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

/// glibc gives each thread that contends for the heap an arena of its own (up to 8 per core),
/// and memory freed in one is not reused by the others: bodies parsed on one worker and freed
/// on another left RSS up to twice the live heap. Two arenas keep RSS near what is in use;
/// allocation is not where the daemon spends its time. Allocations of 1 MiB and more (large
/// bodies, long texts) are mapped on their own and unmapped when freed: glibc's default
/// threshold rises after the first large free, and later large buffers then stayed in the
/// heap. Set before any thread starts.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no thread has started yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

async fn run() -> ExitCode {
    // SIGPIPE stays ignored (Rust's default): the CLI's output ends quietly on a closed pipe
    // by itself (`cli::write_stdout`), and a socket the daemon closes is an error, not death.
    let cli = Cli::parse();
    match cli::run::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactd: {e:#}");
            ExitCode::from(cli::run::exit_code(&e))
        }
    }
}
