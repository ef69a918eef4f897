//! CSI volumes, claims and plugins.

use super::*;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    #[default]
    #[serde(rename = "")]
    Unknown,
    #[serde(rename = "single-node-reader-only")]
    SingleNodeReader,
    #[serde(rename = "single-node-writer")]
    SingleNodeWriter,
    #[serde(rename = "multi-node-reader-only")]
    MultiNodeReader,
    #[serde(rename = "multi-node-single-writer")]
    MultiNodeSingleWriter,
    #[serde(rename = "multi-node-multi-writer")]
    MultiNodeMultiWriter,
}

impl AccessMode {
    pub const ALL: [AccessMode; 6] = [
        AccessMode::Unknown,
        AccessMode::SingleNodeReader,
        AccessMode::SingleNodeWriter,
        AccessMode::MultiNodeReader,
        AccessMode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::Unknown => "",
            AccessMode::SingleNodeReader => "single-node-reader-only",
            AccessMode::SingleNodeWriter => "single-node-writer",
            AccessMode::MultiNodeReader => "multi-node-reader-only",
            AccessMode::MultiNodeSingleWriter => "multi-node-single-writer",
            AccessMode::MultiNodeMultiWriter => "multi-node-multi-writer",
        }
    }

    pub fn parse(text: &str) -> Option<AccessMode> {
        AccessMode::ALL.into_iter().find(|mode| mode.as_str() == text)
    }

    pub fn is_writer(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeWriter | AccessMode::MultiNodeSingleWriter | AccessMode::MultiNodeMultiWriter
        )
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AttachmentMode {
    #[default]
    #[serde(rename = "")]
    Unknown,
    #[serde(rename = "file-system")]
    FileSystem,
    #[serde(rename = "block-device")]
    BlockDevice,
}

impl AttachmentMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentMode::Unknown => "",
            AttachmentMode::FileSystem => "file-system",
            AttachmentMode::BlockDevice => "block-device",
        }
    }

    pub fn parse(text: &str) -> Option<AttachmentMode> {
        [
            AttachmentMode::Unknown,
            AttachmentMode::FileSystem,
            AttachmentMode::BlockDevice,
        ]
        .into_iter()
        .find(|mode| mode.as_str() == text)
    }
}

impl fmt::Display for AttachmentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Nomad's `CSIVolumeClaimMode`: 0 read, 1 write, 2 GC (server-only index bump).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ClaimMode {
    Read,
    Write,
    Gc,
}

impl ClaimMode {
    pub fn as_int(self) -> u8 {
        match self {
            ClaimMode::Read => 0,
            ClaimMode::Write => 1,
            ClaimMode::Gc => 2,
        }
    }
}

/// Nomad's `CSIVolumeClaimState`: the checkpoints of releasing a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ClaimState {
    Taken,
    NodeDetached,
    ControllerDetached,
    ReadyToFree,
    Unpublishing,
}

