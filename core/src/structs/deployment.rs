//! Deployments: the `update` block, and what the servers track while a job version rolls out
//! (Nomad's `UpdateStrategy`, `Deployment`, `DeploymentState`, `AllocDeploymentStatus`).

use super::*;

/// `health_check = "checks"`: tasks running and their Consul checks passing.
pub const HEALTH_CHECK_CHECKS: &str = "checks";
/// `health_check = "task_states"`: tasks running for `min_healthy_time`.
pub const HEALTH_CHECK_TASK_STATES: &str = "task_states";
/// `health_check = "manual"`: an operator sets the health through the API.
pub const HEALTH_CHECK_MANUAL: &str = "manual";

/// A group's `update` block after merging (group over job over Nomad's defaults).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateStrategy {
    pub stagger: Duration,
    /// How many allocations may be destructively updated at once; 0: no deployments (every
    /// update at once, as before deployments existed).
    pub max_parallel: u32,
    pub health_check: String,
    pub min_healthy_time: Duration,
    pub healthy_deadline: Duration,
    /// 0: no progress deadline.
    pub progress_deadline: Duration,
    pub auto_revert: bool,
    pub auto_promote: bool,
    pub canary: u32,
}

impl Default for UpdateStrategy {
    /// Nomad's `DefaultUpdateStrategy`.
    fn default() -> Self {
        UpdateStrategy {
            stagger: Duration::from_secs(30),
            max_parallel: 1,
            health_check: HEALTH_CHECK_CHECKS.into(),
            min_healthy_time: Duration::from_secs(10),
            healthy_deadline: Duration::from_secs(5 * 60),
            progress_deadline: Duration::from_secs(10 * 60),
            auto_revert: false,
            auto_promote: false,
            canary: 0,
        }
    }
}

impl UpdateStrategy {
    /// Nomad's `IsEmpty`: no rolling updates, no deployment.
    pub fn is_empty(&self) -> bool {
        self.max_parallel == 0
    }

    /// Nomad's `UpdateStrategy.Validate`, every problem with its text.
    pub fn problems(&self) -> Vec<String> {
        let go = crate::goduration::format;
        let mut problems = Vec::new();
        if ![HEALTH_CHECK_CHECKS, HEALTH_CHECK_TASK_STATES, HEALTH_CHECK_MANUAL].contains(&self.health_check.as_str()) {
            problems.push(format!("Invalid health check given: {:?}", self.health_check));
        }
        if self.canary == 0 && self.auto_promote {
            problems.push("Auto Promote requires a Canary count greater than zero".into());
        }
        if self.healthy_deadline.is_zero() {
            problems.push(format!(
                "Healthy deadline must be greater than zero: {}",
                go(self.healthy_deadline)
            ));
        }
        if self.min_healthy_time >= self.healthy_deadline {
            problems.push(format!(
                "Minimum healthy time must be less than healthy deadline: {} > {}",
                go(self.min_healthy_time),
                go(self.healthy_deadline)
            ));
        }
        if !self.progress_deadline.is_zero() && self.healthy_deadline >= self.progress_deadline {
            problems.push(format!(
                "Healthy deadline must be less than progress deadline: {} > {}",
                go(self.healthy_deadline),
                go(self.progress_deadline)
            ));
        }
        if self.stagger.is_zero() {
            problems.push(format!("Stagger must be greater than zero: {}", go(self.stagger)));
        }
        problems
    }
}

/// Nomad's deployment status descriptions.
pub const DEPLOYMENT_DESC_RUNNING: &str = "Deployment is running";
pub const DEPLOYMENT_DESC_NEEDS_PROMOTION: &str = "Deployment is running but requires manual promotion";
pub const DEPLOYMENT_DESC_AUTO_PROMOTION: &str = "Deployment is running pending automatic promotion";
pub const DEPLOYMENT_DESC_PAUSED: &str = "Deployment is paused";
pub const DEPLOYMENT_DESC_SUCCESSFUL: &str = "Deployment completed successfully";
pub const DEPLOYMENT_DESC_STOPPED_JOB: &str = "Cancelled because job is stopped";
pub const DEPLOYMENT_DESC_NEWER_JOB: &str = "Cancelled due to newer version of job";
pub const DEPLOYMENT_DESC_FAILED_ALLOCATIONS: &str = "Failed due to unhealthy allocations";
pub const DEPLOYMENT_DESC_PROGRESS_DEADLINE: &str = "Failed due to progress deadline";
pub const DEPLOYMENT_DESC_FAILED_BY_USER: &str = "Deployment marked as failed";

