//! `GET /v1/client/fs/logs/:alloc`: a task's stdout or stderr, in Nomad's framed JSON
//! (`{"File", "Offset", "Data": base64, "FileEvent"}` objects back to back) or raw with
//! `plain=true`, from `origin=start|end` plus `offset`, following with `follow=true`.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::ApiError;
use crate::client::ClientView;
use crate::logstream::{Chunk, LogRead};

pub fn router(view: ClientView) -> Router {
    Router::new()
        .route("/v1/client/fs/logs/{alloc}", get(logs))
        .with_state(view)
}

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

async fn logs(
    State(view): State<ClientView>,
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
    let Some(dir) = view.log_dir(&alloc_id, &query.task) else {
        let message = if view.has_alloc(&alloc_id) {
            format!("unknown task name {:?}", query.task)
        } else {
            format!("Unknown allocation {alloc_id:?}")
        };
        return Err(ApiError(StatusCode::NOT_FOUND, message));
    };
    let read = LogRead {
        dir,
        base: format!("{}.{}", query.task, query.kind),
        from_end,
        offset: query.offset.unwrap_or(0),
        follow,
    };
    // A few chunks in flight at most: a slow reader slows the reading, nothing piles up.
    let (sender, receiver) = mpsc::channel::<Chunk>(4);
    let task = query.task.clone();
    tokio::spawn(crate::logstream::stream(
        read,
        move || view.task_dead(&alloc_id, &task),
        sender,
    ));
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
