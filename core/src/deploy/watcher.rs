//! The deployment watcher: one proposal at a time, like the scheduler worker and the drainer,
//! run on every input of the leader's core, with a timer only for progress deadlines.
//!
//! For each running deployment, in order:
//! 1. an unhealthy allocation fails it (`Failed due to unhealthy allocations`), rolling back
//!    when a group has `auto_revert`;
//! 2. a group that made no progress by its deadline fails it (`Failed due to progress
//!    deadline`) — not while its healthy canaries wait for an operator's promotion. The deadline is the cluster time by which an allocation had to turn healthy
//!    (each healthy one moves it), kept here on the leader's monotonic clock from the cluster
//!    time of the last applied entry, so a new leader never fires one early;
//! 3. canaries that are all healthy in groups that all `auto_promote` are promoted;
//! 4. a deployment whose counts changed since the watcher last looked gets an evaluation, so
//!    the scheduler takes the rollout's next step.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::time::Duration;

use crate::fsm::{Command, ServerState, Table};
use crate::structs::{
    DEPLOYMENT_DESC_FAILED_ALLOCATIONS, DEPLOYMENT_DESC_PROGRESS_DEADLINE, DEPLOYMENT_RUNNING, Deployment,
};
use crate::time::Instant;

/// What the watcher last acted on of one deployment: its groups' health counts and
/// promotions.
type Seen = Vec<(u32, u32, bool)>;

#[derive(Debug, Default)]
pub struct DeploymentWatcher {
    enabled: bool,
    in_flight: bool,
    seen: BTreeMap<String, Seen>,
    /// Progress deadlines on the leader's clock, by deployment and group, with the cluster
    /// time they were computed from.
    deadlines: BTreeMap<(String, String), (u64, Instant)>,
    /// The deployments and allocations tables' indexes when last looked at.
    looked_at: (u64, u64),
}

fn seen(deployment: &Deployment) -> Seen {
    deployment
        .task_groups
        .values()
        .map(|state| (state.healthy_allocs, state.unhealthy_allocs, state.promoted))
        .collect()
}

