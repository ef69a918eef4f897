//! Node writes an operator makes (reference §7.1): `PUT /v1/node/:id/drain` and
//! `PUT /v1/node/:id/eligibility`, in Nomad's request and response shapes, through the leader.
//!
//! The evaluations that follow (the drainer's migrations, the node-update evaluations of a
//! node made eligible) are created by the leader afterwards, so `EvalIDs` is empty here.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::rpc::ServerRequest;
use drover_core::structs::{DrainStrategy, SchedulingEligibility};
use serde::Deserialize;
use serde_json::json;

use super::csi::reply_to_result;
use super::{ApiError, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;

/// Nomad's `api.DrainSpec`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DrainSpec {
    /// Nanoseconds; `0` no deadline, negative: force.
    deadline: i64,
    ignore_system_jobs: bool,
}

/// Nomad's `api.NodeUpdateDrainRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DrainRequest {
    drain_spec: Option<DrainSpec>,
    mark_eligible: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct EligibilityRequest {
    eligibility: String,
}

fn update_response(index: u64) -> serde_json::Value {
    json!({
        "EvalIDs": [],
        "EvalCreateIndex": 0,
        "NodeModifyIndex": index,
        "Index": index,
    })
}

/// `PUT /v1/node/:id/drain` body into the request it sends the leader.
pub fn decode_drain(node_id: String, body: &[u8]) -> Result<ServerRequest, ApiError> {
    let request: DrainRequest = parse_body(body, "drain request")?;
    let strategy = request.drain_spec.map(|spec| DrainStrategy {
        deadline_ns: spec.deadline,
        ignore_system_jobs: spec.ignore_system_jobs,
        ..DrainStrategy::default()
    });
    Ok(ServerRequest::NodeUpdateDrain {
        node_id,
        strategy,
        mark_eligible: request.mark_eligible,
    })
}

/// `PUT /v1/node/:id/eligibility` body into the request it sends the leader.
pub fn decode_eligibility(node_id: String, body: &[u8]) -> Result<ServerRequest, ApiError> {
    let request: EligibilityRequest = parse_body(body, "eligibility request")?;
    let Some(eligibility) = SchedulingEligibility::parse(&request.eligibility) else {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("invalid scheduling eligibility {:?}", request.eligibility),
        ));
    };
    Ok(ServerRequest::NodeUpdateEligibility { node_id, eligibility })
}

pub async fn drain(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let request = decode_drain(id, &body)?;
    let index = reply_to_result(handle.request_applied(request).await)?;
    Ok((query_headers(&handle, index), axum::Json(update_response(index))))
}

pub async fn eligibility(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let request = decode_eligibility(id, &body)?;
    let index = reply_to_result(handle.request_applied(request).await)?;
    Ok((query_headers(&handle, index), axum::Json(update_response(index))))
}
