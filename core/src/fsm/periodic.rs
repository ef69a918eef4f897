//! Periodic launches in the state store: each periodic parent's last launch, recorded in the
//! same entry that registers its child, so whichever leader proposes a launch, a time is
//! launched at most once and a launch is recorded exactly when its child exists.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use crate::structs::{Job, PeriodicLaunch};

impl ServerState {
    /// A periodic parent registered with a new spec (or started again): its schedule counts
    /// from now, as Nomad's dispatcher does when a job is added, so nothing the spec named
    /// while the job was stopped or different is launched late.
    pub(super) fn periodic_registered(&mut self, index: u64, at_ms: u64, job: &Job) {
        if !job.is_periodic_active() {
            return;
        }
        let key = (job.namespace.clone(), job.id.clone());
        let launch = match self.periodic_launches.get(&key) {
            Some(old) => PeriodicLaunch {
                launch_ms: old.launch_ms.max(at_ms),
                previous_ms: old.launch_ms,
                modify_index: index,
                ..old.clone()
            },
            None => PeriodicLaunch {
                launch_ms: at_ms,
                previous_ms: 0,
                create_index: index,
                modify_index: index,
            },
        };
        self.periodic_launches.insert(key, launch);
        self.touch(Table::PeriodicLaunches, index);
    }

    /// A purged parent's launch record goes with it.
    pub(super) fn forget_periodic(&mut self, namespace: &str, job_id: &str) {
        self.periodic_launches
            .delete(&(namespace.to_string(), job_id.to_string()));
    }

    pub(super) fn apply_periodic_launch(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        let Command::PeriodicLaunch {
            namespace,
            job_id,
            launch_ms,
            forced,
            child,
            ..
        } = command
        else {
            unreachable!("{} is not routed here", command.name());
        };
        let key = (namespace.clone(), job_id.clone());
        match self.jobs.get(&key) {
            None => return Response::Error(ErrorKind::NotFound, format!("job {job_id:?} not found")),
            Some(job) if !job.is_periodic_active() => {
                return Response::Error(
                    ErrorKind::Refused,
                    format!("job {job_id:?} is not an active periodic job"),
                );
            }
            Some(_) => {}
        }
        let last = self.periodic_launches.get(&key).cloned();
        if !forced
            && let Some(last) = &last
            && last.launch_ms >= *launch_ms
        {
            return Response::Error(
                ErrorKind::Refused,
                format!("periodic job {job_id:?} already launched at {} ms", last.launch_ms),
            );
        }
        // A child of that second may exist already: a scheduled launch then counts as done
        // by it (an operator forced one in that second); a forced launch registers it again
        // with a new evaluation, as Nomad's re-register of the derived job does.
        let child = child
            .as_ref()
            .filter(|child| *forced || !self.jobs.contains_key(&(namespace.clone(), child.0.id.clone())));
        let launch = match last {
            Some(last) => PeriodicLaunch {
                launch_ms: last.launch_ms.max(*launch_ms),
                previous_ms: last.launch_ms,
                modify_index: index,
                ..last
            },
            None => PeriodicLaunch {
                launch_ms: *launch_ms,
                previous_ms: 0,
                create_index: index,
                modify_index: index,
            },
        };
        self.periodic_launches.insert(key, launch);
        self.touch(Table::PeriodicLaunches, index);
        if let Some(child) = child {
            let (job, eval) = &**child;
            return self.register_job(index, at_ms, job, Some(eval));
        }
        Response::Done
    }

    /// The last launch of a periodic parent.
    pub fn periodic_launch(&self, namespace: &str, job_id: &str) -> Option<&PeriodicLaunch> {
        self.periodic_launches.get(&(namespace.to_string(), job_id.to_string()))
    }

    /// Every periodic parent's last launch, by (namespace, job id).
    pub fn periodic_launches(&self) -> impl Iterator<Item = (&(String, String), &PeriodicLaunch)> {
        self.periodic_launches.iter()
    }

