//! CSI volumes, CSI plugins and nodes (reference §7.1): reads from the local state store
//! (stale reads allowed, blocking on the table's index), writes through the leader's endpoints.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::{ServerState, Table};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, AttachmentMode, CsiCapability, CsiMountOptions, CsiTopology, CsiTopologyRequest, CsiVolume,
    DEFAULT_NAMESPACE,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, namespace, parse_body, query_headers, render};
use drover_io_real::driver::AgentHandle;

const ID_LEN_MAX: usize = 128;

/// Volume and plugin ids become CSI RPC arguments and client path components: no path
/// separators, no `..`, no control characters, bounded length.
pub fn validate_id(kind: &str, id: &str) -> Result<(), ApiError> {
    let reason = if id.is_empty() {
        "must not be empty"
    } else if id.len() > ID_LEN_MAX {
        "must be at most 128 bytes"
    } else if id.contains('/') || id.contains('\\') {
        "must not contain path separators"
    } else if id.contains("..") {
        "must not contain \"..\""
    } else if id.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        return Ok(());
    };
    Err(ApiError(
        StatusCode::BAD_REQUEST,
        format!("invalid {kind} ID {id:?}: {reason}"),
    ))
}

/// Maps an endpoint reply to HTTP (by the error's kind, [`super::reply_index`]).
pub(super) fn reply_to_result(reply: ServerReply) -> Result<u64, ApiError> {
    super::reply_index(reply)
}

/// The page of volume stubs `options` asks for in `namespace` (`*`: every one), and the next
/// page's token (`GET /v1/volumes?type=csi`).
fn volumes_page(
    state: &ServerState,
    options: &QueryOptions,
    namespace: &str,
    filter: &super::page::ItemFilter,
) -> (Vec<Value>, Option<String>) {
    let every_namespace = namespace == "*";
    let on_node = options.node_id.as_ref().map(|node| state.volumes_on_node(node));
    let keys: Vec<&(String, String)> = match &options.plugin_id {
        Some(plugin) => state.volumes_of_plugin(plugin).collect(),
        None => state.volume_keys().collect(),
    };
    let matching = keys
        .into_iter()
        .filter(|(ns, _)| every_namespace || *ns == namespace)
        .filter(|(_, id)| options.prefix.as_ref().is_none_or(|prefix| id.starts_with(prefix)))
        .filter(|key| on_node.as_ref().is_none_or(|keys| keys.contains(*key)))
        .filter(|(ns, id)| {
            filter.keeps(|| {
                state
                    .volume(ns, id)
                    .map_or(Value::Null, |volume| render::volume(&volume, state))
            })
        })
        .map(|key| {
            let token = if every_namespace {
                format!("{}.{}", key.0, key.1)
            } else {
                key.1.clone()
            };
            (token, key)
        });
    // Paged on the keys, so only the page's volumes are looked up and rendered.
    let (keys, next) = if every_namespace {
        super::page::namespaced_page(matching, options)
    } else {
        super::page::page(matching, options)
    };
    let volumes = keys
        .into_iter()
        .filter_map(|(ns, id)| state.volume(ns, id))
        .filter(|volume| {
            options
                .plugin_id
                .as_ref()
                .is_none_or(|plugin| volume.plugin_id == *plugin)
        })
        .map(|volume| render::volume_stub(&volume))
        .collect();
    (volumes, next)
}

/// The page of plugin stubs `options` asks for, and the next page's token.
fn plugins_page(state: &ServerState, options: &QueryOptions) -> (Vec<Value>, Option<String>) {
    let matching = state
        .plugins()
        .filter(|plugin| {
            options
                .prefix
                .as_ref()
                .is_none_or(|prefix| plugin.id.starts_with(prefix))
        })
        .map(|plugin| (plugin.id.clone(), plugin));
    let (plugins, next) = super::page::page(matching, options);
    (plugins.into_iter().map(render::plugin_stub).collect(), next)
}

pub async fn list_volumes(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    match options.kind.as_deref() {
        None => return Ok((query_headers(&handle, 1), axum::Json(Vec::new()))),
        Some("csi") => {}
        Some(other) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("unsupported volume type {other:?}"),
            ));
        }
    }
    let filter = super::page::ItemFilter::of(&options)?;
    let namespace = namespace(&options);
    super::blocking_page(&handle, Table::CsiVolumes, options, move |state, options| {
        let listed = volumes_page(state, options, &namespace, &filter);
        filter.finish(listed)
    })
    .await
}

