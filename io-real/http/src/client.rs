//! `GET /v1/client/allocation/:id/stats` (Nomad's `AllocResourceUsage`, with what the client
//! measures — RSS and CPU per task from its driver, device stats — and task states), served by
//! the client that runs the allocation and relayed to it from any other agent.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use drover_io_real::service::{NodeCall, NodeCallKind};

/// `GET /v1/client/allocation/:id/stats` from any agent: this agent's client, or relayed to
/// the one that runs the allocation.
pub async fn alloc_stats(
    State(handle): State<drover_io_real::driver::AgentHandle>,
    Path(id): Path<String>,
) -> Response {
    match handle.client_stats(id).await {
        Ok(stats) => Json(stats).into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `?node_id=` of the node endpoints: the node to ask (none: this agent's own client).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeQuery {
    #[serde(default)]
    node_id: String,
    // The query options every endpoint takes.
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

fn node_call(query: Result<Query<NodeQuery>, QueryRejection>, kind: NodeCallKind) -> Result<NodeCall, super::ApiError> {
    let Query(query) = query.map_err(|rejection| super::ApiError(StatusCode::BAD_REQUEST, rejection.body_text()))?;
    let _ = (query.region, query.namespace);
    Ok(NodeCall {
        node_id: query.node_id,
        kind,
    })
}

/// `GET /v1/client/stats[?node_id=]`: Nomad's `HostStats` of this agent's client, or of the
/// node named, relayed to it.
pub async fn host_stats(
    State(handle): State<drover_io_real::driver::AgentHandle>,
    query: Result<Query<NodeQuery>, QueryRejection>,
) -> Response {
    let call = match node_call(query, NodeCallKind::HostStats) {
        Ok(call) => call,
        Err(error) => return error.into_response(),
    };
    match handle.node_call(call).await {
        Ok(stats) => Json(stats).into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `GET|PUT /v1/client/gc[?node_id=]`: the client destroys its finished allocations (those
/// the servers list as finished and that are done here); an empty answer, as Nomad's.
pub async fn node_gc(
    State(handle): State<drover_io_real::driver::AgentHandle>,
    query: Result<Query<NodeQuery>, QueryRejection>,
) -> Response {
    let call = match node_call(query, NodeCallKind::Gc) {
        Ok(call) => call,
        Err(error) => return error.into_response(),
    };
    match handle.node_call(call).await {
        Ok(_) => StatusCode::OK.into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `GET|PUT /v1/client/allocation/:id/gc`: one finished allocation destroyed by its client.
pub async fn alloc_gc(State(handle): State<drover_io_real::driver::AgentHandle>, Path(id): Path<String>) -> Response {
    let known = handle.read_state(|state| state.alloc(&id).is_some());
    match handle.client_gc(id).await {
        Ok(Ok(_)) => StatusCode::OK.into_response(),
        Ok(Err(error)) => super::ApiError::from(error).into_response(),
        // The relay failed: an allocation the servers do not hold is unknown (404); one they
        // hold whose client could not be reached is a failure (500).
        Err(error) if known == Some(true) => (StatusCode::INTERNAL_SERVER_ERROR, error.message).into_response(),
        Err(error) => (StatusCode::NOT_FOUND, error.message).into_response(),
    }
}
