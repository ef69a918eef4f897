//! BUGGIFY (FoundationDB's name for it): named points in the drivers where, under simulation,
//! a seed may make something rare happen on purpose — a retryable error from a call that
//! would have succeeded, a reply that takes its time — so the code paths that handle them run
//! in ordinary seeds, not only on a bad day in production.
//!
//! In production [`fires`] is a constant `false` the compiler removes. Under `--cfg madsim`
//! each simulated run (one thread) says which points are on and how often they fire
//! ([`enable`]); a point that is off draws nothing from the simulator's generator, so runs
//! without BUGGIFY replay exactly as before it existed. What fired is counted per run for the
//! coverage table ([`fired`]).

/// Every injection point, with what firing it does.
pub const POINTS: &[(&str, &str)] = &[
    (
        CLIENT_RPC_UNREACHABLE,
        "a client-to-server call fails as if no server answered, before it is sent",
    ),
    (
        CSI_UNAVAILABLE,
        "a node plugin call fails UNAVAILABLE before it reaches the plugin",
    ),
    (CSI_SLOW, "a node plugin call waits 0.2–2 s before it is made"),
    (RAFT_SLOW, "a Raft message to a peer waits 20–400 ms before it is sent"),
    (
        RECOVER_FAILS,
        "reattaching to a running task after an agent restart fails, the process still alive",
    ),
];

pub const CLIENT_RPC_UNREACHABLE: &str = "client rpc unreachable";
pub const CSI_UNAVAILABLE: &str = "csi call unavailable";
pub const CSI_SLOW: &str = "csi call slow";
pub const RAFT_SLOW: &str = "raft message slow";
pub const RECOVER_FAILS: &str = "task recover fails";
/// Reattaching to a running task after an agent restart waits 0.5–3 s: what the servers say
/// meanwhile (the allocation stopped) reaches a runner still restoring. Not among [`POINTS`]
/// (the swarm's draw over them stays as it was): `client_churn` turns it on.
pub const RECOVER_SLOW: &str = "task recover slow";

#[cfg(madsim)]
mod sim {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    thread_local! {
        /// The run's points that are on, with the chance each fires when reached.
        static ENABLED: RefCell<BTreeMap<&'static str, f64>> = const { RefCell::new(BTreeMap::new()) };
        /// How often each point fired in the run.
        static FIRED: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
    }

    pub fn enable(points: BTreeMap<&'static str, f64>) {
        ENABLED.with(|enabled| *enabled.borrow_mut() = points);
        FIRED.with(|fired| fired.borrow_mut().clear());
    }

    /// Turns every point off for the rest of the run (its liveness phase), keeping the counts.
    pub fn disable() {
        ENABLED.with(|enabled| enabled.borrow_mut().clear());
    }

    pub fn fires(point: &'static str) -> bool {
        let Some(chance) = ENABLED.with(|enabled| enabled.borrow().get(point).copied()) else {
            return false;
        };
        let fire = crate::runtime::random::<f64>() < chance;
        if fire {
            FIRED.with(|fired| *fired.borrow_mut().entry(point).or_default() += 1);
        }
        fire
    }

    pub fn fired() -> BTreeMap<&'static str, u64> {
        FIRED.with(|fired| fired.borrow().clone())
    }
}

#[cfg(madsim)]
pub use sim::{disable, enable, fired, fires};

/// Whether `point` fires here: never outside the simulation.
#[cfg(not(madsim))]
#[inline(always)]
pub fn fires(_point: &'static str) -> bool {
    false
}

/// A delay in `range` (milliseconds), drawn only when a point fired.
pub fn delay_millis(range: std::ops::Range<u64>) -> std::time::Duration {
    let span = range.end.saturating_sub(range.start).max(1);
    std::time::Duration::from_millis(range.start + crate::runtime::random::<u64>() % span)
}
