//! Tasks: driver config values, volume mounts and requests, restart policies, resources,
//! services and checks.

use super::*;

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
    /// `memory_max`: the hard limit when it is above `memory` (Nomad's memory
    /// oversubscription); 0 for none, `memory` is then the hard limit.
    #[serde(default)]
    pub memory_max_mb: u32,
    /// 0.11-style `resources { network {} }`: ports of this task alone.
    #[serde(default)]
    pub networks: Vec<NetworkResource>,
    /// `cores`: whole CPU cores the task has to itself (Nomad 1.1's reserved cores); the
    /// scheduler picks which, and the task's CPU is then those cores' MHz (`cpu` is 0).
    #[serde(default)]
    pub cores: u32,
}

/// Nomad's default `kill_timeout`.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// `logs { max_files max_file_size }` (Nomad's `LogConfig`): each of the task's streams is
/// kept in at most `max_files` files of at most `max_file_size_mb` MB, the oldest removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogConfig {
    pub max_files: u32,
    pub max_file_size_mb: u32,
}

impl Default for LogConfig {
    /// Nomad's defaults: 10 files of 10 MB.
    fn default() -> Self {
        LogConfig {
            max_files: 10,
            max_file_size_mb: 10,
        }
    }
}

impl LogConfig {
    /// Nomad's `LogConfig.Validate` texts.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.max_files < 1 {
            problems.push(format!("minimum number of files is 1; got {}", self.max_files));
        }
        if self.max_file_size_mb < 1 {
            problems.push(format!("minimum file size is 1MB; got {}", self.max_file_size_mb));
        }
        problems
    }
}

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
    /// The task's `meta {}` (merged over the group's and the job's for `NOMAD_META_*`).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// `template` blocks, rendered before the task starts.
    #[serde(default)]
    pub templates: Vec<super::Template>,
    /// `dispatch_payload { file }`: a dispatched job's payload written into `local/`.
    #[serde(default)]
    pub dispatch_payload: Option<super::DispatchPayloadConfig>,
    /// What the task is to Nomad beyond its config: `connect-proxy:<service>` for a Connect
    /// sidecar, `connect-native:<service>`, `csi-plugin` is not one (empty for most tasks).
    #[serde(default)]
    pub kind: String,
    /// `lifecycle { hook sidecar }`.
    #[serde(default)]
    pub lifecycle: Option<TaskLifecycle>,
    /// `logs {}`: how the client rotates the task's stdout and stderr.
    #[serde(default)]
    pub logs: LogConfig,
    /// `kill_signal`: what a stop sends first (empty: SIGINT, Nomad's default).
    #[serde(default)]
    pub kill_signal: String,
    /// `leader`: when this task finishes, its allocation's other tasks are stopped.
    #[serde(default)]
    pub leader: bool,
    /// The task's own `restart` block, laid over its group's (Nomad's task-level restart
    /// policy); `None`: the group's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<super::RestartPolicy>,
    /// `shutdown_delay`: on a kill, the wait between taking the task's services out of
    /// Consul and sending its kill signal (after its group's own delay).
    #[serde(default, skip_serializing_if = "Duration::is_zero")]
    pub shutdown_delay: Duration,
}

/// `lifecycle` hook values Nomad accepts.
pub const LIFECYCLE_PRESTART: &str = "prestart";
pub const LIFECYCLE_POSTSTART: &str = "poststart";
pub const LIFECYCLE_POSTSTOP: &str = "poststop";

/// A task's `lifecycle {}` block (Nomad's `TaskLifecycleConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLifecycle {
    pub hook: String,
    #[serde(default)]
    pub sidecar: bool,
}

impl TaskLifecycle {
    /// Nomad's `TaskLifecycleConfig.Validate` texts.
    pub fn validate(&self) -> Result<(), String> {
        match self.hook.as_str() {
            LIFECYCLE_PRESTART | LIFECYCLE_POSTSTART | LIFECYCLE_POSTSTOP => Ok(()),
            "" => Err("no lifecycle hook provided".into()),
            other => Err(format!("invalid hook: {other}")),
        }
    }
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
    /// `connect {}` (group services only).
    #[serde(default)]
    pub connect: Option<super::ConsulConnect>,
    /// The task behind a group service (Connect native), set explicitly or by the job mutator.
    #[serde(default)]
    pub task_name: String,
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
    /// The status Consul gives the check until it first runs (`""`: Consul's, critical).
    #[serde(default)]
    pub initial_status: String,
    /// A `grpc` check's service name (Consul's `GRPC` target `host:port/<service>`).
    #[serde(default)]
    pub grpc_service: String,
    #[serde(default)]
    pub grpc_use_tls: bool,
    /// An `http` or `grpc` check over TLS without verifying the task's certificate.
    #[serde(default)]
    pub tls_skip_verify: bool,
    /// An `http` check's request headers.
    #[serde(default)]
    pub header: BTreeMap<String, Vec<String>>,
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
        if !matches!(self.initial_status.as_str(), "" | "passing" | "warning" | "critical") {
            return Err(format!(
                "invalid initial check state ({}), must be one of \"passing\", \"warning\", \"critical\" or empty",
                self.initial_status
            ));
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

    /// A group service's canonical form: an empty name is `<job>-<group>`, and `${TASK}` is
    /// `group`, as Nomad canonicalises group services.
    pub fn canonicalize_group(&mut self, job: &str, group: &str) {
        if self.name.is_empty() {
            self.name = format!("{job}-{group}");
        }
        self.canonicalize(job, group, "group");
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
        if let Some(connect) = &self.connect
            && let Err(problem) = connect.validate()
        {
            errors.push(problem);
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
            meta: BTreeMap::new(),
            constraints: Vec::new(),
            affinities: Vec::new(),
            templates: Vec::new(),
            dispatch_payload: None,
            kind: String::new(),
            lifecycle: None,
            logs: LogConfig::default(),
            kill_signal: String::new(),
            leader: false,
            restart_policy: None,
            shutdown_delay: Duration::ZERO,
        }
    }
}
