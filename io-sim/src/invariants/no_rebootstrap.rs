//! A server that started with Raft state (or with `bootstrapped` persisted) never initialises
//! Raft again.

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct NoRebootstrap {
    started_with_state: BTreeMap<String, bool>,
}

impl Invariant for NoRebootstrap {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::BootstrapRequested { .. }))
    }

    fn name(&self) -> &'static str {
        "no re-bootstrap with existing state"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(event) = event else { return Ok(()) };
        match event {
            AgentEvent::Started { boot, .. } => {
                self.started_with_state
                    .insert(node.to_string(), boot.has_raft_state() || boot.bootstrapped);
            }
            AgentEvent::BootstrapRequested { .. } if self.started_with_state.get(node) == Some(&true) => {
                return Err(format!(
                    "{node} started with existing Raft state and bootstrapped again"
                ));
            }
            _ => {}
        }
        Ok(())
    }
}
