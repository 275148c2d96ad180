//! How the writer thread and a lone caller wait for each other: awake, briefly, then asleep.
//!
//! One client's append crosses two threads and back: the handler hands the write to the
//! writer thread, then waits for its commit (an fsync, 0.3-0.5 ms here). A thread asleep for
//! that long lets its vCPU halt, and on a VM waking a halted vCPU costs tens to hundreds of
//! µs, paid at every handoff and by the fsync's own completion. Measured with one Python
//! client appending on a keep-alive connection (alternating builds, p50 of 1,500 appends):
//! 1,090-2,241 µs with both sides asleep, 509-2,145 µs with the writer awake after a commit,
//! 344-444 µs with the handler awake as well. So both stay awake, for a bound: the writer for
//! [`WRITER_AWAKE`] after each commit (the next append of a client in a loop arrives an HTTP
//! round trip after the answer), a caller for [`CALLER_AWAKE`] while its write is the only
//! one in flight. With more in flight the writer has work queued and callers simply sleep:
//! spinning there would take the cores the writer and the clients need.
//!
//! Awake means polling and yielding the core between polls (the thread's to anything else
//! runnable, the tokio task's to the runtime's other tasks and its I/O), so nothing waits
//! behind it. An idle daemon never polls: only a write starts it. And a busy machine stops
//! it: a yield that took long means another thread wanted the core, and there a poller only
//! gets it back after the other's time slice, where a sleeper is woken at once (measured
//! while a build ran beside: p50 703 µs asleep, 3,968 µs polling). After such a yield
//! nobody polls for [`CONTENDED_FOR`].

use super::StoreError;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the writer polls for the next write after a commit before it sleeps.
pub(super) const WRITER_AWAKE: Duration = Duration::from_micros(500);
/// How long a lone caller polls for its write's answer before it sleeps.
pub(super) const CALLER_AWAKE: Duration = Duration::from_millis(1);

/// A yield that takes longer than this gave the core to another thread.
const YIELD_GAVE_AWAY: Duration = Duration::from_micros(50);
/// After a yield gave the core away, nobody polls for this long.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// µs since [`epoch`] until which nobody polls.
static CONTENDED_UNTIL: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros_now() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// Whether polling may start: no yield gave the core away in the last [`CONTENDED_FOR`].
fn quiet() -> bool {
    micros_now() >= CONTENDED_UNTIL.load(Ordering::Relaxed)
}

/// Notes how long a yield took; false (stop polling) if it gave the core away.
fn yielded_quickly(started: Instant) -> bool {
    if started.elapsed() <= YIELD_GAVE_AWAY {
        return true;
    }
    let until = micros_now() + CONTENDED_FOR.as_micros() as u64;
    CONTENDED_UNTIL.fetch_max(until, Ordering::Relaxed);
    false
}

/// The writer's next job, waiting at most `wait`; polled for [`WRITER_AWAKE`] first when
/// the writer has just committed.
pub(super) fn next_job<J>(
    jobs: &Receiver<J>,
    just_committed: bool,
    wait: Duration,
) -> Result<J, RecvTimeoutError> {
    if just_committed && quiet() {
        let until = Instant::now() + WRITER_AWAKE;
        while Instant::now() < until {
            match jobs.try_recv() {
                Ok(job) => return Ok(job),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let started = Instant::now();
            std::thread::yield_now();
            if !yielded_quickly(started) {
                break;
            }
        }
    }
    jobs.recv_timeout(wait)
}

/// Counts the writes submitted and not yet answered (or abandoned by their caller).
#[derive(Default)]
pub(super) struct InFlight(AtomicUsize);

impl InFlight {
    /// Counts one more write until the returned guard drops.
    pub(super) fn enter(&self) -> Entered<'_> {
        let before = self.0.fetch_add(1, Ordering::AcqRel);
        Entered {
            count: &self.0,
            alone: before == 0,
        }
    }
}

/// One write in flight; `alone` when no other was as it entered.
pub(super) struct Entered<'a> {
    count: &'a AtomicUsize,
    pub(super) alone: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A write's answer: polled for [`CALLER_AWAKE`] first when the write is `alone`, then
/// awaited asleep. A dropped sender (the writer gone) answers [`StoreError::Closed`].
pub(super) async fn answer<T>(
    mut answer: oneshot::Receiver<Result<T, StoreError>>,
    alone: bool,
) -> Result<T, StoreError> {
    if alone && quiet() {
        let until = Instant::now() + CALLER_AWAKE;
        while Instant::now() < until {
            match answer.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Closed) => return Err(StoreError::Closed),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let started = Instant::now();
            tokio::task::yield_now().await;
            if !yielded_quickly(started) {
                break;
            }
        }
    }
    answer.await.map_err(|_| StoreError::Closed)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_yield_that_gave_the_core_away_stops_polling_for_a_while() {
        let a_slice_ago = Instant::now() - Duration::from_millis(4);
        assert!(!yielded_quickly(a_slice_ago));
        assert!(!quiet(), "nobody polls for CONTENDED_FOR after it");
    }

    #[test]
    fn only_a_write_with_none_other_in_flight_is_alone() {
        let in_flight = InFlight::default();
        let first = in_flight.enter();
        let second = in_flight.enter();
        assert!(first.alone);
        assert!(!second.alone);
        drop(first);
        drop(second);
        // Abandoned or answered, a write stops counting: the next one is alone again.
        assert!(in_flight.enter().alone);
    }

    #[test]
    fn the_writer_takes_a_job_sent_while_it_polls_and_sleeps_once_none_comes() {
        let (tx, rx) = channel::<u32>();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(50));
            tx.send(7).unwrap();
            tx
        });
        assert_eq!(next_job(&rx, true, Duration::from_secs(5)), Ok(7));
        let tx = sender.join().unwrap();
        // Nothing comes: past the awake time it sleeps for `wait`, then times out.
        let start = Instant::now();
        assert_eq!(
            next_job(&rx, true, Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout)
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
        drop(tx);
        assert_eq!(
            next_job(&rx, true, Duration::from_secs(5)),
            Err(RecvTimeoutError::Disconnected)
        );
    }

    #[tokio::test]
    async fn a_lone_caller_gets_its_answer_whether_it_comes_while_polling_or_after() {
        for delay in [Duration::ZERO, CALLER_AWAKE * 3] {
            let (reply, rx) = oneshot::channel();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let _ = reply.send(Ok::<u32, StoreError>(5));
            });
            assert_eq!(answer(rx, true).await.ok(), Some(5));
        }
        let (reply, rx) = oneshot::channel::<Result<u32, StoreError>>();
        drop(reply);
        assert!(matches!(answer(rx, true).await, Err(StoreError::Closed)));
    }
}
