//! A forced garbage collection applied (`Command::SystemGc`): each thing the leader picked
//! goes only if it is still collectable in the state the entry applies to (`crate::gc`), and
//! `ReconcileSummaries` rebuilds every job summary from the allocations.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::structs::{Allocation, ClientStatus, Deployment, EvalStatus, Evaluation, JobType, Node, NodeStatus};

/// What a forced GC removes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Garbage {
    pub allocs: Vec<String>,
    pub evals: Vec<String>,
    /// (namespace, job id)
    pub jobs: Vec<(String, String)>,
    pub deployments: Vec<String>,
    pub nodes: Vec<String>,
}

impl Garbage {
    pub fn is_empty(&self) -> bool {
        self.allocs.is_empty()
            && self.evals.is_empty()
            && self.jobs.is_empty()
            && self.deployments.is_empty()
            && self.nodes.is_empty()
    }
}

pub fn alloc_collectable(state: &ServerState, alloc: &Allocation) -> bool {
    if !alloc.client_terminal() {
        return false;
    }
    // Its job is purged or stopped: nothing will run it again or reschedule from it, even if
    // the servers never marked it stopped — a batch allocation that completed before its job
    // was stopped keeps `desired: run` for good, and was never collected (issue 54 §8; Nomad's
    // `allocGCEligible`).
    if state.job(&alloc.namespace, &alloc.job_id).is_none_or(|job| job.stop) {
        return true;
    }
    if !alloc.server_terminal() {
        return false;
    }
    let keeps_batch_done = state.job(&alloc.namespace, &alloc.job_id).is_some_and(|job| {
        job.job_type == JobType::Batch
            && !job.stop
            && alloc.client_status == ClientStatus::Complete
            && alloc.job_version == job.version
    });
    !keeps_batch_done
}

/// `allocs_remain`: whether an allocation of the evaluation stays.
pub fn eval_collectable(eval: &Evaluation, allocs_remain: bool) -> bool {
    eval.status != EvalStatus::Pending && eval.status != EvalStatus::Blocked && !allocs_remain
}

pub fn job_collectable(state: &ServerState, namespace: &str, job_id: &str, allocs_remain: bool) -> bool {
    state.job(namespace, job_id).is_some_and(|job| job.stop)
        && !allocs_remain
        && !state
            .job_evals(namespace, job_id)
            .any(|eval| eval.status == EvalStatus::Pending || eval.status == EvalStatus::Blocked)
}

pub fn deployment_collectable(state: &ServerState, deployment: &Deployment, allocs_remain: bool) -> bool {
    let latest = state
        .latest_deployment(&deployment.namespace, &deployment.job_id)
        .is_some_and(|latest| latest.id == deployment.id);
    let job_kept = state.job(&deployment.namespace, &deployment.job_id).is_some();
    let shown_by_its_job = latest && job_kept;
    !(deployment.active() || allocs_remain || shown_by_its_job)
}

pub fn node_collectable(node: &Node, allocs_remain: bool) -> bool {
    node.status == NodeStatus::Down && !allocs_remain
}

