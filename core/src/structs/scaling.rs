//! Task group `scaling` blocks (Nomad's `ScalingPolicy`, horizontal): the bounds an operator
//! or an autoscaler may move the group's count within, and the autoscaler's own `policy`
//! settings, kept as written. A policy belongs to its group: its ID is derived from the
//! group's (namespace, job, group), so it stays the same across job versions as Nomad keeps
//! it, without a table of its own.

use super::*;

/// How many scaling events are kept per task group, newest first (Nomad's
/// `JobTrackedScalingEvents`).
pub const JOB_TRACKED_SCALING_EVENTS: usize = 20;

/// One scaling of a task group, or an autoscaler's report about it (Nomad's `ScalingEvent`):
/// kept per job and group, across job versions, until the job is purged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalingEvent {
    /// When the entry recording it was applied, in Unix milliseconds.
    pub time_ms: u64,
    /// The count asked for; `None` for a report without one.
    pub count: Option<i64>,
    pub previous_count: i64,
    pub message: String,
    pub error: bool,
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The evaluation the scaling created, if it changed the count.
    pub eval_id: Option<String>,
    pub create_index: u64,
}

/// Nomad's only open-source scaling policy type.
pub const SCALING_HORIZONTAL: &str = "horizontal";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalingPolicy {
    /// The lowest count (the group's count when the block leaves it out).
    pub min: i64,
    /// The highest count; `-1` when the block leaves it out (refused by validation).
    pub max: i64,
    pub enabled: bool,
    /// The autoscaler's `policy {}` block, as written.
    #[serde(default)]
    pub policy: BTreeMap<String, serde_json::Value>,
}

impl ScalingPolicy {
    /// What is wrong with the policy of a group of `count` (Nomad's texts).
    pub fn problems(&self, count: u32) -> Vec<String> {
        let mut problems = Vec::new();
        if self.max < 0 {
            problems.push("maximum count must be specified and non-negative".to_string());
        } else if self.max < self.min {
            problems.push("maximum count must not be less than minimum count".to_string());
        }
        if self.min < 0 {
            problems.push("minimum count must be specified and non-negative".to_string());
        }
        if i64::from(count) > self.max && self.max >= 0 {
            problems.push("task group count must not be greater than maximum count in scaling policy".to_string());
        }
        if i64::from(count) < self.min {
            problems.push("task group count must not be less than minimum count in scaling policy".to_string());
        }
        problems
    }
}

/// The ID of the scaling policy of group `group` of job (`namespace`, `job`): UUID-shaped,
/// the same for every version of the job.
pub fn scaling_policy_id(namespace: &str, job: &str, group: &str) -> String {
    let mut high = crate::hash::Fnv1a::default();
    high.str("scaling").str(namespace).str(job).str(group);
    let mut low = crate::hash::Fnv1a::default();
    low.str(group).str(job).str(namespace).str("policy");
    let hex = format!("{:016x}{:016x}", high.finish(), low.finish());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: i64, max: i64) -> ScalingPolicy {
        ScalingPolicy {
            min,
            max,
            enabled: true,
            policy: BTreeMap::new(),
        }
    }

    #[test]
    fn bounds_are_checked_with_nomads_texts() {
        assert!(policy(1, 5).problems(3).is_empty());
        assert_eq!(
            policy(1, -1).problems(1),
            vec!["maximum count must be specified and non-negative"]
        );
        assert_eq!(
            policy(4, 2).problems(3),
            vec![
                "maximum count must not be less than minimum count",
                "task group count must not be greater than maximum count in scaling policy",
                "task group count must not be less than minimum count in scaling policy",
            ]
        );
        assert_eq!(
            policy(1, 2).problems(3),
            vec!["task group count must not be greater than maximum count in scaling policy"]
        );
    }

    #[test]
    fn a_policy_id_is_stable_and_differs_by_group() {
        let id = scaling_policy_id("default", "web", "frontend");
        assert_eq!(id, scaling_policy_id("default", "web", "frontend"));
        assert_ne!(id, scaling_policy_id("default", "web", "backend"));
        assert_eq!(id.len(), 36);
        assert_eq!(id.matches('-').count(), 4);
    }
}
