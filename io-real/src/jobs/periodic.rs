//! The `periodic` block in Nomad's API form (`PeriodicConfig`), with Nomad's defaults: enabled,
//! spec type `cron`, no overlap rule, time zone UTC.

use drover_core::structs::{JobType, PERIODIC_SPEC_CRON, PeriodicConfig};
use serde::{Deserialize, Serialize};

/// Nomad's `api.PeriodicConfig`: every field optional on the way in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiPeriodicConfig {
    pub enabled: Option<bool>,
    pub spec: Option<String>,
    pub spec_type: Option<String>,
    pub prohibit_overlap: Option<bool>,
    pub time_zone: Option<String>,
}

impl ApiPeriodicConfig {
    /// The core's block with Nomad's defaults; what is wrong with it goes to `problems` in
    /// Nomad's texts.
    pub fn to_config(&self, job_type: JobType, problems: &mut Vec<String>) -> PeriodicConfig {
        let config = PeriodicConfig {
            enabled: self.enabled.unwrap_or(true),
            spec: self.spec.clone().unwrap_or_default(),
            spec_type: self.spec_type.clone().unwrap_or_else(|| PERIODIC_SPEC_CRON.into()),
            prohibit_overlap: self.prohibit_overlap.unwrap_or(false),
            time_zone: self.time_zone.clone().unwrap_or_else(|| "UTC".into()),
        };
        problems.extend(
            crate::periodic::problems(&config, job_type)
                .into_iter()
                .map(|problem| format!("Periodic: {problem}")),
        );
        config
    }

    pub fn from_config(config: &PeriodicConfig) -> ApiPeriodicConfig {
        ApiPeriodicConfig {
            enabled: Some(config.enabled),
            spec: Some(config.spec.clone()),
            spec_type: Some(config.spec_type.clone()),
            prohibit_overlap: Some(config.prohibit_overlap),
            time_zone: Some(config.time_zone.clone()),
        }
    }
}
