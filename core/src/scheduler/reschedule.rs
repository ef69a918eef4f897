//! Failed allocations placed again, as the group's reschedule policy says
//! ([`ReschedulePolicy`]: the `reschedule` blocks over Nomad's defaults).
//!
//! A service or batch allocation its client reports `failed` while the servers still want it
//! running is evaluated again (`alloc-failure`) once its reschedule delay has passed, and the
//! scheduler then stops it ("alloc was rescheduled because it failed") and places a
//! replacement. The delay grows with the failures in a row of the same allocation name
//! (constant, exponential or fibonacci, up to `max_delay`); unless `unlimited`, at most
//! `attempts` failures within `interval` are rescheduled. Defaults: service jobs 30 s
//! doubling up to an hour, unlimited; batch jobs 5 s, one attempt per 24 h. System jobs are
//! never rescheduled.
//!
//! Delays are kept on the leader's monotonic clock from the cluster time of the failure (the
//! allocation's modify time) and the cluster time of the last applied entry, like the
//! drainer's deadlines: a new leader never fires one early.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::fsm::ServerState;
use crate::structs::{Allocation, ClientStatus, Job};
use crate::time::Instant;

pub const ALLOC_RESCHEDULED: &str = "alloc was rescheduled because it failed";

/// The failed allocations to reschedule, and when each becomes due.
#[derive(Debug, Default)]
pub struct Reschedules {
    /// Failed allocations seen, with when they become due on this leader's clock.
    due: BTreeMap<String, Instant>,
    /// Those an evaluation was created for (until they stop qualifying).
    evaluated: BTreeSet<String>,
}

/// Failures in a row of this allocation's name: it and each predecessor that failed.
fn failures_in_a_row(state: &ServerState, alloc: &Allocation) -> u32 {
    let mut count = 1;
    let mut previous = alloc.previous_allocation.clone();
    while let Some(id) = previous {
        match state.alloc(&id) {
            Some(before) if before.client_status == ClientStatus::Failed && count < 32 => {
                count += 1;
                previous = before.previous_allocation.clone();
            }
            _ => break,
        }
    }
    count
}

/// Failures of this allocation's name within the last `window` of cluster time.
fn failures_within(state: &ServerState, alloc: &Allocation, window: Duration) -> u32 {
    let since = alloc.modify_time_ms.saturating_sub(window.as_millis() as u64);
    let mut count = 0;
    let mut current = Some(alloc.id.clone());
    while let Some(id) = current {
        match state.alloc(&id) {
            Some(before) if before.client_status == ClientStatus::Failed && before.modify_time_ms >= since => {
                count += 1;
                current = before.previous_allocation.clone();
            }
            _ => break,
        }
    }
    count
}

/// How long after its failure `alloc` of `job` is placed again; `None` when it never is.
pub fn delay(state: &ServerState, alloc: &Allocation, job: &Job) -> Option<Duration> {
    let policy = job.group(&alloc.task_group)?.reschedule_policy(job.job_type)?;
    if !policy.enabled() {
        return None;
    }
    if !policy.unlimited && failures_within(state, alloc, policy.interval) > policy.attempts {
        return None;
    }
    Some(policy.delay_after(failures_in_a_row(state, alloc)))
}

impl Reschedules {
    pub fn clear(&mut self) {
        self.due.clear();
        self.evaluated.clear();
    }

