//! The client half: alloc and task runners with their hooks, the CSI plugin registry, the
//! plugin supervisor and the volume manager, as sans-IO machines.
//!
//! Every hook is a small machine that asks for I/O ([`Io`]) one request at a time and is
//! resumed with the [`Outcome`]. Runners own the order (written once, as data, in
//! [`hooks`]); the client routes outcomes back by operation id. Requests the client answers
//! itself (mounting through the volume manager) use the same shape, so a hook never knows who
//! served it.

pub mod alloc_runner;
pub mod check_poll;
#[allow(clippy::module_inception)]
pub mod client;
pub mod container_spec;
pub mod containers;
pub mod deadlines;
pub mod devices;
pub mod health;
pub mod hooks;
pub mod paths;
pub mod plugin_supervisor;
pub mod registry;
pub mod restarts;
pub mod server_link;
pub mod servers;
pub mod service_sync;
pub mod services;
pub mod task_runner;
pub mod templates;
pub mod volume_hook;
pub mod volume_manager;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::fmt;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rpc::{NodeAllocsReply, NodeAllocsRequest, ServerReply, ServerRequest};
use crate::structs::{
    AccessMode, AttachmentMode, ConfigValue, CsiControllerInfo, CsiMountOptions, CsiTopology, CsiVolume, Propagation,
    RequestedDevice,
};

/// A bind mount handed to the task driver (Nomad's `drivers.MountConfig`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MountConfig {
    pub task_path: String,
    pub host_path: String,
    pub readonly: bool,
    pub propagation: Propagation,
}

impl fmt::Display for MountConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}->{}({}{})",
            self.host_path,
            self.task_path,
            if self.readonly { "ro," } else { "rw," },
            self.propagation.as_str()
        )
    }
}

/// A device node handed to the task driver (`drivers.DeviceConfig`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceConfig {
    pub task_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// Where a published CSI volume is on the host (`csimanager.MountInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountInfo {
    pub source: String,
    pub is_device: bool,
}

/// Whether a task driver can bind mounts into its tasks (#8030). There is no host-only value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountConfigSupport {
    All,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverCapabilities {
    pub mount_configs: MountConfigSupport,
    /// The task sees the host filesystem (raw_exec): sockets are reached by host path.
    pub fs_isolation: bool,
}

/// Everything a task driver needs to start a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskConfig {
    pub alloc_id: String,
    pub task: String,
    pub driver: String,
    pub config: BTreeMap<String, ConfigValue>,
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<MountConfig>,
    pub devices: Vec<DeviceConfig>,
    /// Host path of the task's working directory.
    pub task_dir: String,
    /// Host path of the alloc's log directory (`<task>.stdout.0`, `<task>.stderr.0`).
    pub log_dir: String,
    pub kill_timeout: Duration,
    /// `resources { cpu memory }`: the task's CPU share (MHz) and memory hard limit (MB),
    /// enforced by drivers that can (cgroups).
    #[serde(default)]
    pub cpu_mhz: u32,
    #[serde(default)]
    pub memory_mb: u32,
    /// `memory_max`: the hard limit when set (then `memory_mb` is the soft limit).
    #[serde(default)]
    pub memory_max_mb: u32,
    /// `logs {}`: how the task's stdout and stderr are rotated.
    #[serde(default)]
    pub logs: crate::structs::LogConfig,
    /// The node's fingerprinted CPU (MHz over all its cores) and its cores: what a task's
    /// `cpu` is a share of (the docker driver's `cpu_hard_limit` quota).
    #[serde(default)]
    pub node_cpu_mhz: u64,
    #[serde(default)]
    pub node_cores: u32,
    /// The node's cores reserved for the task (`resources { cores }`); empty when it asked
    /// for MHz (`cpu`).
    pub reserved_cores: Vec<u32>,
    /// The allocation's shared network namespace, in bridge mode: the task joins it.
    #[serde(default)]
    pub network: Option<AllocNetwork>,
}

