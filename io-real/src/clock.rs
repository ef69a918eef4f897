//! The clocks the drivers read: wall time (the stamps on Raft entries, a client's wall epoch)
//! and the core's monotonic [`Instant`].
//!
//! In production these are the host's clocks. Under `--cfg madsim` every simulated node's
//! clocks can be set apart from the others, as a real fleet's are: a wall-clock offset (skew
//! between machines, or a step either way when NTP or an operator sets the time) and a
//! monotonic jump forward (a paused VM or a stopped process: when it resumes, every deadline
//! it was waiting for has passed at once). The simulation sets them per node ([`sim`]); a node
//! nobody set reads the simulator's clock unchanged, so runs without clock faults replay
//! exactly as before they existed.

use std::time::Duration;

use drover_core::time::Instant;

/// Milliseconds since the Unix epoch on this node's wall clock.
pub fn unix_millis() -> u64 {
    #[cfg(not(madsim))]
    if let Some(simulated) = crate::runtime::simulated_wall_clock_millis() {
        return simulated;
    }
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0);
    #[cfg(madsim)]
    let real = real.saturating_add_signed(sim::offsets().wall_ms);
    real
}

/// The core's `now`: time since `epoch` (the agent's start) on this node's monotonic clock.
pub fn core_now(epoch: tokio::time::Instant) -> Instant {
    let elapsed = tokio::time::Instant::now().saturating_duration_since(epoch);
    #[cfg(madsim)]
    let elapsed = elapsed + sim::offsets().monotonic;
    Instant::from_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
}

/// How far one simulated node's clocks are set apart (the simulation's per-node state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    /// Added to the wall clock (negative: behind).
    pub wall_ms: i64,
    /// How far the monotonic clock has jumped ahead, in total.
    pub monotonic: Duration,
}

#[cfg(madsim)]
pub mod sim {
    //! Per-node clock offsets of the running simulation (one per thread, as madsim runs a
    //! world on one thread), keyed by the simulator's node id.

    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::time::Duration;

    use madsim::task::NodeId;

    pub use super::Offsets;

    thread_local! {
        static OFFSETS: RefCell<BTreeMap<NodeId, Offsets>> = const { RefCell::new(BTreeMap::new()) };
    }

    /// Forgets every offset: a new run starts with every clock agreeing.
    pub fn reset() {
        OFFSETS.with(|offsets| offsets.borrow_mut().clear());
    }

    /// Sets `node`'s wall clock `ms` apart from the simulator's (skew, or a step).
    pub fn set_wall_offset(node: NodeId, ms: i64) {
        OFFSETS.with(|offsets| offsets.borrow_mut().entry(node).or_default().wall_ms = ms);
    }

    /// Moves `node`'s monotonic clock `by` ahead, for good.
    pub fn jump_monotonic(node: NodeId, by: Duration) {
        OFFSETS.with(|offsets| offsets.borrow_mut().entry(node).or_default().monotonic += by);
    }

    pub fn offsets_of(node: NodeId) -> Offsets {
        OFFSETS.with(|offsets| offsets.borrow().get(&node).copied().unwrap_or_default())
    }

    /// The offsets of the node the calling task runs on.
    pub(crate) fn offsets() -> Offsets {
        offsets_of(madsim::plugin::node())
    }
}
