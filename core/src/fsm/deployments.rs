//! Deployments in the state store: created and updated by plans, their status changed by the
//! leader's deployment watcher and by operators (promote, pause, fail, allocation health),
//! their counts kept from the allocations they placed, and job versions marked stable.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use crate::structs::{
    AllocDeploymentStatus, Allocation, Deployment, DeploymentStatus, DeploymentStatusUpdate, Evaluation, Job,
};

impl ServerState {
    pub fn deployment(&self, id: &str) -> Option<&Deployment> {
        self.deployments.get(id)
    }

    pub fn deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.deployments.values()
    }

    /// How many deployments are running or paused.
    pub fn active_deployment_count(&self) -> usize {
        self.active_deployments.len()
    }

    /// The running and paused deployments modified after index `since`, oldest change first.
    pub fn active_deployments_modified_after(&self, since: u64) -> impl Iterator<Item = &Deployment> {
        self.active_deployments_by_modify
            .range((since.saturating_add(1), String::new())..)
            .filter_map(|((_, id), _)| self.deployments.get(id))
    }

    /// The running and paused deployments.
    pub fn active_deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.active_deployments.keys().filter_map(|id| self.deployments.get(id))
    }

    /// A job's deployments, newest first.
    pub fn job_deployments(&self, namespace: &str, job_id: &str) -> Vec<&Deployment> {
        let mut found: Vec<&Deployment> = super::prefixed(&self.deployments_by_job, namespace, job_id)
            .filter_map(|id| self.deployments.get(id))
            .collect();
        found.sort_by_key(|deployment| core::cmp::Reverse((deployment.create_index, deployment.id.clone())));
        found
    }

    /// The job's newest deployment (Nomad's `LatestDeploymentByJobID`).
    pub fn latest_deployment(&self, namespace: &str, job_id: &str) -> Option<&Deployment> {
        self.job_deployments(namespace, job_id).into_iter().next()
    }

    pub(super) fn index_deployment(&mut self, deployment: &Deployment) {
        self.unindex_active_deployment(&deployment.id);
        if deployment.active() {
            self.active_deployments
                .insert(deployment.id.clone(), deployment.modify_index);
            self.active_deployments_by_modify
                .insert((deployment.modify_index, deployment.id.clone()), ());
        }
        self.deployments_by_job.insert(
            (
                deployment.namespace.clone(),
                deployment.job_id.clone(),
                deployment.id.clone(),
            ),
            (),
        );
    }

    /// Deployment commands (plans write deployments through `upsert_deployment`).
    pub(super) fn apply_deployment(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::DeploymentStatus { update, job, eval } => {
                if !self.deployments.contains_key(&update.deployment_id) {
                    return not_found(&update.deployment_id);
                }
                self.update_deployment_status(index, at_ms, update);
                self.register_revert(index, at_ms, job.as_ref(), eval.as_ref());
                Response::Done
            }
            Command::DeploymentPromote {
                deployment_id,
                groups,
                eval,
            } => {
                let Some(mut deployment) = self.deployments.get(deployment_id).cloned() else {
                    return not_found(deployment_id);
                };
                let mut promoted_canaries = Vec::new();
                for (name, state) in deployment.task_groups.iter_mut() {
                    if state.desired_canaries > 0 && (groups.is_empty() || groups.contains(name)) {
                        state.promoted = true;
                        promoted_canaries.extend(state.placed_canaries.iter().cloned());
                    }
                }
                deployment.status_description = deployment.running_description().into();
                self.upsert_deployment(index, at_ms, deployment);
                // Promoted canaries are canaries no more (Nomad's `UpdateDeploymentPromotion`):
                // their clients register their services with their tags, not their canary tags.
                for alloc_id in promoted_canaries {
                    if let Some(mut alloc) = self.allocs.get(&alloc_id).cloned()
                        && let Some(status) = alloc.deployment_status.as_mut()
                        && status.canary
                    {
                        status.canary = false;
                        status.modify_index = index;
                        alloc.modify_index = index;
                        alloc.modify_time_ms = at_ms;
                        self.allocs.insert(alloc_id, alloc);
                        self.touch(Table::Allocs, index);
                    }
                }
                self.upsert_evals(index, at_ms, core::slice::from_ref(eval));
                Response::Done
            }
            Command::DeploymentAllocHealth {
                deployment_id,
                healthy,
                unhealthy,
                update,
                job,
                eval,
            } => {
                if !self.deployments.contains_key(deployment_id) {
                    return not_found(deployment_id);
                }
                let marks = healthy
                    .iter()
                    .map(|id| (id, true))
                    .chain(unhealthy.iter().map(|id| (id, false)));
                let mut changed = Vec::new();
                for (alloc_id, health) in marks {
                    let Some(mut alloc) = self.allocs.get(alloc_id).cloned() else {
                        continue;
                    };
                    let status = alloc.deployment_status.get_or_insert_with(Default::default);
                    status.healthy = Some(health);
                    status.timestamp_ms = at_ms;
                    status.modify_index = index;
                    alloc.modify_index = index;
                    alloc.modify_time_ms = at_ms;
                    changed.push(alloc);
                }
                for alloc in changed {
                    let before = self.allocs.replace(alloc.id.clone(), alloc.clone());
                    self.count_deployment_alloc(index, at_ms, before.as_ref(), &alloc);
                    self.alloc_changed(index, at_ms, &alloc);
                }
                self.touch(Table::Allocs, index);
                if let Some(update) = update {
                    self.update_deployment_status(index, at_ms, update);
                }
                self.register_revert(index, at_ms, job.as_ref(), Some(eval));
                Response::Done
            }
            Command::JobStability {
                namespace,
                job_id,
                version,
                stable,
            } => self.set_job_stability(index, namespace, job_id, *version, *stable),
            other => unreachable!("{} is not routed here", other.name()),
        }
    }

    /// A revert registers an older version's spec as a new version, with its evaluation; a
    /// status change without one just evaluates the job.
    fn register_revert(&mut self, index: u64, at_ms: u64, job: Option<&Job>, eval: Option<&Evaluation>) {
        match (job, eval) {
            (Some(job), Some(eval)) => {
                self.register_job(index, at_ms, job, Some(eval));
            }
            (None, Some(eval)) => self.upsert_evals(index, at_ms, core::slice::from_ref(eval)),
            _ => {}
        }
    }

    /// Creates or replaces a deployment, stamping its indexes.
    pub(super) fn upsert_deployment(&mut self, index: u64, at_ms: u64, mut deployment: Deployment) {
        let old = self.deployments.get(&deployment.id);
        deployment.create_index = old.map_or(index, |old| old.create_index);
        deployment.create_time_ms = old.map_or(at_ms, |old| old.create_time_ms);
        deployment.modify_index = index;
        deployment.modify_time_ms = at_ms;
        self.index_deployment(&deployment);
        self.deployments.insert(deployment.id.clone(), deployment);
        self.touch(Table::Deployments, index);
    }

    /// A status change; a successful deployment marks its job version stable.
    pub(super) fn update_deployment_status(&mut self, index: u64, at_ms: u64, update: &DeploymentStatusUpdate) {
        let Some(mut deployment) = self.deployments.get(&update.deployment_id).cloned() else {
            return;
        };
        deployment.status = update.status;
        deployment.status_description = update.status_description.clone();
        if update.status == DeploymentStatus::Successful {
            let (namespace, job_id, version) = (
                deployment.namespace.clone(),
                deployment.job_id.clone(),
                deployment.job_version,
            );
            self.set_job_stability(index, &namespace, &job_id, version, true);
        }
        self.upsert_deployment(index, at_ms, deployment);
    }

    /// Marks one job version stable (or not), in the version history and, when it is the
    /// current version, in the job.
    fn set_job_stability(&mut self, index: u64, namespace: &str, job_id: &str, version: u64, stable: bool) -> Response {
        let key = (namespace.to_string(), job_id.to_string(), version);
        let Some(mut kept) = self.job_versions.get(&key).cloned() else {
            return Response::Error(
                ErrorKind::NotFound,
                format!("job {job_id:?} in namespace {namespace:?} with version {version} not found"),
            );
        };
        kept.stable = stable;
        self.job_versions.insert(key, kept);
        let job_key = (namespace.to_string(), job_id.to_string());
        if let Some(mut job) = self.jobs.get(&job_key).cloned()
            && job.version == version
        {
            job.stable = stable;
            self.jobs.insert(job_key, job);
        }
        self.touch(Table::Jobs, index);
        Response::Done
    }

    /// Keeps a deployment's counts as its allocations are placed and turn healthy or not
    /// (Nomad's `updateDeploymentWithAlloc`): a newly placed allocation, a first healthy or
    /// unhealthy verdict; a healthy one moves the progress deadline.
    pub(super) fn count_deployment_alloc(
        &mut self,
        index: u64,
        at_ms: u64,
        old: Option<&Allocation>,
        new: &Allocation,
    ) {
        if new.deployment_id.is_empty() {
            return;
        }
        let Some(mut deployment) = self.deployments.get(&new.deployment_id).cloned() else {
            return;
        };
        let Some(state) = deployment.task_groups.get_mut(&new.task_group) else {
            return;
        };
        let was = |check: fn(Option<&AllocDeploymentStatus>) -> bool| {
            old.is_some_and(|old| old.deployment_id == new.deployment_id && check(old.deployment_status.as_ref()))
        };
        let mut changed = false;
        if old.is_none_or(|old| old.deployment_id != new.deployment_id) {
            state.placed_allocs += 1;
            if new.is_canary() && !state.placed_canaries.contains(&new.id) {
                state.placed_canaries.push(new.id.clone());
            }
            changed = true;
        }
        if new.healthy() && !was(AllocDeploymentStatus::is_healthy) {
            state.healthy_allocs += 1;
            if !state.progress_deadline.is_zero() {
                let at = new
                    .deployment_status
                    .as_ref()
                    .map_or(at_ms, |status| status.timestamp_ms);
                let by = at.saturating_add(state.progress_deadline.as_millis() as u64);
                state.require_progress_by_ms = state.require_progress_by_ms.max(by);
            }
            changed = true;
        }
        if new.unhealthy() && !was(AllocDeploymentStatus::is_unhealthy) {
            state.unhealthy_allocs += 1;
            changed = true;
        }
        if changed {
            self.upsert_deployment(index, at_ms, deployment);
        }
    }

    /// Takes deployment `id` out of the active ones.
    pub(super) fn unindex_active_deployment(&mut self, id: &str) {
        if let Some(modified) = self.active_deployments.get(id).copied() {
            self.active_deployments_by_modify.delete(&(modified, id.to_string()));
            self.active_deployments.delete(id);
        }
    }

    /// Deployments per job, for the derived index rebuild.
    pub(super) fn rebuild_deployment_index(&mut self) {
        self.deployments_by_job = super::PMap::default();
        self.active_deployments = super::PMap::default();
        self.active_deployments_by_modify = super::PMap::default();
        let all: Vec<Deployment> = self.deployments.values().cloned().collect();
        for deployment in &all {
            self.index_deployment(deployment);
        }
    }
}

