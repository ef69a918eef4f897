//! `/v1/allocations` and `/v1/allocation/:id`: Nomad's alloc list and read, as blocking
//! queries on the allocs table; `/v1/allocation/:id/stop`; and the client's
//! `/v1/client/allocation/:id/restart|signal`, relayed to the client that runs it.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::client::AllocControl;
use drover_core::fsm::Table;
use drover_core::rpc::{ServerReply, ServerRequest};
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, query_headers, render};
use drover_io_real::driver::AgentHandle;

pub async fn list_allocations(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = super::page::ItemFilter::of(&options)?;
    let namespace = super::namespace(&options);
    super::blocking_page(&handle, Table::Allocs, options, move |state, options| {
        let matching = state
            .allocs()
            .filter(|alloc| super::in_namespace(&namespace, &alloc.namespace))
            .filter(|alloc| {
                options
                    .prefix
                    .as_ref()
                    .is_none_or(|prefix| alloc.id.starts_with(prefix))
            })
            .filter(|alloc| filter.keeps(|| render::alloc(alloc, state)))
            .map(|alloc| (alloc.id.clone(), alloc));
        let (allocs, next) = super::page::page(matching, options);
        let resources = options.resources.unwrap_or(false);
        let task_states = options.task_states.unwrap_or(true);
        let list = allocs
            .into_iter()
            .map(|alloc| {
                let mut stub = render::alloc_stub(alloc, state);
                if resources {
                    stub["AllocatedResources"] = render::allocated_resources(alloc, state);
                }
                if !task_states {
                    stub["TaskStates"] = Value::Null;
                }
                stub
            })
            .collect();
        filter.finish((list, next))
    })
    .await
}

pub async fn get_allocation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_one(&handle, Table::Allocs, &options, "alloc not found", |state| {
        state.alloc(&id).map(|alloc| render::alloc(alloc, state))
    })
    .await
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

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RestartBody {
    task_name: Option<String>,
    all_tasks: bool,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SignalBody {
    task: Option<String>,
    signal: Option<String>,
}

/// A restart request's body into the control it sends the client.
pub fn decode_restart(alloc_id: String, body: &[u8]) -> Result<AllocControl, ApiError> {
    let body: RestartBody = super::parse_body_or_default(body, "restart request")?;
    let task = body.task_name.filter(|name| !name.is_empty() && !body.all_tasks);
    Ok(AllocControl::Restart { alloc_id, task })
}

/// A signal request's body into the control it sends the client.
pub fn decode_signal(alloc_id: String, body: &[u8]) -> Result<AllocControl, ApiError> {
    let body: SignalBody = super::parse_body_or_default(body, "signal request")?;
    Ok(AllocControl::Signal {
        alloc_id,
        task: body.task.filter(|name| !name.is_empty()),
        signal: body.signal.unwrap_or_default(),
    })
}

/// `PUT|POST /v1/client/allocation/:id/restart` with `{"TaskName": ...}` (or `AllTasks`, or
/// nothing: every running task).
pub async fn restart_allocation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let request = decode_restart(id, &body)?;
    handle.alloc_control(request).await.map_err(ApiError::from)?;
    Ok(axum::Json(json!({})))
}

/// `PUT|POST /v1/client/allocation/:id/signal` with `{"Task": ..., "Signal": ...}` (no task:
/// every running task; no signal: SIGKILL, as Nomad).
pub async fn signal_allocation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let request = decode_signal(id, &body)?;
    handle.alloc_control(request).await.map_err(ApiError::from)?;
    Ok(axum::Json(json!({})))
}

/// `GET /v1/node/:id/allocations`: every allocation placed on the node, in full (Nomad's
/// `Node.GetAllocs`), task states included; a blocking query on the allocs table.
pub async fn node_allocations(
    State(handle): State<AgentHandle>,
    Path(node_id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_list(&handle, Table::Allocs, &options, |state| {
        state
            .allocs()
            .filter(|alloc| alloc.node_id == node_id)
            .map(|alloc| render::alloc(alloc, state))
            .collect()
    })
    .await
}
