//! A request's CPU-heavy work runs off the runtime's workers: parsing a large JSON body, and
//! the proxy reading a resent conversation and writing the request that goes upstream (tens
//! of milliseconds of CPU for a history of 10,000 messages). On a worker that work would hold
//! up every other connection the worker serves, another agent's append or `/context` among
//! them; on a blocking thread the kernel shares the cores between it and the workers. At
//! most one such job per core runs at once ([`CpuSlots`]), so a flood of large requests from
//! one local user queues for a slot instead of occupying a thread each. Work on a small body
//! stays where it is: handing it to another thread and back costs more than doing it.

use super::error::ApiError;
use crate::protocol::ErrorCode;
use axum::http::StatusCode;
use std::sync::LazyLock;
use tokio::sync::Semaphore;

/// Work on a body smaller than this runs on the worker that received it (parsing 256 KiB of
/// JSON takes about a millisecond).
pub(super) const OFF_WORKER_BYTES: usize = 256 * 1024;

/// The daemon's slots for heavy work: one per core.
pub(super) static SLOTS: LazyLock<CpuSlots> =
    LazyLock::new(|| CpuSlots::new(std::thread::available_parallelism().map_or(2, |n| n.get())));

/// A bounded number of blocking threads for CPU-heavy work.
pub(super) struct CpuSlots {
    slots: Semaphore,
}

impl CpuSlots {
    pub(super) fn new(slots: usize) -> CpuSlots {
        CpuSlots {
            slots: Semaphore::new(slots.max(1)),
        }
    }

    /// Runs `work` for a body of `bytes`: here if the body is small, else on a blocking
    /// thread once a slot is free.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        bytes: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        if bytes < OFF_WORKER_BYTES {
            return Ok(work());
        }
        let _slot = self.slots.acquire().await.map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ShuttingDown,
                "the daemon is shutting down",
            )
        })?;
        tokio::task::spawn_blocking(work).await.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                format!("a request's work stopped: {e}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::testing::{on_the_only_worker, released_by_another_task};
    use futures_util::FutureExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn thread() -> std::thread::ThreadId {
        std::thread::current().id()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_work_leaves_the_worker_and_small_work_stays() {
        let slots = CpuSlots::new(2);
        let here = thread();
        let small = slots.run(OFF_WORKER_BYTES - 1, thread).await.unwrap();
        assert_eq!(small, here, "a small body's work ran on another thread");
        let large = slots.run(OFF_WORKER_BYTES, thread).await.unwrap();
        assert_ne!(large, here, "a large body's work ran on the worker");
    }

    #[test]
    fn the_only_worker_serves_other_tasks_while_large_work_runs() {
        assert!(
            on_the_only_worker(async {
                let (work, releaser) = released_by_another_task();
                let released = CpuSlots::new(1).run(OFF_WORKER_BYTES, work).await.unwrap();
                releaser.await.unwrap();
                released
            }),
            "the worker was held while the large work ran"
        );
    }

    #[tokio::test]
    async fn large_work_waits_for_a_free_slot_and_then_runs() {
        let slots = Arc::new(CpuSlots::new(1));
        let held = slots.slots.acquire().await.unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let job = {
            let (slots, ran) = (slots.clone(), ran.clone());
            async move {
                slots
                    .run(OFF_WORKER_BYTES, move || ran.store(true, Ordering::SeqCst))
                    .await
            }
        };
        let mut job = Box::pin(job);
        assert!(
            job.as_mut().now_or_never().is_none(),
            "the job did not wait for the only slot"
        );
        assert!(!ran.load(Ordering::SeqCst), "the job ran without a slot");
        drop(held);
        job.await.unwrap();
        assert!(ran.load(Ordering::SeqCst), "the job never ran");
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_internal_error_not_a_crash() {
        let slots = CpuSlots::new(1);
        let err = slots
            .run(OFF_WORKER_BYTES, || panic!("a bug in a parser"))
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            slots.slots.available_permits(),
            1,
            "the slot was not given back"
        );
    }
}