pub async fn get_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("volume", &id)?;
    let namespace = namespace(&options);
    super::blocking_one(&handle, Table::CsiVolumes, &options, "volume not found", |state| {
        state
            .volume(&namespace, &id)
            .map(|volume| render::volume(&volume, state))
    })
    .await
}

#[derive(Deserialize)]
struct RegisterBody {
    #[serde(rename = "Volumes", default)]
    volumes: Vec<VolumeSpec>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct CapabilitySpec {
    #[serde(rename = "AccessMode")]
    access_mode: String,
    #[serde(rename = "AttachmentMode")]
    attachment_mode: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct MountSpec {
    #[serde(rename = "FSType")]
    fs_type: String,
    #[serde(rename = "MountFlags")]
    mount_flags: Vec<String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct TopologySpec {
    #[serde(rename = "Segments")]
    segments: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct TopologyRequestSpec {
    #[serde(rename = "Required")]
    required: Vec<TopologySpec>,
    #[serde(rename = "Preferred")]
    preferred: Vec<TopologySpec>,
}

/// A volume as Nomad's API accepts it for registration.
#[derive(Default, Deserialize)]
#[serde(default)]
struct VolumeSpec {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "ExternalID")]
    external_id: String,
    #[serde(rename = "Namespace")]
    namespace: String,
    #[serde(rename = "PluginID")]
    plugin_id: String,
    #[serde(rename = "AccessMode")]
    access_mode: String,
    #[serde(rename = "AttachmentMode")]
    attachment_mode: String,
    #[serde(rename = "RequestedCapabilities")]
    requested_capabilities: Vec<CapabilitySpec>,
    #[serde(rename = "MountOptions")]
    mount_options: Option<MountSpec>,
    #[serde(rename = "Secrets")]
    secrets: BTreeMap<String, String>,
    #[serde(rename = "Parameters")]
    parameters: BTreeMap<String, String>,
    #[serde(rename = "Context")]
    context: BTreeMap<String, String>,
    #[serde(rename = "RequestedTopologies")]
    requested_topologies: Option<TopologyRequestSpec>,
    #[serde(rename = "RequestedCapacityMin")]
    requested_capacity_min: u64,
    #[serde(rename = "RequestedCapacityMax")]
    requested_capacity_max: u64,
    #[serde(rename = "SnapshotID")]
    snapshot_id: String,
    #[serde(rename = "CloneID")]
    clone_id: String,
}

fn access_mode(text: &str) -> Result<AccessMode, ApiError> {
    AccessMode::parse(text).ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("unknown access mode {text:?}")))
}

fn attachment_mode(text: &str) -> Result<AttachmentMode, ApiError> {
    AttachmentMode::parse(text)
        .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("unknown attachment mode {text:?}")))
}

fn topology(spec: TopologySpec) -> CsiTopology {
    CsiTopology {
        segments: spec.segments,
    }
}

impl VolumeSpec {
    fn into_volume(self) -> Result<CsiVolume, ApiError> {
        validate_id("volume", &self.id)?;
        drover_core::structs::check_secret_keys("volume secrets", self.secrets.keys())
            .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
        if !self.plugin_id.is_empty() {
            validate_id("plugin", &self.plugin_id)?;
        }
        let mut capabilities = Vec::new();
        for capability in &self.requested_capabilities {
            capabilities.push(CsiCapability {
                access_mode: access_mode(&capability.access_mode)?,
                attachment_mode: attachment_mode(&capability.attachment_mode)?,
            });
        }
        // Before 1.1 the modes sat on the volume itself; accept that shape too.
        if capabilities.is_empty() && !self.access_mode.is_empty() {
            capabilities.push(CsiCapability {
                access_mode: access_mode(&self.access_mode)?,
                attachment_mode: attachment_mode(&self.attachment_mode)?,
            });
        }
        Ok(CsiVolume {
            name: if self.name.is_empty() {
                self.id.clone()
            } else {
                self.name
            },
            id: self.id,
            namespace: if self.namespace.is_empty() {
                DEFAULT_NAMESPACE.to_string()
            } else {
                self.namespace
            },
            external_id: self.external_id,
            plugin_id: self.plugin_id,
            requested_capabilities: capabilities,
            mount_options: self.mount_options.map(|options| CsiMountOptions {
                fs_type: options.fs_type,
                mount_flags: options.mount_flags,
            }),
            secrets: self.secrets.into(),
            parameters: self.parameters,
            context: self.context,
            requested_topologies: self.requested_topologies.map(|request| CsiTopologyRequest {
                required: request.required.into_iter().map(topology).collect(),
                preferred: request.preferred.into_iter().map(topology).collect(),
            }),
            requested_capacity_min: self.requested_capacity_min,
            requested_capacity_max: self.requested_capacity_max,
            snapshot_id: self.snapshot_id,
            clone_id: self.clone_id,
            ..CsiVolume::default()
        })
    }
}

