//! CSI volumes and plugins as the API answers them (`/v1/volumes`, `/v1/volume/csi/:id`,
//! `/v1/plugins`, `/v1/plugin/csi/:id`), and a plugin instance's fingerprint as nodes carry it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AllocListStub;

/// Nomad's `CSITopology`: the segments a volume or a node is reachable in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiTopology {
    pub segments: BTreeMap<String, String>,
}

/// Nomad's `CSIVolumeListStub`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    pub name: String,
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    pub topologies: Vec<CsiTopology>,
    /// `single-node-writer`, `multi-node-reader-only`, … (empty when not yet claimed).
    pub access_mode: String,
    /// `file-system` or `block-device` (empty when not yet claimed).
    pub attachment_mode: String,
    pub current_readers: u64,
    pub current_writers: u64,
    pub schedulable: bool,
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    pub provider: String,
    pub controller_required: bool,
    pub controllers_healthy: u32,
    pub controllers_expected: u32,
    pub nodes_healthy: u32,
    pub nodes_expected: u32,
    /// RFC 3339 (Go's zero time: exhaustion is not tracked).
    pub resource_exhausted: String,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    pub modify_time: i64,
}

/// Nomad's `CSIVolume`, denormalised as `GET /v1/volume/csi/:id` answers it (secrets removed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolume {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    pub namespace: String,
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    pub access_mode: String,
    pub attachment_mode: String,
    pub requested_capabilities: Vec<CsiCapability>,
    /// Null when the volume names none.
    pub mount_options: Option<CsiMountOptions>,
    pub parameters: BTreeMap<String, String>,
    pub context: BTreeMap<String, String>,
    pub topologies: Vec<CsiTopology>,
    /// Null when the volume asked for none.
    pub requested_topologies: Option<CsiTopologyRequest>,
    /// Bytes.
    pub capacity: u64,
    pub requested_capacity_min: u64,
    pub requested_capacity_max: u64,
    #[serde(rename = "SnapshotID")]
    pub snapshot_id: String,
    #[serde(rename = "CloneID")]
    pub clone_id: String,
    /// The claiming allocations' IDs, each mapped to null (Nomad's denormalised shape).
    pub read_allocs: BTreeMap<String, ()>,
    pub write_allocs: BTreeMap<String, ()>,
    pub read_claims: BTreeMap<String, CsiVolumeClaim>,
    pub write_claims: BTreeMap<String, CsiVolumeClaim>,
    pub past_claims: BTreeMap<String, CsiVolumeClaim>,
    /// The claiming allocations, readers first.
    pub allocations: Vec<AllocListStub>,
    pub schedulable: bool,
    pub provider: String,
    pub provider_version: String,
    pub controller_required: bool,
    pub controllers_healthy: u32,
    pub controllers_expected: u32,
    pub nodes_healthy: u32,
    pub nodes_expected: u32,
    pub resource_exhausted: String,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time: i64,
    pub modify_time: i64,
}

/// An access and attachment mode a volume was asked to support.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiCapability {
    pub access_mode: String,
    pub attachment_mode: String,
}

/// A volume's mount options; flags are redacted (`["[REDACTED]"]`) when there are any.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiMountOptions {
    #[serde(rename = "FSType")]
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

/// The topologies a volume must, or would rather, be reachable in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiTopologyRequest {
    pub required: Vec<CsiTopology>,
    pub preferred: Vec<CsiTopology>,
}

/// Nomad's `CSIVolumeClaim`: one allocation's hold on a volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeClaim {
    #[serde(rename = "AllocationID")]
    pub allocation_id: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    #[serde(rename = "ExternalNodeID")]
    pub external_node_id: String,
    /// 0 read, 1 write, 2 garbage collection.
    pub mode: u8,
    pub access_mode: String,
    pub attachment_mode: String,
    /// 0 taken, 1 node detached, 2 controller detached, 3 ready to free, 4 unpublishing.
    pub state: u8,
}

