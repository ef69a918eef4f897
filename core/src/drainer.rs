//! The node drainer on the leader (Nomad's `nomad/drainer/`).
//!
//! A drain (`Node.UpdateDrain`) makes its node ineligible; the drainer then moves what runs
//! there by marking allocations `desired_transition.migrate` with an evaluation for each job,
//! and the scheduler stops them and places replacements on eligible nodes (which take their
//! volumes over once the old allocation has stopped). In order:
//!
//! 1. **Service jobs**, a task group at a time within its `migrate { max_parallel }`: a group
//!    loses at most `max_parallel` allocations below its count while replacements start
//!    (Nomad's `healthy - (count - max_parallel)`; an allocation counts as healthy when it
//!    runs, is not being migrated and is not stopping).
//! 2. **Batch jobs** are left to finish; they are migrated only when the deadline passes.
//! 3. **System jobs and CSI plugin jobs** last: only once every other allocation on the node
//!    has finished *and* every volume claim those allocations held on the node is past its
//!    node detach. The node plugin is what unpublishes and unstages those volumes; stopping it
//!    first strands the claims (Nomad #8232, #8080, fixed upstream by draining plugins last,
//!    #12324). With `ignore_system_jobs` they stay.
//! 4. When nothing is left (system jobs finished or ignored), the drain is complete: the
//!    strategy is cleared with the `Node drain complete` event and the node stays ineligible.
//!
//! At the deadline (`-1`: at once) every remaining allocation but the system and plugin ones is
//! migrated regardless of `max_parallel`, and the system and plugin ones no longer wait for
//! claims to be released — only for the other allocations to finish.
//!
//! Deadlines are kept on the leader's monotonic clock: from the strategy's cluster-time
//! deadline minus the cluster time of the last applied entry, when the leader first sees the
//! drain. A new leader therefore never fires a deadline early.
//!
//! One proposal at a time, like the scheduler worker; the drainer runs on every input of the
//! leader's core and sets a timer only for deadlines.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::fsm::{Command, ServerState};
use crate::structs::{Allocation, ClaimState, DesiredStatus, DesiredTransition, EvalStatus, Evaluation, JobType, Node};
use crate::time::Instant;

#[derive(Debug, Default)]
pub struct Drainer {
    enabled: bool,
    in_flight: bool,
    /// Monotonic deadlines of draining nodes that have one; `None` once passed.
    deadlines: BTreeMap<String, Option<Instant>>,
    /// Nomad #8232 re-created on purpose (`CsiFaults::drain_plugins_before_release`).
    plugins_before_release: bool,
}

/// Whether an allocation belongs to the group drained last: system jobs and CSI plugin jobs.
fn drained_last(state: &ServerState, alloc: &Allocation) -> bool {
    state
        .job(&alloc.namespace, &alloc.job_id)
        .is_some_and(|job| job.job_type == JobType::System || job.is_plugin())
}

/// Whether every claim held on `node` by allocations other than `keep` (the plugin and system
/// allocations) is past its node detach: the node plugin has nothing left to unpublish there.
pub fn consumers_released(state: &ServerState, node: &Node, keep: &BTreeSet<&str>) -> bool {
    state.volumes_on_node(&node.id).iter().all(|(namespace, id)| {
        state.volume_raw(namespace, id).is_none_or(|volume| {
            // A release in progress is tracked by the allocation's past claim; its read or
            // write claim stays `taken` until the volume is freed.
            volume
                .read_claims
                .values()
                .chain(volume.write_claims.values())
                .chain(volume.past_claims.values())
                .filter(|claim| claim.node_id == node.id && !keep.contains(claim.allocation_id.as_str()))
                .map(|claim| volume.past_claims.get(&claim.allocation_id).unwrap_or(claim))
                .all(|claim| !matches!(claim.state, ClaimState::Taken | ClaimState::Unpublishing))
        })
    })
}

impl Drainer {
    pub fn new() -> Self {
        Drainer::default()
    }

    /// A drainer with the historical defects `faults` switches on.
    pub fn with_faults(faults: crate::config::CsiFaults) -> Self {
        Drainer {
            plugins_before_release: faults.drain_plugins_before_release,
            ..Drainer::default()
        }
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.in_flight = false;
        self.deadlines.clear();
    }

