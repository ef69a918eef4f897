//! Allocations and evaluations in the state store: upserts (plans included), client status
//! updates, desired transitions from the drainer, deletion.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use crate::structs::{Allocation, ClientStatus};

impl ServerState {
    /// A plan's copy of an existing allocation was taken when the scheduler ran: what the
    /// client reported since (say, that it failed) must survive the plan, or a stopped
    /// allocation that already finished reads as pending for good and holds its claims (found
    /// by csi_controller_faults, seed 46). As Nomad's state store does, the client's status
    /// stays unless the plan marks the allocation lost.
    /// A plan's allocations less the new ones whose job is gone (purged after the plan was
    /// made, before it was applied); changes to allocations already stored all stay.
    fn of_jobs_still_stored(&self, allocs: &[Allocation]) -> Vec<Allocation> {
        allocs
            .iter()
            .filter(|alloc| self.allocs.contains_key(&alloc.id) || self.job(&alloc.namespace, &alloc.job_id).is_some())
            .cloned()
            .collect()
    }

    fn keep_client_status(&self, allocs: &[Allocation]) -> Vec<Allocation> {
        allocs
            .iter()
            .map(|planned| {
                let mut alloc = planned.clone();
                let Some(existing) = self.allocs.get(&alloc.id) else {
                    return alloc;
                };
                if alloc.client_status != ClientStatus::Lost {
                    alloc.client_status = existing.client_status;
                    alloc.client_description = existing.client_description.clone();
                }
                // Only clients say what their tasks did, and whether they turned healthy.
                alloc.task_states = existing.task_states.clone();
                if alloc.deployment_id == existing.deployment_id {
                    alloc.deployment_status = existing.deployment_status.clone();
                }
                alloc
            })
            .collect()
    }

    /// One allocation's report from its client; nothing when the allocation is gone.
    fn client_update(
        &mut self,
        index: u64,
        at_ms: u64,
        alloc_id: &str,
        client_status: ClientStatus,
        task_states: Option<&BTreeMap<String, crate::structs::TaskState>>,
    ) {
        let Some(before) = self.allocs.get(alloc_id).cloned() else {
            return;
        };
        self.count_alloc(&before, false);
        let alloc = self.allocs.get_mut(alloc_id).expect("present");
        alloc.client_status = client_status;
        if let Some(states) = task_states {
            alloc.task_states = states.clone();
            // What Nomad's client says with each status (`getClientStatus`).
            let description = match client_status {
                ClientStatus::Pending => Some("No tasks have started"),
                ClientStatus::Running => Some("Tasks are running"),
                ClientStatus::Complete => Some("All tasks have completed"),
                ClientStatus::Failed => Some("Failed tasks"),
                ClientStatus::Lost => None,
            };
            if let Some(description) = description {
                alloc.client_description = description.into();
            }
        }
        alloc.modify_index = index;
        alloc.modify_time_ms = at_ms;
        let alloc = alloc.clone();
        self.count_alloc(&alloc, true);
        self.queue_failed_alloc(&alloc);
        self.alloc_changed(index, at_ms, &alloc);
        self.recompute_job_plugins(index, at_ms, &(alloc.namespace.clone(), alloc.job_id.clone()));
    }

    /// The health a client decided for an allocation of a deployment: recorded once (a
    /// decided health is not changed by the client again) and counted by the deployment.
    fn client_health(
        &mut self,
        index: u64,
        at_ms: u64,
        alloc_id: &str,
        status: &crate::structs::AllocDeploymentStatus,
    ) {
        let Some(before) = self.allocs.get(alloc_id).cloned() else {
            return;
        };
        if status.healthy.is_none()
            || before
                .deployment_status
                .as_ref()
                .is_some_and(|old| old.healthy.is_some())
        {
            return;
        }
        let mut alloc = before.clone();
        let canary = before.is_canary();
        alloc.deployment_status = Some(crate::structs::AllocDeploymentStatus {
            healthy: status.healthy,
            timestamp_ms: status.timestamp_ms,
            canary,
            modify_index: index,
        });
        self.allocs.insert(alloc.id.clone(), alloc.clone());
        self.count_deployment_alloc(index, at_ms, Some(&before), &alloc);
    }

