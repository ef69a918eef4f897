//! Production CSI: gRPC to a plugin over its unix socket (tonic). Mirrored by
//! `drover-io-sim`'s `csi.rs`, whose plugins fail, hang or are slow on command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_proto::csi::v1::controller_client::ControllerClient;
use drover_proto::csi::v1::identity_client::IdentityClient;
use drover_proto::csi::v1::node_client::NodeClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("cannot connect to CSI plugin at {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
}

/// A connection to one plugin's socket; cheap to clone (one HTTP/2 channel).
#[derive(Clone, Debug)]
pub struct CsiClient {
    channel: Channel,
    socket: PathBuf,
}

impl CsiClient {
    /// Connects to the plugin listening on `socket` ("unix:///path" or a path).
    pub async fn connect(socket: impl AsRef<Path>, timeout: Duration) -> Result<CsiClient, CsiError> {
        let text = socket.as_ref().to_string_lossy().into_owned();
        let socket = PathBuf::from(text.strip_prefix("unix://").unwrap_or(&text));
        let path = socket.clone();
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = Endpoint::from_static("http://csi.plugin")
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|error| CsiError::Connect {
                path: socket.clone(),
                reason: error.to_string(),
            })?;
        Ok(CsiClient { channel, socket })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}

// --- the core's CSI calls, executed over gRPC ----------------------------------------------

use drover_core::client::{CsiCall, CsiReply, ErrorKind, IoError, Outcome, Reply, VolumeCapability};
use drover_core::error::CsiCallError;
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest, ControllerCreateRequest};
use drover_core::structs::{AccessMode, AttachmentMode, CsiCapability, CsiControllerInfo, CsiTopology};
use drover_proto::csi::v1 as csi;

/// gRPC status codes the core's retry rules care about.
/// Secrets reach a plugin opened by the server that sent them; a sealed map here would be
/// ciphertext handed to the plugin as credentials, so the call is refused instead.
fn sealed_refusal(call: &str) -> String {
    format!("{call}: the volume's secrets arrived sealed (the server did not open them); not sent to the plugin")
}

pub fn status_error(call: &str, status: tonic::Status) -> IoError {
    let kind = match status.code() {
        tonic::Code::DeadlineExceeded => ErrorKind::Timeout,
        tonic::Code::Unavailable => ErrorKind::Unavailable,
        tonic::Code::ResourceExhausted => ErrorKind::ResourceExhausted,
        tonic::Code::NotFound => ErrorKind::NotFound,
        tonic::Code::FailedPrecondition => ErrorKind::FailedPrecondition,
        _ => ErrorKind::Other,
    };
    IoError::new(
        kind,
        format!(
            "{call}: rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        ),
    )
}

fn access_mode(mode: AccessMode) -> i32 {
    use csi::volume_capability::access_mode::Mode;
    (match mode {
        AccessMode::Unknown => Mode::Unknown,
        AccessMode::SingleNodeReader => Mode::SingleNodeReaderOnly,
        AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
        AccessMode::MultiNodeReader => Mode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
    }) as i32
}

/// Attachment mode → access type (`file-system` mounts with fs type and flags; `block-device`).
pub fn capability(capability: &VolumeCapability) -> csi::VolumeCapability {
    let access_type = match capability.attachment_mode {
        AttachmentMode::BlockDevice => {
            csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {})
        }
        AttachmentMode::FileSystem | AttachmentMode::Unknown => {
            csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: capability.mount_options.fs_type.clone(),
                mount_flags: capability.mount_options.mount_flags.clone(),
                volume_mount_group: String::new(),
            })
        }
    };
    csi::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: access_mode(capability.access_mode),
        }),
    }
}

pub(crate) fn plain(capability: &CsiCapability) -> csi::VolumeCapability {
    self::capability(&VolumeCapability {
        access_mode: capability.access_mode,
        attachment_mode: capability.attachment_mode,
        mount_options: Default::default(),
    })
}

