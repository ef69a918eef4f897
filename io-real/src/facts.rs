//! Raw facts the server driver reports alongside what it applies, for checkers that must not
//! share the core's reasoning: the simulation's oracles decide from these what should have
//! happened, with rules of their own.

use drover_core::fsm::ServerState;
use drover_core::structs::{Allocation, ClaimState, JobType};

use crate::io::{AgentEvent, DrainClaim, DrainNeighbour};

/// Whether the allocation's job is a system job or runs a CSI plugin task, read off the job.
fn system_or_plugin(state: &ServerState, alloc: &Allocation) -> bool {
    state
        .job(&alloc.namespace, &alloc.job_id)
        .is_some_and(|job| job.job_type == JobType::System || job.is_plugin())
}

fn claim_state(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Taken => "taken",
        ClaimState::Unpublishing => "unpublishing",
        ClaimState::NodeDetached => "node-detached",
        ClaimState::ControllerDetached => "controller-detached",
        ClaimState::ReadyToFree => "ready-to-free",
    }
}

/// A migration the drainer committed for `alloc_id`, with the node as the state shows it:
/// every allocation there, every claim held there, and the drain's deadline.
pub fn drain_migration(state: &ServerState, alloc_id: &str) -> Option<AgentEvent> {
    let alloc = state.alloc(alloc_id)?;
    let node = state.node(&alloc.node_id)?;
    let strategy = node.drain_strategy.as_ref();
    let forced = strategy.is_some_and(|strategy| {
        strategy.deadline_ns < 0
            || strategy
                .force_deadline_ms
                .is_some_and(|deadline| state.last_applied_time_ms() >= deadline)
    });
    let neighbours = state
        .allocs()
        .filter(|other| other.node_id == node.id && other.id != alloc.id)
        .map(|other| DrainNeighbour {
            alloc_id: other.id.clone(),
            system_or_plugin: system_or_plugin(state, other),
            client_terminal: other.client_terminal(),
        })
        .collect();
    let mut claims = Vec::new();
    for (namespace, id) in state.volume_keys() {
        let Some(volume) = state.volume_raw(namespace, id) else {
            continue;
        };
        let tables = [
            ("read", &volume.read_claims),
            ("write", &volume.write_claims),
            ("past", &volume.past_claims),
        ];
        for (table, entries) in tables {
            for claim in entries.values().filter(|claim| claim.node_id == node.id) {
                claims.push(DrainClaim {
                    volume: format!("{namespace}/{id}"),
                    alloc_id: claim.allocation_id.clone(),
                    table,
                    state: claim_state(claim.state),
                });
            }
        }
    }
    Some(AgentEvent::DrainMigrated {
        node_id: node.id.clone(),
        alloc_id: alloc.id.clone(),
        system_or_plugin: system_or_plugin(state, alloc),
        draining: strategy.is_some(),
        forced,
        neighbours,
        claims,
    })
}
