//! The cluster as an operator reads it: `/v1/regions`, `/v1/operator/raft/configuration`
//! and `/v1/agent/servers` (Nomad's shapes).

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{ApiError, api};
use drover_io_real::driver::AgentHandle;

/// `GET /v1/regions`: the regions this agent knows (one: Drover does not federate).
pub async fn regions(State(handle): State<AgentHandle>) -> axum::Json<Value> {
    axum::Json(json!([handle.config().region]))
}

/// `GET /v1/operator/raft/configuration`: every server of the Raft configuration, the leader
/// and the voters marked.
pub async fn raft_configuration(
    State(handle): State<AgentHandle>,
) -> Result<axum::Json<api::RaftConfiguration>, ApiError> {
    let status = handle.status();
    let raft = status
        .raft
        .ok_or_else(|| ApiError(StatusCode::NOT_IMPLEMENTED, "Nomad agent is not a server".into()))?;
    let region = handle.config().region.clone();
    let leader = raft.leader.as_ref().map(|(id, _)| *id);
    let servers = raft
        .peers
        .iter()
        .map(|(id, (node, voter))| api::RaftServer {
            id: id.to_string(),
            // Raft members are named as gossip names servers: `<name>.<region>` already.
            node: if node.name.ends_with(&format!(".{region}")) {
                node.name.clone()
            } else {
                format!("{}.{region}", node.name)
            },
            address: node.rpc_addr.clone(),
            leader: leader == Some(*id),
            voter: *voter,
            raft_protocol: "3".into(),
        })
        .collect();
    Ok(axum::Json(api::RaftConfiguration {
        index: raft.commit_index.unwrap_or(0),
        servers,
    }))
}

/// Nomad's answer on an agent without a client.
fn no_client() -> ApiError {
    ApiError(StatusCode::NOT_IMPLEMENTED, "Invalid method".into())
}

/// `GET /v1/agent/servers`: the servers this agent's client talks to.
pub async fn agent_servers(State(handle): State<AgentHandle>) -> Result<axum::Json<Value>, ApiError> {
    handle
        .client_servers()
        .map(|servers| axum::Json(json!(servers)))
        .ok_or_else(no_client)
}

/// `PUT /v1/agent/servers?address=ip:port&address=...`: the client's servers from now on.
pub async fn set_agent_servers(
    State(handle): State<AgentHandle>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    if handle.client_servers().is_none() {
        return Err(no_client());
    }
    let query = query.unwrap_or_default();
    let mut servers = Vec::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if key != "address" {
            continue;
        }
        let addr = value.parse::<std::net::SocketAddr>().map_err(|_| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("invalid server address {value:?}: want ip:port"),
            )
        })?;
        servers.push(addr);
    }
    if servers.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing server address".into()));
    }
    handle.set_client_servers(servers);
    Ok(StatusCode::OK)
}