/// A running task, as the driver describes it; persisted so the agent can reattach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    pub driver: String,
    pub alloc_id: String,
    pub task: String,
    /// The driver's own reattach data (a pid and start time, for the process drivers).
    pub state: String,
}

/// How a task ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitResult {
    pub exit_code: i32,
    pub signal: i32,
    pub oom_killed: bool,
    pub err: Option<String>,
}

impl ExitResult {
    pub fn successful(&self) -> bool {
        self.exit_code == 0 && self.signal == 0 && self.err.is_none()
    }
}

/// What a device plugin reserved for a task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<MountConfig>,
    pub devices: Vec<DeviceConfig>,
}

/// A CSI volume capability as sent to a node plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeCapability {
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub mount_options: CsiMountOptions,
}

/// Calls to a CSI plugin over its unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CsiCall {
    Probe,
    GetPluginInfo,
    GetPluginCapabilities,
    ControllerGetCapabilities,
    NodeGetInfo,
    NodeGetCapabilities,
    NodeStageVolume {
        volume_id: String,
        publish_context: BTreeMap<String, String>,
        staging_target_path: String,
        capability: VolumeCapability,
        secrets: crate::structs::Secrets,
        volume_context: BTreeMap<String, String>,
    },
    NodePublishVolume {
        volume_id: String,
        publish_context: BTreeMap<String, String>,
        staging_target_path: String,
        target_path: String,
        capability: VolumeCapability,
        readonly: bool,
        secrets: crate::structs::Secrets,
        volume_context: BTreeMap<String, String>,
    },
    NodeUnpublishVolume {
        volume_id: String,
        target_path: String,
    },
    NodeUnstageVolume {
        volume_id: String,
        staging_target_path: String,
    },
    /// `NodeExpandVolume` of one publication (`volume_path`), staged at
    /// `staging_target_path` (empty when the plugin does not stage).
    NodeExpandVolume {
        volume_id: String,
        volume_path: String,
        staging_target_path: String,
        capacity_min: u64,
        capacity_max: u64,
        capability: VolumeCapability,
    },
}

