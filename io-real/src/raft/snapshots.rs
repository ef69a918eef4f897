//! When a server snapshots its state: Nomad's (hashicorp/raft's) policy, not openraft's.
//!
//! openraft's `LogsSinceLast(n)` snapshots as soon as `n` entries were applied since the last
//! one. A snapshot encodes the whole state, seconds of CPU at a million allocations, so at a
//! high write rate on a large state that policy keeps a core busy encoding (every ~4 s at
//! 2,000 writes/s) and every write waits for CPU meanwhile. hashicorp/raft instead looks every
//! `snapshot_interval`, staggered at random up to twice that so servers do not snapshot
//! together, and snapshots only when `snapshot_threshold` entries have been applied since the
//! last: the cost is bounded by time as well as by entries.

use std::time::Duration;

use super::Raft;

/// Runs until Raft shuts down: every `interval` to `2 * interval`, a snapshot when at least
/// `threshold` entries were applied since the last one.
pub async fn take_snapshots(raft: Raft, interval: Duration, threshold: u64) {
    loop {
        let stagger = crate::runtime::random::<u64>() % (interval.as_millis() as u64).max(1);
        tokio::time::sleep(interval + Duration::from_millis(stagger)).await;
        let metrics = raft.metrics().borrow().clone();
        if metrics.running_state.is_err() {
            return;
        }
        let applied = metrics.last_applied.map_or(0, |log| log.index);
        let snapshot = metrics.snapshot.map_or(0, |log| log.index);
        if applied.saturating_sub(snapshot) < threshold {
            continue;
        }
        if let Err(error) = raft.trigger().snapshot().await {
            tracing::debug!(%error, "no snapshot: Raft has stopped");
            return;
        }
    }
}
