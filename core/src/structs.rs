//! The records the server state store holds: nodes, jobs (as far as CSI needs them),
//! allocations, evaluations (shape only), CSI volumes and plugins.
//!
//! Storage shapes, serialized into snapshots; the HTTP layer renders Nomad's JSON shapes from
//! them (and redacts secrets). Times are milliseconds since the Unix epoch, stamped by the
//! proposer into the log entry.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::fmt;
use core::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_NAMESPACE: &str = "default";

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
}

/// A node's total CPU (MHz, summed over cores) and memory (MB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    pub cpu: u64,
    pub memory_mb: u64,
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
    pub name: String,
    pub datacenter: String,
    /// Where the client answers agent RPC (`ClientCSI.*`), `ip:port`.
    pub rpc_addr: String,
    pub http_addr: String,
    pub status: NodeStatus,
    pub status_description: String,
    pub status_updated_at_ms: u64,
    pub attributes: BTreeMap<String, String>,
    pub csi_controller_plugins: BTreeMap<String, CsiInfo>,
    pub csi_node_plugins: BTreeMap<String, CsiInfo>,
    /// Task drivers by name, from the client's driver manager.
    #[serde(default)]
    pub drivers: BTreeMap<String, DriverInfo>,
    /// The client's `host_volume` blocks by name.
    #[serde(default)]
    pub host_volumes: BTreeMap<String, crate::client::volume_hook::HostVolumeConfig>,
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
    /// `draining`, `complete` or `canceled`.
    pub status: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    #[default]
    Service,
    Batch,
    System,
}

impl JobType {
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
        }
    }

    pub fn parse(text: &str) -> Option<JobType> {
        [JobType::Service, JobType::Batch, JobType::System]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CsiPluginType {
    Controller,
    Node,
    Monolith,
}

impl CsiPluginType {
    pub fn is_controller(self) -> bool {
        matches!(self, CsiPluginType::Controller | CsiPluginType::Monolith)
    }

    pub fn is_node(self) -> bool {
        matches!(self, CsiPluginType::Node | CsiPluginType::Monolith)
    }
}

/// Where a CSI plugin task keeps its socket unless told otherwise (Nomad's api Canonicalize).
pub const DEFAULT_CSI_MOUNT_DIR: &str = "/csi";
/// Base inside the plugin task for staging and per-alloc targets (HEAD default).
pub const DEFAULT_CSI_STAGE_PUBLISH_BASE_DIR: &str = "/local/csi";
/// How long the plugin has to answer its first probe before the task is restarted.
pub const DEFAULT_CSI_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCsiPluginConfig {
    pub id: String,
    pub plugin_type: CsiPluginType,
    /// Directory inside the task where the plugin creates `csi.sock`.
    pub mount_dir: String,
    /// Base inside the task for staging and per-alloc target paths sent to the plugin.
    pub stage_publish_base_dir: String,
    pub health_timeout: Duration,
}

impl TaskCsiPluginConfig {
    /// A plugin stanza with Nomad's defaults for everything but id and type.
    pub fn new(id: impl Into<String>, plugin_type: CsiPluginType) -> Self {
        TaskCsiPluginConfig {
            id: id.into(),
            plugin_type,
            mount_dir: DEFAULT_CSI_MOUNT_DIR.into(),
            stage_publish_base_dir: DEFAULT_CSI_STAGE_PUBLISH_BASE_DIR.into(),
            health_timeout: DEFAULT_CSI_HEALTH_TIMEOUT,
        }
    }

    /// Nomad's `Task.Validate` rules for the stanza (§1.1), every problem listed.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.id.is_empty() {
            errors.push("CSIPluginConfig must have a non-empty PluginID".to_string());
        }
        let base = self.stage_publish_base_dir.trim_end_matches('/');
        let mount = self.mount_dir.trim_end_matches('/');
        // The supervisor's stop hook removes the socket dir; staging under it would wipe the
        // mounts of every consumer (#19440).
        if !base.is_empty() && !mount.is_empty() && (base == mount || base.starts_with(&format!("{mount}/"))) {
            errors.push(format!(
                "CSIPluginConfig StagePublishBaseDir must not be a subdirectory of MountDir, got: \
                 StagePublishBaseDir=\"{}\" MountDir=\"{}\"",
                self.stage_publish_base_dir, self.mount_dir
            ));
        }
        if self.health_timeout.is_zero() {
            errors.push("CSIPluginConfig HealthTimeout must be positive".to_string());
        }
        errors
    }
}

