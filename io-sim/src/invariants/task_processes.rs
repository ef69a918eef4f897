//! No task process outlives its task: once a client's task runner has finished a task for good
//! (`AgentEvent::TaskDead`), no process of it runs on that client's host, neither its leader
//! nor anything it started (children that ignored the stop signal, daemons). On a real host
//! the task's cgroup kill (`DestroyTask`) is what guarantees it; the leak of issue 16 (a
//! stopped shell's spinning child burning a core for half an hour) is what it catches.
//!
//! The host reports the processes (`HostEvent`); the client reports the task's end. A new run
//! of a task while processes of its previous run still live is caught by the host itself.

use std::collections::BTreeSet;

use drover_io_real::io::AgentEvent;

use super::Invariant;
use crate::trace::{HostEvent, SimEvent};

#[derive(Default)]
pub struct TaskProcesses {
    /// (node, alloc, task) with a process on the node's host.
    alive: BTreeSet<(String, String, String)>,
}

impl Invariant for TaskProcesses {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::TaskDead { .. }))
    }

    fn name(&self) -> &'static str {
        "no task process outlives its task"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        match event {
            SimEvent::Host(HostEvent::TaskStarted { alloc, task }) => {
                self.alive.insert((node.to_string(), alloc.clone(), task.clone()));
            }
            SimEvent::Host(HostEvent::TaskProcessesGone { alloc, task }) => {
                self.alive.remove(&(node.to_string(), alloc.clone(), task.clone()));
            }
            SimEvent::Agent(AgentEvent::TaskDead { alloc_id, task })
                if self.alive.contains(&(node.to_string(), alloc_id.clone(), task.clone())) =>
            {
                return Err(format!(
                    "{node}: task {alloc_id}/{task} is dead while processes of it still run on its host"
                ));
            }
            _ => {}
        }
        Ok(())
    }
}