    /// The children a periodic (or parameterized) parent launched, by ID.
    pub fn children<'a>(&'a self, namespace: &str, parent_id: &str) -> impl Iterator<Item = &'a Job> + use<'a> {
        let (namespace, parent) = (namespace.to_string(), parent_id.to_string());
        let prefix = format!("{parent}/");
        self.jobs
            .range((namespace.clone(), prefix.clone())..)
            .take_while(move |((ns, id), _)| *ns == namespace && id.starts_with(&prefix))
            .map(|(_, job)| job)
            .filter(move |job| job.parent_id == parent)
    }

    /// Nomad's job status of a stored job.
    pub fn job_status(&self, job: &Job) -> &'static str {
        self.job_summary(&job.namespace, &job.id).status(job)
    }

    /// Nomad's `JobChildrenSummary`: the parent's children by status (pending, running,
    /// dead).
    pub fn children_summary(&self, namespace: &str, parent_id: &str) -> (u32, u32, u32) {
        let mut counts = (0, 0, 0);
        for child in self.children(namespace, parent_id) {
            match self.job_status(child) {
                "pending" => counts.0 += 1,
                "running" => counts.1 += 1,
                _ => counts.2 += 1,
            }
        }
        counts
    }

    /// Whether a child of the parent has not finished (what `prohibit_overlap` waits for).
    pub fn running_children(&self, namespace: &str, parent_id: &str) -> bool {
        self.children(namespace, parent_id)
            .any(|child| self.job_status(child) != "dead")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::Entry;
    use crate::structs::{Evaluation, JobType, PeriodicConfig, TaskGroup};

    fn parent() -> Job {
        Job {
            id: "report".into(),
            namespace: "default".into(),
            job_type: JobType::Batch,
            task_groups: vec![TaskGroup {
                name: "g".into(),
                count: 1,
                ..TaskGroup::default()
            }],
            periodic: Some(alloc::boxed::Box::new(PeriodicConfig {
                spec: "* * * * *".into(),
                ..PeriodicConfig::default()
            })),
            ..Job::default()
        }
    }

    /// A state with the parent registered at `at_ms`.
    fn registered(at_ms: u64) -> (ServerState, Job) {
        let mut state = ServerState::default();
        let job = parent();
        let register = Command::JobRegister {
            job: job.clone(),
            eval: None,
            enforce_index: None,
        };
        assert_eq!(apply(&mut state, at_ms, register), Response::Done);
        (state, job)
    }

    fn stop(purge: bool) -> Command {
        Command::JobStop {
            namespace: "default".into(),
            job_id: "report".into(),
            purge,
            eval: Evaluation::default(),
        }
    }

    fn last_launch(state: &ServerState) -> Option<u64> {
        state
            .periodic_launch("default", "report")
            .map(|launch| launch.launch_ms)
    }

    fn apply(state: &mut ServerState, at_ms: u64, command: Command) -> Response {
        let index = state.last_applied().map_or(1, |last| last + 1);
        state.apply(
            index,
            &Entry {
                at_unix_ms: at_ms,
                command,
            },
        )
    }

    fn launch(job: &Job, launch_ms: u64, forced: bool) -> Command {
        let child = job.periodic_child(launch_ms);
        let eval = Evaluation {
            id: format!("eval-{launch_ms}"),
            namespace: "default".into(),
            job_id: child.id.clone(),
            ..Evaluation::default()
        };
        Command::PeriodicLaunch {
            namespace: "default".into(),
            job_id: job.id.clone(),
            launch_ms,
            forced,
            skipped: 0,
            child: Some(alloc::boxed::Box::new((child, eval))),
        }
    }

    #[test]
    fn a_registered_parent_counts_from_its_registration_and_has_no_evaluation() {
        let (state, _) = registered(60_500);
        assert_eq!(last_launch(&state), Some(60_500));
        assert_eq!(state.evals().count(), 0);
        assert_eq!(state.job_status(state.job("default", "report").unwrap()), "running");
    }

    #[test]
    fn a_time_is_launched_once_whoever_proposes_it() {
        let (mut state, job) = registered(1_000);
        assert_eq!(apply(&mut state, 120_100, launch(&job, 120_000, false)), Response::Done);
        let child = state.job("default", "report/periodic-120").expect("child registered");
        assert_eq!(child.parent_id, "report");
        assert!(child.periodic.is_none());
        assert_eq!(state.evals().count(), 1);
        // A second leader proposing the same time, or an earlier one, is refused.
        for at in [120_000, 60_000] {
            let response = apply(&mut state, 121_000, launch(&job, at, false));
            assert!(
                matches!(response, Response::Error(ErrorKind::Refused, _)),
                "{response:?}"
            );
        }
        assert_eq!(state.children("default", "report").count(), 1);
        assert_eq!(last_launch(&state), Some(120_000));
    }

    #[test]
    fn a_forced_launch_moves_the_schedule_on_and_shares_a_second_with_a_scheduled_one() {
        let (mut state, job) = registered(1_000);
        assert_eq!(apply(&mut state, 90_000, launch(&job, 90_000, true)), Response::Done);
        assert_eq!(last_launch(&state), Some(90_000));
        // Forced again in the same second: the same child, evaluated again.
        assert_eq!(apply(&mut state, 90_400, launch(&job, 90_400, true)), Response::Done);
        assert_eq!(state.children("default", "report").count(), 1);
        assert!(state.eval("eval-90400").is_some());
        assert!(state.running_children("default", "report"), "the pending child runs");
        // A scheduled launch in a second a forced one took counts as launched by it.
        let (mut state, _) = registered(1_000);
        apply(&mut state, 59_100, launch(&job, 59_100, true));
        assert_eq!(apply(&mut state, 59_900, launch(&job, 59_900, false)), Response::Done);
        assert_eq!(state.children("default", "report").count(), 1);
        assert!(state.eval("eval-59900").is_none(), "no second evaluation");
        assert_eq!(last_launch(&state), Some(59_900));
    }

    #[test]
    fn a_stopped_or_purged_parent_launches_nothing() {
        let (mut state, job) = registered(1_000);
        apply(&mut state, 2_000, stop(false));
        let refused = apply(&mut state, 60_000, launch(&job, 60_000, false));
        assert!(matches!(refused, Response::Error(ErrorKind::Refused, _)), "{refused:?}");
        // Started again: counts from the new registration, not from the old launch.
        apply(
            &mut state,
            300_000,
            Command::JobRegister {
                job: job.clone(),
                eval: None,
                enforce_index: None,
            },
        );
        assert_eq!(last_launch(&state), Some(300_000));
        apply(&mut state, 301_000, stop(true));
        assert!(state.periodic_launch("default", "report").is_none());
    }

    #[test]
    fn launch_records_survive_a_snapshot() {
        let (state, _) = registered(7_000);
        let restored = ServerState::restore(&state.snapshot()).expect("restore");
        assert_eq!(last_launch(&restored), Some(7_000));
    }
}