    /// The next deadline to wake up for.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        self.deadlines.values().flatten().copied().min()
    }

    /// The previous proposal was applied (or failed).
    pub fn proposed(&mut self) {
        self.in_flight = false;
    }

    /// One step; returns the command to propose, if any. `new_id` hands out evaluation ids.
    pub fn run(&mut self, now: Instant, state: &ServerState, new_id: &mut dyn FnMut() -> String) -> Option<Command> {
        if !self.enabled {
            return None;
        }
        self.track_deadlines(now, state);
        if self.in_flight {
            return None;
        }
        let command = self.migrations(state, new_id).or_else(|| self.completion(state));
        self.in_flight = command.is_some();
        command
    }

    fn track_deadlines(&mut self, now: Instant, state: &ServerState) {
        let cluster_now_ms = state.last_applied_time_ms();
        let mut live = BTreeSet::new();
        for node in state.draining_nodes() {
            let Some(deadline_ms) = node
                .drain_strategy
                .as_ref()
                .and_then(|strategy| strategy.force_deadline_ms)
            else {
                continue;
            };
            live.insert(node.id.clone());
            let deadline = self
                .deadlines
                .entry(node.id.clone())
                .or_insert_with(|| Some(crate::time::cluster_time_at(now, deadline_ms, cluster_now_ms)));
            if deadline.is_some_and(|at| at <= now) {
                *deadline = None;
            }
        }
        self.deadlines.retain(|id, _| live.contains(id));
    }

    fn forced(&self, node: &Node) -> bool {
        self.deadlines.get(&node.id).is_some_and(Option::is_none)
    }

    /// Allocations of `node` still running (not finished by their client).
    fn remaining<'a>(state: &'a ServerState, node: &Node) -> Vec<&'a Allocation> {
        state
            .allocs_on_node(&node.id)
            .filter(|alloc| !alloc.client_terminal())
            .collect()
    }

    fn migrations(&self, state: &ServerState, new_id: &mut dyn FnMut() -> String) -> Option<Command> {
        let mut marks: BTreeMap<String, &Allocation> = BTreeMap::new();
        // How many more allocations each (namespace, job, group) may lose now.
        let mut budgets: BTreeMap<(String, String, String), i64> = BTreeMap::new();
        for node in state.draining_nodes() {
            let strategy = node.drain_strategy.as_ref().expect("draining");
            let forced = self.forced(node);
            let remaining = Self::remaining(state, node);
            let (last, others): (Vec<&Allocation>, Vec<&Allocation>) =
                remaining.iter().partition(|alloc| drained_last(state, alloc));
            let unmarked =
                |alloc: &&&Allocation| !alloc.desired_transition.migrate && alloc.desired_status == DesiredStatus::Run;
            if others.is_empty() {
                if strategy.ignore_system_jobs {
                    continue;
                }
                let keep: BTreeSet<&str> = last.iter().map(|alloc| alloc.id.as_str()).collect();
                if forced || self.plugins_before_release || consumers_released(state, node, &keep) {
                    for alloc in last.iter().filter(unmarked) {
                        marks.insert(alloc.id.clone(), alloc);
                    }
                }
                continue;
            }
            for alloc in others.iter().filter(unmarked) {
                let Some(job) = state.job(&alloc.namespace, &alloc.job_id).filter(|job| !job.stop) else {
                    // Its job is gone or stopped: the scheduler stops it anyway.
                    continue;
                };
                if forced {
                    marks.insert(alloc.id.clone(), alloc);
                    continue;
                }
                if job.job_type == JobType::Batch {
                    continue;
                }
                let Some(group) = job.task_groups.iter().find(|group| group.name == alloc.task_group) else {
                    marks.insert(alloc.id.clone(), alloc);
                    continue;
                };
                let key = (alloc.namespace.clone(), alloc.job_id.clone(), alloc.task_group.clone());
                let budget = budgets.entry(key).or_insert_with(|| {
                    let healthy = state
                        .job_allocs(&alloc.namespace, &alloc.job_id)
                        .filter(|other| {
                            other.task_group == alloc.task_group
                                && other.desired_status == DesiredStatus::Run
                                && other.client_status == crate::structs::ClientStatus::Running
                                && !other.desired_transition.migrate
                        })
                        .count() as i64;
                    let threshold = i64::from(group.count) - i64::from(group.migrate().max_parallel);
                    healthy - threshold
                });
                if *budget > 0 {
                    *budget -= 1;
                    marks.insert(alloc.id.clone(), alloc);
                }
            }
        }
        if marks.is_empty() {
            return None;
        }
        let mut jobs: BTreeMap<(String, String), String> = BTreeMap::new();
        for alloc in marks.values() {
            jobs.entry((alloc.namespace.clone(), alloc.job_id.clone()))
                .or_insert_with(|| alloc.node_id.clone());
        }
        let evals = jobs
            .into_iter()
            .filter_map(|((namespace, job_id), node_id)| {
                let job = state.job(&namespace, &job_id)?;
                Some(Evaluation {
                    id: new_id(),
                    namespace,
                    priority: job.priority,
                    eval_type: job.job_type,
                    triggered_by: crate::structs::EvalTrigger::NodeDrain,
                    job_id,
                    node_id,
                    status: EvalStatus::Pending,
                    ..Evaluation::default()
                })
            })
            .collect();
        let transitions = marks
            .into_keys()
            .map(|id| (id, DesiredTransition { migrate: true }))
            .collect();
        Some(Command::AllocUpdateDesiredTransition { transitions, evals })
    }

    /// The first draining node with nothing left to move completes its drain.
    fn completion(&self, state: &ServerState) -> Option<Command> {
        state
            .draining_nodes()
            .filter_map(|node| Some((node, node.drain_strategy.as_ref()?)))
            .find(|(node, strategy)| {
                Self::remaining(state, node)
                    .iter()
                    .all(|alloc| strategy.ignore_system_jobs && drained_last(state, alloc))
            })
            .map(|(node, _)| Command::NodeUpdateDrain {
                node_id: node.id.clone(),
                strategy: None,
                mark_eligible: false,
                complete: true,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::{Entry, Response};
    use crate::structs::{
        AccessMode, AttachmentMode, ClaimMode, ClientStatus, CsiVolumeClaim, DrainStrategy, Job, NodeStatus,
        SchedulingEligibility, Task, TaskCsiPluginConfig, TaskGroup,
    };
    use core::time::Duration;

    struct Fx {
        state: ServerState,
        index: u64,
        now: Instant,
        drainer: Drainer,
        ids: u64,
    }

    impl Fx {
        fn new() -> Self {
            let mut drainer = Drainer::new();
            drainer.set_enabled(true);
            Fx {
                state: ServerState::default(),
                index: 0,
                now: Instant::from_millis(1_000),
                drainer,
                ids: 0,
            }
        }

        fn apply(&mut self, command: Command) {
            self.index += 1;
            let entry = Entry {
                at_unix_ms: self.now.as_millis(),
                command,
            };
            let response = self.state.apply(self.index, &entry);
            assert!(!matches!(response, Response::Error(..)), "{response:?}");
        }

        /// Runs the drainer once and applies what it proposes.
        fn step(&mut self) -> Option<Command> {
            let mut ids = self.ids;
            let command = self.drainer.run(self.now, &self.state, &mut || {
                ids += 1;
                format!("eval-{ids}")
            });
            self.ids = ids;
            if let Some(command) = command.clone() {
                self.apply(command);
                self.drainer.proposed();
            }
            command
        }

        fn node(&mut self, id: &str) {
            self.apply(Command::NodeRegister {
                node: Node {
                    id: id.into(),
                    status: NodeStatus::Ready,
                    ..Node::default()
                },
            });
        }

        fn job(&mut self, id: &str, job_type: JobType, count: u32, max_parallel: u32, plugin: bool) {
            let task = Task {
                name: "t".into(),
                driver: "mock".into(),
                csi_plugin: plugin.then(|| TaskCsiPluginConfig {
                    id: "hostpath".into(),
                    plugin_type: crate::structs::CsiPluginType::Node,
                    mount_dir: "/csi".into(),
                    stage_publish_base_dir: "/local/csi".into(),
                    health_timeout: Duration::from_secs(30),
                }),
                ..Task::default()
            };
            self.apply(Command::JobUpsert {
                job: Job {
                    id: id.into(),
                    namespace: "default".into(),
                    job_type,
                    task_groups: vec![TaskGroup {
                        name: "g".into(),
                        count,
                        tasks: vec![task],
                        migrate: Some(crate::structs::MigrateStrategy { max_parallel }),
                        ..TaskGroup::default()
                    }],
                    ..Job::default()
                },
            });
        }

        fn alloc(&mut self, id: &str, job: &str, node: &str) {
            self.apply(Command::AllocUpsert {
                allocs: vec![Allocation {
                    id: id.into(),
                    namespace: "default".into(),
                    job_id: job.into(),
                    task_group: "g".into(),
                    node_id: node.into(),
                    client_status: ClientStatus::Running,
                    ..Allocation::default()
                }],
            });
        }

        fn finish(&mut self, id: &str) {
            self.apply(Command::AllocClientUpdate {
                alloc_id: id.into(),
                client_status: ClientStatus::Complete,
            });
        }

        fn drain(&mut self, node: &str, deadline_ns: i64, ignore_system_jobs: bool) {
            self.apply(Command::NodeUpdateDrain {
                node_id: node.into(),
                strategy: Some(DrainStrategy {
                    deadline_ns,
                    ignore_system_jobs,
                    ..DrainStrategy::default()
                }),
                mark_eligible: false,
                complete: false,
            });
        }

        fn marked(&self) -> Vec<String> {
            self.state
                .allocs()
                .filter(|alloc| alloc.desired_transition.migrate)
                .map(|alloc| alloc.id.clone())
                .collect()
        }
    }

    fn migrated(command: &Option<Command>) -> Vec<String> {
        match command {
            Some(Command::AllocUpdateDesiredTransition { transitions, .. }) => transitions.keys().cloned().collect(),
            other => panic!("expected migrations, got {other:?}"),
        }
    }

    #[test]
    fn service_allocations_move_within_max_parallel_and_system_jobs_go_last() {
        let mut fx = Fx::new();
        fx.node("n1");
        fx.node("n2");
        fx.job("web", JobType::Service, 3, 1, false);
        fx.job("agent", JobType::System, 1, 1, false);
        fx.alloc("web-1", "web", "n1");
        fx.alloc("web-2", "web", "n1");
        fx.alloc("web-3", "web", "n2");
        fx.alloc("agent-1", "agent", "n1");
        fx.drain("n1", 0, false);
        let node = fx.state.node("n1").unwrap();
        assert_eq!(node.scheduling_eligibility, SchedulingEligibility::Ineligible);
        assert_eq!(node.events.last().unwrap().message, "Node drain strategy set");

        // max_parallel 1 of count 3: one at a time, with an evaluation for its job.
        let first = fx.step();
        assert_eq!(migrated(&first), vec!["web-1"]);
        let Some(Command::AllocUpdateDesiredTransition { evals, .. }) = &first else {
            unreachable!()
        };
        assert_eq!(evals.len(), 1);
        assert_eq!(evals[0].triggered_by, crate::structs::EvalTrigger::NodeDrain);
        assert_eq!(evals[0].job_id, "web");
        // Nothing more until the replacement runs.
        assert_eq!(fx.step(), None);
        fx.finish("web-1");
        assert_eq!(fx.step(), None, "the replacement does not run yet");
        fx.alloc("web-4", "web", "n2");
        assert_eq!(migrated(&fx.step()), vec!["web-2"]);
        fx.finish("web-2");
        // The system job is left until every other allocation has finished.
        assert_eq!(fx.marked(), vec!["web-1", "web-2"]);
        fx.alloc("web-5", "web", "n2");
        assert_eq!(migrated(&fx.step()), vec!["agent-1"]);
        assert_eq!(fx.step(), None, "complete only once the system allocation finished");
        fx.finish("agent-1");
        assert!(matches!(
            fx.step(),
            Some(Command::NodeUpdateDrain { complete: true, .. })
        ));
        let node = fx.state.node("n1").unwrap();
        assert!(node.drain_strategy.is_none());
        assert_eq!(node.scheduling_eligibility, SchedulingEligibility::Ineligible);
        assert_eq!(
            node.last_drain.as_ref().unwrap().status,
            crate::structs::DrainStatus::Complete
        );
        assert_eq!(node.events.last().unwrap().message, "Node drain complete");
        assert_eq!(fx.step(), None);
    }

    fn write_claim(state: ClaimState) -> Command {
        Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "vol".into(),
            claim: CsiVolumeClaim {
                allocation_id: "app-1".into(),
                node_id: "n1".into(),
                external_node_id: String::new(),
                mode: ClaimMode::Write,
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
                state,
            },
        }
    }

    /// A draining node with a consumer that finished but still holds its volume claim there,
    /// and the node's plugin allocation.
    fn finished_consumer_with_claim(drainer: Drainer) -> Fx {
        let mut fx = Fx::new();
        fx.drainer = drainer;
        fx.drainer.set_enabled(true);
        fx.apply(Command::NodeRegister {
            node: crate::fsm::csi::tests::node("n1", true),
        });
        fx.job("app", JobType::Service, 1, 1, false);
        // A service job running a CSI plugin is drained last, like a system job.
        fx.job("plugin", JobType::Service, 1, 1, true);
        fx.alloc("app-1", "app", "n1");
        fx.alloc("plugin-1", "plugin", "n1");
        fx.apply(Command::CsiVolumeRegister {
            volumes: vec![crate::fsm::csi::tests::volume("vol")],
        });
        fx.apply(write_claim(ClaimState::Taken));
        fx.drain("n1", 0, false);
        assert_eq!(migrated(&fx.step()), vec!["app-1"]);
        fx.finish("app-1");
        fx
    }

    #[test]
    fn a_plugin_job_outlives_the_claims_of_its_node() {
        let mut fx = finished_consumer_with_claim(Drainer::new());
        // The consumer finished but its claim still needs the node plugin to unpublish.
        assert_eq!(fx.step(), None);
        fx.apply(write_claim(ClaimState::Unpublishing));
        assert_eq!(fx.step(), None, "still unpublishing on the node");
        fx.apply(write_claim(ClaimState::NodeDetached));
        assert_eq!(migrated(&fx.step()), vec!["plugin-1"]);
    }

    #[test]
    fn the_8232_switch_stops_the_plugin_before_the_claims_are_released() {
        let faults = crate::config::CsiFaults {
            drain_plugins_before_release: true,
            ..Default::default()
        };
        let mut fx = finished_consumer_with_claim(Drainer::with_faults(faults));
        assert_eq!(
            migrated(&fx.step()),
            vec!["plugin-1"],
            "the historical defect, on purpose"
        );
    }

    #[test]
    fn batch_allocations_finish_unless_the_deadline_passes() {
        let mut fx = Fx::new();
        fx.node("n1");
        fx.job("report", JobType::Batch, 2, 1, false);
        fx.job("agent", JobType::System, 1, 1, false);
        fx.alloc("report-1", "report", "n1");
        fx.alloc("report-2", "report", "n1");
        fx.alloc("agent-1", "agent", "n1");
        fx.drain("n1", 60_000_000_000, false);
        assert_eq!(fx.step(), None);
        fx.finish("report-1");
        assert_eq!(fx.step(), None);
        assert_eq!(fx.drainer.poll_timeout(), Some(fx.now + Duration::from_secs(60)));
        fx.now = fx.now + Duration::from_secs(60);
        // At the deadline everything but the system job goes at once...
        assert_eq!(migrated(&fx.step()), vec!["report-2"]);
        fx.finish("report-2");
        // ...and the system job follows without waiting for claims.
        assert_eq!(migrated(&fx.step()), vec!["agent-1"]);
    }

    #[test]
    fn ignore_system_jobs_leaves_them_running_and_completes() {
        let mut fx = Fx::new();
        fx.node("n1");
        fx.job("agent", JobType::System, 1, 1, false);
        fx.alloc("agent-1", "agent", "n1");
        fx.drain("n1", -1, true);
        assert!(matches!(
            fx.step(),
            Some(Command::NodeUpdateDrain { complete: true, .. })
        ));
        assert!(fx.marked().is_empty());
    }

    #[test]
    fn an_operator_cancel_keeps_the_node_ineligible_unless_asked() {
        let mut fx = Fx::new();
        fx.node("n1");
        fx.drain("n1", 0, false);
        fx.apply(Command::NodeUpdateDrain {
            node_id: "n1".into(),
            strategy: None,
            mark_eligible: false,
            complete: false,
        });
        let node = fx.state.node("n1").unwrap();
        assert_eq!(
            node.last_drain.as_ref().unwrap().status,
            crate::structs::DrainStatus::Canceled
        );
        assert_eq!(node.events.last().unwrap().message, "Node drain disabled");
        assert_eq!(node.scheduling_eligibility, SchedulingEligibility::Ineligible);
        fx.apply(Command::NodeUpdateEligibility {
            node_id: "n1".into(),
            eligibility: SchedulingEligibility::Eligible,
        });
        let node = fx.state.node("n1").unwrap();
        assert!(node.eligible());
        assert_eq!(
            node.events.last().unwrap().message,
            "Node marked as eligible for scheduling"
        );
        // A draining node cannot be made eligible.
        fx.drain("n1", 0, false);
        fx.index += 1;
        let response = fx.state.apply(
            fx.index,
            &Entry {
                at_unix_ms: 0,
                command: Command::NodeUpdateEligibility {
                    node_id: "n1".into(),
                    eligibility: SchedulingEligibility::Eligible,
                },
            },
        );
        assert_eq!(
            response,
            Response::Error(
                crate::error::ErrorKind::Refused,
                crate::fsm::DRAINING_NOT_ELIGIBLE.into()
            )
        );
        // A client re-registering does not end the drain.
        fx.node("n1");
        assert!(fx.state.node("n1").unwrap().drain_strategy.is_some());
    }
}