/// `PUT /v1/volume/csi/:id` body into the volumes it registers.
pub fn decode_register(id: &str, body: &[u8]) -> Result<Vec<CsiVolume>, ApiError> {
    validate_id("volume", id)?;
    let body: RegisterBody = parse_body(body, "volume request")?;
    if body.volumes.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "request must contain a \"Volumes\" list with at least one volume".into(),
        ));
    }
    body.volumes
        .into_iter()
        .map(|mut spec| {
            if spec.id.is_empty() {
                spec.id = id.to_string();
            }
            spec.into_volume()
        })
        .collect()
}

pub async fn put_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let volumes = decode_register(&id, &body)?;
    write_volumes(&handle, volumes, |volumes| ServerRequest::VolumeRegister { volumes }).await
}

/// `PUT /v1/volume/csi/:id/create`: the plugin's controller makes each volume (Nomad 1.1's
/// `volume create`), then it is registered; answered with the volumes as stored.
pub async fn create_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let volumes = decode_register(&id, &body)?;
    write_volumes(&handle, volumes, |volumes| ServerRequest::VolumeCreate { volumes }).await
}

/// `DELETE /v1/volume/csi/:id/delete`: the plugin deletes the volume, then it is
/// deregistered; `X-Nomad-CSI-Secrets: key=value,...` overrides the volume's secrets.
pub async fn delete_created_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("volume", &id)?;
    let secrets = csi_secrets_header(&headers)?;
    let secrets = handle.seal_secrets(&secrets).await.map_err(super::root_key_error)?;
    let request = ServerRequest::VolumeDelete {
        namespace: namespace(&options),
        volume_id: id,
        secrets,
    };
    let index = reply_to_result(handle.request_applied(request).await)?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

/// Nomad's `X-Nomad-CSI-Secrets` header: `key=value` pairs separated by commas.
pub(super) fn csi_secrets_header(headers: &axum::http::HeaderMap) -> Result<drover_core::structs::Secrets, ApiError> {
    let Some(value) = headers.get("X-Nomad-CSI-Secrets") else {
        return Ok(Default::default());
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, "X-Nomad-CSI-Secrets is not text".into()))?;
    let mut secrets = std::collections::BTreeMap::new();
    for pair in text.split(',').filter(|pair| !pair.trim().is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                "X-Nomad-CSI-Secrets must be key=value pairs separated by commas".into(),
            )
        })?;
        secrets.insert(key.trim().to_string(), value.trim().to_string());
    }
    drover_core::structs::check_secret_keys("volume secrets", secrets.keys())
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    Ok(secrets.into())
}

/// Seals each volume's secrets, sends `request(volumes)` and answers the volumes as stored.
async fn write_volumes(
    handle: &AgentHandle,
    mut volumes: Vec<CsiVolume>,
    request: impl FnOnce(Vec<CsiVolume>) -> ServerRequest,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let handle = handle.clone();
    // Sealed before Raft: the log and the snapshots never hold the secrets.
    for volume in &mut volumes {
        volume.secrets = handle
            .seal_secrets(&volume.secrets)
            .await
            .map_err(super::root_key_error)?;
    }
    let keys: Vec<(String, String)> = volumes.iter().map(CsiVolume::key).collect();
    let index = reply_to_result(handle.request_applied(request(volumes)).await)?;
    let registered: Vec<Value> = handle
        .read_state(|state| {
            keys.iter()
                .filter_map(|(ns, id)| state.volume(ns, id))
                .map(|volume| render::volume(&volume, state))
                .collect()
        })
        .unwrap_or_default();
    Ok((
        query_headers(&handle, index),
        axum::Json(json!({ "Volumes": registered, "Warnings": "", "Index": index })),
    ))
}

