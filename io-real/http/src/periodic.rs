//! `PUT /v1/job/:id/periodic/force` (Nomad's `Periodic.Force`): a periodic parent's child
//! launched now, answered with the child's evaluation.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::rpc::{ServerReply, ServerRequest};

use super::{ApiError, QueryOptions, namespace, query_headers};
use drover_io_real::driver::AgentHandle;

pub async fn force(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let request = ServerRequest::PeriodicForce {
        namespace: namespace(&options),
        job_id: id,
    };
    match handle.request_applied(request).await {
        ServerReply::JobRegistered { index, eval_id, .. } => Ok((
            query_headers(&handle, index),
            axum::Json(crate::api::PeriodicForceResponse {
                eval_id,
                eval_create_index: index,
                index,
            }),
        )),
        ServerReply::Error(error) => Err(error.into()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}
