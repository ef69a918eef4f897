//! `GET /v1/agent/monitor?log_level=&plain=&node_id=&server_id=` (Nomad's `agent monitor`):
//! this agent's log lines from now on, at the level asked (default `info`), as Nomad's
//! stream frames (`{"Data": base64}` one per line) or, with `plain=true`, as text. A
//! `node_id` or `server_id` other than this agent's is refused by name: Drover does not relay
//! a monitor to another agent.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;

use super::ApiError;
use drover_io_real::driver::AgentHandle;
use drover_io_real::logbus::{Watch, parse_level};

#[derive(Debug, Default, Deserialize)]
pub struct MonitorQuery {
    #[serde(default)]
    log_level: Option<String>,
    #[serde(default)]
    plain: Option<String>,
    #[serde(default)]
    log_json: Option<String>,
    #[serde(default)]
    node_id: Option<String>,
    #[serde(default)]
    server_id: Option<String>,
}

pub async fn monitor(
    State(handle): State<AgentHandle>,
    Query(query): Query<MonitorQuery>,
) -> Result<Response, ApiError> {
    let bad = |text: String| ApiError(StatusCode::BAD_REQUEST, text);
    let level_text = query.log_level.clone().unwrap_or_else(|| "info".into());
    let level = parse_level(&level_text).ok_or_else(|| bad(format!("Unknown log level: {level_text}")))?;
    let plain = match query.plain.as_deref() {
        None | Some("") => false,
        Some(text) => super::parse_bool(text).ok_or_else(|| bad(format!("Unknown option plain: {text:?}")))?,
    };
    if query.log_json.as_deref().and_then(super::parse_bool) == Some(true) {
        return Err(bad(
            "log_json is not supported: Drover's monitor streams text lines".into()
        ));
    }
    let own_node = handle.node_id_text();
    if let Some(node) = query
        .node_id
        .as_deref()
        .filter(|node| !node.is_empty() && Some(*node) != own_node.as_deref())
    {
        return Err(bad(format!(
            "node_id {node:?} is not this agent's client: ask that node's agent for its log"
        )));
    }
    let name = handle.config().name.clone();
    if let Some(server) = query
        .server_id
        .as_deref()
        .filter(|server| !server.is_empty() && *server != name && *server != "leader")
    {
        return Err(bad(format!(
            "server_id {server:?} is not this agent: ask that server's agent for its log"
        )));
    }
    let watch = Watch::new(level);
    let body = futures::stream::unfold(watch, move |mut watch| async move {
        let line = watch.next().await?;
        let chunk = if plain {
            line.into_bytes()
        } else {
            let data = base64::engine::general_purpose::STANDARD.encode(line.as_bytes());
            format!("{{\"Data\":\"{data}\"}}\n").into_bytes()
        };
        Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(chunk)), watch))
    });
    let content_type = if plain { "text/plain" } else { "application/json" };
    Ok(([(header::CONTENT_TYPE, content_type)], Body::from_stream(body)).into_response())
}
