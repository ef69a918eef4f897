//! `Deployment.*`, `Job.Revert` and `Job.Stable` on the leader: operators' hands on a rollout.
//!
//! Each is checked against the applied state with Nomad's texts, proposed with the evaluation
//! that makes the scheduler act on it, and answered with that evaluation once applied.

#[allow(unused_imports)]
use crate::prelude::*;

use super::jobs::{JobEndpoints, JobFlow};
use super::outbox::{Outbox, Owner};
use super::{ReqId, RpcError, ServerReply};
use crate::fsm::{Command, ServerState};
use crate::structs::{
    DEPLOYMENT_DESC_FAILED_BY_USER, DEPLOYMENT_DESC_PAUSED, Deployment, DeploymentStatus, DeploymentStatusUpdate,
    Evaluation,
};

/// An operator's request about a deployment or a job's versions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DeploymentRequest {
    /// `Deployment.Promote`: every group's canaries (`groups` empty) or the named groups'.
    Promote { deployment_id: String, groups: Vec<String> },
    /// `Deployment.Pause`: pause, or resume.
    Pause { deployment_id: String, pause: bool },
    /// `Deployment.Fail`.
    Fail { deployment_id: String },
    /// `Deployment.SetAllocHealth`.
    AllocHealth {
        deployment_id: String,
        healthy: Vec<String>,
        unhealthy: Vec<String>,
    },
    /// `Job.Revert`: the job as it was at `version`, registered as a new version.
    Revert {
        namespace: String,
        job_id: String,
        version: u64,
        /// Refused unless the current version is this one.
        enforce_prior_version: Option<u64>,
    },
    /// `Job.Stable`.
    Stable {
        namespace: String,
        job_id: String,
        version: u64,
        stable: bool,
    },
}

fn invalid(text: impl Into<String>) -> RpcError {
    RpcError::invalid(text.into())
}

impl JobEndpoints {
    /// Checks and proposes an operator's deployment request; a refusal is answered at once.
    pub fn deployment_request(
        &mut self,
        req: ReqId,
        request: DeploymentRequest,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        match self.deployment_command(request, state) {
            Ok((command, namespace, job_id, eval_id)) => {
                let flow = JobFlow::Write {
                    req,
                    eval_id,
                    namespace,
                    job_id,
                };
                out.propose_new(Owner::Jobs(flow), command);
            }
            Err(error) => out.reply(req, ServerReply::Error(error)),
        }
    }

    /// The command, with the job it concerns and its evaluation's id ("" without one).
    fn deployment_command(
        &mut self,
        request: DeploymentRequest,
        state: &ServerState,
    ) -> Result<(Command, String, String, String), RpcError> {
        use DeploymentRequest as D;
        match request {
            D::Promote { deployment_id, groups } => {
                let deployment = active(state, &deployment_id, "promote")?;
                check_promotion(state, deployment, &groups)?;
                let eval = self.deployment_eval(state, deployment);
                let keys = (deployment.namespace.clone(), deployment.job_id.clone(), eval.id.clone());
                let command = Command::DeploymentPromote {
                    deployment_id,
                    groups,
                    eval,
                };
                Ok((command, keys.0, keys.1, keys.2))
            }
            D::Pause { deployment_id, pause } => {
                let deployment = active(state, &deployment_id, if pause { "pause" } else { "resume" })?;
                let keys = (deployment.namespace.clone(), deployment.job_id.clone());
                let (status, description, eval) = if pause {
                    (DeploymentStatus::Paused, DEPLOYMENT_DESC_PAUSED.to_string(), None)
                } else {
                    let eval = self.deployment_eval(state, deployment);
                    (
                        DeploymentStatus::Running,
                        deployment.running_description().to_string(),
                        Some(eval),
                    )
                };
                let eval_id = eval.as_ref().map(|eval| eval.id.clone()).unwrap_or_default();
                let update = DeploymentStatusUpdate {
                    deployment_id,
                    status,
                    status_description: description,
                };
                Ok((
                    Command::DeploymentStatus {
                        update,
                        job: None,
                        eval,
                    },
                    keys.0,
                    keys.1,
                    eval_id,
                ))
            }
            D::Fail { deployment_id } => {
                let deployment = active(state, &deployment_id, "fail")?;
                let (update, job) = crate::deploy::fail(state, deployment, DEPLOYMENT_DESC_FAILED_BY_USER);
                let eval = self.deployment_eval(state, deployment);
                let keys = (deployment.namespace.clone(), deployment.job_id.clone(), eval.id.clone());
                Ok((
                    Command::DeploymentStatus {
                        update,
                        job,
                        eval: Some(eval),
                    },
                    keys.0,
                    keys.1,
                    keys.2,
                ))
            }
            D::AllocHealth {
                deployment_id,
                healthy,
                unhealthy,
            } => self.alloc_health(state, deployment_id, healthy, unhealthy),
            D::Revert {
                namespace,
                job_id,
                version,
                enforce_prior_version,
            } => {
                let current = state
                    .job(&namespace, &job_id)
                    .ok_or_else(|| RpcError::not_found(format!("job {job_id:?} not found")))?;
                if let Some(prior) = enforce_prior_version
                    && prior != current.version
                {
                    return Err(invalid(format!(
                        "Current job has version {}; enforcing version {prior}",
                        current.version
                    )));
                }
                if version == current.version {
                    return Err(invalid("can't revert to current version"));
                }
                let old = state.job_version(&namespace, &job_id, version).ok_or_else(|| {
                    RpcError::not_found(format!(
                        "job {job_id:?} in namespace {namespace:?} at version {version} not found"
                    ))
                })?;
                let eval = (!old.is_launcher()).then(|| {
                    self.new_eval(
                        &namespace,
                        &job_id,
                        old.job_type,
                        old.priority,
                        crate::structs::EvalTrigger::JobRegister,
                    )
                });
                let eval_id = eval.as_ref().map(|eval| eval.id.clone()).unwrap_or_default();
                // The prior version is checked again when the entry applies, by its index.
                let command = Command::JobRegister {
                    job: old.clone(),
                    eval,
                    enforce_index: enforce_prior_version.map(|_| current.job_modify_index),
                };
                Ok((command, namespace, job_id, eval_id))
            }
            D::Stable {
                namespace,
                job_id,
                version,
                stable,
            } => {
                if state.job_version(&namespace, &job_id, version).is_none() {
                    return Err(RpcError::not_found(format!(
                        "job {job_id:?} in namespace {namespace:?} at version {version} not found"
                    )));
                }
                let command = Command::JobStability {
                    namespace: namespace.clone(),
                    job_id: job_id.clone(),
                    version,
                    stable,
                };
                Ok((command, namespace, job_id, String::new()))
            }
        }
    }

