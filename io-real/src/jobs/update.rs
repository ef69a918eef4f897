//! The `update` block in Nomad's API form (`UpdateStrategy`, durations in nanoseconds), and
//! Nomad's canonicalisation: a service job without one gets the default strategy, a group's
//! block is laid over the job's, and whatever is left unset takes Nomad's default.

use std::time::Duration;

use drover_core::structs::{JobType, UpdateStrategy};
use serde::{Deserialize, Serialize};

/// Nomad's `api.UpdateStrategy`: every field optional, so a group can set one and inherit the
/// rest from the job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiUpdateStrategy {
    pub stagger: Option<i64>,
    pub max_parallel: Option<i64>,
    pub health_check: Option<String>,
    pub min_healthy_time: Option<i64>,
    pub healthy_deadline: Option<i64>,
    pub progress_deadline: Option<i64>,
    pub canary: Option<i64>,
    pub auto_revert: Option<bool>,
    pub auto_promote: Option<bool>,
}

impl ApiUpdateStrategy {
    /// `self` with `over`'s set fields laid over it (Nomad's `Merge`).
    pub fn merged(&self, over: &ApiUpdateStrategy) -> ApiUpdateStrategy {
        ApiUpdateStrategy {
            stagger: over.stagger.or(self.stagger),
            max_parallel: over.max_parallel.or(self.max_parallel),
            health_check: over.health_check.clone().or_else(|| self.health_check.clone()),
            min_healthy_time: over.min_healthy_time.or(self.min_healthy_time),
            healthy_deadline: over.healthy_deadline.or(self.healthy_deadline),
            progress_deadline: over.progress_deadline.or(self.progress_deadline),
            canary: over.canary.or(self.canary),
            auto_revert: over.auto_revert.or(self.auto_revert),
            auto_promote: over.auto_promote.or(self.auto_promote),
        }
    }

    /// The strategy with Nomad's defaults filled in; negative values are problems, named as
    /// Nomad's validation names them.
    pub fn to_strategy(&self, problems: &mut Vec<String>) -> UpdateStrategy {
        let base = UpdateStrategy::default();
        let count = |value: Option<i64>, default: u32, what: &str, problems: &mut Vec<String>| match value {
            None => default,
            Some(value) if value < 0 => {
                problems.push(format!("{what} can not be less than zero: {value} < 0"));
                0
            }
            Some(value) => u32::try_from(value).unwrap_or(u32::MAX),
        };
        let span = |value: Option<i64>, default: Duration, text: &str, problems: &mut Vec<String>| match value {
            None => default,
            Some(value) if value < 0 => {
                let shown = format!(
                    "-{}",
                    drover_core::goduration::format(Duration::from_nanos(value.unsigned_abs()))
                );
                problems.push(format!("{text}: {shown}"));
                Duration::ZERO
            }
            Some(value) => Duration::from_nanos(value as u64),
        };
        UpdateStrategy {
            stagger: span(
                self.stagger,
                base.stagger,
                "Stagger must be greater than zero",
                problems,
            ),
            max_parallel: count(self.max_parallel, base.max_parallel, "Max parallel", problems),
            health_check: self.health_check.clone().unwrap_or(base.health_check),
            min_healthy_time: span(
                self.min_healthy_time,
                base.min_healthy_time,
                "Minimum healthy time may not be less than zero",
                problems,
            ),
            healthy_deadline: span(
                self.healthy_deadline,
                base.healthy_deadline,
                "Healthy deadline must be greater than zero",
                problems,
            ),
            progress_deadline: span(
                self.progress_deadline,
                base.progress_deadline,
                "Progress deadline must be zero or greater",
                problems,
            ),
            canary: count(self.canary, base.canary, "Canary count", problems),
            auto_revert: self.auto_revert.unwrap_or(base.auto_revert),
            auto_promote: self.auto_promote.unwrap_or(base.auto_promote),
        }
    }

    pub fn from_strategy(strategy: &UpdateStrategy) -> ApiUpdateStrategy {
        ApiUpdateStrategy {
            stagger: Some(super::nanos(strategy.stagger)),
            max_parallel: Some(i64::from(strategy.max_parallel)),
            health_check: Some(strategy.health_check.clone()),
            min_healthy_time: Some(super::nanos(strategy.min_healthy_time)),
            healthy_deadline: Some(super::nanos(strategy.healthy_deadline)),
            progress_deadline: Some(super::nanos(strategy.progress_deadline)),
            canary: Some(i64::from(strategy.canary)),
            auto_revert: Some(strategy.auto_revert),
            auto_promote: Some(strategy.auto_promote),
        }
    }
}

/// The job-level strategy after canonicalisation: as written, else the default for a service
/// job, else none.
pub fn job_strategy(job_type: JobType, written: Option<&ApiUpdateStrategy>) -> Option<ApiUpdateStrategy> {
    match written {
        Some(written) => Some(written.clone()),
        None if job_type == JobType::Service => Some(ApiUpdateStrategy::from_strategy(&UpdateStrategy::default())),
        None => None,
    }
}

/// A group's strategy: its own laid over the job's.
pub fn group_strategy(
    job: Option<&ApiUpdateStrategy>,
    group: Option<&ApiUpdateStrategy>,
    problems: &mut Vec<String>,
) -> Option<UpdateStrategy> {
    let merged = match (job, group) {
        (Some(job), Some(group)) => job.merged(group),
        (Some(job), None) => job.clone(),
        (None, Some(group)) => group.clone(),
        (None, None) => return None,
    };
    Some(merged.to_strategy(problems))
}
