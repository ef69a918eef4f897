//! Nomad's API form of a job (`{"Job": {...}}` with PascalCase fields, durations in
//! nanoseconds), converted to and from the core's [`Job`]. The HTTP API reads and writes it;
//! the CLI produces it from HCL. Omitted fields get Nomad's defaults (its `Canonicalize`):
//! namespace `default`, name = ID, priority 50, type `service`, count 1, 100 MHz and 300 MB
//! per task, a 5 s kill timeout.

mod connect;
pub mod diff;
mod network;
mod parameterized;
mod periodic;
mod reschedule;
mod scaling;
pub mod strict;
mod template;
mod update;

use std::collections::BTreeMap;
use std::time::Duration;

pub use connect::{
    ApiConsulConnect, ApiConsulProxy, ApiConsulUpstream, ApiLifecycle, ApiSidecarService, ApiSidecarTask,
};
pub use network::{ApiNetworkResource, ApiPort, ApiPortMapping};
pub use parameterized::{ApiDispatchPayloadConfig, ApiParameterizedJobConfig, bytes_base64};
pub use periodic::ApiPeriodicConfig;
pub use reschedule::ApiReschedulePolicy;
pub use scaling::{ApiScalingPolicy, policy_json, policy_stub};
pub use template::ApiTemplate;
pub use update::ApiUpdateStrategy;

use drover_core::structs::{
    AccessMode, Affinity, AttachmentMode, ConfigValue, Constraint, CsiMountOptions, CsiPluginType, Job, JobType,
    MigrateStrategy, Propagation, RequestedDevice, RestartMode, RestartPolicy, Service, ServiceCheck, Spread,
    SpreadTarget, Task, TaskCsiPluginConfig, TaskGroup, TaskResources, VolumeMount, VolumeRequest, VolumeType,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const DEFAULT_CPU: u32 = 100;
pub const DEFAULT_MEMORY_MB: u32 = 300;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiJob {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub region: String,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: Option<u32>,
    pub datacenters: Vec<String>,
    pub task_groups: Vec<ApiTaskGroup>,
    pub stop: bool,
    // Read-only on the way out.
    pub status: String,
    pub version: u64,
    pub submit_time: i64,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
    pub meta: BTreeMap<String, String>,
    pub constraints: Vec<ApiConstraint>,
    pub affinities: Vec<ApiAffinity>,
    pub update: Option<ApiUpdateStrategy>,
    pub stable: bool,
    pub periodic: Option<ApiPeriodicConfig>,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub parameterized_job: Option<ApiParameterizedJobConfig>,
    pub dispatched: bool,
    #[serde(with = "bytes_base64")]
    pub payload: Vec<u8>,
    pub dispatch_idempotency_token: String,
    pub all_at_once: bool,
    pub spreads: Vec<ApiSpread>,
    /// The job's `reschedule` block: laid under each group's (read back there, as Nomad's).
    pub reschedule: Option<ApiReschedulePolicy>,
    /// The job's `migrate` block: laid under each group's (read back there, as Nomad's).
    pub migrate: Option<ApiMigrate>,
}

/// Nomad's `api.Constraint`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiConstraint {
    #[serde(rename = "LTarget")]
    pub ltarget: String,
    #[serde(rename = "RTarget")]
    pub rtarget: String,
    pub operand: String,
}

/// Nomad's `api.Affinity`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiAffinity {
    #[serde(rename = "LTarget")]
    pub ltarget: String,
    #[serde(rename = "RTarget")]
    pub rtarget: String,
    pub operand: String,
    pub weight: i32,
}

/// Nomad's `api.Spread`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiSpread {
    pub attribute: String,
    pub weight: Option<i64>,
    pub spread_target: Vec<ApiSpreadTarget>,
}

/// Nomad's `api.SpreadTarget`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiSpreadTarget {
    pub value: String,
    pub percent: i64,
}

fn spreads_in(api: &[ApiSpread], problems: &mut Vec<String>) -> Vec<Spread> {
    api.iter()
        .map(|spread| {
            let mut number = |value: i64, what: &str| {
                u32::try_from(value).unwrap_or_else(|_| {
                    problems.push(format!("spread {what} must not be negative: {value}"));
                    0
                })
            };
            Spread {
                attribute: spread.attribute.clone(),
                weight: spread
                    .weight
                    .map_or(drover_core::structs::SPREAD_WEIGHT_DEFAULT, |weight| {
                        number(weight, "weight")
                    }),
                targets: spread
                    .spread_target
                    .iter()
                    .map(|target| SpreadTarget {
                        value: target.value.clone(),
                        percent: number(target.percent, "percent"),
                    })
                    .collect(),
            }
        })
        .collect()
}

fn spreads_out(core: &[Spread]) -> Vec<ApiSpread> {
    core.iter()
        .map(|spread| ApiSpread {
            attribute: spread.attribute.clone(),
            weight: Some(i64::from(spread.weight)),
            spread_target: spread
                .targets
                .iter()
                .map(|target| ApiSpreadTarget {
                    value: target.value.clone(),
                    percent: i64::from(target.percent),
                })
                .collect(),
        })
        .collect()
}

