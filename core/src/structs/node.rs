//! Nodes: status, fingerprints (drivers, CSI plugins, resources), events, drains and
//! scheduling eligibility.

use super::*;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    #[default]
    Initializing,
    Ready,
    Down,
    Disconnected,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Initializing => "initializing",
            NodeStatus::Ready => "ready",
            NodeStatus::Down => "down",
            NodeStatus::Disconnected => "disconnected",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiTopology {
    pub segments: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiNodeInfo {
    /// The storage provider's name for this host (used as the external node id).
    pub id: String,
    pub max_volumes: u64,
    pub accessible_topology: Option<CsiTopology>,
    pub requires_node_stage_volume: bool,
    pub supports_stats: bool,
    pub supports_expand: bool,
    pub supports_condition: bool,
}

/// One plugin instance's fingerprint on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiInfo {
    pub plugin_id: String,
    pub alloc_id: String,
    pub healthy: bool,
    pub health_description: String,
    pub update_time_ms: u64,
    pub provider: String,
    pub provider_version: String,
    pub requires_controller_plugin: bool,
    pub requires_topologies: bool,
    pub controller_info: Option<CsiControllerInfo>,
    pub node_info: Option<CsiNodeInfo>,
}

/// What a task driver reports about itself on a node (Nomad's `DriverInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    pub detected: bool,
    pub healthy: bool,
    pub health_description: String,
    pub attributes: BTreeMap<String, String>,
    /// When the servers last saw this driver's fingerprint change (Unix ms of the entry; 0
    /// before it reaches them). Clients leave it 0; the state store stamps it.
    #[serde(default)]
    pub update_time_ms: u64,
}

impl DriverInfo {
    /// Whether `other` says the same of the driver, whenever it was stamped.
    pub fn same_fingerprint(&self, other: &DriverInfo) -> bool {
        self.detected == other.detected
            && self.healthy == other.healthy
            && self.health_description == other.health_description
            && self.attributes == other.attributes
    }
}

/// A node's total CPU (MHz, summed over cores) and memory (MB), its addresses, and which
/// ports allocations may have.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    pub cpu: u64,
    pub memory_mb: u64,
    /// The disk allocation directories may take (MB); 0: unknown, not counted.
    #[serde(default)]
    pub disk_mb: u64,
    /// The addresses tasks' ports are allocated on (the first one is used).
    #[serde(default)]
    pub networks: Vec<NodeNetwork>,
    /// `reserved { reserved_ports }`: ports no allocation gets.
    #[serde(default)]
    pub reserved_ports: BTreeSet<u16>,
    /// The dynamic port range; 0 for Nomad's defaults.
    #[serde(default)]
    pub min_dynamic_port: u16,
    #[serde(default)]
    pub max_dynamic_port: u16,
}

impl NodeResources {
    /// The dynamic port range, Nomad's default where unset.
    pub fn dynamic_range(&self) -> core::ops::RangeInclusive<u16> {
        let min = if self.min_dynamic_port == 0 {
            DEFAULT_MIN_DYNAMIC_PORT
        } else {
            self.min_dynamic_port
        };
        let max = if self.max_dynamic_port == 0 {
            DEFAULT_MAX_DYNAMIC_PORT
        } else {
            self.max_dynamic_port
        };
        min..=max
    }

    /// The address ports are allocated on.
    pub fn host_ip(&self) -> &str {
        self.networks.first().map_or("127.0.0.1", |network| network.ip.as_str())
    }
}

