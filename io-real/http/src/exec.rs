//! `GET /v1/client/allocation/:id/exec?task=&command=[...]&tty=` upgraded to a websocket in
//! Nomad's frame format: the client sends `{"stdin":{"data":<base64>}}`, `{"stdin":{"close":
//! true}}` and `{"tty_size":{"height":..,"width":..}}`; the agent sends `{"stdout":{"data":..}}`,
//! `{"stderr":{"data":..}}` and, last, `{"exited":true,"result":{"exit_code":N}}`.
//!
//! The session is started before the upgrade, so a bad allocation, task or command is an HTTP
//! error; after it, every step goes through the relay to the client that runs the task.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use drover_io_real::driver::AgentHandle;
use drover_io_real::exec::{ExecReply, ExecRequest};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ExecQuery {
    task: String,
    command: String,
    tty: Option<String>,
}

pub async fn exec(
    ws: WebSocketUpgrade,
    State(handle): State<AgentHandle>,
    Path(alloc_id): Path<String>,
    Query(query): Query<ExecQuery>,
) -> Result<Response, ApiError> {
    if query.task.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing task parameter".into()));
    }
    let command: Vec<String> = serde_json::from_str(&query.command)
        .ok()
        .filter(|command: &Vec<String>| !command.is_empty())
        .ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                "command is not a non-empty array of strings".into(),
            )
        })?;
    let tty = match query.tty.as_deref() {
        None | Some("") => false,
        Some(text) => super::parse_bool(text)
            .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("tty value is not a boolean: {text:?}")))?,
    };
    let start = ExecRequest::Start {
        alloc_id: alloc_id.clone(),
        task: query.task,
        command,
        tty,
    };
    let session = handle.client_exec(start).await.map_err(ApiError::from)?.session;
    Ok(ws.on_upgrade(move |socket| run(socket, handle, alloc_id, session)))
}

fn output(reply: &ExecReply) -> Vec<Value> {
    let b64 = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
    let mut frames = Vec::new();
    if !reply.stdout.is_empty() {
        frames.push(json!({"stdout": {"data": b64(&reply.stdout)}}));
    }
    if !reply.stderr.is_empty() {
        frames.push(json!({"stderr": {"data": b64(&reply.stderr)}}));
    }
    if let Some(code) = reply.exit {
        frames.push(json!({"exited": true, "result": {"exit_code": code}}));
    }
    frames
}

/// One incoming frame as the step it asks for.
fn input(alloc_id: &str, session: u64, frame: &Value) -> Option<ExecRequest> {
    if let Some(stdin) = frame.get("stdin") {
        let data = stdin
            .get("data")
            .and_then(Value::as_str)
            .and_then(|text| base64::engine::general_purpose::STANDARD.decode(text).ok())
            .unwrap_or_default();
        return Some(ExecRequest::Input {
            alloc_id: alloc_id.to_string(),
            session,
            data,
            close: stdin.get("close").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    let size = frame.get("tty_size")?;
    let dimension = |key: &str| size.get(key).and_then(Value::as_u64).unwrap_or(0) as u16;
    Some(ExecRequest::Resize {
        alloc_id: alloc_id.to_string(),
        session,
        width: dimension("width"),
        height: dimension("height"),
    })
}

async fn run(socket: WebSocket, handle: AgentHandle, alloc_id: String, session: u64) {
    let (mut outgoing, mut incoming) = socket.split();
    let inputs = {
        let (handle, alloc_id) = (handle.clone(), alloc_id.clone());
        tokio::spawn(async move {
            while let Some(Ok(message)) = incoming.next().await {
                let frame: Value = match &message {
                    Message::Text(text) => serde_json::from_str(text.as_str()).unwrap_or(Value::Null),
                    Message::Binary(bytes) => serde_json::from_slice(bytes).unwrap_or(Value::Null),
                    Message::Close(_) => break,
                    _ => continue,
                };
                if let Some(request) = input(&alloc_id, session, &frame)
                    && handle.client_exec(request).await.is_err()
                {
                    return;
                }
            }
        })
    };
    let read = ExecRequest::Read {
        alloc_id: alloc_id.clone(),
        session,
    };
    let mut closing = None;
    loop {
        // The client closed the websocket (or it broke): the session is given up, and its
        // command is cancelled below even if it writes nothing (a send would never fail).
        if inputs.is_finished() {
            break;
        }
        let reply = match handle.client_exec(read.clone()).await {
            Ok(reply) => reply,
            Err(error) => {
                closing = Some(error.message);
                break;
            }
        };
        let mut sent = true;
        for frame in output(&reply) {
            sent &= outgoing.send(Message::Text(frame.to_string().into())).await.is_ok();
        }
        if !sent {
            break;
        }
        if reply.exit.is_some() {
            break;
        }
    }
    inputs.abort();
    let _ = handle
        .client_exec(ExecRequest::Cancel {
            alloc_id: alloc_id.clone(),
            session,
        })
        .await;
    let frame = CloseFrame {
        code: if closing.is_some() { 1011 } else { 1000 },
        reason: closing.unwrap_or_default().chars().take(120).collect::<String>().into(),
    };
    let _ = outgoing.send(Message::Close(Some(frame))).await;
}
