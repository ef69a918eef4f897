//! No task reported running whose container is gone: once a task's container has ended
//! (exited, OOM-killed, stopped with its daemon, removed), the client says so within
//! [`NOTICE`] of being able to know it. The client cannot know while its agent is down or
//! its engine does not answer (stopped or hung), so the time counts from the latest of the
//! container's end, the agent's start and the engine answering again.
//!
//! The engine reports its containers (`HostEvent::ContainerRunning` / `ContainerGone`) and
//! whether it answers; the client reports its task states (`AgentEvent::TaskRunning`). A
//! restarted client agent reports again every task it reattached to, so what it said before
//! it was killed is forgotten when it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use drover_io_real::io::AgentEvent;

use super::Invariant;
use crate::trace::{HostEvent, PluginEvent, SimEvent};

/// How long the client may take to notice a container's end once it can: a call to a daemon
/// that hung times out after 60 s (the call may have started just before the daemon answered
/// again), the driver's wait retries within 5 s, and the exit then travels to the task runner.
pub const NOTICE: Duration = Duration::from_secs(90);

/// (node, allocation, task).
type Key = (String, String, String);

#[derive(Default)]
pub struct ContainersRunning {
    /// Tasks their client reports running.
    reported: BTreeSet<Key>,
    /// Tasks whose latest container has ended, and when.
    gone: BTreeMap<Key, Duration>,
    /// Nodes whose agent is down.
    agent_down: BTreeSet<String>,
    /// Nodes whose engine does not answer.
    engine_down: BTreeSet<String>,
    /// When each node's client last became able to see its engine (agent started, engine
    /// answering again).
    seeing_since: BTreeMap<String, Duration>,
}

fn key(node: &str, alloc: &str, task: &str) -> Key {
    (node.to_string(), alloc.to_string(), task.to_string())
}

impl ContainersRunning {
    fn forget_reports_of(&mut self, node: &str) {
        self.reported.retain(|(reported, _, _)| reported != node);
    }

    fn check(&self, at: Duration) -> Result<(), String> {
        for ((node, alloc, task), ended) in &self.gone {
            if self.agent_down.contains(node) || self.engine_down.contains(node) {
                continue;
            }
            if !self.reported.contains(&key(node, alloc, task)) {
                continue;
            }
            let from = (*ended).max(self.seeing_since.get(node).copied().unwrap_or_default());
            if at > from + NOTICE {
                return Err(format!(
                    "{node}: task {alloc}/{task} is reported running {:.1} s after its container \
                     ended at {:.1} s (the client could see its engine from {:.1} s)",
                    (at - from).as_secs_f64(),
                    ended.as_secs_f64(),
                    from.as_secs_f64()
                ));
            }
        }
        Ok(())
    }
}

