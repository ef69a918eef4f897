//! Job summaries maintained on apply (Nomad's `JobSummary` table): per task group, how many of
//! the job's allocations are in each client status, and how many are live. Listing jobs and
//! answering `/v1/job/:id/summary` then cost what they return, not the job's allocations; a
//! system job's live count (which its CSI plugins expect) no longer scans every allocation.
//!
//! Derived, like the allocation indexes: not in the snapshot, rebuilt on restore. Kept in step
//! at the only places an allocation's group, status or ownership changes: an allocation
//! indexed or unindexed (upsert, delete) and a client's status report; and rebuilt from the
//! job's allocations when a job of that ID is created again after a purge.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use super::ServerState;
use crate::structs::{Allocation, ClientStatus, Job};

/// The allocation counts of one task group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupSummary {
    /// Client status `pending` (Nomad's summary calls it `Starting`).
    pub starting: u32,
    pub running: u32,
    pub complete: u32,
    pub failed: u32,
    pub lost: u32,
    /// Neither stopped by the servers nor finished on the client.
    pub live: u32,
}

/// The allocation counts of one job, by task group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSummary {
    pub groups: BTreeMap<String, GroupSummary>,
}

impl JobSummary {
    pub fn group(&self, name: &str) -> GroupSummary {
        self.groups.get(name).copied().unwrap_or_default()
    }

    /// Whether any allocation of the job is live.
    pub fn any_live(&self) -> bool {
        self.groups.values().any(|group| group.live > 0)
    }

    /// Whether the job has any allocation at all.
    pub fn any(&self) -> bool {
        self.groups
            .values()
            .any(|group| group.starting + group.running + group.complete + group.failed + group.lost > 0)
    }

    /// Nomad's job status: `dead` when stopped or nothing runs, `running` when something does,
    /// `pending` otherwise (as [`Job::status`] computes it from the allocations).
    pub fn status(&self, job: &Job) -> &'static str {
        if job.is_launcher() {
            if job.stop { "dead" } else { "running" }
        } else if self.any_live() {
            "running"
        } else if job.stop || self.any() {
            "dead"
        } else {
            "pending"
        }
    }

    fn count(&mut self, alloc: &Allocation, add: bool) {
        let group = self.groups.entry(alloc.task_group.clone()).or_default();
        let step = |n: &mut u32| *n = if add { n.saturating_add(1) } else { n.saturating_sub(1) };
        step(match alloc.client_status {
            ClientStatus::Pending => &mut group.starting,
            ClientStatus::Running => &mut group.running,
            ClientStatus::Complete => &mut group.complete,
            ClientStatus::Failed => &mut group.failed,
            ClientStatus::Lost => &mut group.lost,
        });
        if !alloc.terminal() {
            step(&mut group.live);
        }
        if *group == GroupSummary::default() {
            self.groups.remove(&alloc.task_group);
        }
    }
}

/// Whether `alloc` is one of `job`'s own (Nomad's `AllocsByJob` with `anyCreateIndex =
/// false`): an allocation of an earlier, purged job of the same ID was created before it.
pub(super) fn belongs(job: &Job, alloc: &Allocation) -> bool {
    alloc.create_index == 0 || alloc.create_index >= job.create_index
}

