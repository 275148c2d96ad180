//! What the daemon's work may hold in memory at once, by construction.
//!
//! Two budgets of KiB permits, each shared by everything that draws on it: requests (every
//! body on every listener, charged before it is parsed for what parsing it will cost, and
//! every answer being recorded as it grows) and compactions (each charged for the session it
//! loads). A request that cannot get its charge within a few seconds is told to retry (503);
//! a compaction waits its turn. Requests may wait for compactions (the proxy compacts before
//! it forwards) but a compaction never waits for a request, so the two cannot deadlock. With
//! both budgets spent the daemon holds about their sum plus its baseline: the bound
//! docs/RELIABILITY.md states and `compactd torture` checks.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What bodies being read, parsed and answered, and answers being recorded, may hold.
pub(crate) const REQUEST_BUDGET: usize = 128 << 20;
/// What compactions may hold: the session's messages, the plan and the summary's prompt.
pub(crate) const COMPACTION_BUDGET: usize = 64 << 20;

/// What a request body costs once read, by what it holds: the charge it takes from the
/// request budget before it is parsed (see `server::body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Costs {
    /// Per JSON object or array.
    pub(crate) container: usize,
    /// Per byte, on top of its containers.
    pub(crate) byte: usize,
    /// The containers one request may hold; `None`: as many as the budget holds.
    pub(crate) max_containers: Option<usize>,
}

impl Costs {
    /// The API's requests: parsed whole (the parsed value, the message it becomes, its row;
    /// measured with heaptrack on bodies of 220,000 tiny messages), text held about twice
    /// (parsed, then as the message stored).
    pub(crate) const API: Costs = Costs {
        container: 1024,
        byte: 2,
        max_containers: Some(50_000),
    };
    /// The proxy's calls: every message held as its text and as compactd's message, read one
    /// at a time. Per container, the worst body measured (glibc's `mallinfo2`, a release
    /// build): 829 bytes for tool inputs of 100,000 one-key objects (each a map node held
    /// parsed in its message); 501 for 100,000 one-letter messages; 705 for tool arguments
    /// that are JSON in strings (counted as containers, see [`crate::json_shape`]); 275 for
    /// a real-shaped tool loop of 12,000 messages. Per byte, three copies at most: the body
    /// and the messages' text (as sent and as read) while it is read, then the messages and
    /// the request sent on. A Claude Code message (1,163 bytes and 3.6 containers on average
    /// in `../shared/transcripts`) is charged 6.5 KB: the budget holds about 20,000 of them.
    pub(crate) const PROXY: Costs = Costs {
        container: 832,
        byte: 3,
        max_containers: None,
    };

    /// What a body of `bytes` holding `containers` costs.
    pub(crate) fn of(self, bytes: usize, containers: usize) -> usize {
        bytes
            .saturating_mul(self.byte)
            .saturating_add(containers.saturating_mul(self.container))
    }
}
/// What a compaction costs per message it loads, and per token of their text (four bytes a
/// token, held as parts, in the prompt and in the plan).
pub(crate) const COMPACTION_MESSAGE_COST: usize = 1024;
pub(crate) const COMPACTION_TOKEN_COST: usize = 12;

/// The daemon's two budgets.
#[derive(Debug, Clone)]
pub struct Memory {
    pub requests: Budget,
    pub compactions: Budget,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory {
            requests: Budget::new(REQUEST_BUDGET),
            compactions: Budget::new(COMPACTION_BUDGET),
        }
    }
}

impl Memory {
    /// What each budget holds now, for `/health`.
    pub fn status(&self) -> crate::protocol::MemoryStatus {
        crate::protocol::MemoryStatus {
            requests_bytes: self.requests.bytes() - self.requests.available(),
            request_budget_bytes: self.requests.bytes(),
            compactions_bytes: self.compactions.bytes() - self.compactions.available(),
            compaction_budget_bytes: self.compactions.bytes(),
        }
    }
}

/// A number of bytes that may be held at once, in KiB permits.
#[derive(Debug, Clone)]
pub struct Budget {
    permits: Arc<Semaphore>,
    kib: usize,
}

