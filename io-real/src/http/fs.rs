//! `GET /v1/client/fs/logs/:alloc`: a task's stdout or stderr, in Nomad's framed JSON
//! (`{"File", "Offset", "Data": base64, "FileEvent"}` objects back to back) or raw with
//! `plain=true`, from `origin=start|end` plus `offset`, following with `follow=true`.
//!
//! Any agent serves it: each read goes to the client that runs the allocation (its own, or
//! relayed through the servers, `service::relay`), one chunk at a time, so a slow reader
//! holds the reading back and nothing piles up anywhere on the way.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::ApiError;
use crate::driver::AgentHandle;
use crate::logstream::{Chunk, LogsRequest};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LogsQuery {
    task: String,
    #[serde(rename = "type")]
    kind: String,
    origin: Option<String>,
    offset: Option<u64>,
    follow: Option<String>,
    plain: Option<String>,
}

fn flag(value: &Option<String>, name: &str) -> Result<bool, ApiError> {
    match value.as_deref() {
        None | Some("") => Ok(false),
        Some(text) => super::parse_bool(text).ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("failed to parse {name} field to boolean: {text:?}"),
            )
        }),
    }
}

/// One frame of Nomad's `StreamFrame`.
fn frame(chunk: &Chunk) -> Vec<u8> {
    let frame = json!({
        "File": chunk.file,
        "Offset": chunk.offset,
        "Data": base64::engine::general_purpose::STANDARD.encode(&chunk.data),
        "FileEvent": "",
    });
    serde_json::to_vec(&frame).expect("a frame serializes")
}

/// The most one relayed read carries.
const READ_MAX: u32 = 256 * 1024;

pub async fn logs(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    if query.task.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "must provide task name".into()));
    }
    if query.kind != "stdout" && query.kind != "stderr" {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("Invalid log type {:?}: must be \"stdout\" or \"stderr\"", query.kind),
        ));
    }
    let from_end = match query.origin.as_deref() {
        None | Some("") | Some("start") => false,
        Some("end") => true,
        Some(_) => return Err(ApiError(StatusCode::BAD_REQUEST, "origin must be start or end".into())),
    };
    let (follow, plain) = (flag(&query.follow, "follow")?, flag(&query.plain, "plain")?);
    let request = LogsRequest {
        alloc_id,
        task: query.task,
        kind: query.kind,
        from_end,
        offset: query.offset.unwrap_or(0),
        cursor: None,
        max: READ_MAX,
    };
    // The first read answers errors with a status; the rest stream.
    let first = handle.client_logs(request.clone()).await.map_err(|error| {
        let code = if error.starts_with("Unknown allocation") || error.starts_with("unknown task") {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError(code, error)
    })?;
    let (sender, receiver) = mpsc::channel::<Chunk>(2);
    tokio::spawn(async move {
        let read = |request: LogsRequest| {
            let handle = handle.clone();
            async move { handle.client_logs(request).await }
        };
        crate::logstream::pump(request, first, follow, read, sender).await;
    });
    let body = futures::stream::unfold(receiver, move |mut receiver| async move {
        let chunk = receiver.recv().await?;
        let bytes = if plain { chunk.data } else { frame(&chunk) };
        Some((Ok::<_, std::io::Error>(bytes), receiver))
    });
    let content_type = if plain {
        "text/plain; charset=utf-8"
    } else {
        "application/json"
    };
    Ok(([(header::CONTENT_TYPE, content_type)], Body::from_stream(body)).into_response())
}