impl ServerState {
    /// The job's allocation counts, kept on apply.
    pub fn job_summary(&self, namespace: &str, job_id: &str) -> JobSummary {
        self.summaries
            .get(&(namespace.to_string(), job_id.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Adds `alloc` to (or takes it out of) its job's summary, when it is the job's own.
    pub(super) fn count_alloc(&mut self, alloc: &Allocation, add: bool) {
        let key = (alloc.namespace.clone(), alloc.job_id.clone());
        let Some(job) = self.jobs.get(&key) else {
            return;
        };
        if !belongs(job, alloc) {
            return;
        }
        let summary = self.summaries.get_or_insert_with(key.clone(), JobSummary::default);
        summary.count(alloc, add);
        if summary.groups.is_empty() {
            self.summaries.delete(&key);
        }
    }

    /// Counts the job's allocations afresh: when a job is created (perhaps again, after a
    /// purge, with older allocations of its ID still stored) or gone.
    pub(super) fn rebuild_summary(&mut self, namespace: &str, job_id: &str) {
        let mut summary = JobSummary::default();
        for alloc in self.job_allocs(namespace, job_id) {
            summary.count(alloc, true);
        }
        let key = (namespace.to_string(), job_id.to_string());
        if summary.groups.is_empty() || self.jobs.get(&key).is_none() {
            self.summaries.delete(&key);
        } else {
            self.summaries.insert(key, summary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::{Command, Entry};
    use crate::structs::{DesiredStatus, Evaluation, TaskGroup};
    use rand_010::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const JOBS: [&str; 3] = ["a", "b", "c"];
    const GROUPS: [&str; 2] = ["web", "db"];
    const STATUSES: [ClientStatus; 5] = [
        ClientStatus::Pending,
        ClientStatus::Running,
        ClientStatus::Complete,
        ClientStatus::Failed,
        ClientStatus::Lost,
    ];

    /// Counted from the job's allocations (none while no job of that ID exists).
    fn computed(state: &ServerState, job_id: &str) -> JobSummary {
        let mut summary = JobSummary::default();
        if state.job("default", job_id).is_none() {
            return summary;
        }
        for alloc in state.job_allocs("default", job_id) {
            summary.count(alloc, true);
        }
        summary
    }

    fn random_command(rng: &mut ChaCha8Rng, state: &ServerState, next: &mut u32) -> Command {
        let job_id = JOBS[rng.random_range(0..JOBS.len())].to_string();
        let eval = Evaluation {
            id: format!("e{next}"),
            namespace: "default".into(),
            job_id: job_id.clone(),
            ..Evaluation::default()
        };
        let existing: Vec<String> = state.allocs().map(|alloc| alloc.id.clone()).collect();
        let pick = |rng: &mut ChaCha8Rng| existing[rng.random_range(0..existing.len())].clone();
        *next += 1;
        match rng.random_range(0..10) {
            0 | 1 => Command::JobRegister {
                job: Job {
                    id: job_id.clone(),
                    name: job_id,
                    namespace: "default".into(),
                    task_groups: GROUPS
                        .iter()
                        .map(|name| TaskGroup {
                            name: (*name).into(),
                            count: 1,
                            ..TaskGroup::default()
                        })
                        .collect(),
                    ..Job::default()
                },
                eval: Some(eval),
                enforce_index: None,
            },
            2 => Command::JobStop {
                namespace: "default".into(),
                job_id,
                purge: rng.random_range(0..2) == 0,
                eval,
            },
            3 if !existing.is_empty() => Command::AllocDelete {
                alloc_ids: vec![pick(rng)],
            },
            4..=6 if !existing.is_empty() => Command::AllocClientUpdate {
                alloc_id: pick(rng),
                client_status: STATUSES[rng.random_range(0..STATUSES.len())],
            },
            _ => {
                // A new allocation or a new version of an existing one (a plan stopping it,
                // say), possibly moved to another group.
                let id = if existing.is_empty() || rng.random_range(0..2) == 0 {
                    format!("x{next}")
                } else {
                    pick(rng)
                };
                let alloc = Allocation {
                    id,
                    namespace: "default".into(),
                    job_id,
                    task_group: GROUPS[rng.random_range(0..GROUPS.len())].into(),
                    node_id: "n1".into(),
                    desired_status: [DesiredStatus::Run, DesiredStatus::Stop][rng.random_range(0..2)],
                    client_status: STATUSES[rng.random_range(0..STATUSES.len())],
                    ..Allocation::default()
                };
                Command::AllocUpsert { allocs: vec![alloc] }
            }
        }
    }

    /// Random jobs, purges, re-registrations, allocation upserts, client reports and deletes:
    /// after every entry each job's kept summary equals one counted from its allocations, and a
    /// restored state rebuilds the same.
    #[test]
    fn kept_summaries_equal_counted_ones_through_random_histories() {
        for seed in 0..100 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut state = ServerState::default();
            let mut next = 0;
            for index in 1..=120 {
                let command = random_command(&mut rng, &state, &mut next);
                let label = format!("seed {seed} entry {index}: {command:?}");
                state.apply(
                    index,
                    &Entry {
                        at_unix_ms: index,
                        command,
                    },
                );
                let restored = ServerState::restore(&state.snapshot()).unwrap();
                for job in JOBS {
                    let kept = state.job_summary("default", job);
                    assert_eq!(
                        restored.job_summary("default", job),
                        kept,
                        "restored, {label}, job {job}"
                    );
                    assert_eq!(kept, computed(&state, job), "{label}, job {job}");
                    if let Some(found) = state.job("default", job) {
                        let allocs: Vec<&Allocation> = state.job_allocs("default", job).collect();
                        assert_eq!(kept.status(found), found.status(&allocs), "{label}, job {job}");
                    }
                }
            }
            let restored = ServerState::restore(&state.snapshot()).unwrap();
            for job in JOBS {
                assert_eq!(restored.job_summary("default", job), state.job_summary("default", job));
            }
        }
    }
}