fn constraints_in(api: &[ApiConstraint]) -> Vec<Constraint> {
    api.iter()
        .map(|c| Constraint {
            ltarget: c.ltarget.clone(),
            rtarget: c.rtarget.clone(),
            operand: c.operand.clone(),
        })
        .collect()
}

fn constraints_out(core: &[Constraint]) -> Vec<ApiConstraint> {
    core.iter()
        .map(|c| ApiConstraint {
            ltarget: c.ltarget.clone(),
            rtarget: c.rtarget.clone(),
            operand: c.operand.clone(),
        })
        .collect()
}

fn affinities_in(api: &[ApiAffinity]) -> Vec<Affinity> {
    api.iter()
        .map(|a| Affinity {
            ltarget: a.ltarget.clone(),
            rtarget: a.rtarget.clone(),
            operand: a.operand.clone(),
            weight: a.weight,
        })
        .collect()
}

fn affinities_out(core: &[Affinity]) -> Vec<ApiAffinity> {
    core.iter()
        .map(|a| ApiAffinity {
            ltarget: a.ltarget.clone(),
            rtarget: a.rtarget.clone(),
            operand: a.operand.clone(),
            weight: a.weight,
        })
        .collect()
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiTaskGroup {
    pub name: String,
    pub count: Option<u32>,
    pub tasks: Vec<ApiTask>,
    pub volumes: BTreeMap<String, ApiVolumeRequest>,
    pub restart_policy: Option<ApiRestartPolicy>,
    pub migrate: Option<ApiMigrate>,
    pub meta: BTreeMap<String, String>,
    pub constraints: Vec<ApiConstraint>,
    pub affinities: Vec<ApiAffinity>,
    pub networks: Vec<ApiNetworkResource>,
    pub services: Vec<ApiService>,
    pub update: Option<ApiUpdateStrategy>,
    pub scaling: Option<ApiScalingPolicy>,
    pub reschedule_policy: Option<ApiReschedulePolicy>,
    pub spreads: Vec<ApiSpread>,
    /// Nanoseconds (Nomad's `ShutdownDelay`).
    pub shutdown_delay: Option<i64>,
    /// Nanoseconds (Nomad's `StopAfterClientDisconnect`).
    pub stop_after_client_disconnect: Option<i64>,
    pub ephemeral_disk: Option<ApiEphemeralDisk>,
}

/// Nomad's `EphemeralDisk` JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiEphemeralDisk {
    #[serde(rename = "SizeMB")]
    pub size_mb: Option<u64>,
    #[serde(rename = "Sticky")]
    pub sticky: bool,
    #[serde(rename = "Migrate")]
    pub migrate: bool,
}

/// The `migrate` block: how a node drain moves the group.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiMigrate {
    pub max_parallel: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiRestartPolicy {
    pub attempts: Option<u32>,
    pub interval: Option<i64>,
    pub delay: Option<i64>,
    pub mode: Option<String>,
}

impl ApiRestartPolicy {
    /// The fields given, laid over `base` (a group's over its job type's default, a task's
    /// over its group's, as Nomad merges them).
    fn laid_over(&self, base: RestartPolicy, problems: &mut Vec<String>) -> RestartPolicy {
        let mut policy = base;
        if let Some(attempts) = self.attempts {
            policy.attempts = attempts;
        }
        if let Some(interval) = self.interval {
            policy.interval = duration("restart interval", interval, problems);
        }
        if let Some(delay) = self.delay {
            policy.delay = duration("restart delay", delay, problems);
        }
        if let Some(mode) = &self.mode {
            policy.mode = match mode.as_str() {
                "fail" => RestartMode::Fail,
                "delay" => RestartMode::Delay,
                other => {
                    problems.push(format!("Unsupported restart mode: {other:?}"));
                    RestartMode::Fail
                }
            };
        }
        policy
    }

