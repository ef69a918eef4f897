//! A job's summary and what a job write answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Nomad's `JobSummary`: allocations per task group by client status, and a parent's
/// children.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobSummary {
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub namespace: String,
    pub summary: BTreeMap<String, TaskGroupSummary>,
    pub children: JobChildrenSummary,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One task group's allocations by client status; `queued` are those no node could take yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskGroupSummary {
    pub queued: u32,
    pub complete: u32,
    pub failed: u32,
    pub running: u32,
    pub starting: u32,
    pub lost: u32,
    pub unknown: u32,
}

/// A periodic or parameterized parent's children by status (zeros for any other job).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobChildrenSummary {
    pub pending: u32,
    pub running: u32,
    pub dead: u32,
}

/// Nomad's `JobRegisterResponse`, as a register, a revert or a scale answers. A periodic
/// parent is registered without an evaluation: `EvalID` empty, `EvalCreateIndex` 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobRegisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    pub warnings: String,
    pub index: u64,
    pub last_contact: u64,
    pub known_leader: bool,
    pub next_token: String,
}

/// Nomad's `JobDeregisterResponse` (`DELETE /v1/job/:id`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobDeregisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    pub index: u64,
    pub last_contact: u64,
    pub known_leader: bool,
}

/// Nomad's `PeriodicForceResponse` (`POST /v1/job/:id/periodic/force`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PeriodicForceResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub index: u64,
}

/// Nomad's `AllocMetric`: what placing one task group's allocations found, node by node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocMetric {
    pub nodes_evaluated: u32,
    pub nodes_filtered: u32,
    pub nodes_in_pool: u32,
    /// Ready nodes per datacenter.
    pub nodes_available: BTreeMap<String, u32>,
    pub class_filtered: BTreeMap<String, u32>,
    /// Filter reasons (Nomad's strings) and how many nodes each removed.
    pub constraint_filtered: BTreeMap<String, u32>,
    pub nodes_exhausted: u32,
    pub class_exhausted: BTreeMap<String, u32>,
    /// Exhausted dimensions (`cpu`, `memory`) and how many nodes ran out of each.
    pub dimension_exhausted: BTreeMap<String, u32>,
    pub quota_exhausted: Vec<String>,
    pub score_meta_data: Vec<Value>,
    /// Nanoseconds.
    pub allocation_time: u64,
    /// How many more allocations failed for the same reasons.
    pub coalesced_failures: u32,
}

/// Nomad's `JobPlanResponse` (`PUT /v1/job/:id/plan`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobPlanResponse {
    pub annotations: PlanAnnotations,
    /// Per task group, why it could not be placed in full; null when everything was.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, AllocMetric>>,
    /// The stored job's modify index, for `job run -check-index`.
    pub job_modify_index: u64,
    pub created_evals: Value,
    /// Nomad's `JobDiff` when asked for (`"Diff": true`), null otherwise: a tree of fields
    /// and objects, each `Added`, `Deleted`, `Edited` or `None`.
    pub diff: Value,
    /// RFC 3339 (Go's zero time for a job that is not periodic).
    pub next_periodic_launch: String,
    pub warnings: String,
    pub index: u64,
}

/// What the plan would do to each task group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PlanAnnotations {
    #[serde(rename = "DesiredTGUpdates")]
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    pub preempted_allocs: Value,
}

/// Nomad's `DesiredUpdates`: how many allocations of a group each kind of change touches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DesiredUpdates {
    pub ignore: u64,
    pub place: u64,
    pub migrate: u64,
    pub stop: u64,
    pub in_place_update: u64,
    pub destructive_update: u64,
    pub canary: u64,
    pub preemptions: u64,
}

/// Nomad's `JobValidateResponse` (`PUT /v1/validate/job`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobValidateResponse {
    pub driver_config_validated: bool,
    /// Each problem found, in Nomad's words; empty when the job is valid.
    pub validation_errors: Vec<String>,
    /// The problems as one text (empty when none).
    pub error: String,
    pub warnings: String,
}