pub async fn delete_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("volume", &id)?;
    let request = ServerRequest::VolumeDeregister {
        namespace: namespace(&options),
        volume_ids: vec![id],
        force: options.force.unwrap_or(false),
    };
    let index = reply_to_result(handle.request_applied(request).await)?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

pub async fn detach_volume(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("volume", &id)?;
    let Some(node) = options.node.clone().filter(|node| !node.is_empty()) else {
        return Err(ApiError(StatusCode::BAD_REQUEST, "detach requires node ID".into()));
    };
    let request = ServerRequest::VolumeDetach {
        namespace: namespace(&options),
        volume_id: id,
        node_id: node,
    };
    let index = reply_to_result(handle.request_applied(request).await)?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

pub async fn list_plugins(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    match options.kind.as_deref() {
        None => return Ok((query_headers(&handle, 1), axum::Json(Vec::new()))),
        Some("csi") => {}
        Some(other) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("unsupported plugin type {other:?}"),
            ));
        }
    }
    super::blocking_page(&handle, Table::CsiPlugins, options, move |state, options| {
        Ok(plugins_page(state, options))
    })
    .await
}

pub async fn get_plugin(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("plugin", &id)?;
    super::blocking_one(&handle, Table::CsiPlugins, &options, "plugin not found", |state| {
        state.plugin(&id).map(|plugin| render::plugin(plugin, state))
    })
    .await
}