impl DeploymentWatcher {
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.in_flight = false;
        self.seen.clear();
        self.deadlines.clear();
        self.looked_at = (0, 0);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        self.deadlines.values().map(|(_, at)| *at).min()
    }

    pub fn proposed(&mut self) {
        self.in_flight = false;
    }

    /// One step; returns the command to propose, if any.
    pub fn run(&mut self, now: Instant, state: &ServerState, new_id: &mut dyn FnMut() -> String) -> Option<Command> {
        if !self.enabled || self.in_flight {
            return None;
        }
        let tables = (state.table_index(Table::Deployments), state.table_index(Table::Allocs));
        let deadline_due = self.deadlines.values().any(|(_, at)| *at <= now);
        if tables == self.looked_at && !deadline_due {
            return None;
        }
        self.track_deadlines(now, state);
        let running: Vec<&Deployment> = state
            .active_deployments()
            .filter(|deployment| deployment.status == DEPLOYMENT_RUNNING)
            .collect();
        let command = running
            .iter()
            .find_map(|deployment| self.fail_unhealthy(now, state, deployment, new_id))
            .or_else(|| {
                running
                    .iter()
                    .find_map(|deployment| self.promote(state, deployment, new_id))
            })
            .or_else(|| self.evaluate(state, new_id));
        match &command {
            Some(_) => self.in_flight = true,
            None => self.looked_at = tables,
        }
        command
    }

    /// Deadlines of running deployments' groups still short of healthy allocations.
    fn track_deadlines(&mut self, now: Instant, state: &ServerState) {
        let cluster_now = state.last_applied_time_ms();
        let mut kept = BTreeMap::new();
        for deployment in state.active_deployments() {
            if deployment.status != DEPLOYMENT_RUNNING {
                continue;
            }
            for (group, dstate) in &deployment.task_groups {
                let wanted = dstate.desired_total.max(dstate.desired_canaries);
                // Healthy canaries waiting on an operator's promotion are not late.
                let promotion_due = dstate.awaits_promotion() && dstate.healthy_allocs >= dstate.desired_canaries;
                if dstate.require_progress_by_ms == 0 || dstate.healthy_allocs >= wanted || promotion_due {
                    continue;
                }
                let key = (deployment.id.clone(), group.clone());
                let at = match self.deadlines.get(&key) {
                    Some((by, at)) if *by == dstate.require_progress_by_ms => *at,
                    _ => now + Duration::from_millis(dstate.require_progress_by_ms.saturating_sub(cluster_now)),
                };
                kept.insert(key, (dstate.require_progress_by_ms, at));
            }
        }
        self.deadlines = kept;
    }

    /// Fails a deployment with an unhealthy allocation or a passed progress deadline.
    fn fail_unhealthy(
        &self,
        now: Instant,
        state: &ServerState,
        deployment: &Deployment,
        new_id: &mut dyn FnMut() -> String,
    ) -> Option<Command> {
        let unhealthy = deployment.task_groups.values().any(|group| group.unhealthy_allocs > 0);
        let late = self
            .deadlines
            .iter()
            .any(|((id, _), (_, at))| *id == deployment.id && *at <= now);
        let base = if unhealthy {
            DEPLOYMENT_DESC_FAILED_ALLOCATIONS
        } else if late {
            DEPLOYMENT_DESC_PROGRESS_DEADLINE
        } else {
            return None;
        };
        let (update, job) = super::fail(state, deployment, base);
        let current = state.job(&deployment.namespace, &deployment.job_id);
        let eval = super::eval(deployment, job.as_ref().or(current), new_id());
        tracing::info!(deployment = %deployment.id, job = %deployment.job_id, reason = %update.status_description, "deployment failed");
        Some(Command::DeploymentStatus {
            update,
            job,
            eval: Some(eval),
        })
    }

    /// Promotes a deployment whose waiting groups all `auto_promote` once all their canaries
    /// are healthy.
    fn promote(
        &self,
        state: &ServerState,
        deployment: &Deployment,
        new_id: &mut dyn FnMut() -> String,
    ) -> Option<Command> {
        let waiting: Vec<_> = deployment
            .task_groups
            .values()
            .filter(|group| group.awaits_promotion())
            .collect();
        if waiting.is_empty() || !waiting.iter().all(|group| group.auto_promote) {
            return None;
        }
        let ready = waiting.iter().all(|group| {
            let healthy = group
                .placed_canaries
                .iter()
                .filter(|id| {
                    state
                        .alloc(id)
                        .is_some_and(|alloc| alloc.healthy() && !alloc.terminal())
                })
                .count() as u32;
            healthy >= group.desired_canaries
        });
        if !ready {
            return None;
        }
        let job = state.job(&deployment.namespace, &deployment.job_id);
        Some(Command::DeploymentPromote {
            deployment_id: deployment.id.clone(),
            groups: Vec::new(),
            eval: super::eval(deployment, job, new_id()),
        })
    }

    /// Evaluations for the deployments whose counts changed since last seen.
    fn evaluate(&mut self, state: &ServerState, new_id: &mut dyn FnMut() -> String) -> Option<Command> {
        let mut evals = Vec::new();
        let mut now_seen = BTreeMap::new();
        for deployment in state.active_deployments() {
            let current = seen(deployment);
            let before = self.seen.get(&deployment.id);
            // A deployment just created has nothing new to say.
            let fresh = before.is_none() && current.iter().all(|group| *group == (0, 0, false));
            if before != Some(&current) && !fresh {
                let job = state.job(&deployment.namespace, &deployment.job_id);
                evals.push(super::eval(deployment, job, new_id()));
            }
            now_seen.insert(deployment.id.clone(), current);
        }
        self.seen = now_seen;
        (!evals.is_empty()).then_some(Command::EvalUpsert { evals })
    }
}