    /// Allocation and evaluation commands, plans included.
    pub(super) fn apply_alloc(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::AllocUpsert { allocs } => {
                let mut jobs = BTreeSet::new();
                for alloc in allocs {
                    let mut alloc = alloc.clone();
                    let old = self.allocs.get(&alloc.id);
                    alloc.create_index = old.map_or(index, |old| old.create_index);
                    alloc.create_time_ms = old.map_or(at_ms, |old| old.create_time_ms);
                    alloc.modify_index = index;
                    alloc.modify_time_ms = at_ms;
                    jobs.insert((alloc.namespace.clone(), alloc.job_id.clone()));
                    let old = self.allocs.replace(alloc.id.clone(), alloc.clone());
                    self.index_alloc(old.as_ref(), &alloc);
                    self.count_deployment_alloc(index, at_ms, old.as_ref(), &alloc);
                    self.alloc_changed(index, at_ms, &alloc);
                }
                self.touch(Table::Allocs, index);
                self.touch(Table::CsiVolumes, index);
                for key in jobs {
                    self.recompute_job_plugins(index, at_ms, &key);
                }
                Response::Done
            }
            Command::AllocUpdateDesiredTransition { transitions, evals } => {
                for (alloc_id, transition) in transitions {
                    // Allocations collected since the drainer looked are skipped.
                    if let Some(alloc) = self.allocs.get_mut(alloc_id) {
                        alloc.desired_transition = *transition;
                        alloc.modify_index = index;
                        alloc.modify_time_ms = at_ms;
                    }
                }
                self.touch(Table::Allocs, index);
                self.upsert_evals(index, at_ms, evals);
                Response::Done
            }
            Command::AllocClientUpdate {
                alloc_id,
                client_status,
            } => {
                if !self.allocs.contains_key(alloc_id) {
                    return Response::Error(ErrorKind::NotFound, format!("Unknown allocation: {alloc_id}"));
                }
                self.client_update(index, at_ms, alloc_id, *client_status, None);
                self.touch(Table::Allocs, index);
                self.touch(Table::CsiVolumes, index);
                Response::Done
            }
            Command::AllocClientUpdates { updates } => {
                for update in updates {
                    let states = Some(&update.task_states);
                    self.client_update(index, at_ms, &update.alloc_id, update.client_status, states);
                    if let Some(status) = &update.deployment_status {
                        self.client_health(index, at_ms, &update.alloc_id, status);
                    }
                }
                self.touch(Table::Allocs, index);
                self.touch(Table::CsiVolumes, index);
                Response::Done
            }
            Command::AllocDelete { alloc_ids } => {
                let mut jobs = BTreeSet::new();
                for id in alloc_ids {
                    if let Some(alloc) = self.allocs.remove(id) {
                        self.unindex_alloc(&alloc);
                        jobs.insert((alloc.namespace.clone(), alloc.job_id.clone()));
                    }
                }
                self.touch(Table::Allocs, index);
                self.touch(Table::CsiVolumes, index);
                for key in jobs {
                    self.recompute_job_plugins(index, at_ms, &key);
                }
                Response::Done
            }
            Command::PlanApply {
                allocs,
                evals,
                deployment,
                deployment_updates,
            } => {
                if let Some(deployment) = deployment {
                    self.upsert_deployment(index, at_ms, deployment.clone());
                }
                for update in deployment_updates {
                    self.update_deployment_status(index, at_ms, update);
                }
                // A plan made before its job was purged places nothing: its new allocations
                // would belong to no job and stay pending for good (issue 54 §9).
                let allocs = self.of_jobs_still_stored(allocs);
                // An empty plan must not touch the allocs table: blocked evaluations wake on it.
                let response = if allocs.is_empty() {
                    Response::Done
                } else {
                    let allocs = self.keep_client_status(&allocs);
                    self.apply_cluster(index, at_ms, &Command::AllocUpsert { allocs })
                };
                self.upsert_evals(index, at_ms, evals);
                response
            }
            Command::EvalUpsert { evals } => {
                self.upsert_evals(index, at_ms, evals);
                Response::Done
            }
            other => unreachable!("{} is not routed here", other.name()),
        }
    }
}
