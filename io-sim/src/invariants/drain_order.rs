//! A drain stops system and CSI plugin allocations last: only once every other allocation on
//! the node has finished and every claim those allocations held there is released on the node
//! (Nomad #8232, #8080: a node plugin stopped first strands the claims of the volumes it
//! served; fixed upstream by #12324). Before its deadline, that is; past it only the other
//! allocations have to be finished.
//!
//! Its own oracle: judged from the raw facts the server reports with each applied migration
//! (every allocation on the node, every claim held there, the deadline), not from the
//! drainer's helpers, so a wrong helper cannot vouch for itself.

use drover_io_real::io::{AgentEvent, DrainClaim, DrainNeighbour};

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct DrainOrder;

/// What the node still needed before `alloc` could go: other allocations running, consumers'
/// claims not yet released on the node.
fn blockers(forced: bool, neighbours: &[DrainNeighbour], claims: &[DrainClaim]) -> Vec<String> {
    let consumers: Vec<&DrainNeighbour> = neighbours.iter().filter(|other| !other.system_or_plugin).collect();
    let mut blockers: Vec<String> = consumers
        .iter()
        .filter(|other| !other.client_terminal)
        .map(|other| format!("allocation {} still running", other.alloc_id))
        .collect();
    if forced {
        return blockers;
    }
    for consumer in &consumers {
        let held: Vec<&DrainClaim> = claims
            .iter()
            .filter(|claim| claim.alloc_id == consumer.alloc_id)
            .collect();
        if held.is_empty() {
            continue;
        }
        // A release in progress is recorded as the allocation's past claim; without one the
        // claim has not started to be released at all.
        let released = held
            .iter()
            .filter(|claim| claim.table == "past")
            .any(|claim| matches!(claim.state, "node-detached" | "controller-detached" | "ready-to-free"));
        if !released {
            let states: Vec<String> = held
                .iter()
                .map(|claim| format!("{} {} {}", claim.volume, claim.table, claim.state))
                .collect();
            blockers.push(format!(
                "claims of {} not released on the node ({})",
                consumer.alloc_id,
                states.join(", ")
            ));
        }
    }
    blockers
}

impl Invariant for DrainOrder {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::DrainMigrated { .. }))
    }

    fn name(&self) -> &'static str {
        "a drain stops system and plugin allocations only after the node's other allocations and claims"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(AgentEvent::DrainMigrated {
            node_id,
            alloc_id,
            system_or_plugin: true,
            draining: true,
            forced,
            neighbours,
            claims,
        }) = event
        else {
            return Ok(());
        };
        let blockers = blockers(*forced, neighbours, claims);
        if blockers.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{node}: {alloc_id} on draining node {node_id} migrated while waiting on {}",
            blockers.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migrated(forced: bool, app_finished: bool, claims: &[(&'static str, &'static str)]) -> SimEvent {
        SimEvent::Agent(AgentEvent::DrainMigrated {
            node_id: "c1".into(),
            alloc_id: "plugin-1".into(),
            system_or_plugin: true,
            draining: true,
            forced,
            neighbours: vec![
                DrainNeighbour {
                    alloc_id: "app-1".into(),
                    system_or_plugin: false,
                    client_terminal: app_finished,
                },
                DrainNeighbour {
                    alloc_id: "agent-1".into(),
                    system_or_plugin: true,
                    client_terminal: false,
                },
            ],
            claims: claims
                .iter()
                .map(|(table, state)| DrainClaim {
                    volume: "default/vol".into(),
                    alloc_id: "app-1".into(),
                    table,
                    state,
                })
                .collect(),
        })
    }

    #[test]
    fn a_plugin_stopped_before_its_consumers_or_their_claims_is_caught() {
        let mut invariant = DrainOrder;
        let ok = |invariant: &mut DrainOrder, event| invariant.observe("s1", &event).is_ok();
        assert!(
            !ok(&mut invariant, migrated(false, false, &[])),
            "consumer still running"
        );
        assert!(
            !ok(&mut invariant, migrated(false, true, &[("write", "taken")])),
            "claim not released"
        );
        assert!(
            !ok(
                &mut invariant,
                migrated(false, true, &[("write", "taken"), ("past", "unpublishing")])
            ),
            "release still on the node"
        );
        assert!(ok(
            &mut invariant,
            migrated(false, true, &[("write", "taken"), ("past", "node-detached")])
        ));
        assert!(ok(&mut invariant, migrated(false, true, &[])), "claim freed");
        assert!(
            ok(&mut invariant, migrated(true, true, &[("write", "taken")])),
            "deadline passed"
        );
        assert!(
            !ok(&mut invariant, migrated(true, false, &[])),
            "even past the deadline, consumers first"
        );
    }
}