/// `<description> - rolling back to job version <n>`.
pub fn rollback_description(base: &str, version: u64) -> String {
    format!("{base} - rolling back to job version {version}")
}

/// `<description> - not rolling back to stable job version <n> as current job has same
/// specification`.
pub fn no_rollback_description(base: &str, version: u64) -> String {
    format!("{base} - not rolling back to stable job version {version} as current job has same specification")
}

/// One job version's rollout (Nomad's `Deployment`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub id: String,
    pub namespace: String,
    pub job_id: String,
    pub job_version: u64,
    pub job_modify_index: u64,
    pub job_create_index: u64,
    /// By task group.
    pub task_groups: BTreeMap<String, DeploymentState>,
    pub status: DeploymentStatus,
    pub status_description: String,
    #[serde(default)]
    pub eval_priority: u32,
    pub create_index: u64,
    pub modify_index: u64,
    #[serde(default)]
    pub create_time_ms: u64,
    #[serde(default)]
    pub modify_time_ms: u64,
}

/// One task group's part of a deployment (Nomad's `DeploymentState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentState {
    pub auto_revert: bool,
    pub auto_promote: bool,
    pub progress_deadline: Duration,
    /// Cluster time (Unix ms) by which an allocation must turn healthy; 0: no deadline.
    pub require_progress_by_ms: u64,
    pub promoted: bool,
    pub placed_canaries: Vec<String>,
    pub desired_canaries: u32,
    pub desired_total: u32,
    pub placed_allocs: u32,
    pub healthy_allocs: u32,
    pub unhealthy_allocs: u32,
}

impl DeploymentState {
    /// Canaries wait for a promotion.
    pub fn awaits_promotion(&self) -> bool {
        self.desired_canaries > 0 && !self.promoted
    }
}

impl Deployment {
    /// Running or paused: the deployment still decides how its job's allocations change.
    pub fn active(&self) -> bool {
        self.status.is_active()
    }

    /// Some group's canaries wait for a promotion.
    pub fn requires_promotion(&self) -> bool {
        self.task_groups.values().any(DeploymentState::awaits_promotion)
    }

    /// The description of a running deployment: whether it waits for a promotion, and whose.
    pub fn running_description(&self) -> &'static str {
        let waiting: Vec<&DeploymentState> = self
            .task_groups
            .values()
            .filter(|state| state.awaits_promotion())
            .collect();
        if waiting.is_empty() {
            DEPLOYMENT_DESC_RUNNING
        } else if waiting.iter().all(|state| state.auto_promote) {
            DEPLOYMENT_DESC_AUTO_PROMOTION
        } else {
            DEPLOYMENT_DESC_NEEDS_PROMOTION
        }
    }
}

/// A deployment's status change (Nomad's `DeploymentStatusUpdate`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentStatusUpdate {
    pub deployment_id: String,
    pub status: DeploymentStatus,
    pub status_description: String,
}

/// What a deployment knows of one of its allocations (Nomad's `AllocDeploymentStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocDeploymentStatus {
    /// `None` until the client (or an operator, for `manual`) decides.
    pub healthy: Option<bool>,
    /// When the health was decided (Unix ms).
    #[serde(default)]
    pub timestamp_ms: u64,
    /// Placed as a canary of its deployment.
    #[serde(default)]
    pub canary: bool,
    #[serde(default)]
    pub modify_index: u64,
}

impl AllocDeploymentStatus {
    pub fn is_healthy(status: Option<&Self>) -> bool {
        status.is_some_and(|status| status.healthy == Some(true))
    }

    pub fn is_unhealthy(status: Option<&Self>) -> bool {
        status.is_some_and(|status| status.healthy == Some(false))
    }
}
