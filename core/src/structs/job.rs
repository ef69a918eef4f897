//! Task groups and jobs.

use super::*;

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
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// The group's `network` block (Nomad allows one): ports shared by its tasks.
    #[serde(default)]
    pub networks: Vec<NetworkResource>,
    /// Group `service` blocks (Consul Connect lives here), canonicalised by
    /// `Service::canonicalize_group`.
    #[serde(default)]
    pub services: Vec<Service>,
    /// The `update` block merged over the job's (and, for service jobs, Nomad's default):
    /// `None` or an empty one (`max_parallel = 0`) updates everything at once, with no
    /// deployment.
    #[serde(default)]
    pub update: Option<alloc::boxed::Box<UpdateStrategy>>,
    /// The `scaling` block: the bounds of `job scale` and an autoscaler's policy.
    #[serde(default)]
    pub scaling: Option<alloc::boxed::Box<ScalingPolicy>>,
    /// The `reschedule` block merged over the job's and the type's default (`None`: the
    /// type's default, as jobs stored before the block was read have).
    #[serde(default)]
    pub reschedule_policy: Option<ReschedulePolicy>,
    /// `spread` blocks: how the group's allocations spread over node values.
    #[serde(default)]
    pub spreads: Vec<Spread>,
    /// `shutdown_delay`: on a stop, the wait between taking the group's services out of
    /// Consul and signalling its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_delay: Option<core::time::Duration>,
    /// `stop_after_client_disconnect`: a client out of touch with the servers this long stops
    /// the group's allocations, and the servers place their replacements only after that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after_client_disconnect: Option<core::time::Duration>,
    /// `ephemeral_disk`: the disk the group's allocation directory may take on its node
    /// (`None`: not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_disk: Option<EphemeralDisk>,
}

/// Nomad's `EphemeralDisk`: the size counts against the node's disk; `sticky` and `migrate`
/// are refused at parse time (not honoured yet), so stored ones are always false.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EphemeralDisk {
    pub size_mb: u64,
    #[serde(default)]
    pub sticky: bool,
    #[serde(default)]
    pub migrate: bool,
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

    /// How the group's failed allocations are placed again; `None` for system jobs, which
    /// never are.
    pub fn reschedule_policy(&self, job_type: JobType) -> Option<ReschedulePolicy> {
        if job_type == JobType::System {
            return None;
        }
        self.reschedule_policy
            .or_else(|| ReschedulePolicy::default_for(job_type))
    }

    /// The group's update strategy when it rolls out through deployments.
    pub fn rolling_update(&self) -> Option<&UpdateStrategy> {
        self.update.as_deref().filter(|update| !update.is_empty())
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
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// The job-level `update` block as written (groups carry the merged one).
    #[serde(default)]
    pub update: Option<alloc::boxed::Box<UpdateStrategy>>,
    /// A deployment of this version completed (or an operator marked it): the version an
    /// `auto_revert` rolls back to.
    #[serde(default)]
    pub stable: bool,
    /// The `periodic` block: the leader launches children of this job on its schedule.
    #[serde(default)]
    pub periodic: Option<alloc::boxed::Box<PeriodicConfig>>,
    /// The periodic (or parameterized) job this one was launched from.
    #[serde(default)]
    pub parent_id: String,
    /// The `parameterized` block: `job dispatch` registers children of this job.
    #[serde(default)]
    pub parameterized: Option<alloc::boxed::Box<ParameterizedJobConfig>>,
    /// A child registered by `job dispatch`.
    #[serde(default)]
    pub dispatched: bool,
    /// The dispatch's payload (written to tasks' `dispatch_payload { file }`).
    #[serde(default)]
    pub payload: Vec<u8>,
    /// The dispatch's idempotency token: a second dispatch with it returns this child.
    #[serde(default)]
    pub dispatch_idempotency_token: String,
    /// `all_at_once`: place every allocation of an evaluation or none. Drover's plans are
    /// always committed whole (one scheduler, no partial plans), so it holds for every job;
    /// kept as written.
    #[serde(default)]
    pub all_at_once: bool,
    /// Job-level `spread` blocks: they apply to every group.
    #[serde(default)]
    pub spreads: Vec<Spread>,
}

impl Job {
    /// The task group named `name`.
    pub fn group(&self, name: &str) -> Option<&TaskGroup> {
        self.task_groups.iter().find(|group| group.name == name)
    }

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
    /// A periodic parent runs until it is stopped, whatever its children do.
    pub fn status(&self, allocs: &[&Allocation]) -> &'static str {
        if self.is_launcher() {
            if self.stop { "dead" } else { "running" }
        } else if allocs.iter().any(|alloc| !alloc.terminal()) {
            "running"
        } else if self.stop || !allocs.is_empty() {
            "dead"
        } else {
            "pending"
        }
    }
}

/// `*` matches any run of characters; everything else literally.
/// Nomad's namespace names, `^[a-zA-Z0-9-]{1,128}$`: nothing that could be a path segment
/// (`..`), a separator or a control character. Refused by name with Nomad's text.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    let valid = (1..=128).contains(&namespace.len())
        && namespace
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid namespace {namespace:?}. Must match regex ^[a-zA-Z0-9-]{{1,128}}$"
        ))
    }
}

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
