//! Deployments in the scheduler (Nomad's reconciler, its deployment half): a service job's
//! version rolls out through a deployment when its groups have an `update` block.
//!
//! - A new version gets a deployment; an active one of an older version is cancelled
//!   (`Cancelled due to newer version of job`), and so is one of a stopped job.
//! - Destructive updates go at most `max_parallel` at a time: every allocation the deployment
//!   placed that is not healthy yet holds a slot, and an unhealthy one stops the rollout.
//! - With `canary = n`, n canaries of the new version are placed first beside the old
//!   allocations, named after the ones they will replace; nothing else changes until the
//!   deployment is promoted. Promoted canaries take those names over (the old ones stop).
//! - A paused deployment places nothing new but replacements of lost or failed allocations;
//!   a failed one neither, and its unpromoted canaries are stopped.
//! - When every group has its healthy allocations and nothing is left to change, the
//!   deployment is successful, which marks the job version stable.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeSet;

use crate::fsm::ServerState;
use crate::structs::{
    Allocation, DEPLOYMENT_DESC_NEWER_JOB, DEPLOYMENT_DESC_STOPPED_JOB, DEPLOYMENT_DESC_SUCCESSFUL, Deployment,
    DeploymentState, DeploymentStatus, DeploymentStatusUpdate, Job, JobType, TaskGroup, UpdateStrategy,
};

/// The job's deployment as this plan sees and changes it.
#[derive(Debug, Default)]
pub(super) struct Rollout {
    /// The deployment of the job's current version: stored, or created by this plan.
    pub deployment: Option<Deployment>,
    /// `deployment` was created or changed by this plan (it goes into the plan).
    pub changed: bool,
    pub updates: Vec<DeploymentStatusUpdate>,
    /// Groups that changed something in this plan (placed, updated or stopped): not done.
    pub busy: BTreeSet<String>,
    /// The `max-parallel` regression switch: destructive updates all at once.
    pub ignore_max_parallel: bool,
}

/// What one group's rollout allows this plan.
#[derive(Debug)]
pub(super) struct GroupAllowance {
    /// Destructive updates allowed now.
    pub limit: usize,
    /// Placements of new names (not replacements) allowed now.
    pub place_new: bool,
    /// Canaries still to place.
    pub canaries: u32,
}

impl GroupAllowance {
    /// No deployment holds the group back: everything at once.
    const UNLIMITED: GroupAllowance = GroupAllowance {
        limit: usize::MAX,
        place_new: true,
        canaries: 0,
    };
}

impl Rollout {
    /// The job's current deployment; stale ones cancelled.
    pub fn start(state: &ServerState, namespace: &str, job_id: &str, job: Option<&Job>) -> Rollout {
        let mut rollout = Rollout::default();
        let Some(latest) = state.latest_deployment(namespace, job_id) else {
            return rollout;
        };
        let current =
            job.is_some_and(|job| latest.job_version == job.version && latest.job_create_index == job.create_index);
        if current {
            rollout.deployment = Some(latest.clone());
        } else if latest.active() {
            let description = if job.is_none() {
                DEPLOYMENT_DESC_STOPPED_JOB
            } else {
                DEPLOYMENT_DESC_NEWER_JOB
            };
            rollout.updates.push(DeploymentStatusUpdate {
                deployment_id: latest.id.clone(),
                status: DeploymentStatus::Cancelled,
                status_description: description.into(),
            });
        }
        rollout
    }

    fn status(&self) -> Option<DeploymentStatus> {
        self.deployment.as_ref().map(|deployment| deployment.status)
    }

    pub fn failed(&self) -> bool {
        self.status() == Some(DeploymentStatus::Failed)
    }

    pub fn paused(&self) -> bool {
        self.status() == Some(DeploymentStatus::Paused)
    }

    /// The id placements join: the deployment's while it is active.
    pub fn placing_into(&self, group: &str) -> Option<&str> {
        self.deployment
            .as_ref()
            .filter(|deployment| deployment.active() && deployment.task_groups.contains_key(group))
            .map(|deployment| deployment.id.as_str())
    }

    /// The deployment's state of `group`, creating the deployment (for a new version that
    /// changes something) as needed; `None`: the group does not roll out through a deployment
    /// in this plan.
    pub fn group(
        &mut self,
        state: &ServerState,
        job: &Job,
        group: &TaskGroup,
        had_current: bool,
        updating: bool,
        new_id: &mut dyn FnMut() -> String,
    ) -> Option<DeploymentState> {
        if let Some(deployment) = &self.deployment {
            return deployment.task_groups.get(&group.name).cloned();
        }
        if group.count == 0 || (had_current && !updating) {
            return None;
        }
        let now = state.last_applied_time_ms();
        let mut deployment = Deployment {
            id: new_id(),
            namespace: job.namespace.clone(),
            job_id: job.id.clone(),
            job_version: job.version,
            job_modify_index: job.job_modify_index,
            job_create_index: job.create_index,
            status: DeploymentStatus::Running,
            eval_priority: job.priority,
            ..Deployment::default()
        };
        for other in job.task_groups.iter() {
            let Some(strategy) = other.rolling_update() else {
                continue;
            };
            let progress = strategy.progress_deadline;
            deployment.task_groups.insert(
                other.name.clone(),
                DeploymentState {
                    auto_revert: strategy.auto_revert,
                    auto_promote: strategy.auto_promote,
                    progress_deadline: progress,
                    require_progress_by_ms: if progress.is_zero() {
                        0
                    } else {
                        now.saturating_add(progress.as_millis() as u64)
                    },
                    desired_total: other.count,
                    ..DeploymentState::default()
                },
            );
        }
        deployment.status_description = deployment.running_description().into();
        self.deployment = Some(deployment);
        self.changed = true;
        self.deployment
            .as_ref()
            .and_then(|deployment| deployment.task_groups.get(&group.name).cloned())
    }