impl CsiCall {
    pub fn name(&self) -> &'static str {
        match self {
            CsiCall::Probe => "Probe",
            CsiCall::GetPluginInfo => "GetPluginInfo",
            CsiCall::GetPluginCapabilities => "GetPluginCapabilities",
            CsiCall::ControllerGetCapabilities => "ControllerGetCapabilities",
            CsiCall::NodeGetInfo => "NodeGetInfo",
            CsiCall::NodeGetCapabilities => "NodeGetCapabilities",
            CsiCall::NodeStageVolume { .. } => "NodeStageVolume",
            CsiCall::NodePublishVolume { .. } => "NodePublishVolume",
            CsiCall::NodeUnpublishVolume { .. } => "NodeUnpublishVolume",
            CsiCall::NodeUnstageVolume { .. } => "NodeUnstageVolume",
            CsiCall::NodeExpandVolume { .. } => "NodeExpandVolume",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CsiReply {
    Probe {
        ready: bool,
    },
    PluginInfo {
        name: String,
        version: String,
    },
    PluginCapabilities {
        controller_service: bool,
        accessibility_constraints: bool,
    },
    ControllerCapabilities(CsiControllerInfo),
    NodeInfo {
        node_id: String,
        max_volumes: u64,
        topology: Option<CsiTopology>,
    },
    NodeCapabilities {
        stage_unstage: bool,
        stats: bool,
        expand: bool,
        condition: bool,
    },
    /// `NodeExpandVolume`: the capacity the node sees now (0: the plugin did not say).
    Expanded {
        capacity: u64,
    },
    Done,
}

/// A request the client answers itself: the volume manager of a node plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeOp {
    Mount {
        plugin_id: String,
        volume: alloc::boxed::Box<CsiVolume>,
        alloc_id: String,
        usage: UsageOptions,
        publish_context: BTreeMap<String, String>,
    },
    Unmount {
        plugin_id: String,
        namespace: String,
        volume_id: String,
        remote_id: String,
        alloc_id: String,
        usage: UsageOptions,
    },
    /// A server's `NodeExpandVolume` for one allocation's publication of the volume, after
    /// its controller expanded it.
    Expand {
        plugin_id: String,
        namespace: String,
        volume_id: String,
        remote_id: String,
        alloc_id: String,
        usage: UsageOptions,
        capacity_min: u64,
        capacity_max: u64,
    },
    /// After an agent restart: is the allocation's volume still mounted? If so the manager
    /// takes the allocation back as a user of the volume (usage lives only in memory).
    HasMount {
        plugin_id: String,
        namespace: String,
        volume_id: String,
        alloc_id: String,
        usage: UsageOptions,
        mount: MountInfo,
    },
}

/// How an allocation uses a volume (`csimanager.UsageOptions`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UsageOptions {
    pub read_only: bool,
    pub attachment_mode: AttachmentMode,
    pub access_mode: AccessMode,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

impl UsageOptions {
    /// The directory name of this usage: `rw-file-system-single-node-writer` (`ToFS`).
    pub fn to_fs(&self) -> String {
        format!(
            "{}-{}-{}",
            if self.read_only { "ro" } else { "rw" },
            self.attachment_mode.as_str(),
            self.access_mode.as_str()
        )
    }
}

/// One piece of I/O a hook or runner needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Io {
    /// `mkdir -p` with mode 0700.
    Mkdir {
        path: String,
    },
    /// `rm -rf`.
    RemoveAll {
        path: String,
    },
    /// `rmdir` (fails when the directory is not empty or is still a mount point).
    Rmdir {
        path: String,
    },
    /// Is `path` a mount point? Replies `Bool`.
    IsMountPoint {
        path: String,
    },
    /// A small file's text; replies `File(None)` when there is none.
    ReadFile {
        path: String,
    },
    /// Writes `content` to `path` (atomically, through a temporary file) with `mode`.
    WriteFile {
        path: String,
        content: String,
        mode: u32,
    },
    /// Writes bytes to `path` the same way: a dispatched job's payload, which need not be
    /// text.
    WriteBytes {
        path: String,
        content: Vec<u8>,
        mode: u32,
    },
    /// Runs `program` with `args` (and `env` added to the agent's environment) to completion;
    /// its stdout, when it exits 0, is written to `stdout_path` (atomically) with `mode`. A
    /// non-zero exit is an error carrying stderr. Arguments and environment may carry secrets:
    /// neither is ever logged.
    RunCommand {
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        stdout_path: String,
        mode: u32,
    },
    StartTask(alloc::boxed::Box<TaskConfig>),
    /// Signal, then SIGKILL after `kill_timeout`; replies once the task is gone.
    StopTask {
        handle: TaskHandle,
        kill_timeout: Duration,
        /// Sent first (the task's `kill_signal`); SIGKILL once `kill_timeout` has passed.
        signal: i32,
    },
    /// Reattach to a task started before an agent restart.
    RecoverTask {
        handle: TaskHandle,
    },
    /// The task's leader is gone (it exited, was stopped, or was found gone after an agent
    /// restart): kill every process it left behind (its cgroup, or what is left of its
    /// session), remove its cgroup and release what the driver holds for it (Nomad's
    /// `DestroyTask`). Idempotent: a handle already destroyed answers `Unit`.
    DestroyTask {
        handle: TaskHandle,
    },
    /// Makes the network namespace the allocation's tasks share (group `network { mode =
    /// "bridge" }`), with the group's `ports` published from the host into it (Nomad's
    /// driver `CreateNetwork`). Idempotent: the allocation's existing namespace is answered
    /// again (after an agent restart). Replies `Network`.
    CreateNetwork {
        alloc_id: String,
        driver: String,
        ports: Vec<crate::structs::AllocatedPort>,
    },
    /// Removes the allocation's namespace once its tasks are gone. Idempotent.
    DestroyNetwork {
        alloc_id: String,
        network: AllocNetwork,
    },
    /// Serves a unix socket at `path` (created, with its parent, replacing a stale one) that
    /// forwards each connection to the TCP address `target`: how tasks in a network of their
    /// own reach the host's Consul (Nomad's `consul_grpc_socket` hook). Replies `Unit`.
    ProxySocket {
        path: String,
        target: String,
    },
    /// Stops serving the socket at `path` and removes it. Idempotent.
    StopProxySocket {
        path: String,
    },
    /// Sends `signal` (a Linux signal number) to the running task (a template's
    /// `change_mode = "signal"`).
    SignalTask {
        handle: TaskHandle,
        signal: i32,
    },
    /// Renders one `template` block with the variables fetched so far; the file is written
    /// only when every variable it reads was supplied and exists. Replies `Rendered`.
    RenderTemplate(alloc::boxed::Box<RenderRequest>),
    /// Devices for one task from the client's device plugins (the devices hook); the client
    /// chooses the instances ([`devices`]) and asks the driver to `PrepareDevices`.
    ReserveDevices {
        alloc_id: String,
        task: String,
        devices: Vec<RequestedDevice>,
    },
    /// What a task needs to use these instances (env, mounts, device nodes); replies
    /// `Reserved`.
    PrepareDevices {
        picks: Vec<devices::DevicePick>,
    },
    Csi {
        socket: String,
        call: CsiCall,
    },
    /// The narrow server interface (Nomad's `RPCer`): one request, one reply.
    Server(ServerRequest),
    /// `Node.GetClientAllocs`, a blocking read any server answers; replies `Allocs`.
    AllocSync(NodeAllocsRequest),
    /// The local Consul agent's service API.
    Consul(ConsulOp),
    Volume(VolumeOp),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Unit,
    Bool(bool),
    Started(TaskHandle),
    Reserved(Reservation),
    Csi(CsiReply),
    Server(ServerReply),
    Mounted(MountInfo),
    Allocs(NodeAllocsReply),
    /// The services the Consul agent holds, by id.
    Services(BTreeMap<String, services::RegisteredService>),
    /// The checks the Consul agent runs: each one's status (`passing`, `warning`,
    /// `critical`) by check id.
    Checks(BTreeMap<String, String>),
    Rendered(RenderReply),
    /// `ReadFile`: the file's text, `None` when it does not exist.
    File(Option<String>),
    /// The proxy versions the Consul agent supports, newest first, by proxy.
    Proxies(BTreeMap<String, Vec<String>>),
    /// `CreateNetwork`: the namespace made.
    Network(AllocNetwork),
}

