//! How the writer thread waits for its next write: awake, briefly, then asleep; and how a
//! caller knows its write is the only one in flight.
//!
//! One client's append used to cross two threads and back: the handler handed the write to
//! the writer thread, then waited for its commit (an fsync, 0.3-0.5 ms here). A thread asleep
//! for that long lets its vCPU halt, and on a VM waking a halted vCPU costs tens to hundreds
//! of µs, paid at every handoff. Measured with one Python client appending on a keep-alive
//! connection (alternating builds, p50 of 1,500 appends): 1,090-2,241 µs with both sides
//! asleep, 344-444 µs with both polling. A write that is [`Entered::alone`] now commits on its
//! caller's thread (see `writer`), with no handoff at all; writes that come together go to
//! the writer thread, and after each commit it polls for [`WRITER_AWAKE`] for the next (the
//! clients it just answered send theirs an HTTP round trip later). An idle daemon never
//! polls: only a commit starts it.
//!
//! Polling means yielding the core between polls, so nothing runnable waits behind it. And a
//! busy machine stops it: a yield that took long means another thread wanted the core, and
//! there a poller only gets it back after the other's time slice, where a sleeper is woken at
//! once (measured while a build ran beside: p50 703 µs asleep, 3,968 µs polling). After such
//! a yield the writer does not poll for [`CONTENDED_FOR`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// How long the writer polls for the next write after a commit before it sleeps.
pub(super) const WRITER_AWAKE: Duration = Duration::from_micros(500);

/// A yield that takes longer than this gave the core to another thread.
const YIELD_GAVE_AWAY: Duration = Duration::from_micros(50);
/// After a yield gave the core away, the writer does not poll for this long.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// The writer thread's memory of a busy machine: until when it does not poll.
#[derive(Default)]
pub(super) struct Backoff {
    until: Option<Instant>,
}

impl Backoff {
    /// Whether polling may start: no yield gave the core away in the last [`CONTENDED_FOR`].
    fn quiet(&self) -> bool {
        self.until.is_none_or(|until| Instant::now() >= until)
    }

    /// Notes how long a yield took; false (stop polling) if it gave the core away.
    fn yielded_quickly(&mut self, started: Instant) -> bool {
        if started.elapsed() <= YIELD_GAVE_AWAY {
            return true;
        }
        self.until = Some(Instant::now() + CONTENDED_FOR);
        false
    }
}

/// The writer's next job, waiting at most `wait`; polled for [`WRITER_AWAKE`] first when
/// the writer has just committed and `backoff` allows it.
pub(super) fn next_job<J>(
    jobs: &Receiver<J>,
    just_committed: bool,
    wait: Duration,
    backoff: &mut Backoff,
) -> Result<J, RecvTimeoutError> {
    if just_committed && backoff.quiet() {
        let until = Instant::now() + WRITER_AWAKE;
        while Instant::now() < until {
            match jobs.try_recv() {
                Ok(job) => return Ok(job),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let started = Instant::now();
            std::thread::yield_now();
            if !backoff.yielded_quickly(started) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_yield_that_gave_the_core_away_stops_polling_for_a_while() {
        let mut backoff = Backoff::default();
        assert!(backoff.quiet());
        let a_slice_ago = Instant::now() - Duration::from_millis(4);
        assert!(!backoff.yielded_quickly(a_slice_ago));
        assert!(!backoff.quiet(), "nobody polls for CONTENDED_FOR after it");
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
        let backoff = &mut Backoff::default();
        assert_eq!(next_job(&rx, true, Duration::from_secs(5), backoff), Ok(7));
        let tx = sender.join().unwrap();
        // Nothing comes: past the awake time it sleeps for `wait`, then times out.
        let start = Instant::now();
        assert_eq!(
            next_job(&rx, true, Duration::from_millis(20), backoff),
            Err(RecvTimeoutError::Timeout)
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
        drop(tx);
        assert_eq!(
            next_job(&rx, true, Duration::from_secs(5), backoff),
            Err(RecvTimeoutError::Disconnected)
        );
    }
}