/// Nomad's `CSIPluginListStub`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiPluginListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub provider: String,
    pub controller_required: bool,
    pub controllers_healthy: u32,
    pub controllers_expected: u32,
    pub nodes_healthy: u32,
    pub nodes_expected: u32,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Nomad's `CSIPlugin`: its instances by node, and the allocations running them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiPlugin {
    #[serde(rename = "ID")]
    pub id: String,
    pub provider: String,
    pub version: String,
    pub controller_required: bool,
    /// Controller instances by node ID.
    pub controllers: BTreeMap<String, CsiInfo>,
    /// Node instances by node ID.
    pub nodes: BTreeMap<String, CsiInfo>,
    pub allocations: Vec<AllocListStub>,
    pub controllers_healthy: u32,
    pub controllers_expected: u32,
    pub nodes_healthy: u32,
    pub nodes_expected: u32,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time: i64,
    pub modify_time: i64,
}

/// Nomad's `CSIInfo`: one plugin instance's fingerprint on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiInfo {
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    pub healthy: bool,
    pub health_description: String,
    /// RFC 3339.
    pub update_time: String,
    pub provider: String,
    pub provider_version: String,
    pub requires_controller_plugin: bool,
    pub requires_topologies: bool,
    /// Present on controller instances only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_info: Option<CsiControllerInfo>,
    /// Present on node instances only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_info: Option<CsiNodeInfo>,
}

/// What a controller instance supports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiControllerInfo {
    pub supports_read_only_attach: bool,
    pub supports_attach_detach: bool,
    pub supports_list_volumes: bool,
    pub supports_get_capacity: bool,
    pub supports_create_delete: bool,
    pub supports_create_delete_snapshot: bool,
    pub supports_list_snapshots: bool,
    pub supports_clone: bool,
    pub supports_expand: bool,
    pub supports_list_volumes_attached_nodes: bool,
    pub supports_condition: bool,
    pub supports_get: bool,
}

/// What a node instance says of its host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiNodeInfo {
    #[serde(rename = "ID")]
    pub id: String,
    pub max_volumes: u64,
    /// Null when the plugin reports none.
    pub accessible_topology: Option<CsiTopology>,
    pub requires_node_stage_volume: bool,
    pub supports_stats: bool,
    pub supports_expand: bool,
    pub supports_condition: bool,
}

/// Nomad's `CSISnapshot` as a plugin reports it (secrets never shown).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiSnapshot {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ExternalSourceVolumeID")]
    pub external_source_volume_id: String,
    pub size_bytes: u64,
    /// Unix seconds.
    pub create_time: i64,
    pub is_ready: bool,
    #[serde(rename = "SourceVolumeID")]
    pub source_volume_id: String,
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    pub name: String,
    /// Always null: secrets are taken, never shown.
    pub secrets: Option<BTreeMap<String, String>>,
    pub parameters: BTreeMap<String, String>,
}

/// A plugin's snapshots, one page (`GET`/`PUT /v1/volumes/snapshot`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiSnapshotListResponse {
    pub snapshots: Vec<CsiSnapshot>,
    pub next_token: String,
    pub index: u64,
}

/// A volume the storage provider holds, registered here or not (Nomad's
/// `CSIVolumeExternalStub`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeExternalStub {
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    pub capacity_bytes: u64,
    pub volume_context: BTreeMap<String, String>,
    #[serde(rename = "CloneID")]
    pub clone_id: String,
    #[serde(rename = "SnapshotID")]
    pub snapshot_id: String,
    #[serde(rename = "PublishedExternalNodeIDs")]
    pub published_external_node_ids: Vec<String>,
    pub is_abnormal: bool,
    pub status: String,
}

/// A plugin's external volumes, one page (`GET /v1/volumes/external`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeListExternalResponse {
    pub volumes: Vec<CsiVolumeExternalStub>,
    pub next_token: String,
    pub index: u64,
}
