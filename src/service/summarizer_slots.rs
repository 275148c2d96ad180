//! How many compactions call the summarizer at once (`[summarizer] max_concurrent`).
//!
//! Every session over a trigger compacts at once after a restart or a config edit that lowers
//! a trigger, and busy agents compact side by side. Hundreds of calls at once make a model
//! server answer slowly or with 429s (and the breaker then opens for sessions that did nothing
//! wrong), a local model runs them one at a time anyway, and a command summarizer would start a
//! process for each. A compaction waits here for a slot; a context that waits for it past
//! `max_wait_s` hurries it as it hurries a slow model. The built-in extractive summarizer only
//! computes, on the blocking pool, and takes no slot.

use crate::protocol::SummarizerCalls;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Semaphore, SemaphorePermit};

pub struct SummarizerSlots {
    slots: Semaphore,
    max: usize,
    waiting: AtomicUsize,
}

/// Counts a compaction as waiting for as long as it waits, however that ends (a hurried or
/// cancelled compaction stops waiting too).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SummarizerSlots {
    pub fn new(max: usize) -> SummarizerSlots {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        SummarizerSlots {
            slots: Semaphore::new(max),
            max,
            waiting: AtomicUsize::new(0),
        }
    }

    /// A slot, once one is free; held for the whole call (all its chunks).
    pub async fn take(&self) -> SemaphorePermit<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        // The semaphore is never closed.
        self.slots
            .acquire()
            .await
            .unwrap_or_else(|_| unreachable!("the summarizer's slots are never closed"))
    }

    /// Calls running and waiting now, for `/health`.
    pub fn status(&self) -> SummarizerCalls {
        SummarizerCalls {
            running: self.max - self.slots.available_permits(),
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
        let (a, _b) = (slots.take().await, slots.take().await);
        let third = slots.take();
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
    async fn a_wait_given_up_is_no_longer_counted() {
        let slots = SummarizerSlots::new(1);
        let _held = slots.take().await;
        {
            let waiting = slots.take();
            tokio::pin!(waiting);
            assert!(futures_util::poll!(waiting.as_mut()).is_pending());
            assert_eq!(slots.status().waiting, 1);
        }
        assert_eq!(slots.status().waiting, 0);
    }
}
