//! `/v1/allocations` and `/v1/allocation/:id`: Nomad's alloc list and read, as blocking
//! queries on the allocs table, and `/v1/allocation/:id/stop`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::Table;
use drover_core::rpc::{ServerReply, ServerRequest};
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, block_on_table, query_headers, render};
use crate::driver::AgentHandle;

pub async fn list_allocations(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::Allocs, &options).await?;
    let list: Vec<Value> = handle
        .read_state(|state| {
            state
                .allocs()
                .filter(|alloc| {
                    options
                        .prefix
                        .as_ref()
                        .is_none_or(|prefix| alloc.id.starts_with(prefix))
                })
                .map(|alloc| render::alloc_stub(alloc, state))
                .collect()
        })
        .unwrap_or_default();
    Ok((query_headers(&handle, index), axum::Json(Value::Array(list))))
}

pub async fn get_allocation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::Allocs, &options).await?;
    let alloc = handle
        .read_state(|state| state.alloc(&id).map(|alloc| render::alloc(alloc, state)))
        .flatten();
    match alloc {
        Some(alloc) => Ok((query_headers(&handle, index), axum::Json(alloc))),
        None => Err(ApiError(StatusCode::NOT_FOUND, "alloc not found".into())),
    }
}

/// `PUT|POST /v1/allocation/:id/stop`: Nomad's `Alloc.Stop`, answered with the evaluation that
/// replaces the allocation.
pub async fn stop_allocation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    match handle.request_applied(ServerRequest::AllocStop { alloc_id: id }).await {
        ServerReply::JobRegistered { index, eval_id, .. } => Ok((
            query_headers(&handle, index),
            axum::Json(json!({ "EvalID": eval_id, "Index": index })),
        )),
        ServerReply::Error(error) => Err(error.into()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}
