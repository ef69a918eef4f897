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

/// The rollouts of the jobs of `allocs` (a plan's), as [`AgentEvent::Rollout`]s: for every
/// group of their running deployments, what the job version asks of `max_parallel` and the
/// allocations in flight — placed by the deployment (created since it was), not healthy, in
/// place of one stopped for the update — counted from the allocations themselves.
pub fn rollouts(state: &ServerState, allocs: &[Allocation]) -> Vec<AgentEvent> {
    let jobs: std::collections::BTreeSet<(String, String)> = allocs
        .iter()
        .map(|alloc| (alloc.namespace.clone(), alloc.job_id.clone()))
        .collect();
    let mut events = Vec::new();
    for (namespace, job_id) in jobs {
        let Some(deployment) = state.latest_deployment(&namespace, &job_id).filter(|d| d.active()) else {
            continue;
        };
        let Some(job) = state.job_version(&namespace, &job_id, deployment.job_version) else {
            continue;
        };
        for group in &job.task_groups {
            let Some(update) = group.update.as_deref() else {
                continue;
            };
            let replacing = state
                .job_allocs(&namespace, &job_id)
                .filter(|alloc| alloc.task_group == group.name && alloc.deployment_id == deployment.id)
                // Placed by this deployment: one moved into it in place was placed earlier.
                .filter(|alloc| alloc.create_index >= deployment.create_index)
                .filter(|alloc| !alloc.terminal() && !alloc.healthy())
                .filter(|alloc| {
                    alloc
                        .previous_allocation
                        .as_deref()
                        .and_then(|previous| state.alloc(previous))
                        .is_some_and(|previous| previous.desired_description == drover_core::scheduler::ALLOC_UPDATING)
                })
                .map(|alloc| alloc.id.clone())
                .collect();
            events.push(AgentEvent::Rollout {
                deployment: deployment.id.clone(),
                job: job_id.clone(),
                group: group.name.clone(),
                max_parallel: update.max_parallel,
                replacing,
            });
        }
    }
    events
}

/// A periodic launch the entry at `index` applied (none when the state machine refused it:
/// the parent's launch record then does not carry this index).
pub fn periodic_launch(state: &ServerState, index: u64, command: &drover_core::fsm::Command) -> Option<AgentEvent> {
    let drover_core::fsm::Command::PeriodicLaunch {
        namespace,
        job_id,
        launch_ms,
        forced,
        skipped,
        ..
    } = command
    else {
        return None;
    };
    let record = state.periodic_launch(namespace, job_id)?;
    if record.modify_index != index {
        return None;
    }
    let periodic = state.job(namespace, job_id)?.periodic.as_deref()?;
    Some(AgentEvent::PeriodicLaunched {
        index,
        job: format!("{namespace}/{job_id}"),
        spec: periodic.spec.clone(),
        time_zone: periodic.time_zone.clone(),
        launch_ms: *launch_ms,
        previous_ms: record.previous_ms,
        skipped: *skipped,
        forced: *forced,
    })
}
