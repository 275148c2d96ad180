//! Work that holds its thread for long (a commit's fsync, a compaction of thousands of
//! messages with the built-in summarizer) without holding up the async runtime's other
//! tasks: on the daemon's multi-thread runtime the worker hands its queue to another thread
//! for the duration (tokio's `block_in_place`), so every other connection goes on being
//! served. On a current-thread runtime (tests, one-shot tools) nothing else waits on the
//! thread in the same way, and `block_in_place` is not allowed there: the work runs in place.

use std::future::Future;
use tokio::runtime::{Handle, RuntimeFlavor};

/// Whether this thread runs on a multi-thread runtime, where a task may block in place.
pub(crate) fn may_block_in_place() -> bool {
    Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

/// Runs `work` (synchronous, long) without keeping the worker's other tasks waiting.
pub fn off_the_worker<T>(work: impl FnOnce() -> T) -> T {
    if may_block_in_place() {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// Runs `work`, a future that never waits for anything outside itself (it only computes),
/// without keeping the worker's other tasks waiting.
pub async fn computed_off_the_worker<F: Future>(work: F) -> F::Output {
    if may_block_in_place() {
        tokio::task::block_in_place(|| Handle::current().block_on(work))
    } else {
        work.await
    }
}

/// What tests of work kept off the worker share (here and in the daemon's).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::future::Future;

    /// Runs `scenario` as a task on a runtime of one worker: the test's own body would run
    /// on the test's thread, not on a worker.
    pub fn on_the_only_worker(scenario: impl Future<Output = bool> + Send + 'static) -> bool {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async { tokio::spawn(scenario).await.unwrap() })
    }

    /// Work that waits (at most 10 s, so that a broken build fails instead of hanging) for
    /// another task of the runtime to release it: run on the only worker, it waits in vain.
    pub fn released_by_another_task() -> (
        impl FnOnce() -> bool + Send + 'static,
        tokio::task::JoinHandle<()>,
    ) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let releaser = tokio::spawn(async move {
            let _ = release.send(());
        });
        let work = move || {
            released
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok()
        };
        (work, releaser)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{on_the_only_worker, released_by_another_task};
    use super::*;

    #[test]
    fn the_only_worker_serves_other_tasks_while_work_blocks() {
        assert!(
            on_the_only_worker(async {
                let (work, releaser) = released_by_another_task();
                let released = off_the_worker(work);
                releaser.await.unwrap();
                released
            }),
            "the worker was held while the work ran"
        );
        assert!(
            on_the_only_worker(async {
                let (work, releaser) = released_by_another_task();
                let released = computed_off_the_worker(async move { work() }).await;
                releaser.await.unwrap();
                released
            }),
            "the worker was held while the computed future ran"
        );
    }

    #[tokio::test]
    async fn on_a_current_thread_runtime_work_runs_in_place() {
        let here = std::thread::current().id();
        assert_eq!(off_the_worker(|| std::thread::current().id()), here);
        let computed = computed_off_the_worker(async { std::thread::current().id() }).await;
        assert_eq!(computed, here);
    }
}
