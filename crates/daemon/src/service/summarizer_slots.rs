//! How many compactions call the summarizer at once (`[summarizer] max_concurrent`).
//!
//! Every session over a trigger compacts at once after a restart or a config edit that lowers
//! a trigger, and busy agents compact side by side. Hundreds of calls at once make a model
//! server answer slowly or with 429s (and the breaker then opens for sessions that did nothing
//! wrong), a local model runs them one at a time anyway, and a command summarizer would start a
//! process for each. A compaction waits here for a slot. One slot more is kept for compactions
//! someone waits for (a context over its trigger, a manual compaction), so they never queue
//! behind background ones; a context that still waits past `max_wait_s` cuts its
//! compaction's model call off, as it does a slow model's. The built-in extractive summarizer only computes,
//! on the blocking pool, and takes no slot.

use crate::protocol::SummarizerCalls;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Semaphore, SemaphorePermit};

pub struct SummarizerSlots {
    shared: Semaphore,
    /// The one slot only a compaction someone waits for may take.
    waited_for: Semaphore,
    max: usize,
    waiting: AtomicUsize,
}

/// Counts a compaction as waiting for as long as it waits, however that ends (a cut-off or
/// cancelled compaction stops waiting too).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SummarizerSlots {
    pub fn new(max: usize) -> SummarizerSlots {
        let max = max.clamp(1, Semaphore::MAX_PERMITS - 1);
        SummarizerSlots {
            shared: Semaphore::new(max),
            waited_for: Semaphore::new(1),
            max,
            waiting: AtomicUsize::new(0),
        }
    }

    /// A slot, once one is free; held for the whole call (all its chunks). `waited_for`: a
    /// context or a manual compaction waits for this one, which may also take the slot kept
    /// for such compactions.
    pub async fn take(&self, waited_for: bool) -> SemaphorePermit<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        // The semaphores are never closed.
        let never_closed = |_| unreachable!("the summarizer's slots are never closed");
        if !waited_for {
            return self.shared.acquire().await.unwrap_or_else(never_closed);
        }
        tokio::select! {
            biased;
            slot = self.shared.acquire() => slot.unwrap_or_else(never_closed),
            slot = self.waited_for.acquire() => slot.unwrap_or_else(never_closed),
        }
    }

    /// Calls running and waiting now, for `/health`.
    pub fn status(&self) -> SummarizerCalls {
        SummarizerCalls {
            running: self.max - self.shared.available_permits() + 1
                - self.waited_for.available_permits(),
            waiting: self.waiting.load(Ordering::Relaxed),
            max_concurrent: self.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_the_slots_waits_until_one_is_given_back() {
        let slots = SummarizerSlots::new(2);
        let (a, _b) = (slots.take(false).await, slots.take(false).await);
        let third = slots.take(false);
        tokio::pin!(third);
        assert!(futures_util::poll!(third.as_mut()).is_pending());
        let s = slots.status();
        assert_eq!((s.running, s.waiting, s.max_concurrent), (2, 1, 2));
        drop(a);
        let _c = third.await;
        let s = slots.status();
        assert_eq!((s.running, s.waiting), (2, 0));
    }

    #[tokio::test]
    async fn a_compaction_someone_waits_for_never_queues_behind_background_ones() {
        let slots = SummarizerSlots::new(2);
        let _background = (slots.take(false).await, slots.take(false).await);
        let queued = slots.take(false);
        tokio::pin!(queued);
        assert!(futures_util::poll!(queued.as_mut()).is_pending());
        // The slot kept for it: running at once, past the background one queued before it.
        let waited_for = slots.take(true).await;
        assert_eq!(slots.status().running, 3);
        // One more waited for waits for a slot like any other.
        let second = slots.take(true);
        tokio::pin!(second);
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        drop(waited_for);
        let _second = second.await;
        assert!(futures_util::poll!(queued.as_mut()).is_pending());
    }

    #[tokio::test]
    async fn a_wait_given_up_is_no_longer_counted() {
        let slots = SummarizerSlots::new(1);
        let _held = slots.take(false).await;
        {
            let waiting = slots.take(false);
            tokio::pin!(waiting);
            assert!(futures_util::poll!(waiting.as_mut()).is_pending());
            assert_eq!(slots.status().waiting, 1);
        }
        assert_eq!(slots.status().waiting, 0);
    }
}
