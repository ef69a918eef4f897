//! The `reschedule` block in Nomad's API form (`ReschedulePolicy`, durations in nanoseconds),
//! and Nomad's canonicalisation: the job type's default, the job's block laid over it, then
//! the group's; what is left unset keeps the default.

use std::time::Duration;

use drover_core::structs::{DelayFunction, JobType, ReschedulePolicy};
use serde::{Deserialize, Serialize};

/// Nomad's `api.ReschedulePolicy`: every field optional, so a group can set one and inherit
/// the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiReschedulePolicy {
    pub attempts: Option<i64>,
    pub interval: Option<i64>,
    pub delay: Option<i64>,
    pub delay_function: Option<String>,
    pub max_delay: Option<i64>,
    pub unlimited: Option<bool>,
}

impl ApiReschedulePolicy {
    fn laid_over(&self, base: ReschedulePolicy, problems: &mut Vec<String>) -> ReschedulePolicy {
        let span = |value: Option<i64>, default: Duration, what: &str, problems: &mut Vec<String>| match value {
            None => default,
            Some(nanos) if nanos < 0 => {
                problems.push(format!("reschedule {what} must not be negative"));
                default
            }
            Some(nanos) => Duration::from_nanos(nanos as u64),
        };
        ReschedulePolicy {
            attempts: match self.attempts {
                None => base.attempts,
                Some(attempts) => u32::try_from(attempts).unwrap_or_else(|_| {
                    problems.push(format!(
                        "reschedule attempts must be a non-negative number, not {attempts}"
                    ));
                    base.attempts
                }),
            },
            interval: span(self.interval, base.interval, "interval", problems),
            delay: span(self.delay, base.delay, "delay", problems),
            delay_function: match &self.delay_function {
                None => base.delay_function,
                Some(text) => DelayFunction::parse(text).unwrap_or_else(|| {
                    problems.push(format!(
                        "Invalid delay function {text:?}, must be one of [\"constant\" \"exponential\" \"fibonacci\"]"
                    ));
                    base.delay_function
                }),
            },
            max_delay: span(self.max_delay, base.max_delay, "max_delay", problems),
            unlimited: self.unlimited.unwrap_or(base.unlimited),
        }
    }

    pub fn from_policy(policy: &ReschedulePolicy) -> ApiReschedulePolicy {
        ApiReschedulePolicy {
            attempts: Some(i64::from(policy.attempts)),
            interval: Some(super::nanos(policy.interval)),
            delay: Some(super::nanos(policy.delay)),
            delay_function: Some(policy.delay_function.as_str().into()),
            max_delay: Some(super::nanos(policy.max_delay)),
            unlimited: Some(policy.unlimited),
        }
    }
}

/// A group's policy: the type's default with the job's block and then the group's laid over
/// it. A system job has none unless one was written (which validation then refuses, as
/// Nomad's does).
pub fn group_policy(
    job_type: JobType,
    job: Option<&ApiReschedulePolicy>,
    group: Option<&ApiReschedulePolicy>,
    problems: &mut Vec<String>,
) -> Option<ReschedulePolicy> {
    let base = match ReschedulePolicy::default_for(job_type) {
        Some(base) => base,
        None if job.is_none() && group.is_none() => return None,
        None => ReschedulePolicy::BATCH,
    };
    let merged = job.map_or(base, |job| job.laid_over(base, problems));
    Some(group.map_or(merged, |group| group.laid_over(merged, problems)))
}
