//! Liveness after the faults stop: every live server knows the same leader, which is itself a
//! live server that believes it leads.

use drover_core::server::RaftRole;
use drover_io_real::driver::AgentStatus;

/// `Ok(leader id)` when the live servers agree on a live leader, else why not.
pub fn common_leader(live: &[(String, u64, AgentStatus)]) -> Result<u64, String> {
    if live.is_empty() {
        return Err("no live servers".to_string());
    }
    let mut views = Vec::new();
    let mut leader: Option<u64> = None;
    let mut agreed = true;
    for (name, _, status) in live {
        let seen = status
            .raft
            .as_ref()
            .and_then(|raft| raft.leader.as_ref().map(|(id, _)| *id));
        views.push(format!(
            "{name}→{}",
            seen.map_or("none".to_string(), |id| id.to_string())
        ));
        match (leader, seen) {
            (_, None) => agreed = false,
            (None, Some(id)) => leader = Some(id),
            (Some(first), Some(id)) if first != id => agreed = false,
            _ => {}
        }
    }
    let describe = || views.join(", ");
    let Some(leader) = leader.filter(|_| agreed) else {
        return Err(format!("servers disagree on the leader: {}", describe()));
    };
    let leads = live.iter().any(|(_, id, status)| {
        *id == leader && status.raft.as_ref().and_then(|raft| raft.role) == Some(RaftRole::Leader)
    });
    if !leads {
        return Err(format!(
            "leader {leader} is not a live server that leads: {}",
            describe()
        ));
    }
    Ok(leader)
}
