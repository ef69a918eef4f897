//! `PUT /v1/job/:id/dispatch` (Nomad's `Job.Dispatch`): a child of a parameterized job with a
//! payload (base64, as Go's `[]byte`) and meta, answered with the child and its evaluation.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::rpc::{JobDispatchRequest, ServerReply, ServerRequest};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, QueryOptions, namespace, parse_body_or_default, query_headers};
use drover_io_real::driver::AgentHandle;
use drover_io_real::jobs::bytes_base64;

/// Nomad's `JobDispatchRequest` (unset maps arrive as `null` from Go's client).
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct DispatchBody {
    #[serde(rename = "JobID")]
    job_id: String,
    #[serde(with = "bytes_base64")]
    payload: Vec<u8>,
    meta: Option<BTreeMap<String, String>>,
    idempotency_token: String,
}

pub async fn dispatch(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: DispatchBody = parse_body_or_default(&body, "dispatch request")?;
    if !body.job_id.is_empty() && body.job_id != id {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job ID does not match".into()));
    }
    let request = ServerRequest::JobDispatch(Box::new(JobDispatchRequest {
        namespace: namespace(&options),
        job_id: id,
        payload: body.payload,
        meta: body.meta.unwrap_or_default(),
        idempotency_token: body.idempotency_token,
    }));
    match handle.request_applied(request).await {
        ServerReply::JobDispatched {
            index,
            dispatched_job_id,
            eval_id,
            job_create_index,
        } => Ok((
            query_headers(&handle, index),
            axum::Json(json!({
                "DispatchedJobID": dispatched_job_id,
                "EvalCreateIndex": if eval_id.is_empty() { 0 } else { index },
                "EvalID": eval_id,
                "JobCreateIndex": job_create_index,
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
