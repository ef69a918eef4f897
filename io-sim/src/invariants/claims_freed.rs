//! After the quiet phase, every claim of a terminal (or garbage-collected) allocation is freed:
//! no leaked claims (#10927).

use drover_core::fsm::ServerState;

/// `Ok(())` when no volume holds a claim of a finished allocation, else which ones.
pub fn no_leaked_claims(state: &ServerState) -> Result<(), String> {
    let mut leaks = Vec::new();
    for (namespace, id) in state.volume_keys() {
        let Some(volume) = state.volume(namespace, id) else {
            continue;
        };
        for claim in volume.read_claims.values().chain(volume.write_claims.values()) {
            let finished = state
                .alloc(&claim.allocation_id)
                .is_none_or(|alloc| alloc.client_terminal());
            if finished {
                leaks.push(format!(
                    "{id}:{} ({:?})",
                    claim.allocation_id,
                    volume.past_claims.get(&claim.allocation_id).map(|c| c.state)
                ));
            }
        }
    }
    if leaks.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "claims of finished allocations still held: {}",
            leaks.join(", ")
        ))
    }
}
