//! Periodic jobs (Nomad's `PeriodicConfig`): a parent job that is never scheduled itself; the
//! leader launches a child of it, `<parent>/periodic-<unix seconds>`, at every time its cron
//! spec names.

use super::*;

/// What a periodic parent's launched children are called after: `<parent>/periodic-<unix>`.
pub const PERIODIC_LAUNCH_SUFFIX: &str = "/periodic-";

/// The only spec type Nomad accepts from users.
pub const PERIODIC_SPEC_CRON: &str = "cron";

/// Nomad's `PeriodicConfig`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicConfig {
    pub enabled: bool,
    /// The cron expression, in Nomad's dialect: 5 fields (minute first), 6 (a year last), or
    /// 7 (seconds first, year last), or a nickname (`@daily`).
    pub spec: String,
    pub spec_type: String,
    /// Skip a launch while an earlier child still runs.
    pub prohibit_overlap: bool,
    /// The IANA zone the spec is read in; empty is UTC.
    pub time_zone: String,
}

impl Default for PeriodicConfig {
    fn default() -> Self {
        PeriodicConfig {
            enabled: true,
            spec: String::new(),
            spec_type: PERIODIC_SPEC_CRON.into(),
            prohibit_overlap: false,
            time_zone: "UTC".into(),
        }
    }
}

/// The last launch of a periodic parent (Nomad's `PeriodicLaunch`): set when the parent is
/// registered (so the first child is the first time after that), and by every launch in the
/// same log entry that registers the child, so a launch is recorded exactly when its child
/// exists and no leader launches the same time twice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicLaunch {
    /// Unix milliseconds of the launch (a time the spec names, or a forced launch's now).
    pub launch_ms: u64,
    /// The launch (or registration) this one followed.
    #[serde(default)]
    pub previous_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The child of `parent` launched at `launch_ms`.
pub fn periodic_child_id(parent: &str, launch_ms: u64) -> String {
    format!("{parent}{PERIODIC_LAUNCH_SUFFIX}{}", launch_ms / 1000)
}

impl Job {
    /// Whether the job has a `periodic` block (enabled or not).
    pub fn is_periodic(&self) -> bool {
        self.periodic.is_some()
    }

    /// Whether the leader launches children of this job (Nomad's `IsPeriodicActive`). A
    /// parameterized parent that is also periodic is not launched itself: each child
    /// `job dispatch` makes keeps the `periodic` block and is launched instead, as
    /// `<child>/periodic-<unix>`.
    pub fn is_periodic_active(&self) -> bool {
        self.periodic.as_ref().is_some_and(|periodic| periodic.enabled) && !self.stop && !self.is_parameterized()
    }

    /// Whether the job only launches children and is never scheduled itself: a periodic or
    /// a parameterized parent.
    pub fn is_launcher(&self) -> bool {
        self.is_periodic() || self.is_parameterized()
    }

    /// The child launched at `launch_ms`: the parent's spec under the child's ID and name,
    /// without the `periodic` block, as Nomad's `deriveJob` makes it.
    pub fn periodic_child(&self, launch_ms: u64) -> Job {
        let id = periodic_child_id(&self.id, launch_ms);
        Job {
            name: id.clone(),
            id,
            parent_id: self.id.clone(),
            periodic: None,
            stop: false,
            stable: false,
            version: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
            submit_time_ms: 0,
            ..self.clone()
        }
    }
}