/// The network namespace an allocation's tasks share, as the driver that made it names it
/// (the docker driver: its pause container); persisted, so a restarted agent finds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocNetwork {
    pub driver: String,
    pub id: String,
}

/// One template to render (`Io::RenderTemplate`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderRequest {
    pub template: crate::structs::Template,
    /// The task directory `source` and `destination` are relative to.
    pub task_dir: String,
    /// The task's environment (the template's `env` function).
    pub env: BTreeMap<String, String>,
    /// Variables fetched so far: path → items, `None` when the path holds no variable.
    pub variables: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

/// What rendering found (`Reply::Rendered`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderReply {
    pub content: String,
    /// Variable paths the template read.
    pub used: alloc::collections::BTreeSet<String>,
    /// Paths it read that were not supplied: fetch them and render again.
    pub unknown: alloc::collections::BTreeSet<String>,
    /// Paths `nomadVar` read that hold no variable: rendering waits for them, as Nomad's does.
    pub blocked: alloc::collections::BTreeSet<String>,
}

impl RenderReply {
    /// Whether the result is final (and so was written).
    pub fn complete(&self) -> bool {
        self.unknown.is_empty() && self.blocked.is_empty()
    }
}

/// A call to the local Consul agent's service API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsulOp {
    /// `GET /v1/agent/services`; replies `Services`.
    Services,
    /// `PUT /v1/agent/service/register`, at `address`; replies `Unit`.
    Register {
        registration: alloc::boxed::Box<services::TaskServiceRegistration>,
        address: String,
    },
    /// `PUT /v1/agent/service/deregister/<id>`; replies `Unit`.
    Deregister { id: String },
    /// `GET /v1/agent/checks`: the status of every check the agent runs; replies `Checks`.
    Checks,
    /// `GET /v1/agent/self`'s `xDS.SupportedProxies`: the proxy versions the agent supports,
    /// newest first, by proxy (`envoy`); replies `Proxies`.
    SupportedProxies,
}

