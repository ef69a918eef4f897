//! Jobs and evaluations in the state store: registration with versions, stop and purge, and
//! evaluation upserts (plans reuse the allocation upsert).

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use crate::structs::{Evaluation, Job};

/// How many versions of a job are kept (Nomad's `JobTrackedVersions`).
pub const JOB_TRACKED_VERSIONS: usize = 6;

/// Whether two jobs have the same spec (what a register compares to decide on a new version).
pub fn same_spec(a: &Job, b: &Job) -> bool {
    spec(a) == spec(b)
}

/// The spec of a job, without what the state store stamps on it.
fn spec(job: &Job) -> Job {
    Job {
        version: 0,
        submit_time_ms: 0,
        create_index: 0,
        modify_index: 0,
        job_modify_index: 0,
        stop: false,
        stable: false,
        ..job.clone()
    }
}

impl ServerState {
    /// Job commands: upsert, deregister, register with an evaluation, stop.
    pub(super) fn apply_job(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::JobUpsert { job } => {
                let key = (job.namespace.clone(), job.id.clone());
                let mut job = job.clone();
                let new = !self.jobs.contains_key(&key);
                job.create_index = self.jobs.get(&key).map_or(index, |old| old.create_index);
                job.modify_index = index;
                self.jobs.insert(key.clone(), job);
                if new {
                    self.rebuild_summary(&key.0, &key.1);
                }
                self.touch(Table::Jobs, index);
                self.recompute_job_plugins(index, at_ms, &key);
                Response::Done
            }
            Command::JobDeregister { namespace, job_id } => {
                let key = (namespace.clone(), job_id.clone());
                if !self.jobs.delete(&key) {
                    return Response::Error(ErrorKind::NotFound, format!("job not found: {job_id}"));
                }
                self.rebuild_summary(namespace, job_id);
                self.touch(Table::Jobs, index);
                self.recompute_job_plugins(index, at_ms, &key);
                Response::Done
            }
            Command::JobRegister {
                job,
                eval,
                enforce_index,
            } => match enforce_index.and_then(|expected| self.enforce_index_error(&job.namespace, &job.id, expected)) {
                Some(refused) => refused,
                None => self.register_job(index, at_ms, job, eval.as_ref()),
            },
            Command::JobStop {
                namespace,
                job_id,
                purge,
                eval,
            } => self.stop_job(index, at_ms, namespace, job_id, *purge, eval),
            other => unreachable!("{} is not routed here", other.name()),
        }
    }

    pub(super) fn upsert_evals(&mut self, index: u64, at_ms: u64, evals: &[Evaluation]) {
        for eval in evals {
            let mut eval = eval.clone();
            let old = self.evals.get(&eval.id);
            eval.create_index = old.map_or(index, |old| old.create_index);
            eval.create_time_ms = old.map_or(at_ms, |old| old.create_time_ms);
            eval.modify_index = index;
            eval.modify_time_ms = at_ms;
            self.index_eval(&eval);
            self.evals.insert(eval.id.clone(), eval);
        }
        self.touch(Table::Evals, index);
    }

    fn keep_version(&mut self, job: &Job) {
        let key = (job.namespace.clone(), job.id.clone());
        self.job_versions
            .insert((key.0.clone(), key.1.clone(), job.version), job.clone());
        let versions: Vec<u64> = self
            .job_versions
            .range((key.0.clone(), key.1.clone(), 0)..=(key.0.clone(), key.1.clone(), u64::MAX))
            .map(|((_, _, version), _)| *version)
            .collect();
        for version in versions
            .iter()
            .take(versions.len().saturating_sub(JOB_TRACKED_VERSIONS))
        {
            self.job_versions.delete(&(key.0.clone(), key.1.clone(), *version));
        }
    }

    /// Nomad's `EnforceIndex` check, with its texts: `None` when the stored job's
    /// `job_modify_index` is `expected` (0: when no job of that ID is stored), otherwise the
    /// refusal. Checked by the endpoint for an early answer and again when the entry applies.
    pub fn enforce_index_error(&self, namespace: &str, job_id: &str, expected: u64) -> Option<Response> {
        let stored = self
            .jobs
            .get(&(namespace.to_string(), job_id.to_string()))
            .map(|job| job.job_modify_index);
        let text = match (expected, stored) {
            (0, None) => return None,
            (0, Some(_)) => "Enforcing job modify index 0: job already exists".to_string(),
            (expected, None) => format!("Enforcing job modify index {expected}: job does not exist"),
            (expected, Some(actual)) if actual != expected => {
                format!("Enforcing job modify index {expected}: job exists with conflicting job modify index: {actual}")
            }
            _ => return None,
        };
        Some(Response::Error(ErrorKind::Invalid, text))
    }

    /// A register that changes nothing keeps the version (and does not un-stop nothing).
    pub(super) fn register_job(&mut self, index: u64, at_ms: u64, job: &Job, eval: Option<&Evaluation>) -> Response {
        let key = (job.namespace.clone(), job.id.clone());
        let old = self.jobs.get(&key).cloned();
        let changed = old.as_ref().is_none_or(|old| old.stop || spec(old) != spec(job));
        let mut job = job.clone();
        job.stop = false;
        job.create_index = old.as_ref().map_or(index, |old| old.create_index);
        job.modify_index = index;
        match (&old, changed) {
            (Some(old), false) => {
                job.stable = old.stable;
                job.version = old.version;
                job.job_modify_index = old.job_modify_index;
                job.submit_time_ms = old.submit_time_ms;
            }
            (old, _) => {
                job.stable = false;
                job.version = old.as_ref().map_or(0, |old| old.version + 1);
                job.job_modify_index = index;
                job.submit_time_ms = at_ms;
                self.keep_version(&job);
            }
        }
        if changed {
            self.periodic_registered(index, at_ms, &job);
        }
        let eval = eval.map(|eval| Evaluation {
            job_modify_index: job.job_modify_index,
            ..eval.clone()
        });
        self.jobs.insert(key.clone(), job);
        if old.is_none() {
            self.rebuild_summary(&key.0, &key.1);
        }
        self.touch(Table::Jobs, index);
        self.recompute_job_plugins(index, at_ms, &key);
        if let Some(eval) = eval {
            self.upsert_evals(index, at_ms, &[eval]);
        }
        Response::Done
    }

    /// Removes a job with its versions (a purge, or the GC of a stopped job).
    pub(super) fn purge_job(&mut self, namespace: &str, job_id: &str) {
        let key = (namespace.to_string(), job_id.to_string());
        self.jobs.delete(&key);
        let versions: Vec<(String, String, u64)> = self
            .job_versions
            .range((key.0.clone(), key.1.clone(), 0)..=(key.0.clone(), key.1.clone(), u64::MAX))
            .map(|(version, _)| version.clone())
            .collect();
        for version in versions {
            self.job_versions.delete(&version);
        }
        self.forget_periodic(namespace, job_id);
        self.forget_scaling_events(namespace, job_id);
        self.rebuild_summary(namespace, job_id);
    }

    pub(super) fn stop_job(
        &mut self,
        index: u64,
        at_ms: u64,
        namespace: &str,
        job_id: &str,
        purge: bool,
        eval: &Evaluation,
    ) -> Response {
        let key = (namespace.to_string(), job_id.to_string());
        let Some(old) = self.jobs.get(&key).cloned() else {
            return Response::Error(crate::error::ErrorKind::NotFound, "job not found".into());
        };
        if purge {
            self.purge_job(namespace, job_id);
        } else if !old.stop {
            let mut job = old.clone();
            job.stop = true;
            job.version = old.version + 1;
            job.modify_index = index;
            job.job_modify_index = index;
            // Nomad stops a copy of the job: its SubmitTime stays the register's.
            self.keep_version(&job);
            self.jobs.insert(key.clone(), job);
        }
        self.touch(Table::Jobs, index);
        self.recompute_job_plugins(index, at_ms, &key);
        let mut eval = eval.clone();
        eval.job_modify_index = self
            .jobs
            .get(&key)
            .map_or(old.job_modify_index, |job| job.job_modify_index);
        self.upsert_evals(index, at_ms, &[eval]);
        Response::Done
    }
}
