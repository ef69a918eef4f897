//! A plugin's snapshots and external volumes (Nomad 1.1+): `/v1/volumes/snapshot` (list,
//! create, delete) and `/v1/volumes/external`, answered by the plugin's controller through
//! the leader. Nothing here is kept in the state: each call asks the storage provider.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use drover_core::rpc::{ListPage, ServerReply, ServerRequest};
use drover_core::structs::{CsiExternalVolume, CsiSnapshot, Secrets};
use serde::Deserialize;
use serde_json::Value;

use super::csi::{csi_secrets_header, validate_id};
use super::{ApiError, QueryOptions, api, namespace, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;

fn snapshot(snapshot: &CsiSnapshot) -> api::CsiSnapshot {
    api::CsiSnapshot {
        id: snapshot.id.clone(),
        external_source_volume_id: snapshot.external_source_volume_id.clone(),
        size_bytes: snapshot.size_bytes,
        create_time: snapshot.create_time,
        is_ready: snapshot.is_ready,
        source_volume_id: snapshot.source_volume_id.clone(),
        plugin_id: snapshot.plugin_id.clone(),
        name: snapshot.name.clone(),
        secrets: None,
        parameters: snapshot.parameters.clone(),
    }
}

fn external(volume: &CsiExternalVolume) -> api::CsiVolumeExternalStub {
    api::CsiVolumeExternalStub {
        external_id: volume.external_id.clone(),
        capacity_bytes: volume.capacity_bytes,
        volume_context: volume.volume_context.clone(),
        clone_id: volume.clone_id.clone(),
        snapshot_id: volume.snapshot_id.clone(),
        published_external_node_ids: volume.published_external_node_ids.clone(),
        is_abnormal: volume.is_abnormal,
        status: volume.status.clone(),
    }
}

/// `?plugin_id=` (required) and the page a listing asks for.
fn listing(options: &QueryOptions) -> Result<(String, ListPage), ApiError> {
    let plugin_id = options.plugin_id.clone().unwrap_or_default();
    if plugin_id.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing plugin_id".into()));
    }
    validate_id("plugin", &plugin_id)?;
    let per_page = match options.per_page.as_deref() {
        None | Some("") => 0,
        Some(text) => text
            .parse::<u32>()
            .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("invalid per_page {text:?}")))?,
    };
    let page = ListPage {
        per_page,
        next_token: options.next_token.clone().unwrap_or_default(),
    };
    Ok((plugin_id, page))
}

/// A page of snapshots or of external volumes, in Nomad's response shape.
fn answered(handle: &AgentHandle, reply: ServerReply) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let (index, page) = match reply {
        ServerReply::Snapshots {
            index,
            snapshots,
            next_token,
        } => (
            index,
            serde_json::to_value(api::CsiSnapshotListResponse {
                snapshots: snapshots.iter().map(snapshot).collect(),
                next_token,
                index,
            }),
        ),
        ServerReply::ExternalVolumes {
            index,
            volumes,
            next_token,
        } => (
            index,
            serde_json::to_value(api::CsiVolumeListExternalResponse {
                volumes: volumes.iter().map(external).collect(),
                next_token,
                index,
            }),
        ),
        ServerReply::Error(error) => return Err(error.into()),
        other => {
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unexpected reply {other:?}"),
            ));
        }
    };
    let page = page.expect("a page of snapshots or volumes serializes");
    Ok((query_headers(handle, index), axum::Json(page)))
}

/// `GET /v1/volumes/snapshot?plugin_id=&per_page=&next_token=` (`X-Nomad-CSI-Secrets`).
pub async fn list_snapshots(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    headers: axum::http::HeaderMap,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let (plugin_id, page) = listing(&options)?;
    let secrets = csi_secrets_header(&headers)?;
    let reply = handle
        .request(ServerRequest::SnapshotList {
            plugin_id,
            page,
            secrets,
        })
        .await;
    answered(&handle, reply)
}

/// `GET /v1/volumes/external?plugin_id=&per_page=&next_token=`.
pub async fn list_external(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let (plugin_id, page) = listing(&options)?;
    let reply = handle
        .request(ServerRequest::VolumeListExternal { plugin_id, page })
        .await;
    answered(&handle, reply)
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct SnapshotSpec {
    #[serde(rename = "SourceVolumeID", default)]
    source_volume_id: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "PluginID", default)]
    plugin_id: String,
    #[serde(default)]
    secrets: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    parameters: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SnapshotCreateBody {
    #[serde(default)]
    snapshots: Vec<SnapshotSpec>,
}

/// `PUT /v1/volumes/snapshot`: `{"Snapshots":[{"SourceVolumeID","Name","PluginID",
/// "Secrets","Parameters"}]}`, answered with the snapshots the plugin made.
pub async fn create_snapshots(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let body: SnapshotCreateBody = parse_body(&body, "snapshot create request")?;
    let mut snapshots = Vec::new();
    for spec in body.snapshots {
        if spec.source_volume_id.is_empty() {
            return Err(ApiError(StatusCode::BAD_REQUEST, "missing volume ID".into()));
        }
        validate_id("volume", &spec.source_volume_id)?;
        let secrets: Secrets = spec.secrets.into();
        let secrets = handle.seal_secrets(&secrets).await.map_err(super::root_key_error)?;
        snapshots.push(CsiSnapshot {
            source_volume_id: spec.source_volume_id,
            name: spec.name,
            plugin_id: spec.plugin_id,
            secrets,
            parameters: spec.parameters,
            ..CsiSnapshot::default()
        });
    }
    let request = ServerRequest::SnapshotCreate {
        namespace: namespace(&options),
        snapshots,
    };
    let reply = handle.request(request).await;
    answered(&handle, reply)
}

/// `DELETE /v1/volumes/snapshot?plugin_id=&snapshot_id=` (`X-Nomad-CSI-Secrets`).
pub async fn delete_snapshot(
    State(handle): State<AgentHandle>,
    Query(options): Query<SnapshotQuery>,
    headers: axum::http::HeaderMap,
) -> Result<(axum::http::HeaderMap, StatusCode), ApiError> {
    if options.plugin_id.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing plugin_id".into()));
    }
    if options.snapshot_id.is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing snapshot_id".into()));
    }
    validate_id("plugin", &options.plugin_id)?;
    let secrets = csi_secrets_header(&headers)?;
    let secrets = handle.seal_secrets(&secrets).await.map_err(super::root_key_error)?;
    let request = ServerRequest::SnapshotDelete {
        snapshots: vec![CsiSnapshot {
            id: options.snapshot_id,
            plugin_id: options.plugin_id,
            secrets,
            ..CsiSnapshot::default()
        }],
    };
    match handle.request(request).await {
        ServerReply::Error(error) => Err(error.into()),
        reply => Ok((query_headers(&handle, reply.index().unwrap_or(0)), StatusCode::OK)),
    }
}

#[derive(Deserialize)]
pub struct SnapshotQuery {
    #[serde(default)]
    plugin_id: String,
    #[serde(default)]
    snapshot_id: String,
}