/// Why an I/O request failed; the kind decides retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    Timeout,
    Unavailable,
    ResourceExhausted,
    NotFound,
    FailedPrecondition,
    /// The driver or host cannot do this at all (`alloc exec` in a driver without exec).
    Unsupported,
    /// A container's image could not be pulled, and why (the engine's status, not its text).
    ImagePull(containers::PullFailure),
    /// The driver refused the task's own configuration (a bind mount outside the allocation,
    /// `privileged` on a client that does not allow it): no attempt will fare better.
    TaskConfig,
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoError {
    pub kind: ErrorKind,
    pub message: String,
}

impl IoError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        IoError {
            kind,
            message: message.into(),
        }
    }

    pub fn other(message: impl Into<String>) -> Self {
        IoError::new(ErrorKind::Other, message)
    }

    /// Retried by node RPCs: timeout, unavailable, resource exhausted (§1.6).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::ResourceExhausted
        )
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A plugin's failure as the servers' CSI decisions read it: `FailedPrecondition` kept,
/// every other kind `Other`.
impl From<IoError> for crate::error::CsiCallError {
    fn from(error: IoError) -> Self {
        use crate::error::{CsiCallError, CsiCallFailure};
        let kind = match error.kind {
            ErrorKind::FailedPrecondition => CsiCallFailure::FailedPrecondition,
            _ => CsiCallFailure::Other,
        };
        CsiCallError::new(kind, error.message)
    }
}

pub type Outcome = Result<Reply, IoError>;

pub use crate::structs::TaskEvent;

pub mod events {
    pub const RECEIVED: &str = "Received";
    pub const SETUP: &str = "Task Setup";
    pub const SETUP_FAILURE: &str = "Setup Failure";
    pub const STARTED: &str = "Started";
    pub const DRIVER_FAILURE: &str = "Driver Failure";
    pub const TERMINATED: &str = "Terminated";
    pub const RESTARTING: &str = "Restarting";
    pub const NOT_RESTARTING: &str = "Not Restarting";
    pub const KILLING: &str = "Killing";
    pub const KILLED: &str = "Killed";
    pub const RESTART_SIGNALED: &str = "Restart Signaled";
    pub const SIGNALING: &str = "Signaling";
    pub const SIBLING_FAILED: &str = "Sibling Task Failed";
    pub const LEADER_DEAD: &str = "Leader Task Dead";
    pub const WAITING_SHUTDOWN_DELAY: &str = "Waiting for shutdown delay";
    pub const PLUGIN_HEALTHY: &str = "Plugin became healthy";
    pub const PLUGIN_UNHEALTHY: &str = "Plugin became unhealthy";
    pub const WAITING_ON_SERVERS: &str = "Waiting for servers";
}

/// An operator's action on a running allocation (`alloc restart`, `alloc signal`), from the
/// HTTP API of any agent; `task: None` means every running task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocControl {
    Restart {
        alloc_id: String,
        task: Option<String>,
    },
    Signal {
        alloc_id: String,
        task: Option<String>,
        signal: String,
    },
}

impl AllocControl {
    pub fn alloc_id(&self) -> &str {
        match self {
            AllocControl::Restart { alloc_id, .. } | AllocControl::Signal { alloc_id, .. } => alloc_id,
        }
    }
}

/// A node event (`Mount volume`, `Unmount volume`, plugin health).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientNodeEvent {
    pub subsystem: String,
    pub message: String,
    pub details: BTreeMap<String, String>,
}

/// Deterministic jitter from a seed handed in (no global randomness in core).
#[derive(Clone, Debug)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Jitter(seed | 1)
    }

    /// A value in `0..bound` (xorshift; quality is irrelevant, determinism is not).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % bound
    }
}