/// How many events a node keeps (Nomad's `MaxRetainedNodeEvents`).
pub const MAX_RETAINED_NODE_EVENTS: usize = 10;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub message: String,
    pub subsystem: String,
    pub details: BTreeMap<String, String>,
    pub timestamp_ms: u64,
    pub create_index: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    /// The node's secret (Nomad's `SecretID`): what proves a client is this node, never shown
    /// by the API.
    #[serde(default)]
    pub secret_id: String,
    pub name: String,
    pub datacenter: String,
    /// Where the client answers agent RPC (`ClientCSI.*`), `ip:port`.
    pub rpc_addr: String,
    pub http_addr: String,
    pub status: NodeStatus,
    pub status_description: String,
    pub status_updated_at_ms: u64,
    pub attributes: BTreeMap<String, String>,
    /// The client's `meta {}` block (`${meta.<key>}`).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The client's `node_class`.
    #[serde(default)]
    pub node_class: String,
    pub csi_controller_plugins: BTreeMap<String, CsiInfo>,
    pub csi_node_plugins: BTreeMap<String, CsiInfo>,
    /// Task drivers by name, from the client's driver manager.
    #[serde(default)]
    pub drivers: BTreeMap<String, DriverInfo>,
    /// The client's `host_volume` blocks by name.
    #[serde(default)]
    pub host_volumes: BTreeMap<String, HostVolumeConfig>,
    /// What the node offers to allocations (fingerprinted CPU and memory).
    #[serde(default)]
    pub resources: NodeResources,
    pub events: Vec<NodeEvent>,
    /// Whether the scheduler may place new allocations here (`node eligibility`); a drain
    /// makes the node ineligible and leaves it so when it completes.
    #[serde(default)]
    pub scheduling_eligibility: SchedulingEligibility,
    /// Set while the node is draining.
    #[serde(default)]
    pub drain_strategy: Option<DrainStrategy>,
    /// The last drain: when it started, how it ended.
    #[serde(default)]
    pub last_drain: Option<DrainMetadata>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Node {
    pub fn eligible(&self) -> bool {
        self.scheduling_eligibility == SchedulingEligibility::Eligible
    }

    /// One core's MHz: its CPU shared evenly over its cores (what a reserved core counts as).
    pub fn mhz_per_core(&self) -> u64 {
        self.resources.cpu / u64::from(self.cores())
    }

    /// Its fingerprinted cores (`cpu.numcores`), at least one.
    pub fn cores(&self) -> u32 {
        self.attributes
            .get("cpu.numcores")
            .and_then(|cores| cores.parse::<u32>().ok())
            .filter(|cores| *cores > 0)
            .unwrap_or(1)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingEligibility {
    #[default]
    Eligible,
    Ineligible,
}

impl SchedulingEligibility {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingEligibility::Eligible => "eligible",
            SchedulingEligibility::Ineligible => "ineligible",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [SchedulingEligibility::Eligible, SchedulingEligibility::Ineligible]
            .into_iter()
            .find(|value| value.as_str() == text)
    }
}

/// Nomad's `DrainStrategy`: how a node is drained.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainStrategy {
    /// `DrainSpec.Deadline` in nanoseconds: `0` no deadline, `-1` force (everything at once),
    /// positive: after that long every remaining allocation is stopped.
    pub deadline_ns: i64,
    /// Leave system jobs (and CSI plugin jobs) running on the node.
    pub ignore_system_jobs: bool,
    /// When the deadline passes (cluster time, ms); `None` without a deadline. Set when the
    /// strategy is applied.
    pub force_deadline_ms: Option<u64>,
    pub started_at_ms: u64,
}

impl DrainStrategy {
    /// Whether the deadline has passed at cluster time `now_ms`.
    pub fn deadline_passed(&self, now_ms: u64) -> bool {
        self.force_deadline_ms.is_some_and(|deadline| now_ms >= deadline)
    }
}

/// Nomad's `DrainMetadata` (`LastDrain`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainMetadata {
    pub started_at_ms: u64,
    pub updated_at_ms: u64,
    pub status: DrainStatus,
}

/// A `host_volume` block of the client's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVolumeConfig {
    pub path: String,
    pub read_only: bool,
}

/// Nomad's cpuset list notation: ascending ids, runs of three or more as ranges
/// (`0-2,5,7-9`), a run of two as both ids (`3,4`).
pub fn cpuset(cores: &[u32]) -> String {
    let mut sorted: Vec<u32> = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let start = sorted[index];
        let mut end = start;
        while index + 1 < sorted.len() && sorted[index + 1] == end + 1 {
            index += 1;
            end += 1;
        }
        match end - start {
            0 => parts.push(start.to_string()),
            1 => parts.push(format!("{start},{end}")),
            _ => parts.push(format!("{start}-{end}")),
        }
        index += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpusets_are_written_as_nomad_writes_them() {
        assert_eq!(cpuset(&[]), "");
        assert_eq!(cpuset(&[3]), "3");
        assert_eq!(cpuset(&[4, 3]), "3,4");
        assert_eq!(cpuset(&[0, 1, 2, 5, 9, 7, 8]), "0-2,5,7-9");
    }
}
