//! Allocation health for deployments (Nomad's `allochealth.Tracker` and the alloc runner's
//! health hook), on the client.
//!
//! An allocation placed by a deployment is watched from when the client first hears of it in
//! that deployment (a new one after an in-place update into a later deployment):
//! - it is **healthy** once every main task (no lifecycle hook, or a sidecar) has been running
//!   without a break for `min_healthy_time`, and every prestart task that is not a sidecar has
//!   completed successfully;
//! - it is **unhealthy** as soon as a task fails, or when `healthy_deadline` passes first.
//!
//! A task that restarts starts the `min_healthy_time` wait over. The verdict is reported once,
//! with the allocation's status (`Node.UpdateAlloc`'s `DeploymentStatus`), and never changes
//! within its deployment. `health_check = "manual"` is left to operators. With `checks` (the
//! default) every Consul check of the allocation's services must also be `passing`, read by
//! [`check_poll`](crate::client::check_poll): `min_healthy_time` counts from when both tasks
//! and checks are healthy, and starts over when either stops being so. A failing check alone
//! never makes the allocation unhealthy (it may yet pass); `healthy_deadline` does, as in
//! Nomad. An allocation whose services have no checks is judged on its tasks alone.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::structs::{
    AllocDeploymentStatus, Allocation, ClientStatus, HEALTH_CHECK_CHECKS, HEALTH_CHECK_MANUAL, LIFECYCLE_PRESTART,
    TaskGroup, TaskState, TaskStatus,
};
use crate::time::Instant;

/// A Consul check's status when it passes.
pub const CHECK_PASSING: &str = "passing";

#[derive(Clone, Debug, PartialEq, Eq)]
struct Watch {
    deployment_id: String,
    min_healthy_time: Duration,
    /// `health_check = "checks"`: the allocation's Consul checks count too.
    checks: bool,
    /// When the allocation must be healthy by.
    deadline: Instant,
    /// Since when every main task has been running.
    running_since: Option<Instant>,
    /// The verdict, and when it was reached.
    verdict: Option<(bool, Instant)>,
}

/// The watched allocations by id.
#[derive(Clone, Debug, Default)]
pub struct HealthTracker {
    watches: BTreeMap<String, Watch>,
    /// The Consul agent's check statuses by check id, as last read.
    check_statuses: BTreeMap<String, String>,
}

/// What the allocation's tasks say about its health now: `Some(false)` failed, `Some(true)`
/// every main task running, `None` not (yet) all running.
fn tasks_health(group: &TaskGroup, status: ClientStatus, states: &BTreeMap<String, TaskState>) -> Option<bool> {
    if status == ClientStatus::Failed || states.values().any(|state| state.failed) {
        return Some(false);
    }
    let all_up = group.tasks.iter().all(|task| {
        let state = states.get(&task.name);
        match &task.lifecycle {
            Some(lifecycle) if lifecycle.hook == LIFECYCLE_PRESTART && !lifecycle.sidecar => {
                state.is_some_and(|state| state.state == TaskStatus::Dead && !state.failed)
            }
            Some(lifecycle) if !lifecycle.sidecar => true,
            _ => state.is_some_and(|state| state.state == TaskStatus::Running),
        }
    });
    all_up.then_some(true)
}

impl HealthTracker {
    /// Starts watching `alloc` when it belongs to a deployment whose health the client judges
    /// and no verdict is known for it in that deployment; forgets a watch of an earlier one.
    pub fn watch(&mut self, now: Instant, alloc: &Allocation, group: Option<&TaskGroup>) {
        let known = alloc
            .deployment_status
            .as_ref()
            .is_some_and(|status| status.healthy.is_some());
        let strategy = group.and_then(TaskGroup::rolling_update);
        let wanted = !alloc.deployment_id.is_empty()
            && !alloc.terminal()
            && strategy.is_some_and(|strategy| strategy.health_check != HEALTH_CHECK_MANUAL);
        if !wanted {
            self.watches.remove(&alloc.id);
            return;
        }
        match self.watches.get(&alloc.id) {
            Some(watch) if watch.deployment_id == alloc.deployment_id => return,
            Some(_) => {
                self.watches.remove(&alloc.id);
            }
            None => {}
        }
        if known {
            // Decided in this deployment before (by this agent before a restart, or by an
            // operator).
            return;
        }
        let Some(strategy) = strategy else { return };
        self.watches.insert(
            alloc.id.clone(),
            Watch {
                deployment_id: alloc.deployment_id.clone(),
                min_healthy_time: strategy.min_healthy_time,
                checks: strategy.health_check == HEALTH_CHECK_CHECKS,
                deadline: now + strategy.healthy_deadline,
                running_since: None,
                verdict: None,
            },
        );
    }