fn controller_info(capabilities: &[csi::ControllerServiceCapability]) -> CsiControllerInfo {
    use csi::controller_service_capability::rpc::Type;
    let mut info = CsiControllerInfo::default();
    for capability in capabilities {
        let Some(csi::controller_service_capability::Type::Rpc(rpc)) = &capability.r#type else {
            continue;
        };
        match Type::try_from(rpc.r#type) {
            Ok(Type::CreateDeleteVolume) => info.supports_create_delete = true,
            Ok(Type::PublishUnpublishVolume) => info.supports_attach_detach = true,
            Ok(Type::ListVolumes) => info.supports_list_volumes = true,
            Ok(Type::GetCapacity) => info.supports_get_capacity = true,
            Ok(Type::CreateDeleteSnapshot) => info.supports_create_delete_snapshot = true,
            Ok(Type::ListSnapshots) => info.supports_list_snapshots = true,
            Ok(Type::CloneVolume) => info.supports_clone = true,
            Ok(Type::PublishReadonly) => info.supports_read_only_attach = true,
            Ok(Type::ExpandVolume) => info.supports_expand = true,
            Ok(Type::ListVolumesPublishedNodes) => info.supports_list_volumes_attached_nodes = true,
            Ok(Type::VolumeCondition) => info.supports_condition = true,
            Ok(Type::GetVolume) => info.supports_get = true,
            _ => {}
        }
    }
    info
}

