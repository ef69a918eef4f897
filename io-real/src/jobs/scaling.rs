//! The task group `scaling` block in Nomad's API form (`ScalingPolicy`), with Nomad's
//! defaults: enabled, `min` the group's count, type `horizontal`.

use std::collections::BTreeMap;

use drover_core::structs::{SCALING_HORIZONTAL, ScalingPolicy, scaling_policy_id};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Nomad's `api.ScalingPolicy`: every field optional on the way in; the ID, target and
/// indexes are the server's on the way out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiScalingPolicy {
    #[serde(rename = "ID", skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "Type")]
    pub policy_type: Option<String>,
    pub target: Option<BTreeMap<String, String>>,
    pub min: Option<i64>,
    pub max: Option<i64>,
    pub enabled: Option<bool>,
    pub policy: BTreeMap<String, Value>,
    pub create_index: Option<u64>,
    pub modify_index: Option<u64>,
}

impl ApiScalingPolicy {
    /// The core's policy of a group of `count`; a type other than `horizontal` goes to
    /// `problems`.
    pub fn to_policy(&self, count: u32, problems: &mut Vec<String>) -> ScalingPolicy {
        if let Some(kind) = self
            .policy_type
            .as_deref()
            .filter(|kind| !kind.is_empty() && *kind != SCALING_HORIZONTAL)
        {
            problems.push(format!("Scaling: scaling policy type {kind:?} is not supported"));
        }
        ScalingPolicy {
            min: self.min.unwrap_or(i64::from(count)),
            max: self.max.unwrap_or(-1),
            enabled: self.enabled.unwrap_or(true),
            policy: self.policy.clone(),
        }
    }

    /// The policy as the API shows it inside its job, with its ID and target.
    pub fn from_policy(policy: &ScalingPolicy, namespace: &str, job: &str, group: &str) -> ApiScalingPolicy {
        ApiScalingPolicy {
            id: Some(scaling_policy_id(namespace, job, group)),
            policy_type: Some(SCALING_HORIZONTAL.into()),
            target: Some(target(namespace, job, group)),
            min: Some(policy.min),
            max: Some(policy.max),
            enabled: Some(policy.enabled),
            policy: policy.policy.clone(),
            create_index: None,
            modify_index: None,
        }
    }
}

/// Nomad's policy target: the group it scales.
pub fn target(namespace: &str, job: &str, group: &str) -> BTreeMap<String, String> {
    [
        ("Namespace".to_string(), namespace.to_string()),
        ("Job".to_string(), job.to_string()),
        ("Group".to_string(), group.to_string()),
    ]
    .into()
}

/// `/v1/scaling/policy/:id`: the stub's fields and the bounds and policy, indexed by its
/// job's.
pub fn policy_json(policy: &ScalingPolicy, job: &drover_core::structs::Job, group: &str) -> Value {
    let mut whole = policy_stub(policy, job, group);
    whole["Min"] = json!(policy.min);
    whole["Max"] = json!(policy.max);
    whole["Policy"] = json!(policy.policy);
    whole
}

/// `/v1/scaling/policies`: a policy's stub.
pub fn policy_stub(policy: &ScalingPolicy, job: &drover_core::structs::Job, group: &str) -> Value {
    json!({
        "ID": scaling_policy_id(&job.namespace, &job.id, group),
        "Type": SCALING_HORIZONTAL,
        "Target": target(&job.namespace, &job.id, group),
        "Enabled": policy.enabled,
        "CreateIndex": job.create_index,
        "ModifyIndex": job.job_modify_index,
    })
}