    /// Jobs (namespace, id) with a failed allocation now due, each marked evaluated; and when
    /// the next one not yet due will be.
    pub fn due_jobs(&mut self, now: Instant, state: &ServerState) -> (BTreeSet<(String, String)>, Option<Instant>) {
        let cluster_now_ms = state.last_applied_time_ms();
        let mut failed = BTreeSet::new();
        for alloc in state.failed_allocs() {
            let Some(job) = state
                .job(&alloc.namespace, &alloc.job_id)
                .filter(|job| !job.stop && super::is_scheduled(job))
            else {
                continue;
            };
            let Some(delay) = delay(state, alloc, job) else {
                continue;
            };
            failed.insert(alloc.id.clone());
            self.due.entry(alloc.id.clone()).or_insert_with(|| {
                let at_ms = alloc.modify_time_ms.saturating_add(delay.as_millis() as u64);
                crate::time::cluster_time_at(now, at_ms, cluster_now_ms)
            });
        }
        self.due.retain(|id, _| failed.contains(id));
        self.evaluated.retain(|id| failed.contains(id));
        let mut jobs = BTreeSet::new();
        let mut next = None;
        for (id, at) in &self.due {
            if *at > now {
                next = Some(next.map_or(*at, |next: Instant| next.min(*at)));
            } else if self.evaluated.insert(id.clone())
                && let Some(alloc) = state.alloc(id)
            {
                jobs.insert((alloc.namespace.clone(), alloc.job_id.clone()));
            }
        }
        (jobs, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::csi::tests::Fixture;
    use crate::structs::{DelayFunction, JobType, ReschedulePolicy, TaskGroup};

    /// `jobs` of `job_type` with `policy` on its group, and `count` allocations failed in a row.
    fn failed_in_a_row(
        job_type: JobType,
        policy: Option<ReschedulePolicy>,
        count: usize,
    ) -> (Fixture, Job, Vec<Allocation>) {
        let mut state = Fixture::new();
        let mut allocs = Vec::new();
        let mut previous: Option<String> = None;
        for i in 0..count {
            let mut alloc = crate::fsm::csi::tests::alloc(&format!("a{i}"), "n1");
            alloc.client_status = ClientStatus::Failed;
            alloc.previous_allocation = previous.replace(alloc.id.clone());
            allocs.push(alloc);
        }
        state.ok(crate::fsm::Command::AllocUpsert { allocs: allocs.clone() });
        let group = allocs[0].task_group.clone();
        let job = Job {
            job_type,
            task_groups: vec![TaskGroup {
                name: group,
                reschedule_policy: policy,
                ..TaskGroup::default()
            }],
            ..Job::default()
        };
        (state, job, allocs)
    }

    fn delays(state: &Fixture, job: &Job, allocs: &[Allocation]) -> Vec<Option<u64>> {
        allocs
            .iter()
            .map(|alloc| delay(&state.state, alloc, job).map(|delay| delay.as_secs()))
            .collect()
    }

    #[test]
    fn service_delays_double_per_failure_in_a_row_up_to_an_hour() {
        let (state, job, allocs) = failed_in_a_row(JobType::Service, None, 10);
        let hour = Some(3_600);
        assert_eq!(
            delays(&state, &job, &allocs),
            [
                Some(30),
                Some(60),
                Some(120),
                Some(240),
                Some(480),
                Some(960),
                Some(1_920),
                hour,
                hour,
                hour
            ]
        );
        let (state, job, allocs) = failed_in_a_row(JobType::System, None, 1);
        assert_eq!(delays(&state, &job, &allocs), [None]);
        let (state, job, allocs) = failed_in_a_row(JobType::Batch, None, 2);
        assert_eq!(delays(&state, &job, &allocs), [Some(5), None], "one attempt a day");
    }

    /// A written policy is what decides: its delay function and ceiling, and its attempts
    /// within its interval; `attempts = 0` without `unlimited` turns rescheduling off.
    #[test]
    fn a_groups_policy_decides_the_delay_and_the_attempts() {
        let fibonacci = ReschedulePolicy {
            attempts: 0,
            interval: Duration::ZERO,
            delay: Duration::from_secs(10),
            delay_function: DelayFunction::Fibonacci,
            max_delay: Duration::from_secs(60),
            unlimited: true,
        };
        let (state, job, allocs) = failed_in_a_row(JobType::Service, Some(fibonacci), 7);
        assert_eq!(
            delays(&state, &job, &allocs),
            [Some(10), Some(10), Some(20), Some(30), Some(50), Some(60), Some(60)]
        );
        let three_an_hour = ReschedulePolicy {
            attempts: 3,
            interval: Duration::from_secs(3_600),
            delay: Duration::from_secs(15),
            delay_function: DelayFunction::Constant,
            max_delay: Duration::ZERO,
            unlimited: false,
        };
        let (state, job, allocs) = failed_in_a_row(JobType::Batch, Some(three_an_hour), 4);
        assert_eq!(delays(&state, &job, &allocs), [Some(15), Some(15), Some(15), None]);
        let off = ReschedulePolicy {
            attempts: 0,
            unlimited: false,
            ..three_an_hour
        };
        let (state, job, allocs) = failed_in_a_row(JobType::Service, Some(off), 1);
        assert_eq!(delays(&state, &job, &allocs), [None]);
    }
}
