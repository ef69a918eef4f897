//! One cluster per `bootstrap_expect` set: every Raft initialisation in a run uses the same
//! voter configuration. Several servers may bootstrap concurrently (Nomad's design is racy on
//! purpose) but only with the identical configuration; a different one means two clusters.

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct SingleCluster {
    first: Option<(String, Vec<u64>)>,
    node_ids: BTreeMap<String, u64>,
}

impl Invariant for SingleCluster {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::BootstrapRequested { .. }))
    }

    fn name(&self) -> &'static str {
        "no split brain: one cluster per bootstrap_expect set"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(event) = event else { return Ok(()) };
        match event {
            AgentEvent::Started { node_id, .. } => {
                self.node_ids.insert(node.to_string(), *node_id);
            }
            AgentEvent::BootstrapRequested { voters } => match &self.first {
                None => self.first = Some((node.to_string(), voters.clone())),
                Some((first_node, first_voters)) if first_voters != voters => {
                    let name = |voters: &[u64]| {
                        let mut names: Vec<String> = voters
                            .iter()
                            .map(|id| {
                                self.node_ids
                                    .iter()
                                    .find(|(_, node_id)| *node_id == id)
                                    .map_or_else(|| id.to_string(), |(name, _)| name.clone())
                            })
                            .collect();
                        names.sort();
                        names.join(",")
                    };
                    return Err(format!(
                        "split brain: {first_node} bootstrapped {{{}}} but {node} bootstrapped {{{}}}",
                        name(first_voters),
                        name(voters)
                    ));
                }
                Some(_) => {}
            },
            _ => {}
        }
        Ok(())
    }
}