/// One value of a driver's free-form `config` block (typed so snapshots stay postcard).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigValue {
    Bool(bool),
    Int(i64),
    String(String),
    List(Vec<ConfigValue>),
    Map(BTreeMap<String, ConfigValue>),
}

impl ConfigValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ConfigValue::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            ConfigValue::Int(value) => Some(*value),
            ConfigValue::String(text) => text.parse().ok(),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            ConfigValue::Bool(value) => Some(*value),
            _ => None,
        }
    }

    /// A list of strings (`args = ["-c", "..."]`).
    pub fn as_strings(&self) -> Option<Vec<String>> {
        match self {
            ConfigValue::List(items) => items.iter().map(|item| item.as_str().map(String::from)).collect(),
            _ => None,
        }
    }
}

/// Mount propagation of a bind mount into a task (`private` / `host-to-task` / `bidirectional`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Propagation {
    #[default]
    #[serde(rename = "private")]
    Private,
    #[serde(rename = "host-to-task")]
    HostToTask,
    #[serde(rename = "bidirectional")]
    Bidirectional,
}

impl Propagation {
    pub fn as_str(self) -> &'static str {
        match self {
            Propagation::Private => "private",
            Propagation::HostToTask => "host-to-task",
            Propagation::Bidirectional => "bidirectional",
        }
    }

    pub fn parse(text: &str) -> Option<Propagation> {
        [
            Propagation::Private,
            Propagation::HostToTask,
            Propagation::Bidirectional,
        ]
        .into_iter()
        .find(|mode| mode.as_str() == text)
    }
}

/// A task's `volume_mount` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The group `volume` alias.
    pub volume: String,
    pub destination: String,
    pub read_only: bool,
    pub propagation_mode: Propagation,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeType {
    #[default]
    Host,
    Csi,
}

/// A group's `volume "<alias>"` block (`source` at the top level, the seed-003 shape).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRequest {
    pub name: String,
    pub volume_type: VolumeType,
    pub source: String,
    pub read_only: bool,
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub mount_options: Option<CsiMountOptions>,
    pub per_alloc: bool,
}

impl VolumeRequest {
    /// The volume this allocation uses: `source`, or `source[<index>]` with `per_alloc`.
    pub fn source_for(&self, alloc_index: u32) -> String {
        if self.per_alloc {
            format!("{}[{alloc_index}]", self.source)
        } else {
            self.source.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    #[default]
    Fail,
    Delay,
}

/// A group's `restart` block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub attempts: u32,
    pub interval: Duration,
    pub delay: Duration,
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// Nomad's defaults for service (and system) jobs: 2 attempts in 30 min, 15 s apart, fail.
    pub const SERVICE: RestartPolicy = RestartPolicy {
        attempts: 2,
        interval: Duration::from_secs(30 * 60),
        delay: Duration::from_secs(15),
        mode: RestartMode::Fail,
    };
    /// Nomad's defaults for batch jobs: 3 attempts in 24 h, 15 s apart, fail.
    pub const BATCH: RestartPolicy = RestartPolicy {
        attempts: 3,
        interval: Duration::from_secs(24 * 60 * 60),
        delay: Duration::from_secs(15),
        mode: RestartMode::Fail,
    };
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy::SERVICE
    }
}

/// A device a task asks for (`device "<vendor/type/name>" { count = N }`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestedDevice {
    pub name: String,
    pub count: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskResources {
    pub cpu: u32,
    pub memory_mb: u32,
    pub devices: Vec<RequestedDevice>,
}

/// Nomad's default `kill_timeout`.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub name: String,
    pub driver: String,
    pub config: BTreeMap<String, ConfigValue>,
    pub env: BTreeMap<String, String>,
    pub volume_mounts: Vec<VolumeMount>,
    pub csi_plugin: Option<TaskCsiPluginConfig>,
    pub kill_timeout: Duration,
    pub resources: TaskResources,
    /// `service` blocks, names already canonicalised (`${JOB}`, `${TASKGROUP}`, `${TASK}`,
    /// `${BASE}` replaced; an empty name is `<job>-<group>-<task>`).
    #[serde(default)]
    pub services: Vec<Service>,
}