    /// Nomad's JSON of a policy.
    fn of(policy: RestartPolicy) -> Self {
        ApiRestartPolicy {
            attempts: Some(policy.attempts),
            interval: Some(nanos(policy.interval)),
            delay: Some(nanos(policy.delay)),
            mode: Some(match policy.mode {
                RestartMode::Fail => "fail".into(),
                RestartMode::Delay => "delay".into(),
            }),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiTask {
    pub name: String,
    pub driver: String,
    pub config: BTreeMap<String, Value>,
    pub env: BTreeMap<String, String>,
    pub resources: Option<ApiResources>,
    pub volume_mounts: Vec<ApiVolumeMount>,
    #[serde(rename = "CSIPluginConfig")]
    pub csi_plugin_config: Option<ApiCsiPluginConfig>,
    pub kill_timeout: Option<i64>,
    pub services: Vec<ApiService>,
    pub meta: BTreeMap<String, String>,
    pub constraints: Vec<ApiConstraint>,
    pub affinities: Vec<ApiAffinity>,
    pub templates: Vec<ApiTemplate>,
    pub kind: String,
    pub lifecycle: Option<connect::ApiLifecycle>,
    pub log_config: Option<ApiLogConfig>,
    pub dispatch_payload: Option<ApiDispatchPayloadConfig>,
    pub kill_signal: String,
    pub leader: bool,
    /// The task's own `restart` block, laid over its group's.
    pub restart_policy: Option<ApiRestartPolicy>,
    /// Nanoseconds (Nomad's `ShutdownDelay`).
    pub shutdown_delay: i64,
}

/// The `logs` block (Nomad's `LogConfig`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiLogConfig {
    pub max_files: Option<u32>,
    #[serde(rename = "MaxFileSizeMB")]
    pub max_file_size_mb: Option<u32>,
}

/// Nomad's `api.Service` (the fields this project keeps).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiService {
    pub name: String,
    pub port_label: String,
    pub address_mode: String,
    pub tags: Vec<String>,
    pub canary_tags: Vec<String>,
    pub enable_tag_override: bool,
    pub meta: BTreeMap<String, String>,
    pub checks: Vec<ApiServiceCheck>,
    pub connect: Option<connect::ApiConsulConnect>,
    pub task_name: String,
}

/// Nomad's `api.ServiceCheck`; `Interval` and `Timeout` in nanoseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiServiceCheck {
    pub name: String,
    #[serde(rename = "Type")]
    pub check_type: String,
    pub command: String,
    pub args: Vec<String>,
    pub path: String,
    pub protocol: String,
    pub method: String,
    pub port_label: String,
    pub interval: i64,
    pub timeout: i64,
    pub initial_status: String,
    #[serde(rename = "GRPCService")]
    pub grpc_service: String,
    #[serde(rename = "GRPCUseTLS")]
    pub grpc_use_tls: bool,
    #[serde(rename = "TLSSkipVerify")]
    pub tls_skip_verify: bool,
    pub header: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiResources {
    #[serde(rename = "CPU")]
    pub cpu: Option<u32>,
    pub cores: Option<u32>,
    #[serde(rename = "MemoryMB")]
    pub memory_mb: Option<u32>,
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: Option<u32>,
    pub devices: Vec<ApiDevice>,
    pub networks: Vec<ApiNetworkResource>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiDevice {
    pub name: String,
    pub count: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiVolumeMount {
    pub volume: String,
    pub destination: String,
    pub read_only: bool,
    pub propagation_mode: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiCsiPluginConfig {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Type")]
    pub plugin_type: String,
    pub mount_dir: String,
    pub stage_publish_base_dir: String,
    pub health_timeout: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiVolumeRequest {
    pub name: String,
    #[serde(rename = "Type")]
    pub volume_type: String,
    pub source: String,
    pub read_only: bool,
    pub access_mode: String,
    pub attachment_mode: String,
    pub mount_options: Option<ApiMountOptions>,
    pub per_alloc: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiMountOptions {
    #[serde(rename = "FSType")]
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

fn nanos(duration: Duration) -> i64 {
    duration.as_nanos().min(i64::MAX as u128) as i64
}

fn duration(field: &str, nanos: i64, problems: &mut Vec<String>) -> Duration {
    if nanos < 0 {
        problems.push(format!("{field} must not be negative"));
        return Duration::ZERO;
    }
    Duration::from_nanos(nanos as u64)
}

/// How deep a task's `config` may nest lists and maps. Drivers' configs nest a few levels;
/// this bound keeps every accepted config far inside what the JSON of a registration may nest
/// (serde_json stops at 128), so `job run` and the HTTP API refuse the same jobs (a fuzzed
/// jobspec nesting `config` blocks 60 deep parsed from HCL and was refused over JSON).
pub const CONFIG_DEPTH_MAX: usize = 32;

/// Why a task's config value cannot be taken.
enum ConfigRefusal {
    Unsupported,
    TooDeep,
}

fn config_value(value: &Value, depth: usize) -> Result<ConfigValue, ConfigRefusal> {
    if depth > CONFIG_DEPTH_MAX {
        return Err(ConfigRefusal::TooDeep);
    }
    Ok(match value {
        Value::Bool(flag) => ConfigValue::Bool(*flag),
        Value::Number(number) => ConfigValue::Int(number.as_i64().ok_or(ConfigRefusal::Unsupported)?),
        Value::String(text) => ConfigValue::String(text.clone()),
        Value::Array(items) => ConfigValue::List(
            items
                .iter()
                .map(|item| config_value(item, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => ConfigValue::Map(
            map.iter()
                .map(|(key, value)| Ok((key.clone(), config_value(value, depth + 1)?)))
                .collect::<Result<_, _>>()?,
        ),
        Value::Null => return Err(ConfigRefusal::Unsupported),
    })
}

/// One entry of a task's `config`, or the problem that names it (`at`: whose config).
fn config_entry(at: &str, key: &str, value: &Value) -> Result<ConfigValue, String> {
    config_value(value, 1).map_err(|refusal| match refusal {
        ConfigRefusal::Unsupported => format!("{at}: config {key:?} has an unsupported value"),
        ConfigRefusal::TooDeep => {
            format!("{at}: config {key:?} nests lists and maps deeper than {CONFIG_DEPTH_MAX} levels")
        }
    })
}

fn config_json(value: &ConfigValue) -> Value {
    match value {
        ConfigValue::Bool(flag) => Value::Bool(*flag),
        ConfigValue::Int(number) => Value::from(*number),
        ConfigValue::String(text) => Value::String(text.clone()),
        ConfigValue::List(items) => Value::Array(items.iter().map(config_json).collect()),
        ConfigValue::Map(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), config_json(v))).collect()),
    }
}

/// `value` with every `null` object member removed, at any depth. Nomad's Go API client
/// encodes nil slices, maps and pointers as `null`; here they mean what an absent field means.
pub fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(key, value)| (key, without_nulls(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

fn enum_text<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        _ => String::new(),
    }
}

impl ApiJob {
    /// The core job, with Nomad's defaults; problems the conversion finds (unknown modes,
    /// bad values) come back as a list, like validation's.
    pub fn to_job(&self) -> Result<Job, Vec<String>> {
        let mut problems = Vec::new();
        let job_type = if self.job_type.is_empty() {
            JobType::Service
        } else {
            JobType::parse(&self.job_type).unwrap_or_else(|| {
                problems.push(format!("Invalid job type: {:?}", self.job_type));
                JobType::Service
            })
        };
        let name = if self.name.is_empty() {
            self.id.clone()
        } else {
            self.name.clone()
        };
        let job_update = update::job_strategy(job_type, self.update.as_ref());
        let task_groups = self
            .task_groups
            .iter()
            .map(|group| group.to_group(self, job_type, &name, job_update.as_ref(), &mut problems))
            .collect();
        let update = job_update.map(|update| Box::new(update.to_strategy(&mut problems)));
        let periodic = self
            .periodic
            .as_ref()
            .map(|periodic| Box::new(periodic.to_config(job_type, &mut problems)));
        let parameterized = self
            .parameterized_job
            .as_ref()
            .map(|parameterized| Box::new(parameterized.to_config(job_type, &mut problems)));
        let job = Job {
            id: self.id.clone(),
            namespace: if self.namespace.is_empty() {
                "default".into()
            } else {
                self.namespace.clone()
            },
            name,
            job_type,
            priority: self.priority.unwrap_or(drover_core::jobspec::PRIORITY_DEFAULT),
            datacenters: if self.datacenters.is_empty() {
                vec!["*".into()]
            } else {
                self.datacenters.clone()
            },
            task_groups,
            stop: self.stop,
            meta: self.meta.clone(),
            constraints: constraints_in(&self.constraints),
            affinities: affinities_in(&self.affinities),
            update,
            periodic,
            parent_id: self.parent_id.clone(),
            parameterized,
            dispatched: self.dispatched,
            payload: self.payload.clone(),
            dispatch_idempotency_token: self.dispatch_idempotency_token.clone(),
            all_at_once: self.all_at_once,
            spreads: spreads_in(&self.spreads, &mut problems),
            ..Job::default()
        };
        if problems.is_empty() { Ok(job) } else { Err(problems) }
    }

    pub fn from_job(job: &Job, status: &str) -> ApiJob {
        ApiJob {
            id: job.id.clone(),
            name: job.name.clone(),
            namespace: job.namespace.clone(),
            region: "global".into(),
            job_type: job.job_type.as_str().into(),
            priority: Some(job.priority),
            datacenters: job.datacenters.clone(),
            task_groups: job
                .task_groups
                .iter()
                .map(|group| ApiTaskGroup::from_group(group, &job.namespace, &job.id))
                .collect(),
            stop: job.stop,
            status: status.into(),
            version: job.version,
            submit_time: (job.submit_time_ms as i64).saturating_mul(1_000_000),
            create_index: job.create_index,
            modify_index: job.modify_index,
            job_modify_index: job.job_modify_index,
            meta: job.meta.clone(),
            constraints: constraints_out(&job.constraints),
            affinities: affinities_out(&job.affinities),
            update: job.update.as_deref().map(ApiUpdateStrategy::from_strategy),
            stable: job.stable,
            periodic: job.periodic.as_deref().map(ApiPeriodicConfig::from_config),
            parent_id: job.parent_id.clone(),
            parameterized_job: job.parameterized.as_deref().map(ApiParameterizedJobConfig::from_config),
            dispatched: job.dispatched,
            payload: job.payload.clone(),
            dispatch_idempotency_token: job.dispatch_idempotency_token.clone(),
            all_at_once: job.all_at_once,
            spreads: spreads_out(&job.spreads),
            reschedule: None,
            migrate: None,
        }
    }
}

impl ApiTaskGroup {
    fn to_group(
        &self,
        job: &ApiJob,
        job_type: JobType,
        job_name: &str,
        job_update: Option<&ApiUpdateStrategy>,
        problems: &mut Vec<String>,
    ) -> TaskGroup {
        let update = update::group_strategy(job_update, self.update.as_ref(), problems).map(Box::new);
        let default_policy = match job_type {
            JobType::Batch => RestartPolicy::BATCH,
            JobType::Service | JobType::System => RestartPolicy::SERVICE,
        };
        let restart_policy = self
            .restart_policy
            .as_ref()
            .map(|policy| policy.laid_over(default_policy, problems));
        let group_policy = restart_policy.unwrap_or(default_policy);
        // Nomad: a count left unset beside `scaling { min }` starts at the minimum.
        let count = self
            .count
            .or_else(|| {
                let min = self.scaling.as_ref()?.min?;
                u32::try_from(min).ok()
            })
            .unwrap_or(1);
        TaskGroup {
            name: self.name.clone(),
            count,
            tasks: self
                .tasks
                .iter()
                .map(|task| task.to_task(job_name, &self.name, group_policy, problems))
                .collect(),
            volumes: self
                .volumes
                .iter()
                .map(|(alias, request)| (alias.clone(), request.to_request(alias, problems)))
                .collect(),
            restart_policy,
            meta: self.meta.clone(),
            constraints: constraints_in(&self.constraints),
            affinities: affinities_in(&self.affinities),
            networks: self
                .networks
                .iter()
                .map(|network| network.to_network(&format!("Group {}", self.name), problems))
                .collect(),
            migrate: match (&job.migrate, &self.migrate) {
                (None, None) => None,
                (job, group) => Some(MigrateStrategy {
                    max_parallel: group
                        .as_ref()
                        .and_then(|group| group.max_parallel)
                        .or_else(|| job.as_ref().and_then(|job| job.max_parallel))
                        .unwrap_or(MigrateStrategy::default().max_parallel),
                }),
            },
            spreads: spreads_in(&self.spreads, problems),
            shutdown_delay: self
                .shutdown_delay
                .map(|nanos| duration("shutdown_delay", nanos, problems)),
            stop_after_client_disconnect: self
                .stop_after_client_disconnect
                .map(|nanos| duration("stop_after_client_disconnect", nanos, problems)),
            ephemeral_disk: self.ephemeral_disk.as_ref().map(|disk| {
                // Not honoured yet: refused by name rather than stored and ignored.
                for (set, field) in [(disk.sticky, "sticky"), (disk.migrate, "migrate")] {
                    if set {
                        problems.push(format!(
                            "Group {:?} ephemeral_disk: {field} is not supported by Drover",
                            self.name
                        ));
                    }
                }
                drover_core::structs::EphemeralDisk {
                    // Nomad's default size.
                    size_mb: disk.size_mb.unwrap_or(300),
                    sticky: false,
                    migrate: false,
                }
            }),
            reschedule_policy: reschedule::group_policy(
                job_type,
                job.reschedule.as_ref(),
                self.reschedule_policy.as_ref(),
                problems,
            ),
            services: self
                .services
                .iter()
                .map(|service| {
                    let mut service = service.to_service(problems);
                    service.canonicalize_group(job_name, &self.name);
                    service
                })
                .collect(),
            update,
            scaling: self.scaling.as_ref().map(|scaling| {
                let mut found = Vec::new();
                let policy = scaling.to_policy(count, &mut found);
                problems.extend(found);
                Box::new(policy)
            }),
        }
    }

    fn from_group(group: &TaskGroup, namespace: &str, job_id: &str) -> ApiTaskGroup {
        ApiTaskGroup {
            scaling: group
                .scaling
                .as_deref()
                .map(|policy| ApiScalingPolicy::from_policy(policy, namespace, job_id, &group.name)),
            migrate: group.migrate.map(|migrate| ApiMigrate {
                max_parallel: Some(migrate.max_parallel),
            }),
            update: group.update.as_deref().map(ApiUpdateStrategy::from_strategy),
            reschedule_policy: group.reschedule_policy.as_ref().map(ApiReschedulePolicy::from_policy),
            spreads: spreads_out(&group.spreads),
            shutdown_delay: group.shutdown_delay.map(nanos),
            stop_after_client_disconnect: group.stop_after_client_disconnect.map(nanos),
            ephemeral_disk: group.ephemeral_disk.map(|disk| ApiEphemeralDisk {
                size_mb: Some(disk.size_mb),
                sticky: disk.sticky,
                migrate: disk.migrate,
            }),
            name: group.name.clone(),
            meta: group.meta.clone(),
            constraints: constraints_out(&group.constraints),
            affinities: affinities_out(&group.affinities),
            count: Some(group.count),
            networks: group.networks.iter().map(ApiNetworkResource::from_network).collect(),
            tasks: group.tasks.iter().map(ApiTask::from_task).collect(),
            services: group.services.iter().map(ApiService::from_service).collect(),
            volumes: group
                .volumes
                .iter()
                .map(|(alias, request)| (alias.clone(), ApiVolumeRequest::from_request(request)))
                .collect(),
            restart_policy: group.restart_policy.map(ApiRestartPolicy::of),
        }
    }
}

impl ApiTask {
    fn to_task(
        &self,
        job_name: &str,
        group_name: &str,
        group_policy: RestartPolicy,
        problems: &mut Vec<String>,
    ) -> Task {
        let resources = self.resources.clone().unwrap_or_default();
        let mut config = BTreeMap::new();
        for (key, value) in &self.config {
            match config_entry(&format!("Task {}", self.name), key, value) {
                Ok(value) => {
                    config.insert(key.clone(), value);
                }
                Err(problem) => problems.push(problem),
            }
        }
        let csi_plugin = self.csi_plugin_config.as_ref().map(|plugin| {
            let plugin_type = match plugin.plugin_type.as_str() {
                "controller" => CsiPluginType::Controller,
                "node" => CsiPluginType::Node,
                "monolith" => CsiPluginType::Monolith,
                other => {
                    problems.push(format!(
                        "Task {}: csi_plugin type must be controller, node or monolith, not {other:?}",
                        self.name
                    ));
                    CsiPluginType::Monolith
                }
            };
            let mut stanza = TaskCsiPluginConfig::new(plugin.id.clone(), plugin_type);
            if !plugin.mount_dir.is_empty() {
                stanza.mount_dir = plugin.mount_dir.clone();
            }
            if !plugin.stage_publish_base_dir.is_empty() {
                stanza.stage_publish_base_dir = plugin.stage_publish_base_dir.clone();
            }
            if let Some(timeout) = plugin.health_timeout {
                stanza.health_timeout = duration("csi_plugin health_timeout", timeout, problems);
            }
            stanza
        });
        Task {
            shutdown_delay: duration("shutdown_delay", self.shutdown_delay, problems),
            restart_policy: self
                .restart_policy
                .as_ref()
                .map(|policy| policy.laid_over(group_policy, problems)),
            kill_signal: self.kill_signal.clone(),
            leader: self.leader,
            dispatch_payload: self
                .dispatch_payload
                .as_ref()
                .map(|payload| payload.to_config(&self.name, problems)),
            name: self.name.clone(),
            driver: self.driver.clone(),
            config,
            env: self.env.clone(),
            meta: self.meta.clone(),
            constraints: constraints_in(&self.constraints),
            affinities: affinities_in(&self.affinities),
            templates: self
                .templates
                .iter()
                .map(|template| template.to_template(problems))
                .collect(),
            volume_mounts: self
                .volume_mounts
                .iter()
                .map(|mount| VolumeMount {
                    volume: mount.volume.clone(),
                    destination: mount.destination.clone(),
                    read_only: mount.read_only,
                    propagation_mode: if mount.propagation_mode.is_empty() {
                        Propagation::Private
                    } else {
                        Propagation::parse(&mount.propagation_mode).unwrap_or_else(|| {
                            problems.push(format!("unknown propagation_mode {:?}", mount.propagation_mode));
                            Propagation::Private
                        })
                    },
                })
                .collect(),
            csi_plugin,
            kill_timeout: self
                .kill_timeout
                .map(|nanos| duration("kill_timeout", nanos, problems))
                .unwrap_or(drover_core::structs::DEFAULT_KILL_TIMEOUT),
            services: self
                .services
                .iter()
                .map(|service| {
                    let mut service = service.to_service(problems);
                    service.canonicalize(job_name, group_name, &self.name);
                    service
                })
                .collect(),
            kind: self.kind.clone(),
            lifecycle: self.lifecycle.as_ref().map(connect::ApiLifecycle::to_lifecycle),
            logs: {
                let defaults = drover_core::structs::LogConfig::default();
                let given = self.log_config.clone().unwrap_or_default();
                drover_core::structs::LogConfig {
                    max_files: given.max_files.unwrap_or(defaults.max_files),
                    max_file_size_mb: given.max_file_size_mb.unwrap_or(defaults.max_file_size_mb),
                }
            },
            resources: TaskResources {
                // A task asking for cores gets no default CPU (Nomad's canonicalisation).
                cpu: resources.cpu.unwrap_or(match resources.cores {
                    Some(cores) if cores > 0 => 0,
                    _ => DEFAULT_CPU,
                }),
                cores: resources.cores.unwrap_or(0),
                memory_mb: resources.memory_mb.unwrap_or(DEFAULT_MEMORY_MB),
                memory_max_mb: resources.memory_max_mb.unwrap_or(0),
                networks: resources
                    .networks
                    .iter()
                    .map(|network| network.to_network(&format!("Task {}", self.name), problems))
                    .collect(),
                devices: resources
                    .devices
                    .iter()
                    .map(|device| RequestedDevice {
                        name: device.name.clone(),
                        count: device.count.unwrap_or(1),
                    })
                    .collect(),
            },
        }
    }

    fn from_task(task: &Task) -> ApiTask {
        ApiTask {
            shutdown_delay: nanos(task.shutdown_delay),
            restart_policy: task.restart_policy.map(ApiRestartPolicy::of),
            kill_signal: task.kill_signal.clone(),
            leader: task.leader,
            dispatch_payload: task
                .dispatch_payload
                .as_ref()
                .map(ApiDispatchPayloadConfig::from_config),
            name: task.name.clone(),
            driver: task.driver.clone(),
            config: task.config.iter().map(|(k, v)| (k.clone(), config_json(v))).collect(),
            env: task.env.clone(),
            resources: Some(ApiResources {
                cpu: Some(task.resources.cpu),
                cores: Some(task.resources.cores),
                memory_mb: Some(task.resources.memory_mb),
                memory_max_mb: (task.resources.memory_max_mb > 0).then_some(task.resources.memory_max_mb),
                networks: task
                    .resources
                    .networks
                    .iter()
                    .map(ApiNetworkResource::from_network)
                    .collect(),
                devices: task
                    .resources
                    .devices
                    .iter()
                    .map(|device| ApiDevice {
                        name: device.name.clone(),
                        count: Some(device.count),
                    })
                    .collect(),
            }),
            volume_mounts: task
                .volume_mounts
                .iter()
                .map(|mount| ApiVolumeMount {
                    volume: mount.volume.clone(),
                    destination: mount.destination.clone(),
                    read_only: mount.read_only,
                    propagation_mode: mount.propagation_mode.as_str().into(),
                })
                .collect(),
            csi_plugin_config: task.csi_plugin.as_ref().map(|plugin| ApiCsiPluginConfig {
                id: plugin.id.clone(),
                plugin_type: enum_text(&plugin.plugin_type),
                mount_dir: plugin.mount_dir.clone(),
                stage_publish_base_dir: plugin.stage_publish_base_dir.clone(),
                health_timeout: Some(nanos(plugin.health_timeout)),
            }),
            kill_timeout: Some(nanos(task.kill_timeout)),
            services: task.services.iter().map(ApiService::from_service).collect(),
            meta: task.meta.clone(),
            constraints: constraints_out(&task.constraints),
            affinities: affinities_out(&task.affinities),
            templates: task.templates.iter().map(ApiTemplate::from_template).collect(),
            kind: task.kind.clone(),
            lifecycle: task.lifecycle.as_ref().map(connect::ApiLifecycle::from_lifecycle),
            log_config: Some(ApiLogConfig {
                max_files: Some(task.logs.max_files),
                max_file_size_mb: Some(task.logs.max_file_size_mb),
            }),
        }
    }
}

impl ApiService {
    fn to_service(&self, problems: &mut Vec<String>) -> Service {
        Service {
            name: self.name.clone(),
            port_label: self.port_label.clone(),
            address_mode: self.address_mode.clone(),
            tags: self.tags.clone(),
            canary_tags: self.canary_tags.clone(),
            enable_tag_override: self.enable_tag_override,
            meta: self.meta.clone(),
            checks: self
                .checks
                .iter()
                .map(|check| ServiceCheck {
                    name: check.name.clone(),
                    check_type: check.check_type.clone(),
                    command: check.command.clone(),
                    args: check.args.clone(),
                    path: check.path.clone(),
                    protocol: check.protocol.clone(),
                    method: check.method.clone(),
                    port_label: check.port_label.clone(),
                    interval: duration("check interval", check.interval, problems),
                    timeout: duration("check timeout", check.timeout, problems),
                    initial_status: check.initial_status.clone(),
                    grpc_service: check.grpc_service.clone(),
                    grpc_use_tls: check.grpc_use_tls,
                    tls_skip_verify: check.tls_skip_verify,
                    header: check.header.clone(),
                })
                .collect(),
            connect: self
                .connect
                .as_ref()
                .map(|connect| connect.to_connect(&self.name, problems)),
            task_name: self.task_name.clone(),
        }
    }

    fn from_service(service: &Service) -> ApiService {
        ApiService {
            name: service.name.clone(),
            port_label: service.port_label.clone(),
            address_mode: service.address_mode.clone(),
            tags: service.tags.clone(),
            canary_tags: service.canary_tags.clone(),
            enable_tag_override: service.enable_tag_override,
            meta: service.meta.clone(),
            checks: service
                .checks
                .iter()
                .map(|check| ApiServiceCheck {
                    name: check.name.clone(),
                    check_type: check.check_type.clone(),
                    command: check.command.clone(),
                    args: check.args.clone(),
                    path: check.path.clone(),
                    protocol: check.protocol.clone(),
                    method: check.method.clone(),
                    port_label: check.port_label.clone(),
                    interval: nanos(check.interval),
                    timeout: nanos(check.timeout),
                    initial_status: check.initial_status.clone(),
                    grpc_service: check.grpc_service.clone(),
                    grpc_use_tls: check.grpc_use_tls,
                    tls_skip_verify: check.tls_skip_verify,
                    header: check.header.clone(),
                })
                .collect(),
            connect: service.connect.as_ref().map(connect::ApiConsulConnect::from_connect),
            task_name: service.task_name.clone(),
        }
    }
}

impl ApiVolumeRequest {
    fn to_request(&self, alias: &str, problems: &mut Vec<String>) -> VolumeRequest {
        let volume_type = match self.volume_type.as_str() {
            "" | "host" => VolumeType::Host,
            "csi" => VolumeType::Csi,
            other => {
                problems.push(format!("Volume {alias}: invalid volume type: {other:?}"));
                VolumeType::Host
            }
        };
        let access_mode: AccessMode = if self.access_mode.is_empty() {
            AccessMode::Unknown
        } else {
            AccessMode::parse(&self.access_mode).unwrap_or_else(|| {
                problems.push(format!("Volume {alias}: unknown access_mode {:?}", self.access_mode));
                AccessMode::Unknown
            })
        };
        let attachment_mode: AttachmentMode = if self.attachment_mode.is_empty() {
            AttachmentMode::Unknown
        } else {
            AttachmentMode::parse(&self.attachment_mode).unwrap_or_else(|| {
                problems.push(format!(
                    "Volume {alias}: unknown attachment_mode {:?}",
                    self.attachment_mode
                ));
                AttachmentMode::Unknown
            })
        };
        VolumeRequest {
            name: if self.name.is_empty() {
                alias.to_string()
            } else {
                self.name.clone()
            },
            volume_type,
            source: self.source.clone(),
            read_only: self.read_only,
            access_mode,
            attachment_mode,
            mount_options: self.mount_options.as_ref().map(|options| CsiMountOptions {
                fs_type: options.fs_type.clone(),
                mount_flags: options.mount_flags.clone(),
            }),
            per_alloc: self.per_alloc,
        }
    }

    fn from_request(request: &VolumeRequest) -> ApiVolumeRequest {
        ApiVolumeRequest {
            name: request.name.clone(),
            volume_type: match request.volume_type {
                VolumeType::Host => "host".into(),
                VolumeType::Csi => "csi".into(),
            },
            source: request.source.clone(),
            read_only: request.read_only,
            access_mode: request.access_mode.as_str().into(),
            attachment_mode: request.attachment_mode.as_str().into(),
            mount_options: request.mount_options.as_ref().map(|options| ApiMountOptions {
                fs_type: options.fs_type.clone(),
                mount_flags: options.mount_flags.clone(),
            }),
            per_alloc: request.per_alloc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_api_job_gets_nomads_defaults_and_round_trips() {
        let api: ApiJob = serde_json::from_str(
            r#"{"ID":"web","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec",
               "Config":{"command":"/bin/sleep","args":["10"]}}]}]}"#,
        )
        .unwrap();
        let job = api.to_job().unwrap();
        assert_eq!(
            (job.namespace.as_str(), job.name.as_str(), job.priority),
            ("default", "web", 50)
        );
        assert_eq!(job.job_type, JobType::Service);
        assert_eq!(job.datacenters, ["*"]);
        assert_eq!(job.task_groups[0].count, 1);
        let task = &job.task_groups[0].tasks[0];
        assert_eq!((task.resources.cpu, task.resources.memory_mb), (100, 300));
        assert_eq!(task.kill_timeout, Duration::from_secs(5));
        assert_eq!(
            task.config["args"],
            ConfigValue::List(vec![ConfigValue::String("10".into())])
        );
        let back = ApiJob::from_job(&job, "pending").to_job().unwrap();
        assert_eq!(back, job);
    }

    /// A config nested past [`CONFIG_DEPTH_MAX`] is refused by name, whether the job came
    /// parsed (`job run`) or as JSON (the HTTP API); one level less is taken. (The fuzzer's
    /// jobspec nesting `config` blocks 60 deep was taken from HCL and refused over JSON.)
    #[test]
    fn a_config_nested_too_deep_is_refused_the_same_from_hcl_and_json() {
        let nested = |depth: usize| {
            let mut value = serde_json::json!("leaf");
            for _ in 1..depth {
                value = serde_json::json!({ "f": value });
            }
            value
        };
        let job = |depth: usize| {
            serde_json::json!({"ID":"web","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec",
                "Config":{"command":"/bin/true","deep":nested(depth)}}]}]})
        };
        let api: ApiJob = serde_json::from_value(job(CONFIG_DEPTH_MAX)).unwrap();
        assert!(api.to_job().is_ok(), "{CONFIG_DEPTH_MAX} levels are taken");
        let api: ApiJob = serde_json::from_value(job(CONFIG_DEPTH_MAX + 1)).unwrap();
        let problems = api.to_job().unwrap_err();
        assert_eq!(
            problems,
            [format!(
                "Task t: config \"deep\" nests lists and maps deeper than {CONFIG_DEPTH_MAX} levels"
            )]
        );
    }

