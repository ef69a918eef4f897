//! `/v1/operator/keyring/{keys,rotate,key/:id}`: the root keyring that seals variables and
//! volume secrets (Nomad's `operator root keyring list|rotate|remove`, management tokens only).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::rootkeys::{RootKeyCommand, RootKeyMeta};
use drover_core::fsm::{Command, Response as FsmResponse, Table};
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, block_on_table, query_headers};
use drover_io_real::driver::AgentHandle;

fn meta_json(meta: &RootKeyMeta) -> Value {
    json!({
        "KeyID": meta.key_id,
        "Algorithm": drover_io_real::rootkeys::ALGORITHM,
        "State": meta.state.as_str(),
        "CreateTime": meta.create_time_unix_ms as i128 * 1_000_000,
        "CreateIndex": meta.create_index,
        "ModifyIndex": meta.modify_index,
    })
}

fn server_only() -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, "the root keyring needs a server agent".into())
}

pub async fn list(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::RootKeys, &options).await?;
    let keys: Vec<Value> = handle
        .read_state(|state| state.root_keys().iter().map(meta_json).collect())
        .ok_or_else(server_only)?;
    Ok((query_headers(&handle, index), Json(Value::Array(keys))))
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct RotateQuery {
    full: Option<String>,
}

pub async fn rotate(
    State(handle): State<AgentHandle>,
    Query(query): Query<RotateQuery>,
) -> Result<Json<Value>, ApiError> {
    if query
        .full
        .as_deref()
        .is_some_and(|full| super::parse_bool(full) == Some(true))
    {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "full rotation (re-encrypting every variable) is not supported: rotate, and values are re-sealed with the new key as they are written".into(),
        ));
    }
    if !handle.is_server() {
        return Err(server_only());
    }
    let key_id = handle.new_root_key(false).await.map_err(super::root_key_error)?;
    let meta = handle
        .read_state(|state| state.root_keys().get(&key_id).cloned())
        .flatten()
        .ok_or_else(|| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("root key {key_id} not applied"),
            )
        })?;
    Ok(Json(json!({ "Key": meta_json(&meta) })))
}

pub async fn remove(
    State(handle): State<AgentHandle>,
    Path(key_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    drover_core::fsm::rootkeys::check_key_id(&key_id).map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let (index, response) = handle
        .apply(Command::RootKey(RootKeyCommand::Delete { key_id }))
        .await?;
    match response {
        FsmResponse::Done => Ok((query_headers(&handle, index), StatusCode::OK)),
        FsmResponse::NotFound => Err(ApiError(StatusCode::NOT_FOUND, "root key not found".into())),
        FsmResponse::Error(_, message) => Err(ApiError(StatusCode::BAD_REQUEST, message)),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected result {other:?}"),
        )),
    }
}
