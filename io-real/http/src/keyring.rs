//! `/v1/agent/keyring/{list,install,use,remove}`: the gossip keyring of every server (Nomad's
//! `KeyringResponse` shape: `Keys` with how many servers hold each, `Messages` per server that
//! failed, `NumNodes`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use drover_io_real::driver::AgentHandle;
use drover_io_real::keyring::KeyringRequest;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct KeyBody {
    #[serde(rename = "Key")]
    key: String,
}

pub async fn list(State(handle): State<AgentHandle>) -> Result<Json<Value>, ApiError> {
    operate(&handle, KeyringRequest::List).await
}

pub async fn change(
    State(handle): State<AgentHandle>,
    Path(op): Path<String>,
    body: Option<Json<KeyBody>>,
) -> Result<Json<Value>, ApiError> {
    let key = body.map(|Json(body)| body.key).unwrap_or_default();
    if key.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "missing key in request body (\"Key\")".into(),
        ));
    }
    drover_io_real::keyring::check_key(&key).map_err(|error| ApiError(StatusCode::BAD_REQUEST, error.to_string()))?;
    let request = match op.as_str() {
        "install" => KeyringRequest::Install(key),
        "use" => KeyringRequest::Use(key),
        "remove" => KeyringRequest::Remove(key),
        other => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("unknown keyring operation {other:?}: list, install, use or remove"),
            ));
        }
    };
    operate(&handle, request).await
}

async fn operate(handle: &AgentHandle, request: KeyringRequest) -> Result<Json<Value>, ApiError> {
    let summary = handle
        .keyring(request)
        .await
        .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, "keyring operations need a server agent".into()))?;
    Ok(Json(json!({
        "Keys": summary.keys,
        "Messages": summary.messages,
        "NumNodes": summary.num_nodes,
    })))
}
