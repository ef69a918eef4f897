//! A drain stops system and CSI plugin allocations last: only once every other allocation on
//! the node has finished and every claim there is past its node detach (Nomad #8232, #8080:
//! a node plugin stopped first strands the claims of the volumes it served). Checked on every
//! applied migration of such an allocation, against the state it was applied to.

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct DrainOrder;

impl Invariant for DrainOrder {
    fn name(&self) -> &'static str {
        "a drain stops system and plugin allocations only after the node's other allocations and claims"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        if let SimEvent::Agent(AgentEvent::DrainedLast {
            node_id,
            alloc_id,
            blockers,
        }) = event
            && !blockers.is_empty()
        {
            return Err(format!(
                "{node}: {alloc_id} on draining node {node_id} migrated while waiting on {blockers:?}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_stopped_before_its_consumers_is_caught() {
        let event = |blockers: &[&str]| {
            SimEvent::Agent(AgentEvent::DrainedLast {
                node_id: "c1".into(),
                alloc_id: "plugin-1".into(),
                blockers: blockers.iter().map(|b| b.to_string()).collect(),
            })
        };
        let mut invariant = DrainOrder;
        assert!(invariant.observe("s1", &event(&[])).is_ok());
        assert!(
            invariant
                .observe("s1", &event(&["claims on node c1 not yet node-detached"]))
                .is_err()
        );
    }
}
