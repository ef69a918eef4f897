//! `GET /v1/client/fs/logs/:alloc`: a task's stdout or stderr, in Nomad's framed JSON
//! (`{"File", "Offset", "Data": base64, "FileEvent"}` objects back to back) or raw with
//! `plain=true`, from `origin=start|end` plus `offset`, following with `follow=true`.
//!
//! `ls`, `stat`, `cat`, `readat` and `stream` under `/v1/client/fs/` read the allocation dir,
//! confined to it (`allocfs`).
//!
//! Any agent serves them: each read goes to the client that runs the allocation (its own, or
//! relayed through the servers, `service::relay`), one chunk at a time, so a slow reader
//! holds the reading back and nothing piles up anywhere on the way.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use drover_core::error::{AllocCallError, AllocCallFailure};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::ApiError;
use drover_io_real::allocfs::{FileInfo, FsOp, FsReply, FsRequest};
use drover_io_real::driver::AgentHandle;
use drover_io_real::logstream::{Chunk, LogsRequest};

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

/// A boolean query parameter (Go's `ParseBool` forms), `default` when absent.
fn flag(value: &Option<String>, name: &str, default: bool) -> Result<bool, ApiError> {
    match value.as_deref() {
        None | Some("") => Ok(default),
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
    let frame = crate::api::StreamFrame {
        file: chunk.file.clone(),
        offset: chunk.offset,
        data: base64::engine::general_purpose::STANDARD.encode(&chunk.data),
        file_event: String::new(),
    };
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
    let (follow, plain) = (
        flag(&query.follow, "follow", false)?,
        flag(&query.plain, "plain", false)?,
    );
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
    let first = handle.client_logs(request.clone()).await.map_err(ApiError::from)?;
    let (sender, receiver) = mpsc::channel::<Chunk>(2);
    tokio::spawn(async move {
        let read = |request: LogsRequest| {
            let handle = handle.clone();
            async move { handle.client_logs(request).await }
        };
        drover_io_real::logstream::pump(request, first, follow, read, sender).await;
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

/// `?path=` (and `offset`, `limit`, `origin`, `follow` where they apply).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FsQuery {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
    origin: Option<String>,
    follow: Option<String>,
}

impl FsQuery {
    fn require_path(&self) -> Result<(), ApiError> {
        if self.path.is_empty() {
            return Err(ApiError(StatusCode::BAD_REQUEST, "must provide a file path".into()));
        }
        Ok(())
    }
}

fn file_info(info: &FileInfo) -> crate::api::AllocFileInfo {
    crate::api::AllocFileInfo {
        name: info.name.clone(),
        is_dir: info.is_dir,
        size: info.size,
        file_mode: info.file_mode.clone(),
        mod_time: super::render::rfc3339(info.mod_time_ms),
    }
}

async fn fs_call(handle: &AgentHandle, alloc_id: String, path: String, op: FsOp) -> Result<FsReply, AllocCallError> {
    handle.client_fs(FsRequest { alloc_id, path, op }).await
}

/// `GET /v1/client/fs/ls/:alloc?path=`: Nomad's `AllocFileInfo` list.
pub async fn ls(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, ApiError> {
    let path = if query.path.is_empty() {
        "/".to_string()
    } else {
        query.path
    };
    match fs_call(&handle, alloc_id, path, FsOp::List).await? {
        FsReply::List(entries) => Ok(axum::Json(entries.iter().map(file_info).collect::<Vec<_>>()).into_response()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// `GET /v1/client/fs/stat/:alloc?path=`.
pub async fn stat(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, ApiError> {
    query.require_path()?;
    match fs_call(&handle, alloc_id, query.path, FsOp::Stat).await? {
        FsReply::Stat(info) => Ok(axum::Json(file_info(&info)).into_response()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// Streams a file's bytes from `offset` (at most `limit` of them), read in bounded steps,
/// each through the relay when the file is elsewhere. `framed`: `None` sends the raw bytes
/// (`cat`, `readat`); `Some(follow)` sends Nomad's frames, following new writes if asked.
async fn file_body(
    handle: AgentHandle,
    alloc_id: String,
    path: String,
    offset: u64,
    limit: Option<u64>,
    framed: Option<bool>,
) -> Result<Response, AllocCallError> {
    let follow = framed.unwrap_or(false);
    let read = |offset: u64, left: Option<u64>| FsOp::Read {
        offset,
        limit: left
            .unwrap_or(drover_io_real::allocfs::MAX_READ)
            .min(drover_io_real::allocfs::MAX_READ),
    };
    // The first read answers errors with a status.
    let first = fs_call(&handle, alloc_id.clone(), path.clone(), read(offset, limit)).await?;
    let (sender, receiver) = mpsc::channel::<Chunk>(2);
    let file = format!("alloc/{}", path.trim_start_matches('/'));
    tokio::spawn(async move {
        let (mut offset, mut left, mut reply) = (offset, limit, first);
        loop {
            let FsReply::Data { data, .. } = reply else { return };
            let caught_up = data.is_empty();
            if !caught_up {
                offset += data.len() as u64;
                left = left.map(|left| left.saturating_sub(data.len() as u64));
                let chunk = Chunk {
                    file: file.clone(),
                    offset,
                    data,
                };
                if sender.send(chunk).await.is_err() {
                    return;
                }
            }
            if left == Some(0) || (caught_up && !follow) {
                return;
            }
            if caught_up {
                tokio::time::sleep(drover_io_real::logstream::FOLLOW_POLL).await;
            }
            reply = match fs_call(&handle, alloc_id.clone(), path.clone(), read(offset, left)).await {
                Ok(reply) => reply,
                Err(_) => return,
            };
        }
    });
    let body = futures::stream::unfold(receiver, move |mut receiver| async move {
        let chunk = receiver.recv().await?;
        let bytes = if framed.is_some() { frame(&chunk) } else { chunk.data };
        Some((Ok::<_, std::io::Error>(bytes), receiver))
    });
    let content_type = if framed.is_some() {
        "application/json"
    } else {
        "application/octet-stream"
    };
    Ok(([(header::CONTENT_TYPE, content_type)], Body::from_stream(body)).into_response())
}

/// `GET /v1/client/fs/cat/:alloc?path=`: the whole file.
pub async fn cat(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, ApiError> {
    query.require_path()?;
    Ok(file_body(handle, alloc_id, query.path, 0, None, None).await?)
}

/// `GET /v1/client/fs/readat/:alloc?path=&offset=&limit=`.
pub async fn readat(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, ApiError> {
    query.require_path()?;
    let limit = query
        .limit
        .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, "must provide limit".into()))?;
    Ok(file_body(
        handle,
        alloc_id,
        query.path,
        query.offset.unwrap_or(0),
        Some(limit),
        None,
    )
    .await?)
}

/// `GET /v1/client/fs/stream/:alloc?path=&offset=&origin=&follow=`: framed, following by
/// default as Nomad's does.
pub async fn stream_file(
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, ApiError> {
    query.require_path()?;
    let follow = flag(&query.follow, "follow", true)?;
    let offset = query.offset.unwrap_or(0);
    let offset = match query.origin.as_deref() {
        None | Some("") | Some("start") => offset,
        Some("end") => match fs_call(&handle, alloc_id.clone(), query.path.clone(), FsOp::Stat).await? {
            FsReply::Stat(info) => info.size.saturating_sub(offset),
            _ => 0,
        },
        Some(_) => return Err(ApiError(StatusCode::BAD_REQUEST, "origin must be start or end".into())),
    };
    // Nomad's stream answers a file that is not there with 400 (its `Stat` fails before the
    // stream starts); an unknown allocation stays 404.
    file_body(handle, alloc_id, query.path, offset, None, Some(follow))
        .await
        .map_err(|error| match error.kind {
            AllocCallFailure::NoSuchFile => ApiError(StatusCode::BAD_REQUEST, error.message),
            _ => ApiError::from(error),
        })
}