impl ServerState {
    pub(super) fn apply_gc(&mut self, index: u64, at_ms: u64, garbage: &Garbage) -> Response {
        let allocs: Vec<String> = garbage
            .allocs
            .iter()
            .filter(|id| self.alloc(id).is_some_and(|alloc| alloc_collectable(self, alloc)))
            .cloned()
            .collect();
        if !allocs.is_empty() {
            self.apply_alloc(index, at_ms, &Command::AllocDelete { alloc_ids: allocs });
        }
        for id in &garbage.evals {
            let Some(eval) = self.evals.get(id).cloned() else {
                continue;
            };
            let remain = self
                .job_allocs(&eval.namespace, &eval.job_id)
                .any(|alloc| alloc.eval_id == eval.id);
            if eval_collectable(&eval, remain) {
                let key = (eval.namespace.clone(), eval.job_id.clone(), eval.id.clone());
                self.evals.delete(id);
                self.evals_by_job.delete(&key);
                self.blocked_evals_by_job.delete(&key);
                self.blocked_evals_by_snapshot
                    .delete(&(eval.snapshot_index, eval.id.clone()));
                self.pending_evals.delete(&(eval.create_index, eval.id.clone()));
                self.touch(Table::Evals, index);
            }
        }
        for (namespace, job_id) in &garbage.jobs {
            let remain = self.job_allocs(namespace, job_id).next().is_some();
            if job_collectable(self, namespace, job_id, remain) {
                self.purge_job(namespace, job_id);
                self.touch(Table::Jobs, index);
                self.recompute_job_plugins(index, at_ms, &(namespace.clone(), job_id.clone()));
            }
        }
        for id in &garbage.deployments {
            let Some(deployment) = self.deployments.get(id).cloned() else {
                continue;
            };
            let remain = self
                .job_allocs(&deployment.namespace, &deployment.job_id)
                .any(|alloc| alloc.deployment_id == deployment.id);
            if deployment_collectable(self, &deployment, remain) {
                self.deployments.delete(id);
                self.deployments_by_job.delete(&(
                    deployment.namespace.clone(),
                    deployment.job_id.clone(),
                    deployment.id.clone(),
                ));
                self.unindex_active_deployment(id);
                self.touch(Table::Deployments, index);
            }
        }
        for node_id in &garbage.nodes {
            let collectable = self
                .node(node_id)
                .is_some_and(|node| node_collectable(node, self.allocs_on_node(node_id).next().is_some()));
            if collectable {
                self.apply_cluster(
                    index,
                    at_ms,
                    &Command::NodeDeregister {
                        node_id: node_id.clone(),
                    },
                );
            }
        }
        Response::Done
    }

