//! At most one leader per Raft term, across every server of the run (a split brain shows up
//! here as two leaders of the same term).

use std::collections::BTreeMap;

use drover_core::server::RaftRole;
use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct LeaderPerTerm {
    node_ids: BTreeMap<String, u64>,
    leaders: BTreeMap<u64, (String, u64)>,
}

impl Invariant for LeaderPerTerm {
    fn name(&self) -> &'static str {
        "at most one leader per term"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(event) = event else { return Ok(()) };
        match event {
            AgentEvent::Started { node_id, .. } => {
                self.node_ids.insert(node.to_string(), *node_id);
            }
            AgentEvent::RaftChanged {
                role: RaftRole::Leader,
                term,
                ..
            } => {
                let id = self.node_ids.get(node).copied().unwrap_or_default();
                match self.leaders.get(term) {
                    Some((other, other_id)) if *other_id != id => {
                        return Err(format!("term {term} has two leaders: {other} and {node}"));
                    }
                    Some(_) => {}
                    None => {
                        self.leaders.insert(*term, (node.to_string(), id));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}
