//! Garbage collection of the state store: as an operator forces it (Nomad's
//! `System.GarbageCollect`: every core GC job at once, with no age threshold), and as the
//! leader runs it every few minutes for what has been finished longer than its threshold
//! ([`periodic`], Nomad's core GC jobs). What may go, decided by the same predicates when the
//! leader picks it and again when the entry applies, so nothing that came back to life in
//! between is lost:
//! - an allocation its client finished, whose job is purged or stopped or which the servers
//!   stopped — but not a batch allocation that completed at its live job's current version
//!   (it is what keeps the job done);
//! - a finished evaluation (complete, failed, canceled) none of whose allocations remain;
//! - a stopped job with no allocation left and no evaluation waiting;
//! - a finished deployment no remaining allocation belongs to, unless it is its job's latest;
//! - a down node with no allocation left.

#[allow(unused_imports)]
use crate::prelude::*;

pub mod periodic;

use core::time::Duration;

use crate::fsm::ServerState;
use crate::structs::{Allocation, Evaluation, JobType};

// What may go is decided with the state it is read from: the predicates live beside the
// state machine that checks them again when the entry applies (`fsm/gc.rs`).
pub use crate::fsm::{
    Garbage, alloc_collectable, deployment_collectable, eval_collectable, job_collectable, node_collectable,
};

pub use crate::config::GcThresholds;

/// Whether something last changed at `at_ms` (cluster time) is at least `threshold` old at
/// `now_ms`.
fn aged(at_ms: u64, threshold: Duration, now_ms: u64) -> bool {
    at_ms.saturating_add(threshold.as_millis() as u64) <= now_ms
}

/// Everything a forced GC would remove from `state` now.
pub fn collect(state: &ServerState) -> Garbage {
    collect_older(state, &GcThresholds::NONE)
}

/// What may go that has been finished at least its threshold, in cluster time (the time of
/// the last applied entry). An allocation goes with its evaluation: when the evaluation that
/// placed it is old enough, or is gone already.
pub fn collect_older(state: &ServerState, thresholds: &GcThresholds) -> Garbage {
    let now_ms = state.last_applied_time_ms();
    let eval_old = |eval: &Evaluation| {
        let threshold = if eval.eval_type == JobType::Batch {
            thresholds.batch_eval
        } else {
            thresholds.eval
        };
        aged(eval.modify_time_ms, threshold, now_ms)
    };
    let allocs: Vec<&Allocation> = state
        .allocs()
        .filter(|alloc| alloc_collectable(state, alloc))
        .filter(|alloc| state.eval(&alloc.eval_id).is_none_or(eval_old))
        .filter(|alloc| {
            let threshold = state
                .job(&alloc.namespace, &alloc.job_id)
                .filter(|job| job.job_type == JobType::Batch)
                .map_or(thresholds.eval, |_| thresholds.batch_eval);
            aged(alloc.modify_time_ms, threshold, now_ms)
        })
        .collect();
    let gone: alloc::collections::BTreeSet<&str> = allocs.iter().map(|alloc| alloc.id.as_str()).collect();
    let remaining = |alloc: &&Allocation| !gone.contains(alloc.id.as_str());
    let evals = state
        .evals()
        .filter(|eval| eval_old(eval))
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
            let last_change = state
                .job_evals(&job.namespace, &job.id)
                .map(|eval| eval.modify_time_ms)
                .max()
                .unwrap_or(0)
                .max(job.submit_time_ms);
            aged(last_change, thresholds.job, now_ms)
        })
        .filter(|job| {
            let remain = state.job_allocs(&job.namespace, &job.id).any(|alloc| remaining(&alloc));
            job_collectable(state, &job.namespace, &job.id, remain)
        })
        .map(|job| (job.namespace.clone(), job.id.clone()))
        .collect();
    let deployments = state
        .deployments()
        .filter(|deployment| aged(deployment.modify_time_ms, thresholds.deployment, now_ms))
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
        .filter(|node| aged(node.status_updated_at_ms, thresholds.node, now_ms))
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
