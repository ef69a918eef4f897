//! The scheduler's queues, kept as indexes of the state so the leader's worker, which runs on
//! every input of the leader's core, costs what is queued rather than what is stored (issue 19
//! §4: scanning every allocation and evaluation per input held acknowledged writes at 42/s
//! with 100,000 allocations in the state).
//!
//! - pending evaluations by (create index, id): the oldest is scheduled next;
//! - blocked evaluations (the `blocked_evals_by_job` index, all jobs);
//! - failed allocations that still want to run: the reschedule tracker's candidates;
//! - nodes with a drain strategy: the drainer's.
//!
//! Derived from the tables like the other indexes, so never in a snapshot.

#[allow(unused_imports)]
use crate::prelude::*;

use super::ServerState;
use crate::structs::{Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Node};

impl ServerState {
    /// Files `eval` (already indexed by job) in the pending queue or out of it. The create
    /// index never changes once stored, so the key of an update is that of the original.
    pub(super) fn queue_eval(&mut self, eval: &Evaluation) {
        let key = (eval.create_index, eval.id.clone());
        if eval.status == EvalStatus::Pending {
            self.pending_evals.insert(key, ());
        } else {
            self.pending_evals.delete(&key);
        }
    }

    /// Files `alloc` (as stored now) among the failed allocations that want to run, or out.
    pub(super) fn queue_failed_alloc(&mut self, alloc: &Allocation) {
        if alloc.client_status == ClientStatus::Failed && alloc.desired_status == DesiredStatus::Run {
            self.failed_allocs.insert(alloc.id.clone(), ());
        } else {
            self.failed_allocs.delete(&alloc.id);
        }
    }

    /// Files the node `node_id` (as stored now, or gone) among the draining nodes, or out.
    pub(super) fn queue_draining_node(&mut self, node_id: &str) {
        if self
            .nodes
            .get(node_id)
            .is_some_and(|node| node.drain_strategy.is_some())
        {
            self.draining_nodes.insert(node_id.to_string(), ());
        } else {
            self.draining_nodes.delete(node_id);
        }
    }

    /// Nodes with a drain strategy, by id.
    pub fn draining_nodes(&self) -> impl Iterator<Item = &Node> {
        self.draining_nodes.keys().filter_map(|id| self.nodes.get(id))
    }

    /// Pending evaluations, oldest (lowest create index, then id) first.
    pub fn pending_evals(&self) -> impl Iterator<Item = &Evaluation> {
        self.pending_evals.keys().filter_map(|(_, id)| self.evals.get(id))
    }

    /// Blocked evaluations of every job, by (namespace, job, id).
    pub fn blocked_evals(&self) -> impl Iterator<Item = &Evaluation> {
        self.blocked_evals_by_job
            .keys()
            .filter_map(|(_, _, id)| self.evals.get(id))
    }

    /// The blocked evaluations scheduled on a state older than `index` (their snapshot index
    /// is lower), by snapshot index and id.
    pub fn blocked_evals_before(&self, index: u64) -> impl Iterator<Item = &Evaluation> {
        self.blocked_evals_by_snapshot
            .range(..(index, String::new()))
            .filter_map(|((_, id), _)| self.evals.get(id))
    }

    /// Allocations their client reported failed whose desired status is still run, by id.
    pub fn failed_allocs(&self) -> impl Iterator<Item = &Allocation> {
        self.failed_allocs.keys().filter_map(|id| self.allocs.get(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::Command;
    use crate::structs::EvalStatus;
    use rand_010::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The queues always hold exactly what a scan of the tables finds, through random
    /// evaluation, allocation and drain updates and a snapshot round trip.
    #[test]
    fn the_queues_match_a_scan_of_the_tables() {
        let mut fixture = crate::fsm::csi::tests::Fixture::new();
        let mut rng = ChaCha8Rng::seed_from_u64(19);
        let statuses = [EvalStatus::Pending, EvalStatus::Blocked, EvalStatus::Complete];
        let clients = [
            ClientStatus::Pending,
            ClientStatus::Running,
            ClientStatus::Failed,
            ClientStatus::Complete,
        ];
        let desired = [DesiredStatus::Run, DesiredStatus::Stop];
        for n in ["n1", "n2"] {
            fixture.ok(Command::NodeRegister {
                node: crate::structs::Node {
                    id: n.into(),
                    ..Default::default()
                },
            });
        }
        for _ in 0..300 {
            if rng.random_bool(0.2) {
                let node_id = ["n1", "n2"][rng.random_range(0..2)].to_string();
                let strategy = rng.random_bool(0.5).then(crate::structs::DrainStrategy::default);
                fixture.ok(Command::NodeUpdateDrain {
                    node_id,
                    strategy,
                    mark_eligible: false,
                    complete: false,
                });
            } else if rng.random_bool(0.5) {
                let n = rng.random_range(0..20);
                let eval = Evaluation {
                    id: format!("e{n}"),
                    namespace: "default".into(),
                    job_id: format!("j{}", n % 3),
                    status: statuses[rng.random_range(0..statuses.len())],
                    ..Evaluation::default()
                };
                fixture.ok(Command::EvalUpsert { evals: vec![eval] });
            } else {
                let mut alloc = crate::fsm::csi::tests::alloc(&format!("a{}", rng.random_range(0..20)), "n1");
                alloc.client_status = clients[rng.random_range(0..clients.len())];
                alloc.desired_status = desired[rng.random_range(0..desired.len())];
                fixture.ok(Command::AllocUpsert {
                    allocs: vec![alloc.clone()],
                });
                if rng.random_bool(0.5) {
                    fixture.ok(Command::AllocClientUpdate {
                        alloc_id: alloc.id,
                        client_status: clients[rng.random_range(0..clients.len())],
                    });
                }
            }
            check(&fixture.state);
        }
        let restored = ServerState::restore(&fixture.state.snapshot()).unwrap();
        check(&restored);
        assert_eq!(restored, fixture.state);
    }

    fn check(state: &ServerState) {
        let mut pending: Vec<&Evaluation> = state
            .evals()
            .filter(|eval| eval.status == EvalStatus::Pending)
            .collect();
        pending.sort_by_key(|eval| (eval.create_index, eval.id.clone()));
        let queued: Vec<&Evaluation> = state.pending_evals().collect();
        assert_eq!(queued, pending);
        let mut blocked: Vec<&str> = state
            .evals()
            .filter(|eval| eval.status == EvalStatus::Blocked)
            .map(|eval| eval.id.as_str())
            .collect();
        let mut queued: Vec<&str> = state.blocked_evals().map(|eval| eval.id.as_str()).collect();
        blocked.sort();
        queued.sort();
        assert_eq!(queued, blocked);
        let failed: Vec<&Allocation> = state
            .allocs()
            .filter(|alloc| alloc.client_status == ClientStatus::Failed && alloc.desired_status == DesiredStatus::Run)
            .collect();
        assert_eq!(state.failed_allocs().collect::<Vec<_>>(), failed);
        let draining: Vec<&Node> = state.nodes().filter(|node| node.drain_strategy.is_some()).collect();
        assert_eq!(state.draining_nodes().collect::<Vec<_>>(), draining);
    }
}