impl ClaimState {
    /// The state's name in logs and coverage.
    pub fn name(self) -> &'static str {
        match self {
            ClaimState::Taken => "taken",
            ClaimState::NodeDetached => "node_detached",
            ClaimState::ControllerDetached => "controller_detached",
            ClaimState::ReadyToFree => "ready_to_free",
            ClaimState::Unpublishing => "unpublishing",
        }
    }

    pub fn as_int(self) -> u8 {
        match self {
            ClaimState::Taken => 0,
            ClaimState::NodeDetached => 1,
            ClaimState::ControllerDetached => 2,
            ClaimState::ReadyToFree => 3,
            ClaimState::Unpublishing => 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiVolumeClaim {
    pub allocation_id: String,
    pub node_id: String,
    pub external_node_id: String,
    pub mode: ClaimMode,
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub state: ClaimState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CsiCapability {
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiMountOptions {
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiTopologyRequest {
    pub required: Vec<CsiTopology>,
    pub preferred: Vec<CsiTopology>,
}

/// A CSI volume. Claims are stored by allocation id; allocations themselves are resolved on
/// read (see [`crate::fsm::ServerState::volume`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiVolume {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub external_id: String,
    pub plugin_id: String,
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub requested_capabilities: Vec<CsiCapability>,
    pub mount_options: Option<CsiMountOptions>,
    pub secrets: crate::structs::Secrets,
    pub parameters: BTreeMap<String, String>,
    pub context: BTreeMap<String, String>,
    pub requested_topologies: Option<CsiTopologyRequest>,
    pub topologies: Vec<CsiTopology>,
    pub capacity: u64,
    pub requested_capacity_min: u64,
    pub requested_capacity_max: u64,
    pub snapshot_id: String,
    pub clone_id: String,
    pub read_claims: BTreeMap<String, CsiVolumeClaim>,
    pub write_claims: BTreeMap<String, CsiVolumeClaim>,
    pub past_claims: BTreeMap<String, CsiVolumeClaim>,
    /// Copied from the plugin when read (never trusted from storage).
    pub plugin_health: PluginHealth,
    pub resource_exhausted_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time_ms: u64,
    pub modify_time_ms: u64,
}

/// A snapshot of a volume, as a plugin's controller made or lists it (Nomad's `CSISnapshot`).
/// Snapshots live in the storage provider only; the servers keep no record of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiSnapshot {
    pub id: String,
    pub external_source_volume_id: String,
    pub size_bytes: u64,
    /// Seconds since the Unix epoch.
    pub create_time: i64,
    pub is_ready: bool,
    /// The registered volume it was asked of (create requests only).
    pub source_volume_id: String,
    pub plugin_id: String,
    pub name: String,
    pub secrets: crate::structs::Secrets,
    pub parameters: BTreeMap<String, String>,
}

/// A volume as the plugin's `ListVolumes` reports it, registered or not (Nomad's
/// `CSIVolumeExternalStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiExternalVolume {
    pub external_id: String,
    pub capacity_bytes: u64,
    pub volume_context: BTreeMap<String, String>,
    pub clone_id: String,
    pub snapshot_id: String,
    pub published_external_node_ids: Vec<String>,
    pub is_abnormal: bool,
    pub status: String,
}

/// Plugin facts denormalised onto a volume on every read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginHealth {
    pub provider: String,
    pub provider_version: String,
    pub controller_required: bool,
    pub controllers_healthy: u32,
    pub controllers_expected: u32,
    pub nodes_healthy: u32,
    pub nodes_expected: u32,
    pub schedulable: bool,
}

impl CsiVolume {
    /// The id used in every CSI RPC: the external id when set (#7326).
    pub fn remote_id(&self) -> &str {
        if self.external_id.is_empty() {
            &self.id
        } else {
            &self.external_id
        }
    }

    pub fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.id.clone())
    }

    /// Allocations holding a current (not yet freed) claim, read or write.
    pub fn claimed_allocs(&self) -> BTreeSet<String> {
        self.read_claims
            .keys()
            .chain(self.write_claims.keys())
            .cloned()
            .collect()
    }

    /// The nodes its stored claims name, current or past.
    pub fn claim_nodes(&self) -> BTreeSet<String> {
        self.read_claims
            .values()
            .chain(self.write_claims.values())
            .chain(self.past_claims.values())
            .map(|claim| claim.node_id.clone())
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiPlugin {
    pub id: String,
    pub provider: String,
    pub version: String,
    pub controller_required: bool,
    pub controllers: BTreeMap<String, CsiInfo>,
    pub nodes: BTreeMap<String, CsiInfo>,
    pub controllers_healthy: u32,
    pub nodes_healthy: u32,
    /// Expected instances from jobs: (namespace, job id) → count.
    pub controller_jobs: BTreeMap<(String, String), u32>,
    pub node_jobs: BTreeMap<(String, String), u32>,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time_ms: u64,
    pub modify_time_ms: u64,
}

impl CsiPlugin {
    pub fn controllers_expected(&self) -> u32 {
        self.controller_jobs.values().sum()
    }

    pub fn nodes_expected(&self) -> u32 {
        self.node_jobs.values().sum()
    }

    /// No instances and nothing expected: the plugin record can go.
    pub fn is_empty(&self) -> bool {
        self.controllers.is_empty()
            && self.nodes.is_empty()
            && self.controller_jobs.is_empty()
            && self.node_jobs.is_empty()
    }

    pub fn health(&self) -> PluginHealth {
        let schedulable = self.nodes_healthy > 0 && (!self.controller_required || self.controllers_healthy > 0);
        PluginHealth {
            provider: self.provider.clone(),
            provider_version: self.version.clone(),
            controller_required: self.controller_required,
            controllers_healthy: self.controllers_healthy,
            controllers_expected: self.controllers_expected(),
            nodes_healthy: self.nodes_healthy,
            nodes_expected: self.nodes_expected(),
            schedulable,
        }
    }

    /// Whether the controller half publishes/unpublishes (PUBLISH_UNPUBLISH_VOLUME), judged
    /// from any controller fingerprint.
    pub fn supports_attach_detach(&self) -> bool {
        self.controllers.values().any(|info| {
            info.controller_info
                .as_ref()
                .is_some_and(|controller| controller.supports_attach_detach)
        })
    }
}
