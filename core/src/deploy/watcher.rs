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

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::fsm::{Command, ServerState, Table};
use crate::structs::{
    DEPLOYMENT_DESC_FAILED_ALLOCATIONS, DEPLOYMENT_DESC_PROGRESS_DEADLINE, Deployment, DeploymentStatus,
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
    /// Every deployment modified up to this index of the deployments table has been looked
    /// at: a run considers only those modified since (a health count, a promotion or a status
    /// change modifies one) and those a passed deadline names. Looking at every active
    /// deployment on every change cost O(deployments) per write: with 4,000 stuck deployments
    /// it was 80 % of a server's CPU while jobs were registered.
    processed: u64,
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
        self.processed = 0;
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
        let since = self.processed;
        let due: BTreeSet<String> = self
            .deadlines
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|((id, _), _)| id.clone())
            .collect();
        let mut changed: Vec<&Deployment> = state.active_deployments_modified_after(since).collect();
        changed.extend(
            due.iter()
                .filter_map(|id| state.deployment(id))
                .filter(|deployment| deployment.active() && deployment.modify_index <= since),
        );
        // By id, the order of the active deployments.
        changed.sort_by(|a, b| a.id.cmp(&b.id));
        self.track_deadlines(now, state, &changed, &due);
        let running: Vec<&Deployment> = changed
            .iter()
            .copied()
            .filter(|deployment| deployment.status == DeploymentStatus::Running)
            .collect();
        let command = running
            .iter()
            .find_map(|deployment| self.fail_unhealthy(now, state, deployment, new_id))
            .or_else(|| {
                running
                    .iter()
                    .find_map(|deployment| self.promote(state, deployment, new_id))
            })
            .or_else(|| self.evaluate(state, &changed, new_id));
        match &command {
            Some(_) => self.in_flight = true,
            None => {
                self.looked_at = tables;
                self.processed = tables.0;
            }
        }
        command
    }

    /// Deadlines of running deployments' groups still short of healthy allocations, brought
    /// up to date for the deployments in `changed`; those of deployments no longer running
    /// (finished, or collected) go once they are `due`.
    fn track_deadlines(&mut self, now: Instant, state: &ServerState, changed: &[&Deployment], due: &BTreeSet<String>) {
        let cluster_now = state.last_applied_time_ms();
        for deployment in changed {
            let before = self.remove_deadlines(&deployment.id);
            if deployment.status != DeploymentStatus::Running {
                continue;
            }
            for (group, dstate) in &deployment.task_groups {
                let wanted = dstate.desired_total.max(dstate.desired_canaries);
                // Healthy canaries waiting on an operator's promotion are not late.
                let promotion_due = dstate.awaits_promotion() && dstate.healthy_allocs >= dstate.desired_canaries;
                if dstate.require_progress_by_ms == 0 || dstate.healthy_allocs >= wanted || promotion_due {
                    continue;
                }
                let at = match before.get(group) {
                    Some((by, at)) if *by == dstate.require_progress_by_ms => *at,
                    _ => now + Duration::from_millis(dstate.require_progress_by_ms.saturating_sub(cluster_now)),
                };
                self.deadlines.insert(
                    (deployment.id.clone(), group.clone()),
                    (dstate.require_progress_by_ms, at),
                );
            }
        }
        for id in due {
            let running = state
                .deployment(id)
                .is_some_and(|deployment| deployment.status == DeploymentStatus::Running);
            if !running {
                self.remove_deadlines(id);
            }
        }
    }

    /// Removes the deadlines of deployment `id`; returns them by group.
    fn remove_deadlines(&mut self, id: &str) -> BTreeMap<String, (u64, Instant)> {
        let groups: Vec<String> = self
            .deadlines
            .range((id.to_string(), String::new())..)
            .take_while(|((deployment, _), _)| deployment == id)
            .map(|((_, group), _)| group.clone())
            .collect();
        groups
            .into_iter()
            .filter_map(|group| {
                let value = self.deadlines.remove(&(id.to_string(), group.clone()))?;
                Some((group, value))
            })
            .collect()
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
    fn evaluate(
        &mut self,
        state: &ServerState,
        changed: &[&Deployment],
        new_id: &mut dyn FnMut() -> String,
    ) -> Option<Command> {
        let mut evals = Vec::new();
        for deployment in changed {
            let current = seen(deployment);
            let before = self.seen.get(&deployment.id);
            // A deployment just created has nothing new to say.
            let fresh = before.is_none() && current.iter().all(|group| *group == (0, 0, false));
            if before != Some(&current) && !fresh {
                let job = state.job(&deployment.namespace, &deployment.job_id);
                evals.push(super::eval(deployment, job, new_id()));
            }
            self.seen.insert(deployment.id.clone(), current);
        }
        // What is remembered of deployments no longer active goes now and then, not on every
        // run (that would be a pass over all of them again).
        if self.seen.len() > 64 && self.seen.len() > 2 * state.active_deployment_count() {
            self.seen
                .retain(|id, _| state.deployment(id).is_some_and(Deployment::active));
        }
        (!evals.is_empty()).then_some(Command::EvalUpsert { evals })
    }
}