impl Invariant for ContainersRunning {
    fn name(&self) -> &'static str {
        "no task reported running whose container is gone"
    }

    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Agent(AgentEvent::TaskRunning { .. }) | SimEvent::Host(HostEvent::ContainerGone { .. })
        )
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        self.observe_at(Duration::ZERO, node, event)
    }

    fn observe_at(&mut self, at: Duration, node: &str, event: &SimEvent) -> Result<(), String> {
        match event {
            SimEvent::Host(HostEvent::ContainerRunning { alloc, task }) => {
                self.gone.remove(&key(node, alloc, task));
            }
            SimEvent::Host(HostEvent::ContainerGone { alloc, task }) => {
                self.gone.insert(key(node, alloc, task), at);
            }
            SimEvent::Host(HostEvent::EngineAnswers { answers }) => {
                if *answers {
                    self.engine_down.remove(node);
                    self.seeing_since.insert(node.to_string(), at);
                } else {
                    self.engine_down.insert(node.to_string());
                }
            }
            SimEvent::Plugin(PluginEvent::AgentKilled) => {
                self.agent_down.insert(node.to_string());
                self.forget_reports_of(node);
            }
            SimEvent::Agent(AgentEvent::Started { .. }) => {
                self.agent_down.remove(node);
                self.seeing_since.insert(node.to_string(), at);
                self.forget_reports_of(node);
            }
            SimEvent::Agent(AgentEvent::TaskRunning {
                alloc_id,
                task,
                running,
            }) => {
                if *running {
                    self.reported.insert(key(node, alloc_id, task));
                } else {
                    self.reported.remove(&key(node, alloc_id, task));
                }
            }
            _ => {}
        }
        if self.gone.is_empty() {
            return Ok(());
        }
        self.check(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(alloc: &str, running: bool) -> SimEvent {
        SimEvent::Agent(AgentEvent::TaskRunning {
            alloc_id: alloc.into(),
            task: "web".into(),
            running,
        })
    }

    fn gone(alloc: &str) -> SimEvent {
        SimEvent::Host(HostEvent::ContainerGone {
            alloc: alloc.into(),
            task: "web".into(),
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_task_the_client_never_stops_reporting_is_caught_after_the_notice() {
        let mut invariant = ContainersRunning::default();
        invariant.observe_at(secs(1), "c1", &running("a1", true)).unwrap();
        invariant.observe_at(secs(10), "c1", &gone("a1")).unwrap();
        invariant.observe_at(secs(99), "c1", &running("other", false)).unwrap();
        let error = invariant
            .observe_at(secs(101), "c1", &running("other", false))
            .unwrap_err();
        assert!(error.contains("c1: task a1/web is reported running"), "{error}");
    }

    #[test]
    fn a_client_that_notices_passes() {
        let mut invariant = ContainersRunning::default();
        invariant.observe_at(secs(1), "c1", &running("a1", true)).unwrap();
        invariant.observe_at(secs(10), "c1", &gone("a1")).unwrap();
        invariant.observe_at(secs(12), "c1", &running("a1", false)).unwrap();
        invariant.observe_at(secs(500), "c1", &running("other", false)).unwrap();
    }

    #[test]
    fn time_counts_from_when_the_client_can_see() {
        let mut invariant = ContainersRunning::default();
        invariant.observe_at(secs(1), "c1", &running("a1", true)).unwrap();
        let down = SimEvent::Host(HostEvent::EngineAnswers { answers: false });
        let up = SimEvent::Host(HostEvent::EngineAnswers { answers: true });
        invariant.observe_at(secs(5), "c1", &down).unwrap();
        invariant.observe_at(secs(5), "c1", &gone("a1")).unwrap();
        invariant.observe_at(secs(300), "c1", &running("other", false)).unwrap();
        invariant.observe_at(secs(300), "c1", &up).unwrap();
        invariant.observe_at(secs(380), "c1", &running("other", false)).unwrap();
        assert!(invariant.observe_at(secs(391), "c1", &running("other", false)).is_err());
    }

    #[test]
    fn a_restarted_agent_answers_only_for_what_it_reports_again() {
        let mut invariant = ContainersRunning::default();
        invariant.observe_at(secs(1), "c1", &running("a1", true)).unwrap();
        invariant
            .observe_at(secs(2), "c1", &SimEvent::Plugin(PluginEvent::AgentKilled))
            .unwrap();
        invariant.observe_at(secs(3), "c1", &gone("a1")).unwrap();
        invariant.observe_at(secs(200), "c1", &running("other", false)).unwrap();
        let started = SimEvent::Agent(AgentEvent::Started {
            node_id: 7,
            boot_count: 2,
            boot: drover_core::bootstrap::BootState::default(),
        });
        invariant.observe_at(secs(200), "c1", &started).unwrap();
        // It reattaches to the ended container and says it runs: caught once it could know.
        invariant.observe_at(secs(201), "c1", &running("a1", true)).unwrap();
        invariant.observe_at(secs(290), "c1", &running("other", false)).unwrap();
        assert!(invariant.observe_at(secs(291), "c1", &running("other", false)).is_err());
    }
}
