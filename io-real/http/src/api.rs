//! The API's response shapes as types, shared by the server that renders them (`render.rs`)
//! and the CLI that reads them (`bin/src/cli`), as Nomad's `api` package is shared by its
//! agent and its command line. Field names are Nomad's; every type reads what Nomad's own
//! servers answer too (missing fields take their defaults, extra ones are ignored).
//!
//! A type here serializes to exactly the JSON the endpoint answered before it existed: the
//! render functions build the type and serialize it, so the wire cannot drift from what the
//! CLI reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod acl;
mod cluster;
mod csi;
mod fs;
mod jobs;
mod variables;

pub use acl::*;
pub use cluster::*;
pub use csi::*;
pub use fs::*;
pub use jobs::*;
pub use variables::*;

/// Nomad's `AllocationListStub` (`GET /v1/allocations`, `/v1/job/:id/allocations`, …).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub name: String,
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_type: String,
    pub job_version: u64,
    pub task_group: String,
    pub desired_status: String,
    pub desired_description: String,
    pub client_status: String,
    pub client_description: String,
    /// Per task: its state and events (null when no task has run).
    pub task_states: Option<BTreeMap<String, TaskState>>,
    pub deployment_status: Value,
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    pub next_allocation: String,
    pub reschedule_tracker: Value,
    pub preempted_allocations: Value,
    pub preempted_by_allocation: String,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    pub modify_time: i64,
}

/// Nomad's `TaskState`: one task of an allocation, with its events oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskState {
    /// `pending`, `running` or `dead`.
    pub state: String,
    pub failed: bool,
    pub restarts: u32,
    /// RFC 3339 (Go's zero time when never).
    pub last_restart: String,
    pub started_at: String,
    pub finished_at: String,
    pub events: Vec<TaskEvent>,
}

/// Nomad's `TaskEvent`: the details map, and the flat fields Nomad fills from it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskEvent {
    #[serde(rename = "Type")]
    pub kind: String,
    /// Unix nanoseconds.
    pub time: i64,
    pub message: String,
    pub display_message: String,
    pub details: BTreeMap<String, String>,
    pub fails_task: bool,
    pub restart_reason: String,
    pub setup_error: String,
    pub driver_error: String,
    pub driver_message: String,
    pub exit_code: i64,
    pub signal: i64,
    pub kill_error: String,
    pub kill_reason: String,
    /// Nanoseconds.
    pub kill_timeout: i64,
    pub start_delay: i64,
    pub failed_sibling: String,
    pub task_signal: String,
    pub task_signal_reason: String,
    pub validation_error: String,
    pub download_error: String,
    pub vault_error: String,
    pub disk_limit: i64,
    pub disk_size: i64,
    pub generic_source: String,
}

/// Nomad's `NodeListStub` (`GET /v1/nodes`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub datacenter: String,
    pub name: String,
    pub node_class: String,
    pub node_pool: String,
    pub version: String,
    pub drain: bool,
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    pub last_drain: Option<DrainMetadata>,
    pub drivers: BTreeMap<String, DriverInfo>,
    pub host_volumes: Value,
    pub address: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Nomad's `DriverInfo`: what a node's fingerprint says of one task driver.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DriverInfo {
    pub attributes: BTreeMap<String, String>,
    pub detected: bool,
    pub healthy: bool,
    pub health_description: String,
    /// RFC 3339 (Go's zero time when never seen).
    pub update_time: String,
}

/// Nomad's `DrainMetadata`: the node's last drain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DrainMetadata {
    pub started_at: String,
    pub updated_at: String,
    pub status: String,
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    pub meta: Value,
}

/// Nomad's `Deployment` (`GET /v1/deployments`, `/v1/deployment/:id`, …).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Deployment {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_version: u64,
    pub job_modify_index: u64,
    pub job_spec_modify_index: u64,
    pub job_create_index: u64,
    pub is_multiregion: bool,
    pub task_groups: BTreeMap<String, DeploymentState>,
    pub status: String,
    pub status_description: String,
    pub eval_priority: u32,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    pub modify_time: i64,
}

/// Nomad's `DeploymentState`: one task group's progress in a deployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DeploymentState {
    pub auto_revert: bool,
    pub auto_promote: bool,
    /// Nanoseconds.
    pub progress_deadline: u64,
    /// RFC 3339 with nanoseconds (Go's zero time when unset).
    pub require_progress_by: String,
    pub promoted: bool,
    /// Null when none was placed.
    pub placed_canaries: Option<Vec<String>>,
    pub desired_canaries: u32,
    pub desired_total: u32,
    pub placed_allocs: u32,
    pub healthy_allocs: u32,
    pub unhealthy_allocs: u32,
}

/// Nomad's `JobListStub` (`GET /v1/jobs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    pub namespace: String,
    pub datacenters: Vec<String>,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u32,
    pub periodic: bool,
    pub parameterized_job: bool,
    pub stop: bool,
    /// `pending`, `running` or `dead`.
    pub status: String,
    pub status_description: String,
    /// Allocations per task group by client status.
    pub job_summary: JobSummary,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
    /// Unix nanoseconds.
    pub submit_time: i64,
}

/// Nomad's `Evaluation` (`GET /v1/evaluations`, `/v1/evaluation/:id`, a job's evaluations).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Evaluation {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    pub priority: u32,
    /// The job's type: `service`, `batch` or `system`.
    #[serde(rename = "Type")]
    pub eval_type: String,
    pub triggered_by: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_modify_index: u64,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_modify_index: u64,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    pub status: String,
    pub status_description: String,
    /// Nanoseconds.
    pub wait: u64,
    pub wait_until: String,
    pub next_eval: String,
    pub related_evals: Value,
    pub class_eligibility: Value,
    pub escaped_computed_class: bool,
    pub quota_limit_reached: String,
    pub annotate_plan: bool,
    /// Per task group, why its allocations could not be placed (Nomad's `AllocMetric`); null
    /// when every one was.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, AllocMetric>>,
    pub queued_allocations: BTreeMap<String, u32>,
    pub blocked_eval: String,
    pub previous_eval: String,
    pub snapshot_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    pub modify_time: i64,
}

/// `value` as `T`, or what it lacked: for the CLI, which reads the API's JSON.
pub fn read<T: for<'de> Deserialize<'de>>(value: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(value)
}

/// That `rendered`, what a handler answered, reads back as `T` and serializes to exactly
/// itself: nothing the handler renders is lost to the type or renamed (the CLI reads `T`).
#[cfg(test)]
pub(crate) fn assert_round_trips<T: Serialize + for<'de> Deserialize<'de>>(rendered: Value) {
    let typed: T = read(&rendered).expect("reads back");
    assert_eq!(serde_json::to_value(typed).expect("serializes"), rendered);
}
