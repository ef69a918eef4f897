//! Garbage collection of the state store, as an operator forces it (Nomad's
//! `System.GarbageCollect`: every core GC job at once, with no age threshold). What may go,
//! decided by the same predicates when the leader picks it and again when the entry applies,
//! so nothing that came back to life in between is lost:
//! - an allocation the servers stopped and its client finished — but not a batch allocation
//!   that completed at its live job's current version (it is what keeps the job done);
//! - a finished evaluation (complete, failed, canceled) none of whose allocations remain;
//! - a stopped job with no allocation left and no evaluation waiting;
//! - a finished deployment no remaining allocation belongs to, unless it is its job's latest;
//! - a down node with no allocation left.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::fsm::ServerState;
use crate::structs::{
    Allocation, ClientStatus, Deployment, EVAL_BLOCKED, EVAL_PENDING, Evaluation, JobType, Node, NodeStatus,
};

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
    if !alloc.server_terminal() || !alloc.client_terminal() {
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
    eval.status != EVAL_PENDING && eval.status != EVAL_BLOCKED && !allocs_remain
}

pub fn job_collectable(state: &ServerState, namespace: &str, job_id: &str, allocs_remain: bool) -> bool {
    state.job(namespace, job_id).is_some_and(|job| job.stop)
        && !allocs_remain
        && !state
            .job_evals(namespace, job_id)
            .any(|eval| eval.status == EVAL_PENDING || eval.status == EVAL_BLOCKED)
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

/// Everything a forced GC would remove from `state` now.
pub fn collect(state: &ServerState) -> Garbage {
    let allocs: Vec<&Allocation> = state.allocs().filter(|alloc| alloc_collectable(state, alloc)).collect();
    let gone: alloc::collections::BTreeSet<&str> = allocs.iter().map(|alloc| alloc.id.as_str()).collect();
    let remaining = |alloc: &&Allocation| !gone.contains(alloc.id.as_str());
    let evals = state
        .evals()
        .filter(|eval| {
            let remain = state
                .job_allocs(&eval.namespace, &eval.job_id)
                .filter(remaining)
                .any(|alloc| alloc.eval_id == eval.id);
            eval_collectable(eval, remain)
        })
        .map(|eval| eval.id.clone())
        .collect();
    let jobs = state
        .jobs()
        .filter(|job| {
            let remain = state.job_allocs(&job.namespace, &job.id).any(|alloc| remaining(&alloc));
            job_collectable(state, &job.namespace, &job.id, remain)
        })
        .map(|job| (job.namespace.clone(), job.id.clone()))
        .collect();
    let deployments = state
        .deployments()
        .filter(|deployment| {
            let remain = state
                .job_allocs(&deployment.namespace, &deployment.job_id)
                .filter(remaining)
                .any(|alloc| alloc.deployment_id == deployment.id);
            deployment_collectable(state, deployment, remain)
        })
        .map(|deployment| deployment.id.clone())
        .collect();
    let nodes = state
        .nodes()
        .filter(|node| node_collectable(node, state.allocs_on_node(&node.id).any(|alloc| remaining(&alloc))))
        .map(|node| node.id.clone())
        .collect();
    Garbage {
        allocs: allocs.into_iter().map(|alloc| alloc.id.clone()).collect(),
        evals,
        jobs,
        deployments,
        nodes,
    }
}
