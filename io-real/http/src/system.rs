//! `PUT /v1/system/gc` (Nomad's `System.GarbageCollect`: everything finished removed now,
//! `drover_core::gc`) and `PUT /v1/system/reconcile/summaries` (every job summary rebuilt).
//! Management tokens only, as Nomad's.

use axum::extract::State;
use axum::response::IntoResponse;
use drover_core::rpc::{ServerReply, ServerRequest};

use super::{ApiError, query_headers};
use drover_io_real::driver::AgentHandle;

async fn send(handle: AgentHandle, request: ServerRequest) -> Result<axum::response::Response, ApiError> {
    match handle.request_applied(request).await {
        ServerReply::Error(error) => Err(error.into()),
        reply => {
            let index = reply.index().unwrap_or(0);
            // Nomad's handlers return no object here: 200 with an empty body, not `null`.
            Ok((query_headers(&handle, index), "").into_response())
        }
    }
}

pub async fn gc(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    send(handle, ServerRequest::SystemGc).await
}

pub async fn reconcile_summaries(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    send(handle, ServerRequest::ReconcileSummaries).await
}