/// Service `address_mode` values Nomad accepts.
pub const SERVICE_ADDRESS_MODES: [&str; 4] = ["", "auto", "host", "driver"];
/// Nomad's shortest check interval and timeout.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
pub const MIN_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// A task's `service` block (Nomad's `structs.Service`): how the task is advertised in the
/// service catalog.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    pub port_label: String,
    pub address_mode: String,
    pub tags: Vec<String>,
    pub canary_tags: Vec<String>,
    /// Consul's anti-entropy leaves tags changed through its catalog alone (#2057).
    pub enable_tag_override: bool,
    pub meta: BTreeMap<String, String>,
    pub checks: Vec<ServiceCheck>,
}

/// A `check` block inside a `service`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCheck {
    /// Default `service: "<service>" check`.
    pub name: String,
    /// `http`, `tcp`, `grpc` or `script`.
    pub check_type: String,
    pub command: String,
    pub args: Vec<String>,
    pub path: String,
    pub protocol: String,
    pub method: String,
    pub port_label: String,
    pub interval: Duration,
    pub timeout: Duration,
}

impl ServiceCheck {
    /// Whether the check reaches the task over a port (every type but `script`).
    pub fn requires_port(&self) -> bool {
        matches!(self.check_type.as_str(), "http" | "tcp" | "grpc")
    }

    /// Nomad's `ServiceCheck.validate` texts.
    pub fn validate(&self) -> Result<(), String> {
        match self.check_type.as_str() {
            "http" => {
                if self.path.is_empty() {
                    return Err("http type must have a valid http path".into());
                }
                if self.path.contains("://") {
                    return Err("http type must have a relative http path".into());
                }
            }
            "script" => {
                if self.command.is_empty() {
                    return Err("script type must have a valid script path".into());
                }
            }
            "tcp" | "grpc" => {}
            other => {
                return Err(format!(
                    "invalid type ({other:?}), must be one of \"grpc\", \"tcp\", \"http\", \"script\""
                ));
            }
        }
        if self.interval.is_zero() {
            return Err(format!(
                "missing required value interval. Interval cannot be less than {}s",
                MIN_CHECK_INTERVAL.as_secs()
            ));
        }
        if self.interval < MIN_CHECK_INTERVAL {
            return Err(format!(
                "interval ({:?}) cannot be lower than {}s",
                self.interval,
                MIN_CHECK_INTERVAL.as_secs()
            ));
        }
        if self.timeout.is_zero() {
            return Err(format!(
                "missing required value timeout. Timeout cannot be less than {}s",
                MIN_CHECK_TIMEOUT.as_secs()
            ));
        }
        if self.timeout < MIN_CHECK_TIMEOUT {
            return Err(format!(
                "timeout ({:?}) is lower than required minimum timeout {}s",
                self.timeout,
                MIN_CHECK_TIMEOUT.as_secs()
            ));
        }
        Ok(())
    }
}

impl Service {
    /// Nomad's `Service.Canonicalize`: the default name, and the runtime variables it allows.
    pub fn canonicalize(&mut self, job: &str, group: &str, task: &str) {
        if self.name.is_empty() {
            self.name = format!("{job}-{group}-{task}");
        }
        self.name = self
            .name
            .replace("${JOB}", job)
            .replace("${TASKGROUP}", group)
            .replace("${TASK}", task)
            .replace("${BASE}", &format!("{job}-{group}-{task}"));
        if self.address_mode.is_empty() {
            self.address_mode = "auto".into();
        }
        for check in &mut self.checks {
            if check.name.is_empty() {
                check.name = format!("service: {:?} check", self.name);
            }
        }
    }

    /// Every problem with the service itself (Nomad's `Service.Validate` texts); port labels
    /// and duplicates are checked with the task (`jobspec::validate`).
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if !valid_service_name(&strip_env_vars(&self.name)) {
            errors.push(format!(
                "Service name must be valid per RFC 1123 and can contain only alphanumeric characters or dashes: {:?}",
                self.name
            ));
        }
        if !SERVICE_ADDRESS_MODES.contains(&self.address_mode.as_str()) {
            errors.push(format!(
                "Service address_mode must be \"auto\", \"host\", or \"driver\"; not {:?}",
                self.address_mode
            ));
        }
        for check in &self.checks {
            if self.port_label.is_empty() && check.port_label.is_empty() && check.requires_port() {
                errors.push(format!(
                    "Check {} invalid: check requires a port but neither check nor service {:?} have a port",
                    check.name, self.name
                ));
                continue;
            }
            if let Err(problem) = check.validate() {
                errors.push(format!("Check {} invalid: {problem}", check.name));
            }
        }
        errors
    }
}

