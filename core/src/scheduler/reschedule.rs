//! Failed allocations placed again (Nomad's reschedule policy, with its defaults; the
//! `reschedule {}` stanza itself is not parsed yet).
//!
//! A service or batch allocation its client reports `failed` while the servers still want it
//! running is evaluated again (`alloc-failure`) once its reschedule delay has passed, and the
//! scheduler then stops it ("alloc was rescheduled because it failed") and places a
//! replacement. Service jobs: 30 s, doubling with every failure in a row of the same
//! allocation name, at most an hour, unlimited attempts. Batch jobs: 5 s, one attempt per
//! 24 h. System jobs are never rescheduled.
//!
//! Delays are kept on the leader's monotonic clock from the cluster time of the failure (the
//! allocation's modify time) and the cluster time of the last applied entry, like the
//! drainer's deadlines: a new leader never fires one early.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::fsm::ServerState;
use crate::structs::{Allocation, ClientStatus, JobType};
use crate::time::Instant;

pub const TRIGGER_ALLOC_FAILURE: &str = "alloc-failure";
pub const ALLOC_RESCHEDULED: &str = "alloc was rescheduled because it failed";

const SERVICE_DELAY: Duration = Duration::from_secs(30);
const SERVICE_MAX_DELAY: Duration = Duration::from_secs(3_600);
const BATCH_DELAY: Duration = Duration::from_secs(5);
const BATCH_INTERVAL: Duration = Duration::from_secs(24 * 3_600);

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

/// How long after its failure `alloc` is placed again; `None` when it never is.
pub fn delay(state: &ServerState, alloc: &Allocation, job_type: JobType) -> Option<Duration> {
    match job_type {
        JobType::System => None,
        JobType::Batch => (failures_within(state, alloc, BATCH_INTERVAL) <= 1).then_some(BATCH_DELAY),
        JobType::Service => {
            let doublings = failures_in_a_row(state, alloc).saturating_sub(1).min(16);
            Some((SERVICE_DELAY * 2u32.pow(doublings)).min(SERVICE_MAX_DELAY))
        }
    }
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
            let Some(delay) = delay(state, alloc, job.job_type) else {
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

    #[test]
    fn service_delays_double_per_failure_in_a_row_up_to_an_hour() {
        let mut state = crate::fsm::csi::tests::Fixture::new();
        let mut allocs = Vec::new();
        let mut previous: Option<String> = None;
        for i in 0..10 {
            let mut alloc = crate::fsm::csi::tests::alloc(&format!("a{i}"), "n1");
            alloc.client_status = ClientStatus::Failed;
            alloc.previous_allocation = previous.replace(alloc.id.clone());
            allocs.push(alloc);
        }
        state.ok(crate::fsm::Command::AllocUpsert { allocs: allocs.clone() });
        let delays: Vec<u64> = allocs
            .iter()
            .map(|alloc| delay(&state.state, alloc, JobType::Service).unwrap().as_secs())
            .collect();
        assert_eq!(delays, vec![30, 60, 120, 240, 480, 960, 1_920, 3_600, 3_600, 3_600]);
        assert_eq!(delay(&state.state, &allocs[0], JobType::System), None);
        assert_eq!(delay(&state.state, &allocs[0], JobType::Batch), Some(BATCH_DELAY));
        assert_eq!(
            delay(&state.state, &allocs[1], JobType::Batch),
            None,
            "one attempt a day"
        );
    }
}
