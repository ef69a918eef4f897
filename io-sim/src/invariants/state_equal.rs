//! Every server that has applied as far as the leader holds exactly the leader's state —
//! including servers that restarted and restored from a snapshot.

use drover_core::fsm::ServerState;

/// Compares encoded states; `Err` names the first server that differs.
pub fn same_state(leader: (&str, &ServerState), others: &[(String, ServerState)]) -> Result<usize, String> {
    let reference = leader.1.snapshot();
    let mut compared = 0;
    for (name, state) in others {
        if state.last_applied() != leader.1.last_applied() {
            continue;
        }
        compared += 1;
        if state.snapshot() != reference {
            return Err(format!(
                "{name} applied up to {:?} like {} but its state differs",
                state.last_applied(),
                leader.0
            ));
        }
    }
    Ok(compared)
}
