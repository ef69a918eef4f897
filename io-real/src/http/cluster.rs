//! The cluster as an operator reads it: `/v1/regions` and
//! `/v1/operator/raft/configuration` (Nomad's shapes).

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::ApiError;
use crate::driver::AgentHandle;

/// `GET /v1/regions`: the regions this agent knows (one: Drover does not federate).
pub async fn regions(State(handle): State<AgentHandle>) -> axum::Json<Value> {
    axum::Json(json!([handle.config().region]))
}

/// `GET /v1/operator/raft/configuration`: every server of the Raft configuration, the leader
/// and the voters marked.
pub async fn raft_configuration(State(handle): State<AgentHandle>) -> Result<axum::Json<Value>, ApiError> {
    let status = handle.status();
    let raft = status
        .raft
        .ok_or_else(|| ApiError(StatusCode::NOT_IMPLEMENTED, "Nomad agent is not a server".into()))?;
    let region = handle.config().region.clone();
    let leader = raft.leader.as_ref().map(|(id, _)| *id);
    let servers: Vec<Value> = raft
        .peers
        .iter()
        .map(|(id, (node, voter))| {
            json!({
                "ID": id.to_string(),
                "Node": format!("{}.{region}", node.name),
                "Address": node.rpc_addr,
                "Leader": leader == Some(*id),
                "Voter": voter,
                "RaftProtocol": "3",
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "Index": raft.commit_index.unwrap_or(0),
        "Servers": servers,
    })))
}