/// Nomad's service-name rule: 1 to 63 letters, digits and dashes, not starting or ending with
/// a dash.
fn valid_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Replaces `${...}` interpolations by a placeholder, as Nomad does before checking a name.
fn strip_env_vars(name: &str) -> String {
    let mut out = String::new();
    let mut rest = name;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        match rest[start..].find('}') {
            Some(end) => {
                out.push_str("ENV-VAR");
                rest = &rest[start + end + 1..];
            }
            None => {
                rest = &rest[start..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

impl Default for Task {
    fn default() -> Self {
        Task {
            name: String::new(),
            driver: String::new(),
            config: BTreeMap::new(),
            env: BTreeMap::new(),
            volume_mounts: Vec::new(),
            csi_plugin: None,
            kill_timeout: DEFAULT_KILL_TIMEOUT,
            resources: TaskResources::default(),
            services: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskGroup {
    pub name: String,
    pub count: u32,
    pub tasks: Vec<Task>,
    /// `volume` blocks by alias.
    pub volumes: BTreeMap<String, VolumeRequest>,
    /// `None`: the job type's default.
    pub restart_policy: Option<RestartPolicy>,
    /// `migrate` block: how a node drain moves this group's allocations.
    #[serde(default)]
    pub migrate: Option<MigrateStrategy>,
}

/// Nomad's `MigrateStrategy` (the part a drain reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateStrategy {
    /// How many of the group's allocations a drain moves at once (Nomad's default, 1).
    pub max_parallel: u32,
}

impl Default for MigrateStrategy {
    fn default() -> Self {
        MigrateStrategy { max_parallel: 1 }
    }
}

impl TaskGroup {
    /// The group's migrate strategy, or Nomad's default.
    pub fn migrate(&self) -> MigrateStrategy {
        self.migrate.unwrap_or_default()
    }

    pub fn restart_policy(&self, job_type: JobType) -> RestartPolicy {
        self.restart_policy.unwrap_or(match job_type {
            JobType::Batch => RestartPolicy::BATCH,
            JobType::Service | JobType::System => RestartPolicy::SERVICE,
        })
    }

    pub fn task(&self, name: &str) -> Option<&Task> {
        self.tasks.iter().find(|task| task.name == name)
    }
}

/// A job: what to run, where (datacenters), and its versioned history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    pub job_type: JobType,
    #[serde(default)]
    pub priority: u32,
    /// Datacenters the job may run in; `*` globs as Nomad's do. Empty means every one.
    #[serde(default)]
    pub datacenters: Vec<String>,
    pub task_groups: Vec<TaskGroup>,
    pub stop: bool,
    /// Bumped by every register that changes the spec (and by a stop).
    #[serde(default)]
    pub version: u64,
    #[serde(default)]
    pub submit_time_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
    /// The index of the last change to the spec (not to its status).
    #[serde(default)]
    pub job_modify_index: u64,
}

impl Job {
    /// Whether `datacenter` matches one of the job's datacenters (`*` as a glob).
    pub fn runs_in(&self, datacenter: &str) -> bool {
        self.datacenters.is_empty() || self.datacenters.iter().any(|pattern| glob_match(pattern, datacenter))
    }

    /// Whether a task runs a CSI plugin: a drain stops such jobs last, like system jobs, so
    /// the plugin outlives the volumes of the allocations it serves (Nomad #8232, #12324).
    pub fn is_plugin(&self) -> bool {
        self.task_groups
            .iter()
            .flat_map(|group| &group.tasks)
            .any(|task| task.csi_plugin.is_some())
    }

    /// Nomad's job status: `dead` when stopped or nothing runs, `running` when something
    /// does, `pending` otherwise.
    pub fn status(&self, allocs: &[&Allocation]) -> &'static str {
        if allocs.iter().any(|alloc| !alloc.terminal()) {
            "running"
        } else if self.stop || !allocs.is_empty() {
            "dead"
        } else {
            "pending"
        }
    }
}

/// `*` matches any run of characters; everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(remainder) = text.strip_prefix(head) else {
                return false;
            };
            (0..=remainder.len())
                .filter(|at| remainder.is_char_boundary(*at))
                .any(|at| glob_match(rest, &remainder[at..]))
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    #[default]
    Run,
    Stop,
    Evict,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    #[default]
    Pending,
    Running,
    Complete,
    Failed,
    Lost,
}

impl ClientStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub id: String,
    pub namespace: String,
    pub eval_id: String,
    pub name: String,
    pub node_id: String,
    pub job_id: String,
    pub task_group: String,
    /// The allocation this one replaces (its disk and volumes are handed over).
    pub previous_allocation: Option<String>,
    /// Allocations evicted to make room for this one.
    pub preempted_allocations: Vec<String>,
    pub desired_status: DesiredStatus,
    #[serde(default)]
    pub desired_description: String,
    pub client_status: ClientStatus,
    #[serde(default)]
    pub client_description: String,
    /// The job version this allocation runs.
    #[serde(default)]
    pub job_version: u64,
    /// The resources it was placed with (the scheduler's bin-packing reads them).
    #[serde(default)]
    pub resources: AllocatedResources,
    /// How the scheduler chose its node.
    #[serde(default)]
    pub metrics: Option<AllocMetric>,
    /// What the servers want done with it beyond its desired status (a drain's migration).
    #[serde(default)]
    pub desired_transition: DesiredTransition,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time_ms: u64,
    pub modify_time_ms: u64,
}

/// Nomad's `DesiredTransition`: set by the node drainer, read by the scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredTransition {
    /// Stop it and place a replacement elsewhere (system jobs: just stop it).
    pub migrate: bool,
}

