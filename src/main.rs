//! The `compactd` command line: parses arguments and runs them (`compactd::cli`).

use clap::Parser;
use compactd::cli::args::Cli;
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
    match compactd::cli::run::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactd: {e:#}");
            ExitCode::from(compactd::cli::run::exit_code(&e))
        }
    }
}