    pub(super) fn reconcile_summaries(&mut self, index: u64) -> Response {
        let jobs: Vec<(String, String)> = self.jobs().map(|job| (job.namespace.clone(), job.id.clone())).collect();
        for (namespace, job_id) in jobs {
            self.rebuild_summary(&namespace, &job_id);
        }
        self.touch(Table::Jobs, index);
        Response::Done
    }
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)]
    use crate::prelude::*;

    use crate::fsm::Command;
    use crate::fsm::csi::tests::Fixture;
    use crate::structs::{
        Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, NodeStatus,
    };

    fn job(id: &str, job_type: JobType) -> Job {
        Job {
            id: id.into(),
            namespace: "default".into(),
            job_type,
            ..Job::default()
        }
    }

    fn alloc(id: &str, job: &str, eval: &str, desired: DesiredStatus, client: ClientStatus) -> Allocation {
        Allocation {
            id: id.into(),
            namespace: "default".into(),
            job_id: job.into(),
            eval_id: eval.into(),
            node_id: "n1".into(),
            desired_status: desired,
            client_status: client,
            ..Allocation::default()
        }
    }

    fn eval(id: &str, job: &str) -> Evaluation {
        Evaluation {
            id: id.into(),
            namespace: "default".into(),
            job_id: job.into(),
            status: EvalStatus::Complete,
            ..Evaluation::default()
        }
    }

    #[test]
    fn a_forced_gc_takes_what_is_finished_and_keeps_what_still_matters() {
        let mut fx = Fixture::new();
        fx.ok(Command::NodeRegister {
            node: Node {
                id: "n1".into(),
                status: NodeStatus::Ready,
                ..Node::default()
            },
        });
        fx.ok(Command::NodeRegister {
            node: Node {
                id: "gone".into(),
                status: NodeStatus::Down,
                ..Node::default()
            },
        });
        let mut stopped = job("old", JobType::Service);
        stopped.stop = true;
        for job in [stopped, job("web", JobType::Service), job("batch", JobType::Batch)] {
            fx.ok(Command::JobUpsert { job });
        }
        fx.ok(Command::EvalUpsert {
            evals: vec![eval("e-old", "old"), eval("e-web", "web"), eval("e-batch", "batch")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![
                alloc("a-old", "old", "e-old", DesiredStatus::Stop, ClientStatus::Complete),
                alloc(
                    "a-web-done",
                    "web",
                    "e-web",
                    DesiredStatus::Stop,
                    ClientStatus::Complete,
                ),
                alloc("a-web-live", "web", "e-web", DesiredStatus::Run, ClientStatus::Running),
                alloc("a-web-failed", "web", "e-web", DesiredStatus::Run, ClientStatus::Failed),
                alloc(
                    "a-batch",
                    "batch",
                    "e-batch",
                    DesiredStatus::Stop,
                    ClientStatus::Complete,
                ),
            ],
        });
        let garbage = crate::gc::collect(&fx.state);
        assert_eq!(garbage.allocs, vec!["a-old".to_string(), "a-web-done".to_string()]);
        assert_eq!(
            garbage.evals,
            vec!["e-old".to_string()],
            "e-web and e-batch keep allocations"
        );
        assert_eq!(garbage.jobs, vec![("default".to_string(), "old".to_string())]);
        assert_eq!(garbage.nodes, vec!["gone".to_string()]);
        // Between the pick and the apply, the stopped job is registered again: it stays.
        let mut again = job("old", JobType::Service);
        again.stop = false;
        fx.ok(Command::JobUpsert { job: again });
        fx.ok(Command::SystemGc { garbage });
        let state = &fx.state;
        assert!(state.alloc("a-old").is_none() && state.alloc("a-web-done").is_none());
        assert!(state.alloc("a-web-live").is_some() && state.alloc("a-web-failed").is_some());
        assert!(
            state.alloc("a-batch").is_some(),
            "a completed batch allocation keeps its job done"
        );
        assert!(state.eval("e-old").is_none() && state.eval("e-web").is_some());
        assert!(state.job("default", "old").is_some(), "registered again since the pick");
        assert!(state.node("gone").is_none() && state.node("n1").is_some());
        assert_eq!(state.job_evals("default", "old").count(), 0);
    }

    /// A batch job's allocations complete (the servers leave them `desired: run`), then the
    /// job is stopped, or purged: a forced GC takes them, their evaluation and the stopped job.
    #[test]
    fn finished_batch_allocations_of_a_stopped_or_purged_job_are_collected() {
        let mut fx = Fixture::new();
        let mut stopped = job("stopped", JobType::Batch);
        fx.ok(Command::JobUpsert { job: stopped.clone() });
        fx.ok(Command::JobUpsert {
            job: job("purged", JobType::Batch),
        });
        fx.ok(Command::EvalUpsert {
            evals: vec![eval("e-stopped", "stopped"), eval("e-purged", "purged")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![
                alloc(
                    "a-stopped",
                    "stopped",
                    "e-stopped",
                    DesiredStatus::Run,
                    ClientStatus::Complete,
                ),
                alloc(
                    "a-purged",
                    "purged",
                    "e-purged",
                    DesiredStatus::Run,
                    ClientStatus::Complete,
                ),
            ],
        });
        assert!(
            crate::gc::collect(&fx.state).allocs.is_empty(),
            "while the jobs live, their completed allocations keep them done"
        );
        stopped.stop = true;
        fx.ok(Command::JobUpsert { job: stopped });
        fx.ok(Command::JobDeregister {
            namespace: "default".into(),
            job_id: "purged".into(),
        });
        let garbage = crate::gc::collect(&fx.state);
        assert_eq!(garbage.allocs, ["a-purged", "a-stopped"]);
        assert_eq!(garbage.evals, ["e-purged", "e-stopped"]);
        assert_eq!(garbage.jobs, [("default".to_string(), "stopped".to_string())]);
        fx.ok(Command::SystemGc { garbage });
        assert_eq!(fx.state.allocs().count(), 0);
        assert_eq!(fx.state.evals().count(), 0);
        assert!(fx.state.job("default", "stopped").is_none());
    }
}