    /// The allocation's tasks changed, its checks were read (or time passed): returns whether
    /// a verdict was reached. `checks` are the ids of the checks its services register.
    pub fn observe(
        &mut self,
        now: Instant,
        alloc_id: &str,
        group: &TaskGroup,
        status: ClientStatus,
        states: &BTreeMap<String, TaskState>,
        checks: &BTreeSet<String>,
    ) -> bool {
        let Some(watch) = self.watches.get_mut(alloc_id) else {
            return false;
        };
        if watch.verdict.is_some() {
            return false;
        }
        let statuses = &self.check_statuses;
        let checks_passing = !watch.checks
            || checks
                .iter()
                .all(|id| statuses.get(id).is_some_and(|status| status == CHECK_PASSING));
        match tasks_health(group, status, states) {
            Some(false) => watch.verdict = Some((false, now)),
            Some(true) if !checks_passing => {
                crate::cover::point("deployment health: tasks up, consul checks not yet passing");
                watch.running_since = None;
            }
            Some(true) => {
                let since = *watch.running_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= watch.min_healthy_time {
                    watch.verdict = Some((true, now));
                }
            }
            None => watch.running_since = None,
        }
        if watch.verdict.is_none() && now >= watch.deadline {
            watch.verdict = Some((false, now));
        }
        watch.verdict.is_some()
    }

    /// Whether some undecided allocation waits on its Consul checks.
    pub fn wants_checks(&self) -> bool {
        self.watches
            .values()
            .any(|watch| watch.checks && watch.verdict.is_none())
    }