    /// `Deployment.SetAllocHealth`: only allocations of this deployment; an unhealthy one
    /// fails it (rolling back when a group has `auto_revert`), as the watcher would.
    fn alloc_health(
        &mut self,
        state: &ServerState,
        deployment_id: String,
        healthy: Vec<String>,
        unhealthy: Vec<String>,
    ) -> Result<(Command, String, String, String), RpcError> {
        let deployment = state
            .deployment(&deployment_id)
            .ok_or_else(|| RpcError::not_found("Deployment not found"))?;
        if !deployment.active() {
            return Err(invalid("can't set health of allocations for a terminal deployment"));
        }
        if healthy.is_empty() && unhealthy.is_empty() {
            return Err(invalid("must specify at least one healthy/unhealthy allocation ID"));
        }
        for id in healthy.iter().chain(&unhealthy) {
            match state.alloc(id) {
                None => return Err(RpcError::not_found(format!("Allocation {id:?} doesn't exist"))),
                Some(alloc) if alloc.deployment_id != deployment.id => {
                    return Err(invalid(format!(
                        "Allocation {id:?} isn't part of deployment {:?}",
                        deployment.id
                    )));
                }
                Some(_) => {}
            }
        }
        let (update, job) = if unhealthy.is_empty() {
            (None, None)
        } else {
            let (update, job) =
                crate::deploy::fail(state, deployment, crate::structs::DEPLOYMENT_DESC_FAILED_ALLOCATIONS);
            (Some(update), job)
        };
        let eval = self.deployment_eval(state, deployment);
        let keys = (deployment.namespace.clone(), deployment.job_id.clone(), eval.id.clone());
        let command = Command::DeploymentAllocHealth {
            deployment_id,
            healthy,
            unhealthy,
            update,
            job,
            eval,
        };
        Ok((command, keys.0, keys.1, keys.2))
    }

    fn deployment_eval(&mut self, state: &ServerState, deployment: &Deployment) -> Evaluation {
        let job = state.job(&deployment.namespace, &deployment.job_id);
        crate::deploy::eval(deployment, job, self.new_id())
    }
}

/// The deployment, which must still be running or paused to be acted on.
fn active<'a>(state: &'a ServerState, id: &str, verb: &str) -> Result<&'a Deployment, RpcError> {
    let deployment = state
        .deployment(id)
        .ok_or_else(|| RpcError::not_found("Deployment not found"))?;
    if !deployment.active() {
        return Err(invalid(format!("can't {verb} terminal deployment")));
    }
    Ok(deployment)
}

/// Nomad's promotion checks: the named groups exist, each promoted group's canaries are all
/// placed and healthy, and there is something to promote.
fn check_promotion(state: &ServerState, deployment: &Deployment, groups: &[String]) -> Result<(), RpcError> {
    for group in groups {
        if !deployment.task_groups.contains_key(group) {
            return Err(invalid(format!("Deployment does not include task group {group:?}")));
        }
    }
    let mut any = false;
    for (name, group) in &deployment.task_groups {
        if !groups.is_empty() && !groups.contains(name) || group.desired_canaries == 0 || group.promoted {
            continue;
        }
        any = true;
        let healthy = group
            .placed_canaries
            .iter()
            .filter(|id| {
                state
                    .alloc(id)
                    .is_some_and(|alloc| alloc.healthy() && !alloc.terminal())
            })
            .count();
        if (healthy as u32) < group.desired_canaries {
            return Err(invalid(format!(
                "Task group {name:?} has {healthy}/{} healthy allocations",
                group.desired_canaries
            )));
        }
    }
    if !any {
        return Err(invalid("no canaries to promote"));
    }
    Ok(())
}
