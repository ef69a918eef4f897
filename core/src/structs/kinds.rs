//! Job and CSI plugin types, and the `csi_plugin` stanza of a task.

use super::*;

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