    #[test]
    fn a_go_client_job_with_nulls_and_services_is_read() {
        // Shaped like Nomad's Go `api.Job` encoding: nil slices and maps are `null`.
        let body: Value = serde_json::from_str(
            r#"{"ID":"web","Name":null,"Datacenters":null,"Priority":null,"TaskGroups":[{"Name":"g","Count":null,
               "Volumes":null,"RestartPolicy":null,"Migrate":null,"Tasks":[{"Name":"t","Driver":"raw_exec",
               "Config":{"command":"/bin/true"},"Env":null,"Resources":null,"VolumeMounts":null,
               "CSIPluginConfig":null,"KillTimeout":null,"Services":[{"Name":"","PortLabel":"","Tags":null,
               "CanaryTags":null,"Meta":null,"Checks":[{"Name":"","Type":"script","Command":"/bin/true",
               "Args":null,"Interval":10000000000,"Timeout":2000000000}]}]}]}]}"#,
        )
        .unwrap();
        let api: ApiJob = serde_json::from_value(without_nulls(body)).unwrap();
        let job = api.to_job().unwrap();
        assert_eq!(job.name, "web");
        let service = &job.task_groups[0].tasks[0].services[0];
        assert_eq!(service.name, "web-g-t");
        assert_eq!(service.checks[0].timeout, Duration::from_secs(2));
        // Read whole; its script check is then refused by name, as from HCL.
        let errors = drover_core::jobspec::validate(&job);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0],
            format!(
                "Task group g validation failed: Task t validation failed: {}: check \"service: \\\"web-g-t\\\" check\"",
                drover_core::jobspec::SCRIPT_CHECKS_REFUSED
            )
        );
        let rendered = serde_json::to_value(ApiJob::from_job(&job, "pending")).unwrap();
        assert_eq!(
            rendered["TaskGroups"][0]["Tasks"][0]["Services"][0]["Checks"][0]["Interval"],
            10_000_000_000i64
        );
    }

    #[test]
    fn unknown_modes_are_named() {
        let api: ApiJob = serde_json::from_str(
            r#"{"ID":"web","Type":"cron","TaskGroups":[{"Name":"g","Volumes":{"data":{"Type":"nfs","Source":"x",
               "AccessMode":"single-mode-writer"}},"Tasks":[{"Name":"t","Driver":"exec"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            api.to_job().unwrap_err(),
            [
                "Invalid job type: \"cron\"",
                "Volume data: invalid volume type: \"nfs\"",
                "Volume data: unknown access_mode \"single-mode-writer\"",
            ]
        );
    }
}