pub async fn delete_plugin(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    validate_id("plugin", &id)?;
    let index = reply_to_result(
        handle
            .request_applied(ServerRequest::PluginDelete { plugin_id: id })
            .await,
    )?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

pub async fn list_nodes(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = super::page::ItemFilter::of(&options)?;
    super::blocking_page(&handle, Table::Nodes, options, move |state, options| {
        let matching = state
            .nodes()
            .filter(|node| options.prefix.as_ref().is_none_or(|prefix| node.id.starts_with(prefix)))
            .filter(|node| filter.keeps(|| render::node(node)))
            .map(|node| (node.id.clone(), node));
        let (nodes, next) = super::page::page(matching, options);
        let (resources, os) = (options.resources.unwrap_or(false), options.os.unwrap_or(false));
        let stub = |node: &drover_core::structs::Node| {
            let mut stub = if resources {
                render::node_stub_with_resources(node)
            } else {
                render::node_stub(node)
            };
            if os {
                // Nomad's stub then carries the one attribute, `os.name`.
                let name = node.attributes.get("os.name").cloned().unwrap_or_default();
                stub["Attributes"] = serde_json::json!({ "os.name": name });
            }
            stub
        };
        filter.finish((nodes.into_iter().map(stub).collect(), next))
    })
    .await
}

pub async fn get_node(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_one(&handle, Table::Nodes, &options, "node not found", |state| {
        state.node(&id).map(render::node)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::fsm::{Command, Entry};
    use drover_core::structs::{CsiControllerInfo, CsiInfo, CsiNodeInfo, Node, NodeStatus};

    fn options(query: &str) -> QueryOptions {
        let uri: axum::http::Uri = format!("/v1/volumes?{query}").parse().unwrap();
        Query::<QueryOptions>::try_from_uri(&uri).unwrap().0
    }

    /// A state with plugins `p` and `q` on one node and volumes v0..v4 of `p`.
    fn state() -> ServerState {
        let info = |plugin: &str, controller: bool| CsiInfo {
            plugin_id: plugin.into(),
            alloc_id: format!("plug-{plugin}"),
            healthy: true,
            controller_info: controller.then(CsiControllerInfo::default),
            node_info: (!controller).then(|| CsiNodeInfo {
                id: "ext-n1".into(),
                ..CsiNodeInfo::default()
            }),
            ..CsiInfo::default()
        };
        let node = Node {
            id: "n1".into(),
            status: NodeStatus::Ready,
            csi_controller_plugins: ["p", "q"].map(|p| (p.to_string(), info(p, true))).into(),
            csi_node_plugins: ["p", "q"].map(|p| (p.to_string(), info(p, false))).into(),
            ..Node::default()
        };
        let volume = |id: String| CsiVolume {
            id: id.clone(),
            name: id,
            namespace: "default".into(),
            plugin_id: "p".into(),
            requested_capabilities: vec![CsiCapability {
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
            }],
            ..CsiVolume::default()
        };
        let mut state = ServerState::default();
        let commands = [
            Command::NodeRegister { node },
            Command::CsiVolumeRegister {
                volumes: (0..5).map(|n| volume(format!("v{n}"))).collect(),
            },
        ];
        for (index, command) in commands.into_iter().enumerate() {
            let index = index as u64 + 1;
            state.apply(
                index,
                &Entry {
                    at_unix_ms: index,
                    command,
                },
            );
        }
        state
    }

    fn ids(page: &[Value]) -> Vec<&str> {
        page.iter().map(|item| item["ID"].as_str().unwrap()).collect()
    }

    /// Volume and plugin lists page as the others do: following the tokens gives every item
    /// once, in ID order, and the last page has no token.
    #[test]
    fn volume_and_plugin_lists_page_with_next_tokens() {
        let state = state();
        let volumes_page = |state: &ServerState, options: &QueryOptions, namespace: &str| {
            let filter = super::super::page::ItemFilter::of(options).unwrap();
            let listed = volumes_page(state, options, namespace, &filter);
            filter.finish(listed).unwrap()
        };
        let (page, next) = volumes_page(&state, &options("per_page=2"), "default");
        assert_eq!((ids(&page), next.as_deref()), (vec!["v0", "v1"], Some("v2")));
        let (page, next) = volumes_page(&state, &options("per_page=2&next_token=v2"), "default");
        assert_eq!((ids(&page), next.as_deref()), (vec!["v2", "v3"], Some("v4")));
        let (page, next) = volumes_page(&state, &options("per_page=2&next_token=v4"), "default");
        assert_eq!((ids(&page), next), (vec!["v4"], None));
        // Every namespace: tokens name the namespace too.
        let (_, next) = volumes_page(&state, &options("per_page=3"), "*");
        assert_eq!(next.as_deref(), Some("default.v3"));
        // Filters apply before paging: a prefix, another plugin's (none), no paging at all.
        let (page, next) = volumes_page(&state, &options("per_page=1&prefix=v4"), "default");
        assert_eq!((ids(&page), next), (vec!["v4"], None));
        assert!(volumes_page(&state, &options("plugin_id=q"), "default").0.is_empty());
        assert_eq!(volumes_page(&state, &options(""), "default").0.len(), 5);
        let (page, next) = volumes_page(&state, &options("filter=ID%20%3D%3D%20%22v3%22"), "default");
        assert_eq!((ids(&page), next), (vec!["v3"], None));

        let (page, next) = plugins_page(&state, &options("per_page=1"));
        assert_eq!((ids(&page), next.as_deref()), (vec!["p"], Some("q")));
        let (page, next) = plugins_page(&state, &options("per_page=1&next_token=q"));
        assert_eq!((ids(&page), next), (vec!["q"], None));
    }

    #[test]
    fn csi_secrets_come_from_nomads_header_as_comma_separated_pairs() {
        let mut headers = axum::http::HeaderMap::new();
        assert!(csi_secrets_header(&headers).unwrap().is_empty());
        headers.insert("X-Nomad-CSI-Secrets", "token=abc, region = eu".parse().unwrap());
        let secrets = csi_secrets_header(&headers).unwrap();
        assert_eq!(
            secrets.clone().into_iter().collect::<Vec<_>>(),
            [
                ("region".to_string(), "eu".to_string()),
                ("token".to_string(), "abc".to_string())
            ]
        );
        headers.insert("X-Nomad-CSI-Secrets", "no-equals-sign".parse().unwrap());
        assert!(csi_secrets_header(&headers).unwrap_err().1.contains("key=value pairs"));
        headers.insert("X-Nomad-CSI-Secrets", "=empty-key".parse().unwrap());
        assert!(csi_secrets_header(&headers).is_err(), "an empty key is refused by name");
    }
}