fn not_found(id: &str) -> Response {
    Response::Error(ErrorKind::NotFound, format!("Deployment ID {id:?} couldn't be found"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::DeploymentStatus;

    fn deployment(id: &str, status: DeploymentStatus) -> Deployment {
        Deployment {
            id: id.into(),
            namespace: "default".into(),
            job_id: format!("job-{id}"),
            status,
            ..Default::default()
        }
    }

    /// The deployment watcher's index: active deployments by the index they were last
    /// modified at, kept through updates, completion, collection and a rebuild.
    #[test]
    fn active_deployments_are_found_by_what_changed_since() {
        let mut state = ServerState::default();
        let ids = |state: &ServerState, since| -> Vec<String> {
            state
                .active_deployments_modified_after(since)
                .map(|deployment| deployment.id.clone())
                .collect()
        };
        state.upsert_deployment(10, 0, deployment("a", DeploymentStatus::Running));
        state.upsert_deployment(11, 0, deployment("b", DeploymentStatus::Running));
        state.upsert_deployment(12, 0, deployment("c", DeploymentStatus::Running));
        assert_eq!(ids(&state, 0), ["a", "b", "c"]);
        assert_eq!(ids(&state, 11), ["c"]);
        // An update moves it to its new index; one that finishes leaves the active ones.
        state.upsert_deployment(13, 0, deployment("a", DeploymentStatus::Running));
        state.upsert_deployment(14, 0, deployment("b", DeploymentStatus::Successful));
        assert_eq!(ids(&state, 11), ["c", "a"]);
        assert_eq!(ids(&state, 12), ["a"]);
        assert_eq!(state.active_deployment_count(), 2);
        state.unindex_active_deployment("c");
        assert_eq!(ids(&state, 0), ["a"]);
        state.rebuild_deployment_index();
        assert_eq!(ids(&state, 0), ["c", "a"]);
        assert_eq!(ids(&state, 12), ["a"]);
    }
}