    /// Records that `group` wants canaries (set once, when its destructive updates are first
    /// seen).
    pub fn want_canaries(&mut self, group: &str, canaries: u32) {
        if let Some(deployment) = self.deployment.as_mut()
            && let Some(state) = deployment.task_groups.get_mut(group)
            && state.desired_canaries == 0
            && !state.promoted
        {
            state.desired_canaries = canaries;
            deployment.status_description = deployment.running_description().into();
            self.changed = true;
        }
    }

    /// How much of `group`'s update this plan may do (Nomad's `computeLimit` and its
    /// placement rules). `live` are the group's live allocations, `placed_canaries` how many
    /// of the deployment's canaries the servers still run (failed ones too: a canary that
    /// failed is not placed again, its deployment fails).
    pub fn allowance(
        &self,
        group: &str,
        strategy: &UpdateStrategy,
        live: &[&Allocation],
        placed_canaries: u32,
    ) -> GroupAllowance {
        let Some(deployment) = &self.deployment else {
            return GroupAllowance::UNLIMITED;
        };
        let Some(state) = deployment.task_groups.get(group) else {
            return GroupAllowance::UNLIMITED;
        };
        let stalled = self.failed() || self.paused();
        let canaries = if stalled || !state.awaits_promotion() {
            0
        } else {
            state.desired_canaries.saturating_sub(placed_canaries)
        };
        if stalled || state.awaits_promotion() {
            // Only replacements of lost or failed allocations, and the canaries still due.
            return GroupAllowance {
                limit: 0,
                place_new: false,
                canaries,
            };
        }
        if self.ignore_max_parallel {
            return GroupAllowance::UNLIMITED;
        }
        let mut limit = strategy.max_parallel as usize;
        for alloc in live.iter().filter(|alloc| alloc.deployment_id == deployment.id) {
            if alloc.unhealthy() {
                limit = 0;
                break;
            }
            if !alloc.healthy() {
                limit = limit.saturating_sub(1);
            }
        }
        GroupAllowance {
            limit,
            place_new: true,
            canaries: 0,
        }
    }

    /// Marks a group busy (something changed for it in this plan).
    pub fn busy(&mut self, group: &str) {
        self.busy.insert(group.to_string());
    }

    /// A running deployment whose every group is done — nothing changed for it in this plan,
    /// no canary awaits promotion, and it has its healthy allocations — is successful.
    pub fn finish(&mut self) {
        let Some(deployment) = &self.deployment else { return };
        if deployment.status != DeploymentStatus::Running {
            return;
        }
        let done = deployment.task_groups.iter().all(|(name, state)| {
            !self.busy.contains(name)
                && !state.awaits_promotion()
                && state.desired_total > 0
                && state.healthy_allocs >= state.desired_total.max(state.desired_canaries)
        });
        if done {
            self.updates.push(DeploymentStatusUpdate {
                deployment_id: deployment.id.clone(),
                status: DeploymentStatus::Successful,
                status_description: DEPLOYMENT_DESC_SUCCESSFUL.into(),
            });
        }
    }
}

/// Whether the job's groups roll out through deployments at all: service jobs only (batch
/// jobs refuse `update`; system jobs update at once).
pub(super) fn rolls_out(job: &Job, group: &TaskGroup) -> Option<UpdateStrategy> {
    (job.job_type == JobType::Service)
        .then(|| group.rolling_update().cloned())
        .flatten()
}

/// Whether an allocation of `old` can take `new`'s version without a restart (Nomad's
/// `tasksUpdated` is false): the group as written, apart from its count and `update` block,
/// and what of the job reaches the tasks, are the same.
pub(super) fn in_place(old: &Job, new: &Job, group: &str) -> bool {
    let shape = |job: &Job| {
        job.task_groups.iter().find(|g| g.name == group).map(|g| TaskGroup {
            count: 0,
            update: None,
            ..g.clone()
        })
    };
    let (Some(before), Some(after)) = (shape(old), shape(new)) else {
        return false;
    };
    before == after
        && old.meta == new.meta
        && old.datacenters == new.datacenters
        && old.constraints == new.constraints
        && old.affinities == new.affinities
        && old.priority == new.priority
}
