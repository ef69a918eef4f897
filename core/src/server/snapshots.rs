//! When a server snapshots its state: Nomad's (hashicorp/raft's) policy, not openraft's.
//!
//! openraft's `LogsSinceLast(n)` snapshots as soon as `n` entries were applied since the last
//! one. A snapshot encodes the whole state, seconds of CPU at a million allocations, so at a
//! high write rate on a large state that policy keeps a core busy encoding (every ~4 s at
//! 2,000 writes/s) and every write waits for CPU meanwhile. hashicorp/raft instead looks every
//! `snapshot_interval`, staggered at random up to twice that so servers do not snapshot
//! together, and snapshots only when `snapshot_threshold` entries have been applied since the
//! last: the cost is bounded by time as well as by entries.
//!
//! The policy is a timer and two decisions: when to look (the driver answers with the log's
//! progress) and whether what it reports calls for a snapshot (the driver takes it).

use core::time::Duration;

use rand_010::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::time::Instant;

#[derive(Debug)]
pub struct SnapshotPolicy {
    interval: Duration,
    threshold: u64,
    next_look: Instant,
    /// Its own generator (seeded from the server's seed), so the stagger draws leave the
    /// election timer's sequence as it was.
    rng: ChaCha8Rng,
}

impl SnapshotPolicy {
    pub fn new(now: Instant, interval: Duration, threshold: u64, seed: u64) -> Self {
        let mut policy = SnapshotPolicy {
            interval,
            threshold,
            next_look: now,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_5a95_0000_0001),
        };
        policy.schedule(now);
        policy
    }

    /// The next look: `interval` from now, plus a stagger of up to `interval`.
    fn schedule(&mut self, now: Instant) {
        let span = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX).max(1);
        let stagger = self.rng.random::<u64>() % span;
        self.next_look = now + self.interval + Duration::from_millis(stagger);
    }

    pub fn poll_timeout(&self) -> Instant {
        self.next_look
    }

    /// Whether a look is due now (then the next one is scheduled): the driver is asked for
    /// the log's progress.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        if now < self.next_look {
            return false;
        }
        self.schedule(now);
        true
    }

    /// The log's progress as the driver read it: a snapshot when at least `threshold`
    /// entries were applied since the last one.
    pub fn wants_snapshot(&self, applied: u64, snapshot: u64) -> bool {
        applied.saturating_sub(snapshot) >= self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn looks_every_interval_staggered_up_to_twice_it_and_snapshots_past_the_threshold() {
        let interval = Duration::from_secs(120);
        let mut policy = SnapshotPolicy::new(Instant::ZERO, interval, 8_192, 7);
        let mut now = Instant::ZERO;
        let mut gaps = Vec::new();
        for _ in 0..50 {
            let next = policy.poll_timeout();
            assert!(!policy.handle_timeout(now), "not due before its time");
            gaps.push(next.saturating_duration_since(now));
            now = next;
            assert!(policy.handle_timeout(now));
        }
        assert!(
            gaps.iter().all(|gap| *gap >= interval && *gap < interval * 2),
            "{gaps:?}"
        );
        assert!(gaps.iter().any(|gap| *gap != gaps[0]), "staggered");
        assert!(!policy.wants_snapshot(8_191, 0));
        assert!(policy.wants_snapshot(10_000, 1_808));
        assert!(!policy.wants_snapshot(5, 10), "a snapshot ahead of the applied index");
    }
}