/// Bytes taken from a budget, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    permit: OwnedSemaphorePermit,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let kib = bytes.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS);
        Budget {
            permits: Arc::new(Semaphore::new(kib)),
            kib,
        }
    }

    /// The whole budget, in bytes.
    pub fn bytes(&self) -> usize {
        self.kib * 1024
    }

    /// KiB permits for `bytes`: at least one, at most the whole budget (a charge larger than
    /// the budget waits until it can have all of it, and then runs alone).
    fn permits_for(&self, bytes: usize) -> u32 {
        bytes.div_ceil(1024).clamp(1, self.kib) as u32
    }

    /// Takes `bytes`, waiting at most `wait` (`None`: as long as it takes).
    pub async fn take(&self, bytes: usize, wait: Option<Duration>) -> Option<Charge> {
        let acquire = self
            .permits
            .clone()
            .acquire_many_owned(self.permits_for(bytes));
        let permit = match wait {
            Some(wait) => tokio::time::timeout(wait, acquire).await.ok()?.ok()?,
            None => acquire.await.ok()?,
        };
        Some(Charge { permit })
    }

    /// Adds `bytes` to `charge`, waiting at most `wait`; false if there was no room. The
    /// charge never grows past the whole budget.
    pub async fn extend(&self, charge: &mut Charge, bytes: usize, wait: Duration) -> bool {
        let room = self.kib.saturating_sub(charge.permit.num_permits());
        if room == 0 || bytes == 0 {
            return true;
        }
        let more = self.permits_for(bytes).min(room as u32);
        match tokio::time::timeout(wait, self.permits.clone().acquire_many_owned(more)).await {
            Ok(Ok(permit)) => {
                charge.permit.merge(permit);
                true
            }
            _ => false,
        }
    }

    /// Adds `bytes` to `charge` if there is room now.
    pub fn try_extend(&self, charge: &mut Charge, bytes: usize) -> bool {
        match self
            .permits
            .clone()
            .try_acquire_many_owned(self.permits_for(bytes))
        {
            Ok(permit) => {
                charge.permit.merge(permit);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `bytes` if there is room now.
    pub fn try_take(&self, bytes: usize) -> Option<Charge> {
        self.permits
            .clone()
            .try_acquire_many_owned(self.permits_for(bytes))
            .ok()
            .map(|permit| Charge { permit })
    }

    /// Bytes not charged to anything now.
    pub fn available(&self) -> usize {
        self.permits.available_permits() * 1024
    }
}

impl Charge {
    /// The bytes this charge holds.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits() * 1024
    }
}

/// A charge at least this large hands the memory freed with it back to the system.
const RETURN_AFTER: usize = 8 << 20;

impl Drop for Charge {
    /// glibc keeps what a large request freed in its heap (only the top of a heap goes back
    /// by itself), so one large body after another stacked up resident memory past what the
    /// budgets allow at once: `compactd torture` peaked anywhere from 300 to 440 MB on the
    /// same build. After a large charge, the freed pages go back (`malloc_trim`, which walks
    /// the heap: only after requests of 8 MiB or more).
    fn drop(&mut self) {
        if self.bytes() >= RETURN_AFTER {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free heap pages to the system.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn charges_share_one_budget_and_give_it_back() {
        let budget = Budget::new(10 * 1024);
        let mut a = budget.take(6 * 1024, None).await.unwrap();
        assert!(budget.try_take(5 * 1024).is_none(), "only 4 KiB left");
        assert!(budget.try_extend(&mut a, 4 * 1024));
        assert_eq!(budget.available(), 0);
        let waited = budget
            .take(1024, Some(Duration::from_millis(20)))
            .await
            .is_none();
        assert!(waited, "a full budget makes a request wait, then give up");
        drop(a);
        assert_eq!(budget.available(), 10 * 1024);
        // A charge larger than the budget takes all of it and runs alone.
        let all = budget.take(1 << 30, None).await.unwrap();
        assert_eq!(all.bytes(), 10 * 1024);
    }
}
