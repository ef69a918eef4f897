//! Evaluations asked for by hand: `PUT /v1/job/:id/evaluate` (Nomad's `Job.Evaluate`: a new
//! evaluation of the job as it stands), `PUT /v1/node/:id/evaluate` (`Node.Evaluate`: the
//! evaluations a change of the node would make) and `GET /v1/evaluation/:id/allocations`
//! (what an evaluation placed or changed).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::Table;
use drover_core::rpc::{ServerReply, ServerRequest};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, QueryOptions, namespace, parse_body_or_default, query_headers, render};
use drover_io_real::driver::AgentHandle;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct EvaluateBody {
    #[serde(rename = "JobID")]
    job_id: String,
    eval_options: EvalOptions,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct EvalOptions {
    force_reschedule: bool,
}

/// `PUT /v1/job/:id/evaluate` (body optional: `{"JobID", "EvalOptions": {"ForceReschedule"}}`).
pub async fn evaluate_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: EvaluateBody = parse_body_or_default(&body, "evaluate request")?;
    if !body.job_id.is_empty() && body.job_id != id {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job ID does not match".into()));
    }
    if body.eval_options.force_reschedule {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "EvalOptions.ForceReschedule is not supported: failed allocations are rescheduled by their reschedule policy".into(),
        ));
    }
    let request = ServerRequest::JobEvaluate {
        namespace: namespace(&options),
        job_id: id,
    };
    match handle.request_applied(request).await {
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        } => Ok((
            query_headers(&handle, index),
            axum::Json(json!({
                "EvalID": eval_id,
                "EvalCreateIndex": index,
                "JobModifyIndex": job_modify_index,
                "Warnings": "",
                "Index": index,
            })),
        )),
        ServerReply::Error(error) => Err(error.into()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// `GET /v1/evaluation/:id/allocations`: the stubs of the allocations the evaluation made.
pub async fn evaluation_allocations(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_list(&handle, Table::Allocs, &options, |state| {
        state
            .allocs()
            .filter(|alloc| alloc.eval_id == id)
            .map(|alloc| render::alloc_stub(alloc, state))
            .collect()
    })
    .await
}

/// `PUT /v1/node/:id/evaluate`: answered with the evaluations made (Nomad's
/// `NodeUpdateResponse`: `EvalIDs`, `EvalCreateIndex`, `NodeModifyIndex`).
pub async fn evaluate_node(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let request = ServerRequest::NodeEvaluate { node_id: id.clone() };
    let index = match handle.request_applied(request).await {
        ServerReply::Error(error) => return Err(error.into()),
        reply => reply.index().unwrap_or(0),
    };
    let (eval_ids, node_index) = handle
        .read_state(|state| {
            let eval_ids: Vec<String> = state
                .evals()
                .filter(|eval| eval.node_id == id && eval.create_index == index)
                .map(|eval| eval.id.clone())
                .collect();
            (eval_ids, state.node(&id).map_or(0, |node| node.modify_index))
        })
        .unwrap_or_default();
    Ok((
        query_headers(&handle, index),
        axum::Json(json!({
            "EvalIDs": eval_ids,
            "EvalCreateIndex": index,
            "NodeModifyIndex": node_index,
            "Index": index,
        })),
    ))
}
