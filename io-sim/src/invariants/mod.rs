//! Safety invariants, checked after every recorded event; one file per invariant.
//! Liveness is checked by the scenario runner after the fault phase ([`liveness`]).

pub mod claims_freed;
pub mod containers;
pub mod controller_serial;
pub mod created_volumes;
pub mod csi_call_order;
pub mod direct_writes;
pub mod drain_order;
pub mod elections;
pub mod leader_per_term;
pub mod linearizable;
pub mod liveness;
pub mod log_matching;
pub mod no_rebootstrap;
pub mod one_vote;
pub mod periodic;
pub mod rollout;
pub mod single_cluster;
pub mod state_equal;
pub mod task_processes;
pub mod writers;

use crate::trace::SimEvent;

/// A property every event must preserve. `observe` returns a description of the violation.
pub trait Invariant: Send {
    fn name(&self) -> &'static str;
    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String>;

    /// Whether `event` is one this invariant evaluates (counted as a check in the coverage
    /// table; every other event only passes by).
    fn checks(&self, event: &SimEvent) -> bool;

    /// `observe`, for invariants that need the event's virtual time (since the run began).
    fn observe_at(&mut self, _at: std::time::Duration, node: &str, event: &SimEvent) -> Result<(), String> {
        self.observe(node, event)
    }
}

/// Every safety invariant, fresh for one run.
pub fn all() -> Vec<Box<dyn Invariant>> {
    vec![
        Box::new(leader_per_term::LeaderPerTerm::default()),
        Box::new(one_vote::OneVote::default()),
        Box::new(single_cluster::SingleCluster::default()),
        Box::new(no_rebootstrap::NoRebootstrap::default()),
        Box::new(log_matching::LogMatching::default()),
        Box::new(writers::Writers),
        Box::new(direct_writes::DirectWrites),
        Box::new(csi_call_order::CsiCallOrder::default()),
        Box::new(controller_serial::ControllerSerial::default()),
        Box::new(drain_order::DrainOrder),
        Box::new(rollout::Rollout),
        Box::new(periodic::PeriodicLaunches::default()),
        Box::new(task_processes::TaskProcesses::default()),
        Box::new(containers::ContainersRunning::default()),
    ]
}
