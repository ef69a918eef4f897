//! Scaling events in the state store (Nomad's `JobScalingEvents` table): each job's events by
//! task group, newest first, the last [`JOB_TRACKED_SCALING_EVENTS`] of each group, kept across
//! job versions and dropped with the job when it is purged. A scaling that changes the count
//! registers the new version and records its event in the same entry, so an event never names
//! an evaluation that does not exist.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use super::{Command, Response, ServerState, Table};
use crate::structs::{JOB_TRACKED_SCALING_EVENTS, ScalingEvent};

impl ServerState {
    pub(super) fn apply_job_scale(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        let Command::JobScale {
            namespace,
            job_id,
            group,
            job,
            eval,
            event,
            based_on,
        } = command
        else {
            unreachable!("{} is not routed here", command.name());
        };
        if let Some(based_on) = based_on {
            let current = self
                .jobs
                .get(&(namespace.clone(), job_id.clone()))
                .map(|job| job.job_modify_index);
            if current != Some(*based_on) {
                // Another write landed between the request and this entry: the scaled spec is
                // stale. Refused as a retryable failure, nothing recorded.
                let text = format!(
                    "job {job_id:?} was modified while being scaled (version of index {based_on}, now {}); retry",
                    current.map_or_else(|| "purged".to_string(), |index| index.to_string())
                );
                return Response::Error(crate::error::ErrorKind::Unavailable, text);
            }
        }
        if let Some(job) = job {
            let response = self.register_job(index, at_ms, job, eval.as_ref());
            if matches!(response, Response::Error(..)) {
                return response;
            }
        }
        let key = (namespace.clone(), job_id.clone());
        let mut groups = self.scaling_events.get(&key).cloned().unwrap_or_default();
        let events = groups.entry(group.clone()).or_default();
        events.insert(
            0,
            ScalingEvent {
                time_ms: at_ms,
                create_index: index,
                eval_id: eval.as_ref().map(|eval| eval.id.clone()),
                ..event.clone()
            },
        );
        events.truncate(JOB_TRACKED_SCALING_EVENTS);
        self.scaling_events.insert(key, groups);
        self.touch(Table::Jobs, index);
        Response::Done
    }

    /// A purged job's scaling events go with it.
    pub(super) fn forget_scaling_events(&mut self, namespace: &str, job_id: &str) {
        self.scaling_events.delete(&(namespace.to_string(), job_id.to_string()));
    }

    /// The job's scaling events by group, newest first.
    pub fn scaling_events(&self, namespace: &str, job_id: &str) -> Option<&BTreeMap<String, Vec<ScalingEvent>>> {
        self.scaling_events.get(&(namespace.to_string(), job_id.to_string()))
    }
}
