//! Allocations and evaluations.

use super::*;

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
    /// What the client last reported of each task (Nomad's `TaskStates`).
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// The deployment that placed it ("" when none did).
    #[serde(default)]
    pub deployment_id: String,
    /// Its health within that deployment, and whether it is a canary.
    #[serde(default)]
    pub deployment_status: Option<AllocDeploymentStatus>,
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

/// CPU (MHz), memory (MB) and ports an allocation holds on its node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedResources {
    pub cpu: u64,
    pub memory_mb: u64,
    /// The group's `ephemeral_disk` size (MB).
    #[serde(default)]
    pub disk_mb: u64,
    /// The group network's ports (Nomad's `AllocatedResources.Shared.Ports`).
    #[serde(default)]
    pub ports: Vec<AllocatedPort>,
    /// Ports of tasks' own `resources { network {} }`, by task.
    #[serde(default)]
    pub task_ports: BTreeMap<String, Vec<AllocatedPort>>,
    /// The node's cores reserved for tasks asking for `cores`, by task (Nomad's
    /// `AllocatedResources.Tasks[task].Cpu.ReservedCores`), in ascending order.
    #[serde(default)]
    pub task_cores: BTreeMap<String, Vec<u32>>,
}

impl AllocatedResources {
    /// Every host port the allocation holds.
    pub fn host_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports
            .iter()
            .chain(self.task_ports.values().flatten())
            .map(|port| port.value)
    }

    /// The port `label` as the task `task` sees it: its own task network first, then the
    /// group's.
    pub fn port(&self, task: &str, label: &str) -> Option<&AllocatedPort> {
        self.task_ports
            .get(task)
            .into_iter()
            .flatten()
            .chain(&self.ports)
            .find(|port| port.label == label)
    }
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

/// What a client tells the servers of one of its allocations (an entry of Nomad's
/// `Node.UpdateAlloc`): its status and its tasks' states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocClientReport {
    pub alloc_id: String,
    pub client_status: ClientStatus,
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// The health the client decided for its deployment (`None`: nothing to say).
    #[serde(default)]
    pub deployment_status: Option<AllocDeploymentStatus>,
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

    /// Placed as a canary of its deployment.
    pub fn is_canary(&self) -> bool {
        self.deployment_status.as_ref().is_some_and(|status| status.canary)
    }

    pub fn healthy(&self) -> bool {
        AllocDeploymentStatus::is_healthy(self.deployment_status.as_ref())
    }

    pub fn unhealthy(&self) -> bool {
        AllocDeploymentStatus::is_unhealthy(self.deployment_status.as_ref())
    }
}

/// Why the scheduler runs, and what came of it (Nomad's `Evaluation`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evaluation {
    pub id: String,
    pub namespace: String,
    pub priority: u32,
    /// The job's type.
    #[serde(with = "super::status::job_type_text")]
    pub eval_type: JobType,
    pub triggered_by: EvalTrigger,
    pub job_id: String,
    /// The job's `job_modify_index` when the evaluation was created.
    #[serde(default)]
    pub job_modify_index: u64,
    #[serde(default)]
    pub node_id: String,
    pub status: EvalStatus,
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
    /// The evaluation that picks up where this one stopped (a system job's next rolling
    /// batch).
    #[serde(default)]
    pub next_eval: String,
    /// Scheduled no sooner than this long after it was created (Nomad's `Wait`: a system
    /// job's `stagger` between rolling batches).
    #[serde(default)]
    pub wait_ms: u64,
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