impl CsiClient {
    /// Executes one of the core's CSI calls; the deadline is the caller's.
    pub async fn execute(&self, call: &CsiCall) -> Outcome {
        let name = call.name();
        let error = |status| status_error(name, status);
        if let CsiCall::NodeStageVolume { secrets, .. } | CsiCall::NodePublishVolume { secrets, .. } = call
            && secrets.is_sealed()
        {
            return Err(IoError::new(ErrorKind::Other, sealed_refusal(name)));
        }
        let reply = match call.clone() {
            CsiCall::Probe => {
                let response = self.identity().probe(csi::ProbeRequest {}).await.map_err(error)?;
                // An absent `ready` means ready (CSI spec).
                CsiReply::Probe {
                    ready: response.into_inner().ready.unwrap_or(true),
                }
            }
            CsiCall::GetPluginInfo => {
                let info = self
                    .identity()
                    .get_plugin_info(csi::GetPluginInfoRequest {})
                    .await
                    .map_err(error)?
                    .into_inner();
                CsiReply::PluginInfo {
                    name: info.name,
                    version: info.vendor_version,
                }
            }
            CsiCall::GetPluginCapabilities => {
                use csi::plugin_capability::service::Type;
                let capabilities = self
                    .identity()
                    .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
                    .await
                    .map_err(error)?
                    .into_inner()
                    .capabilities;
                let has = |wanted: Type| {
                    capabilities.iter().any(|capability| {
                        matches!(&capability.r#type,
                            Some(csi::plugin_capability::Type::Service(service)) if service.r#type == wanted as i32)
                    })
                };
                CsiReply::PluginCapabilities {
                    controller_service: has(Type::ControllerService),
                    accessibility_constraints: has(Type::VolumeAccessibilityConstraints),
                }
            }
            CsiCall::ControllerGetCapabilities => {
                let response = self
                    .controller()
                    .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                    .await
                    .map_err(error)?
                    .into_inner();
                CsiReply::ControllerCapabilities(controller_info(&response.capabilities))
            }
            CsiCall::NodeGetInfo => {
                let info = self
                    .node()
                    .node_get_info(csi::NodeGetInfoRequest {})
                    .await
                    .map_err(error)?
                    .into_inner();
                CsiReply::NodeInfo {
                    node_id: info.node_id,
                    max_volumes: info.max_volumes_per_node.max(0) as u64,
                    topology: info.accessible_topology.map(|topology| CsiTopology {
                        segments: topology.segments.into_iter().collect(),
                    }),
                }
            }
            CsiCall::NodeGetCapabilities => {
                use csi::node_service_capability::rpc::Type;
                let capabilities = self
                    .node()
                    .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                    .await
                    .map_err(error)?
                    .into_inner()
                    .capabilities;
                let has = |wanted: Type| {
                    capabilities.iter().any(|capability| {
                        matches!(&capability.r#type,
                            Some(csi::node_service_capability::Type::Rpc(rpc)) if rpc.r#type == wanted as i32)
                    })
                };
                CsiReply::NodeCapabilities {
                    stage_unstage: has(Type::StageUnstageVolume),
                    stats: has(Type::GetVolumeStats),
                    expand: has(Type::ExpandVolume),
                    condition: has(Type::VolumeCondition),
                }
            }
            CsiCall::NodeStageVolume {
                volume_id,
                publish_context,
                staging_target_path,
                capability,
                secrets,
                volume_context,
            } => {
                self.node()
                    .node_stage_volume(csi::NodeStageVolumeRequest {
                        volume_id,
                        publish_context: publish_context.into_iter().collect(),
                        staging_target_path,
                        volume_capability: Some(self::capability(&capability)),
                        secrets: secrets.into_iter().collect(),
                        volume_context: volume_context.into_iter().collect(),
                    })
                    .await
                    .map_err(error)?;
                CsiReply::Done
            }
            CsiCall::NodePublishVolume {
                volume_id,
                publish_context,
                staging_target_path,
                target_path,
                capability,
                readonly,
                secrets,
                volume_context,
            } => {
                self.node()
                    .node_publish_volume(csi::NodePublishVolumeRequest {
                        volume_id,
                        publish_context: publish_context.into_iter().collect(),
                        staging_target_path,
                        target_path,
                        volume_capability: Some(self::capability(&capability)),
                        readonly,
                        secrets: secrets.into_iter().collect(),
                        volume_context: volume_context.into_iter().collect(),
                    })
                    .await
                    .map_err(error)?;
                CsiReply::Done
            }
            CsiCall::NodeUnpublishVolume { volume_id, target_path } => {
                self.node()
                    .node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id, target_path })
                    .await
                    .map_err(error)?;
                CsiReply::Done
            }
            CsiCall::NodeUnstageVolume {
                volume_id,
                staging_target_path,
            } => {
                self.node()
                    .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                        volume_id,
                        staging_target_path,
                    })
                    .await
                    .map_err(error)?;
                CsiReply::Done
            }
            CsiCall::NodeExpandVolume {
                volume_id,
                volume_path,
                staging_target_path,
                capacity_min,
                capacity_max,
                capability: wanted,
            } => {
                let bytes = |value: u64| {
                    i64::try_from(value)
                        .map_err(|_| IoError::new(ErrorKind::Other, format!("capacity {value} is out of range")))
                };
                let answer = self
                    .node()
                    .node_expand_volume(csi::NodeExpandVolumeRequest {
                        volume_id,
                        volume_path,
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: bytes(capacity_min)?,
                            limit_bytes: bytes(capacity_max)?,
                        }),
                        staging_target_path,
                        volume_capability: Some(capability(&wanted)),
                        secrets: Default::default(),
                    })
                    .await
                    .map_err(error)?
                    .into_inner();
                CsiReply::Expanded {
                    capacity: u64::try_from(answer.capacity_bytes).unwrap_or(0),
                }
            }
        };
        Ok(Reply::Csi(reply))
    }

    /// A server's `ClientCSI` controller call, executed against this controller plugin.
    pub async fn controller_request(&self, request: &ClientCsiRequest) -> Result<ClientCsiReply, CsiCallError> {
        let sealed = match request {
            ClientCsiRequest::ControllerAttach(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerDetach(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerValidate(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerCreate(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerDelete(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerCreateSnapshot(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerDeleteSnapshot(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerListSnapshots(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerExpand(request) => request.secrets.is_sealed(),
            ClientCsiRequest::ControllerListVolumes(_)
            | ClientCsiRequest::NodeDetach(_)
            | ClientCsiRequest::NodeExpand(_) => false,
        };
        if sealed {
            return Err(sealed_refusal("a controller call").into());
        }
        match request {
            ClientCsiRequest::ControllerAttach(request) => {
                let response = self
                    .controller()
                    .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                        volume_id: request.volume_id.clone(),
                        node_id: request.client_csi_node_id.clone(),
                        volume_capability: Some(capability(&VolumeCapability {
                            access_mode: request.access_mode,
                            attachment_mode: request.attachment_mode,
                            mount_options: request.mount_options.clone().unwrap_or_default(),
                        })),
                        readonly: request.read_only,
                        secrets: request.secrets.clone().into_iter().collect(),
                        volume_context: request.volume_context.clone().into_iter().collect(),
                    })
                    .await
                    .map_err(|status| status_error("ControllerPublishVolume", status))?;
                Ok(ClientCsiReply::Attached {
                    publish_context: response.into_inner().publish_context.into_iter().collect(),
                })
            }
            ClientCsiRequest::ControllerDetach(request) => {
                self.controller()
                    .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                        volume_id: request.volume_id.clone(),
                        node_id: request.client_csi_node_id.clone(),
                        secrets: request.secrets.clone().into_iter().collect(),
                    })
                    .await
                    .map_err(|status| status_error("ControllerUnpublishVolume", status))?;
                Ok(ClientCsiReply::Done)
            }
            ClientCsiRequest::ControllerValidate(request) => {
                let response = self
                    .controller()
                    .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                        volume_id: request.volume_id.clone(),
                        volume_context: request.context.clone().into_iter().collect(),
                        volume_capabilities: request.capabilities.iter().map(plain).collect(),
                        parameters: request.parameters.clone().into_iter().collect(),
                        secrets: request.secrets.clone().into_iter().collect(),
                        mutable_parameters: Default::default(),
                    })
                    .await
                    .map_err(|status| status_error("ValidateVolumeCapabilities", status))?
                    .into_inner();
                if response.confirmed.is_none() {
                    return Err(format!("volume capability validation failed: {}", response.message).into());
                }
                Ok(ClientCsiReply::Done)
            }
            ClientCsiRequest::ControllerCreate(request) => self.create_volume(request).await,
            ClientCsiRequest::ControllerDelete(request) => {
                self.controller()
                    .delete_volume(csi::DeleteVolumeRequest {
                        volume_id: request.external_id.clone(),
                        secrets: request.secrets.clone().into_iter().collect(),
                    })
                    .await
                    .map_err(|status| status_error("DeleteVolume", status))?;
                Ok(ClientCsiReply::Done)
            }
            ClientCsiRequest::ControllerCreateSnapshot(request) => self.create_snapshot(request).await,
            ClientCsiRequest::ControllerDeleteSnapshot(request) => self.delete_snapshot(request).await,
            ClientCsiRequest::ControllerListSnapshots(request) => self.list_snapshots(request).await,
            ClientCsiRequest::ControllerListVolumes(request) => self.list_volumes(request).await,
            ClientCsiRequest::ControllerExpand(request) => self.expand_volume(request).await,
            ClientCsiRequest::NodeDetach(_) | ClientCsiRequest::NodeExpand(_) => Err(CsiCallError::other(
                "node calls are served by the client's volume manager",
            )),
        }
    }

    /// `ControllerCreateVolume` as the CSI spec has it: the volume's name as the idempotency
    /// key, its capacity range, capabilities, source and topology requirement.
    async fn create_volume(&self, request: &ControllerCreateRequest) -> Result<ClientCsiReply, CsiCallError> {
        let topology = |topology: &CsiTopology| csi::Topology {
            segments: topology.segments.clone().into_iter().collect(),
        };
        let source = if !request.snapshot_id.is_empty() {
            Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: request.snapshot_id.clone(),
                },
            ))
        } else if !request.clone_id.is_empty() {
            Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: request.clone_id.clone(),
                },
            ))
        } else {
            None
        };
        let bytes = |value: u64| i64::try_from(value).map_err(|_| format!("capacity {value} is out of range"));
        let answer = self
            .controller()
            .create_volume(csi::CreateVolumeRequest {
                name: request.name.clone(),
                capacity_range: (request.capacity_min != 0 || request.capacity_max != 0)
                    .then(|| -> Result<csi::CapacityRange, String> {
                        Ok(csi::CapacityRange {
                            required_bytes: bytes(request.capacity_min)?,
                            limit_bytes: bytes(request.capacity_max)?,
                        })
                    })
                    .transpose()?,
                volume_capabilities: request
                    .capabilities
                    .iter()
                    .map(|wanted| {
                        capability(&VolumeCapability {
                            access_mode: wanted.access_mode,
                            attachment_mode: wanted.attachment_mode,
                            mount_options: request.mount_options.clone().unwrap_or_default(),
                        })
                    })
                    .collect(),
                parameters: request.parameters.clone().into_iter().collect(),
                secrets: request.secrets.clone().into_iter().collect(),
                volume_content_source: source.map(|kind| csi::VolumeContentSource { r#type: Some(kind) }),
                accessibility_requirements: request.topology.as_ref().map(|wanted| csi::TopologyRequirement {
                    requisite: wanted.required.iter().map(topology).collect(),
                    preferred: wanted.preferred.iter().map(topology).collect(),
                }),
                mutable_parameters: Default::default(),
            })
            .await
            .map_err(|status| status_error("CreateVolume", status))?
            .into_inner();
        let volume = answer.volume.ok_or("CreateVolume: the plugin answered no volume")?;
        if volume.volume_id.is_empty() {
            return Err("CreateVolume: the plugin answered an empty volume_id".into());
        }
        Ok(ClientCsiReply::Created {
            external_id: volume.volume_id,
            capacity: u64::try_from(volume.capacity_bytes).unwrap_or(0),
            context: volume.volume_context.into_iter().collect(),
            topologies: volume
                .accessible_topology
                .into_iter()
                .map(|topology| CsiTopology {
                    segments: topology.segments.into_iter().collect(),
                })
                .collect(),
        })
    }
}
