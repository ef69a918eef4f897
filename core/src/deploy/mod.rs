//! Deployments on the leader (Nomad's `nomad/deploymentwatcher/`): the watcher that moves a
//! rollout along — evaluations as allocations turn healthy, failure on an unhealthy allocation
//! or a missed progress deadline, the rollback `auto_revert` asks for, automatic promotion —
//! and the pieces operators' requests share with it (`rollback`, `eval`).
//!
//! The scheduler (`scheduler/rollout.rs`) decides what each step of a rollout places; the
//! state store (`fsm/deployments.rs`) counts what was placed and what turned healthy.

pub mod watcher;

#[allow(unused_imports)]
use crate::prelude::*;

use crate::fsm::ServerState;
use crate::structs::{
    Deployment, DeploymentStatusUpdate, EvalStatus, Evaluation, Job, no_rollback_description, rollback_description,
};

/// A pending evaluation of the deployment's job.
pub fn eval(deployment: &Deployment, job: Option<&Job>, id: String) -> Evaluation {
    Evaluation {
        id,
        namespace: deployment.namespace.clone(),
        priority: job.map_or(deployment.eval_priority, |job| job.priority),
        eval_type: job.map_or(crate::structs::JobType::Service, |job| job.job_type),
        triggered_by: crate::structs::EvalTrigger::DeploymentWatcher,
        job_id: deployment.job_id.clone(),
        job_modify_index: job.map_or(0, |job| job.job_modify_index),
        status: EvalStatus::Pending,
        ..Evaluation::default()
    }
}

/// The failure of `deployment` with `base` as its reason and, when `auto_revert` (or an
/// operator's fail of a deployment whose groups ask for it) calls for it, the job to roll back
/// to: the newest stable version before the deployment's, registered again as a new version.
/// A stable version with the current spec is not rolled back to (Nomad's texts say so).
pub fn fail(state: &ServerState, deployment: &Deployment, base: &str) -> (DeploymentStatusUpdate, Option<Job>) {
    let revert = deployment.task_groups.values().any(|group| group.auto_revert);
    let mut description = base.to_string();
    let mut rollback = None;
    if revert && let Some(stable) = latest_stable(state, deployment) {
        let current = state.job(&deployment.namespace, &deployment.job_id);
        if current.is_some_and(|current| crate::fsm::same_spec(current, stable)) {
            description = no_rollback_description(base, stable.version);
        } else {
            description = rollback_description(base, stable.version);
            rollback = Some(stable.clone());
        }
    }
    let update = DeploymentStatusUpdate {
        deployment_id: deployment.id.clone(),
        status: crate::structs::DeploymentStatus::Failed,
        status_description: description,
    };
    (update, rollback)
}

/// The newest stable version of the deployment's job older than the deployment's.
fn latest_stable<'a>(state: &'a ServerState, deployment: &Deployment) -> Option<&'a Job> {
    state
        .job_versions(&deployment.namespace, &deployment.job_id)
        .into_iter()
        .find(|job| job.stable && job.version < deployment.job_version)
}
