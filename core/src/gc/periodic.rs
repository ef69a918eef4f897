//! The leader's periodic garbage collection (Nomad's core GC jobs: `eval-gc`, `job-gc`,
//! `node-gc`, `deployment-gc`, each every 5 minutes by default): what has been finished longer
//! than its [`GcThresholds`] is removed in one `SystemGc` entry. The state machine checks each
//! object again when the entry applies, so a job registered again, an allocation still
//! running or a node that came back meanwhile stays. A new leader waits a whole interval
//! before its first pass.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::fsm::{Command, ServerState};
use crate::time::Instant;

pub use crate::config::CoreGcConfig;

#[derive(Debug, Default)]
pub struct PeriodicGc {
    config: CoreGcConfig,
    /// The next pass; `None` while not the leader.
    next_at: Option<Instant>,
    in_flight: bool,
}

impl PeriodicGc {
    pub fn new(config: CoreGcConfig) -> Self {
        PeriodicGc {
            config,
            ..PeriodicGc::default()
        }
    }

    pub fn set_enabled(&mut self, now: Instant, leader: bool) {
        self.next_at = leader.then(|| now + self.config.interval);
        self.in_flight = false;
    }

    /// The `SystemGc` to propose, when a pass is due and finds garbage.
    pub fn run(&mut self, now: Instant, state: &ServerState) -> Option<Command> {
        let at = self.next_at?;
        if self.in_flight || now < at {
            return None;
        }
        self.next_at = Some(now + self.config.interval);
        let garbage = super::collect_older(state, &self.config.thresholds);
        if garbage.is_empty() {
            return None;
        }
        tracing::info!(
            allocs = garbage.allocs.len(),
            evals = garbage.evals.len(),
            jobs = garbage.jobs.len(),
            deployments = garbage.deployments.len(),
            nodes = garbage.nodes.len(),
            "periodic garbage collection"
        );
        self.in_flight = true;
        Some(Command::SystemGc { garbage })
    }

    /// The proposal was applied (or failed).
    pub fn proposed(&mut self) {
        self.in_flight = false;
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_at.filter(|_| !self.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::csi::tests::Fixture;
    use crate::gc::GcThresholds;
    use crate::structs::{Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType};
    use core::time::Duration;

    fn world() -> Fixture {
        let mut fx = Fixture::new();
        let stopped = Job {
            id: "old".into(),
            namespace: "default".into(),
            job_type: JobType::Service,
            stop: true,
            ..Job::default()
        };
        fx.ok(Command::JobUpsert { job: stopped });
        let eval = Evaluation {
            id: "e1".into(),
            namespace: "default".into(),
            job_id: "old".into(),
            eval_type: JobType::Service,
            status: EvalStatus::Complete,
            ..Evaluation::default()
        };
        fx.ok(Command::EvalUpsert { evals: vec![eval] });
        let alloc = Allocation {
            id: "a1".into(),
            namespace: "default".into(),
            job_id: "old".into(),
            eval_id: "e1".into(),
            desired_status: DesiredStatus::Stop,
            client_status: ClientStatus::Complete,
            ..Allocation::default()
        };
        fx.ok(Command::AllocUpsert { allocs: vec![alloc] });
        fx
    }

    /// Cluster time moves on `secs` (an entry applied that much later).
    fn later(fx: &mut Fixture, secs: u64) {
        fx.index += secs;
        fx.ok(Command::EvalUpsert { evals: Vec::new() });
    }

    #[test]
    fn every_interval_the_leader_removes_what_is_older_than_its_threshold() {
        let config = CoreGcConfig {
            interval: Duration::from_secs(60),
            thresholds: GcThresholds {
                eval: Duration::from_secs(30),
                job: Duration::from_secs(120),
                ..GcThresholds::default()
            },
        };
        let mut fx = world();
        let mut gc = PeriodicGc::new(config);
        let t0 = Instant::from_millis(5_000);
        assert_eq!(gc.run(t0, &fx.state), None, "not the leader");
        gc.set_enabled(t0, true);
        assert_eq!(gc.poll_timeout(), Some(t0 + Duration::from_secs(60)));
        assert_eq!(gc.run(t0, &fx.state), None, "a whole interval first");

        // 40 s on: the evaluation and its allocation are old enough, the stopped job not yet.
        later(&mut fx, 40);
        let t1 = t0 + Duration::from_secs(60);
        let Some(Command::SystemGc { garbage }) = gc.run(t1, &fx.state) else {
            panic!("a pass with garbage")
        };
        assert_eq!(
            (garbage.allocs.clone(), garbage.evals.clone()),
            (vec!["a1".into()], vec!["e1".into()])
        );
        assert!(garbage.jobs.is_empty(), "the job waits for its own threshold");
        assert_eq!(gc.poll_timeout(), None, "one pass in flight");
        fx.ok(Command::SystemGc { garbage });
        gc.proposed();
        assert!(fx.state.alloc("a1").is_none() && fx.state.eval("e1").is_none());

        // Later still: the job goes too; then there is nothing left and nothing is proposed.
        later(&mut fx, 120);
        let t2 = t1 + Duration::from_secs(60);
        let Some(Command::SystemGc { garbage }) = gc.run(t2, &fx.state) else {
            panic!("the job's pass")
        };
        assert_eq!(garbage.jobs, vec![("default".to_string(), "old".to_string())]);
        fx.ok(Command::SystemGc { garbage });
        gc.proposed();
        assert!(fx.state.job("default", "old").is_none());
        assert_eq!(gc.run(t2 + Duration::from_secs(60), &fx.state), None);

        // Nomad's defaults keep an hour-old finish.
        let mut fx = world();
        later(&mut fx, 600);
        assert!(crate::gc::collect_older(&fx.state, &GcThresholds::default()).is_empty());
        assert!(
            !crate::gc::collect(&fx.state).is_empty(),
            "a forced GC takes it at once"
        );
    }
}
