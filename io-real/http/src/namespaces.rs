//! `/v1/namespaces` and `/v1/namespace/:name` (Nomad's namespace API): list, read, create or
//! update, delete. `default` always exists; a job may be registered only into a namespace that
//! exists. Writes are direct Raft writes checked by the core (`fsm::namespaces`).

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use drover_core::acl::Acl;
use drover_core::fsm::namespaces::{Namespace, NamespaceCommand};
use drover_core::fsm::{Command, Response, Table};

use super::{ApiError, QueryOptions, block_on_table, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;

/// Nomad's `Namespace` JSON.
pub fn render(namespace: &Namespace) -> Value {
    json!({
        "Name": namespace.name,
        "Description": namespace.description,
        "Quota": "",
        "Meta": if namespace.meta.is_empty() { Value::Null } else { json!(namespace.meta) },
        "Capabilities": Value::Null,
        "CreateIndex": namespace.create_index,
        "ModifyIndex": namespace.modify_index,
    })
}

/// `GET /v1/namespaces[?prefix=]`: those the token may see anything in.
pub async fn list(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    acl: Option<Extension<Acl>>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::Namespaces, &options).await?;
    let prefix = options.prefix.clone().unwrap_or_default();
    let namespaces = handle.read_state(|state| state.namespaces()).unwrap_or_default();
    let list: Vec<Value> = namespaces
        .iter()
        .filter(|namespace| namespace.name.starts_with(&prefix))
        .filter(|namespace| {
            acl.as_ref()
                .is_none_or(|acl| acl.allows_namespace_at_all(&namespace.name))
        })
        .map(render)
        .collect();
    Ok((query_headers(&handle, index), axum::Json(list)))
}

/// `GET /v1/namespace/:name`.
pub async fn read(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
    Query(options): Query<QueryOptions>,
    acl: Option<Extension<Acl>>,
) -> Result<impl IntoResponse, ApiError> {
    if acl.is_some_and(|acl| !acl.allows_namespace_at_all(&name)) {
        return Err(ApiError(StatusCode::FORBIDDEN, "Permission denied".into()));
    }
    let index = block_on_table(&handle, Table::Namespaces, &options).await?;
    match handle.read_state(|state| state.namespace(&name)).flatten() {
        Some(namespace) => Ok((query_headers(&handle, index), axum::Json(render(&namespace)))),
        None => Err(ApiError(StatusCode::NOT_FOUND, "Namespace not found".into())),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct NamespaceBody {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    meta: Option<std::collections::BTreeMap<String, String>>,
    // Enterprise fields, accepted empty (Nomad's Go client sends them).
    #[serde(default)]
    quota: String,
    #[serde(default)]
    capabilities: Option<Value>,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
}

/// `PUT|POST /v1/namespace[/:name]` with a `Namespace` body: created or replaced.
pub async fn write(
    State(handle): State<AgentHandle>,
    name: Option<Path<String>>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: NamespaceBody = parse_body(&body, "namespace")?;
    if !body.quota.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "namespace quotas are a Nomad Enterprise feature Drover does not have".into(),
        ));
    }
    if body.capabilities.as_ref().is_some_and(|value| !value.is_null()) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "namespace capabilities are not supported".into(),
        ));
    }
    let _ = (body.create_index, body.modify_index);
    let name = match name {
        Some(Path(name)) if !body.name.is_empty() && body.name != name => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "namespace name in the path ({name:?}) and the body ({:?}) differ",
                    body.name
                ),
            ));
        }
        Some(Path(name)) => name,
        None => body.name,
    };
    let command = Command::Namespace(NamespaceCommand::Upsert {
        namespaces: vec![Namespace {
            name,
            description: body.description,
            meta: body.meta.unwrap_or_default(),
            ..Namespace::default()
        }],
    });
    answer(handle.apply(command).await?)
}

/// `DELETE /v1/namespace/:name`.
pub async fn delete(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let command = Command::Namespace(NamespaceCommand::Delete { names: vec![name] });
    answer(handle.apply(command).await?)
}

/// An applied write: Nomad answers with an empty body and the write's index.
fn answer((index, response): (u64, Response)) -> Result<impl IntoResponse, ApiError> {
    match response {
        Response::Error(kind, text) => Err(drover_core::rpc::RpcError::new(kind, text, false).into()),
        _ => {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("X-Nomad-Index", index.into());
            Ok((headers, StatusCode::OK))
        }
    }
}