    /// The check statuses just read; returns the undecided allocations to judge again.
    pub fn set_check_statuses(&mut self, statuses: BTreeMap<String, String>) -> Vec<String> {
        self.check_statuses = statuses;
        self.watches
            .iter()
            .filter(|(_, watch)| watch.checks && watch.verdict.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// When a watch next has something to decide: its tasks' `min_healthy_time` passing, or
    /// its deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.watches
            .values()
            .filter(|watch| watch.verdict.is_none())
            .map(|watch| match watch.running_since {
                Some(since) => (since + watch.min_healthy_time).min(watch.deadline),
                None => watch.deadline,
            })
            .min()
    }

    /// Allocations with a decision due at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.watches
            .iter()
            .filter(|(_, watch)| watch.verdict.is_none())
            .filter(|(_, watch)| {
                now >= watch.deadline
                    || watch
                        .running_since
                        .is_some_and(|since| now >= since + watch.min_healthy_time)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The verdict to report, stamped with the client's wall clock (`wall_epoch` + `Instant`).
    pub fn status(&self, alloc_id: &str, wall_epoch: i64) -> Option<AllocDeploymentStatus> {
        let (healthy, at) = self.watches.get(alloc_id)?.verdict?;
        let unix_nanos = wall_epoch.saturating_add(at.as_nanos() as i64);
        Some(AllocDeploymentStatus {
            healthy: Some(healthy),
            timestamp_ms: (unix_nanos.max(0) / 1_000_000) as u64,
            ..AllocDeploymentStatus::default()
        })
    }

    pub fn forget(&mut self, alloc_id: &str) {
        self.watches.remove(alloc_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{Task, TaskLifecycle, UpdateStrategy};

    fn group() -> TaskGroup {
        TaskGroup {
            name: "g".into(),
            tasks: vec![
                Task {
                    name: "init".into(),
                    lifecycle: Some(TaskLifecycle {
                        hook: LIFECYCLE_PRESTART.into(),
                        sidecar: false,
                    }),
                    ..Task::default()
                },
                Task {
                    name: "main".into(),
                    ..Task::default()
                },
            ],
            update: Some(alloc::boxed::Box::new(UpdateStrategy {
                min_healthy_time: Duration::from_secs(10),
                healthy_deadline: Duration::from_secs(60),
                ..UpdateStrategy::default()
            })),
            ..TaskGroup::default()
        }
    }

    fn alloc(deployment: &str) -> Allocation {
        Allocation {
            id: "a".into(),
            task_group: "g".into(),
            deployment_id: deployment.into(),
            ..Allocation::default()
        }
    }

    fn states(init: TaskStatus, main: TaskStatus, failed: bool) -> BTreeMap<String, TaskState> {
        BTreeMap::from([
            (
                "init".to_string(),
                TaskState {
                    state: init,
                    ..TaskState::default()
                },
            ),
            (
                "main".to_string(),
                TaskState {
                    state: main,
                    failed,
                    ..TaskState::default()
                },
            ),
        ])
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn at(secs: u64) -> Instant {
        Instant::from_millis(secs * 1_000)
    }

    #[test]
    fn healthy_after_min_healthy_time_of_running_restarts_start_over() {
        let (group, alloc) = (group(), alloc("d1"));
        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        let running = states(TaskStatus::Dead, TaskStatus::Running, false);
        let pending = states(TaskStatus::Dead, TaskStatus::Pending, false);
        assert!(!tracker.observe(at(1), "a", &group, ClientStatus::Running, &running, &none()));
        assert_eq!(tracker.poll_timeout(), Some(at(11)));
        // A restart at 5 s: the wait starts over when it runs again.
        assert!(!tracker.observe(at(5), "a", &group, ClientStatus::Running, &pending, &none()));
        assert!(!tracker.observe(at(6), "a", &group, ClientStatus::Running, &running, &none()));
        assert!(tracker.due(at(11)).is_empty());
        assert_eq!(tracker.due(at(16)), vec!["a".to_string()]);
        assert!(tracker.observe(at(16), "a", &group, ClientStatus::Running, &running, &none()));
        let status = tracker.status("a", 1_000_000_000).unwrap();
        assert_eq!((status.healthy, status.timestamp_ms), (Some(true), 17_000));
        // The verdict stays.
        assert!(!tracker.observe(at(17), "a", &group, ClientStatus::Failed, &running, &none()));
    }

    #[test]
    fn a_failed_task_or_the_deadline_makes_it_unhealthy() {
        let (group, alloc) = (group(), alloc("d1"));
        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        let failed = states(TaskStatus::Dead, TaskStatus::Dead, true);
        assert!(tracker.observe(at(3), "a", &group, ClientStatus::Failed, &failed, &none()));
        assert_eq!(tracker.status("a", 0).unwrap().healthy, Some(false));

        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        // The prestart task never completes: not healthy, and at the deadline unhealthy.
        let stuck = states(TaskStatus::Running, TaskStatus::Pending, false);
        assert!(!tracker.observe(at(30), "a", &group, ClientStatus::Pending, &stuck, &none()));
        assert_eq!(tracker.poll_timeout(), Some(at(60)));
        assert!(tracker.observe(at(60), "a", &group, ClientStatus::Pending, &stuck, &none()));
        assert_eq!(tracker.status("a", 0).unwrap().healthy, Some(false));
    }

    #[test]
    fn a_new_deployment_is_watched_afresh_and_a_known_verdict_is_not_watched() {
        let group = group();
        let mut tracker = HealthTracker::default();
        let mut alloc = alloc("d1");
        tracker.watch(at(0), &alloc, Some(&group));
        let running = states(TaskStatus::Dead, TaskStatus::Running, false);
        tracker.observe(at(1), "a", &group, ClientStatus::Running, &running, &none());
        assert!(tracker.observe(at(11), "a", &group, ClientStatus::Running, &running, &none()));
        // The servers recorded it; then an in-place update moves it into d2.
        alloc.deployment_status = Some(tracker.status("a", 0).unwrap());
        tracker.watch(at(12), &alloc, Some(&group));
        assert!(
            tracker.status("a", 0).is_some(),
            "the verdict in d1 is kept while in d1"
        );
        alloc.deployment_id = "d2".into();
        alloc.deployment_status = None;
        tracker.watch(at(20), &alloc, Some(&group));
        assert_eq!(tracker.status("a", 0), None);
        assert!(!tracker.observe(at(21), "a", &group, ClientStatus::Running, &running, &none()));
        assert!(tracker.observe(at(31), "a", &group, ClientStatus::Running, &running, &none()));
        // Without a deployment, nothing is watched.
        let mut plain = alloc.clone();
        plain.deployment_id.clear();
        let mut other = HealthTracker::default();
        other.watch(at(0), &plain, Some(&group));
        assert_eq!(other.poll_timeout(), None);
    }

    #[test]
    fn with_checks_every_check_must_pass_for_min_healthy_time() {
        let (group, alloc) = (group(), alloc("d1"));
        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        assert!(tracker.wants_checks());
        let running = states(TaskStatus::Dead, TaskStatus::Running, false);
        let checks = BTreeSet::from(["c1".to_string(), "c2".to_string()]);
        let read = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(id, status)| (id.to_string(), status.to_string()))
                .collect()
        };
        // Tasks up, but nothing read yet, then one check critical: not healthy, not failed.
        assert!(!tracker.observe(at(1), "a", &group, ClientStatus::Running, &running, &checks));
        assert_eq!(
            tracker.set_check_statuses(read(&[("c1", "passing"), ("c2", "critical")])),
            vec!["a"]
        );
        assert!(!tracker.observe(at(2), "a", &group, ClientStatus::Running, &running, &checks));
        assert!(tracker.due(at(12)).is_empty(), "the wait has not started");
        // Both pass from 5 s; a warning at 8 s starts the wait over from 9 s.
        tracker.set_check_statuses(read(&[("c1", "passing"), ("c2", "passing")]));
        assert!(!tracker.observe(at(5), "a", &group, ClientStatus::Running, &running, &checks));
        tracker.set_check_statuses(read(&[("c1", "passing"), ("c2", "warning")]));
        assert!(!tracker.observe(at(8), "a", &group, ClientStatus::Running, &running, &checks));
        tracker.set_check_statuses(read(&[("c1", "passing"), ("c2", "passing")]));
        assert!(!tracker.observe(at(9), "a", &group, ClientStatus::Running, &running, &checks));
        assert!(!tracker.observe(at(15), "a", &group, ClientStatus::Running, &running, &checks));
        assert!(tracker.observe(at(19), "a", &group, ClientStatus::Running, &running, &checks));
        assert_eq!(tracker.status("a", 0).unwrap().healthy, Some(true));
        assert!(!tracker.wants_checks(), "decided: no more reads");

        // Checks that never pass: unhealthy at the deadline.
        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        tracker.set_check_statuses(read(&[("c1", "critical")]));
        assert!(!tracker.observe(at(30), "a", &group, ClientStatus::Running, &running, &checks));
        assert!(tracker.observe(at(60), "a", &group, ClientStatus::Running, &running, &checks));
        assert_eq!(tracker.status("a", 0).unwrap().healthy, Some(false));

        // `task_states` ignores checks.
        let mut group = group.clone();
        group.update.as_mut().unwrap().health_check = crate::structs::HEALTH_CHECK_TASK_STATES.into();
        let mut tracker = HealthTracker::default();
        tracker.watch(at(0), &alloc, Some(&group));
        assert!(!tracker.wants_checks());
        assert!(!tracker.observe(at(1), "a", &group, ClientStatus::Running, &running, &checks));
        assert!(tracker.observe(at(11), "a", &group, ClientStatus::Running, &running, &checks));
    }
}