/// CPU (MHz) and memory (MB) an allocation holds on its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedResources {
    pub cpu: u64,
    pub memory_mb: u64,
}

/// What the scheduler saw placing one allocation (or failing to): Nomad's `AllocMetric`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocMetric {
    pub nodes_evaluated: u32,
    pub nodes_filtered: u32,
    pub nodes_available: BTreeMap<String, u32>,
    /// Filter reasons (Nomad's strings) and how many nodes each removed.
    pub constraint_filtered: BTreeMap<String, u32>,
    pub nodes_exhausted: u32,
    /// Exhausted dimensions (`cpu`, `memory`) and how many nodes ran out of each.
    pub dimension_exhausted: BTreeMap<String, u32>,
    pub coalesced_failures: u32,
}

impl Allocation {
    /// The index in `job.group[<index>]`, used by `per_alloc` volumes (0 when absent).
    pub fn index(&self) -> u32 {
        self.name
            .rsplit_once('[')
            .and_then(|(_, rest)| rest.strip_suffix(']'))
            .and_then(|index| index.parse().ok())
            .unwrap_or(0)
    }

    /// The server no longer wants it running.
    pub fn server_terminal(&self) -> bool {
        self.desired_status != DesiredStatus::Run
    }

    /// The client reports it finished.
    pub fn client_terminal(&self) -> bool {
        self.client_status.is_terminal()
    }

    pub fn terminal(&self) -> bool {
        self.server_terminal() || self.client_terminal()
    }
}

/// Why the scheduler runs, and what came of it (Nomad's `Evaluation`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evaluation {
    pub id: String,
    pub namespace: String,
    pub priority: u32,
    /// The job's type (`service`, `batch`, `system`).
    pub eval_type: String,
    /// `job-register`, `job-deregister`, `node-update`, `alloc-failure`, `queued-allocs`, ...
    pub triggered_by: String,
    pub job_id: String,
    /// The job's `job_modify_index` when the evaluation was created.
    #[serde(default)]
    pub job_modify_index: u64,
    #[serde(default)]
    pub node_id: String,
    /// `pending`, `complete`, `blocked`, `failed`, `canceled`.
    pub status: String,
    #[serde(default)]
    pub status_description: String,
    /// Task groups that could not be placed, with what the scheduler saw.
    #[serde(default)]
    pub failed_tg_allocs: BTreeMap<String, AllocMetric>,
    /// Allocations still to place, by task group (a blocked evaluation retries them).
    #[serde(default)]
    pub queued_allocations: BTreeMap<String, u32>,
    /// The blocked evaluation created to retry what this one could not place.
    #[serde(default)]
    pub blocked_eval: String,
    #[serde(default)]
    pub previous_eval: String,
    /// A blocked evaluation is retried once the cluster changed after this state index.
    #[serde(default)]
    pub snapshot_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
    #[serde(default)]
    pub create_time_ms: u64,
    #[serde(default)]
    pub modify_time_ms: u64,
}

pub const EVAL_PENDING: &str = "pending";
pub const EVAL_COMPLETE: &str = "complete";
pub const EVAL_BLOCKED: &str = "blocked";
pub const EVAL_CANCELED: &str = "canceled";

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
    pub secrets: BTreeMap<String, String>,
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
