//! ACL policy rules in Nomad's model, checked and expanded as Nomad's `acl.Parse` does.
//!
//! The policy language is HCL (`namespace "default" { policy = "read" }`); the driver parses
//! the text into [`PolicyRules`], and [`PolicyRules::validate`] checks every name and value
//! and expands each `policy` shorthand into the capabilities it grants, so what is stored is
//! what is enforced.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

pub const POLICY_DENY: &str = "deny";
pub const POLICY_READ: &str = "read";
pub const POLICY_WRITE: &str = "write";
pub const POLICY_SCALE: &str = "scale";
pub const POLICY_LIST: &str = "list";

/// Namespace capabilities (Nomad's names).
pub mod cap {
    pub const DENY: &str = "deny";
    pub const LIST_JOBS: &str = "list-jobs";
    pub const PARSE_JOB: &str = "parse-job";
    pub const READ_JOB: &str = "read-job";
    pub const SUBMIT_JOB: &str = "submit-job";
    pub const DISPATCH_JOB: &str = "dispatch-job";
    pub const READ_LOGS: &str = "read-logs";
    pub const READ_FS: &str = "read-fs";
    pub const ALLOC_EXEC: &str = "alloc-exec";
    pub const ALLOC_NODE_EXEC: &str = "alloc-node-exec";
    pub const ALLOC_LIFECYCLE: &str = "alloc-lifecycle";
    pub const SENTINEL_OVERRIDE: &str = "sentinel-override";
    pub const CSI_REGISTER_PLUGIN: &str = "csi-register-plugin";
    pub const CSI_WRITE_VOLUME: &str = "csi-write-volume";
    pub const CSI_READ_VOLUME: &str = "csi-read-volume";
    pub const CSI_LIST_VOLUME: &str = "csi-list-volume";
    pub const CSI_MOUNT_VOLUME: &str = "csi-mount-volume";
    pub const LIST_SCALING_POLICIES: &str = "list-scaling-policies";
    pub const READ_SCALING_POLICY: &str = "read-scaling-policy";
    pub const READ_JOB_SCALING: &str = "read-job-scaling";
    pub const SCALE_JOB: &str = "scale-job";
    pub const SUBMIT_RECOMMENDATION: &str = "submit-recommendation";
}

/// Variable path capabilities.
pub mod var_cap {
    pub const READ: &str = "read";
    pub const WRITE: &str = "write";
    pub const LIST: &str = "list";
    pub const DESTROY: &str = "destroy";
    pub const DENY: &str = "deny";
}

/// Host volume capabilities.
pub mod volume_cap {
    pub const DENY: &str = "deny";
    pub const MOUNT_READONLY: &str = "mount-readonly";
    pub const MOUNT_READWRITE: &str = "mount-readwrite";
}

const NAMESPACE_CAPS: &[&str] = &[
    cap::DENY,
    cap::LIST_JOBS,
    cap::PARSE_JOB,
    cap::READ_JOB,
    cap::SUBMIT_JOB,
    cap::DISPATCH_JOB,
    cap::READ_LOGS,
    cap::READ_FS,
    cap::ALLOC_EXEC,
    cap::ALLOC_NODE_EXEC,
    cap::ALLOC_LIFECYCLE,
    cap::SENTINEL_OVERRIDE,
    cap::CSI_REGISTER_PLUGIN,
    cap::CSI_WRITE_VOLUME,
    cap::CSI_READ_VOLUME,
    cap::CSI_LIST_VOLUME,
    cap::CSI_MOUNT_VOLUME,
    cap::LIST_SCALING_POLICIES,
    cap::READ_SCALING_POLICY,
    cap::READ_JOB_SCALING,
    cap::SCALE_JOB,
    cap::SUBMIT_RECOMMENDATION,
];

const READ: &[&str] = &[
    cap::LIST_JOBS,
    cap::PARSE_JOB,
    cap::READ_JOB,
    cap::CSI_LIST_VOLUME,
    cap::CSI_READ_VOLUME,
    cap::READ_JOB_SCALING,
    cap::LIST_SCALING_POLICIES,
    cap::READ_SCALING_POLICY,
];

const WRITE_EXTRA: &[&str] = &[
    cap::SCALE_JOB,
    cap::SUBMIT_JOB,
    cap::DISPATCH_JOB,
    cap::READ_LOGS,
    cap::READ_FS,
    cap::ALLOC_EXEC,
    cap::ALLOC_LIFECYCLE,
    cap::CSI_MOUNT_VOLUME,
    cap::CSI_WRITE_VOLUME,
    cap::SUBMIT_RECOMMENDATION,
];

const SCALE: &[&str] = &[
    cap::LIST_SCALING_POLICIES,
    cap::READ_SCALING_POLICY,
    cap::READ_JOB_SCALING,
    cap::SCALE_JOB,
];

/// The capabilities a namespace `policy` shorthand grants.
pub fn expand_namespace_policy(policy: &str) -> Vec<&'static str> {
    match policy {
        POLICY_DENY => vec![cap::DENY],
        POLICY_READ => READ.to_vec(),
        POLICY_WRITE => READ.iter().chain(WRITE_EXTRA).copied().collect(),
        POLICY_SCALE => SCALE.to_vec(),
        _ => Vec::new(),
    }
}

fn expand_host_volume_policy(policy: &str) -> Vec<&'static str> {
    match policy {
        POLICY_DENY => vec![volume_cap::DENY],
        POLICY_READ => vec![volume_cap::MOUNT_READONLY],
        POLICY_WRITE => vec![volume_cap::MOUNT_READONLY, volume_cap::MOUNT_READWRITE],
        _ => Vec::new(),
    }
}

/// A parsed policy: what each block of the HCL said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyRules {
    pub namespaces: Vec<NamespaceRule>,
    pub host_volumes: Vec<HostVolumeRule>,
    pub agent: Option<String>,
    pub node: Option<String>,
    pub operator: Option<String>,
    pub quota: Option<String>,
    pub plugin: Option<String>,
}

/// `namespace "<glob>" { policy capabilities variables { path "<glob>" { capabilities } } }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NamespaceRule {
    pub name: String,
    pub policy: Option<String>,
    pub capabilities: Vec<String>,
    pub variables: Vec<VariableRule>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VariableRule {
    pub path: String,
    pub capabilities: Vec<String>,
}

/// `host_volume "<glob>" { policy capabilities }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostVolumeRule {
    pub name: String,
    pub policy: Option<String>,
    pub capabilities: Vec<String>,
}

/// Nomad's `^[a-zA-Z0-9-*]{1,128}$` for namespace and host volume globs.
fn valid_glob(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
}

fn coarse(what: &str, policy: &Option<String>, allowed: &[&str]) -> Result<(), String> {
    match policy {
        Some(policy) if !allowed.contains(&policy.as_str()) => Err(format!("Invalid {what} policy: {policy:?}")),
        _ => Ok(()),
    }
}

impl PolicyRules {
    /// Checks every block and expands each `policy` shorthand into its capabilities (kept in
    /// `capabilities`, deduplicated), with Nomad's texts.
    pub fn validate(&mut self) -> Result<(), String> {
        // A policy with no rules is valid and grants nothing, as Nomad's `acl.Parse` takes it.
        for namespace in &mut self.namespaces {
            if !valid_glob(&namespace.name) {
                return Err(format!("Invalid namespace name: {:?}", namespace.name));
            }
            if let Some(policy) = &namespace.policy
                && ![POLICY_DENY, POLICY_READ, POLICY_WRITE, POLICY_SCALE].contains(&policy.as_str())
            {
                return Err(format!("Invalid namespace policy: {policy:?}"));
            }
            for capability in &namespace.capabilities {
                if !NAMESPACE_CAPS.contains(&capability.as_str()) {
                    return Err(format!(
                        "Invalid namespace capability '{capability}' in namespace {:?}",
                        namespace.name
                    ));
                }
            }
            for variable in &namespace.variables {
                if variable.path.is_empty() {
                    return Err(format!(
                        "Invalid variable policy: no path in namespace {:?}",
                        namespace.name
                    ));
                }
                for capability in &variable.capabilities {
                    if ![
                        var_cap::READ,
                        var_cap::WRITE,
                        var_cap::LIST,
                        var_cap::DESTROY,
                        var_cap::DENY,
                    ]
                    .contains(&capability.as_str())
                    {
                        return Err(format!(
                            "Invalid variable capability '{capability}' for path {:?}",
                            variable.path
                        ));
                    }
                }
            }
            if let Some(policy) = &namespace.policy {
                let extra = expand_namespace_policy(policy);
                merge_caps(&mut namespace.capabilities, &extra);
            }
        }
        for volume in &mut self.host_volumes {
            if !valid_glob(&volume.name) {
                return Err(format!("Invalid host volume name: {:?}", volume.name));
            }
            if let Some(policy) = &volume.policy
                && ![POLICY_DENY, POLICY_READ, POLICY_WRITE].contains(&policy.as_str())
            {
                return Err(format!("Invalid host volume policy: {policy:?}"));
            }
            for capability in &volume.capabilities {
                if ![
                    volume_cap::DENY,
                    volume_cap::MOUNT_READONLY,
                    volume_cap::MOUNT_READWRITE,
                ]
                .contains(&capability.as_str())
                {
                    return Err(format!(
                        "Invalid host volume capability '{capability}' for {:?}",
                        volume.name
                    ));
                }
            }
            if let Some(policy) = &volume.policy {
                let extra = expand_host_volume_policy(policy);
                merge_caps(&mut volume.capabilities, &extra);
            }
        }
        let levels = [POLICY_DENY, POLICY_READ, POLICY_WRITE];
        coarse("agent", &self.agent, &levels)?;
        coarse("node", &self.node, &levels)?;
        coarse("operator", &self.operator, &levels)?;
        coarse("quota", &self.quota, &levels)?;
        coarse("plugin", &self.plugin, &[POLICY_DENY, POLICY_LIST, POLICY_READ])?;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.host_volumes.is_empty()
            && self.agent.is_none()
            && self.node.is_none()
            && self.operator.is_none()
            && self.quota.is_none()
            && self.plugin.is_none()
    }
}

fn merge_caps(into: &mut Vec<String>, extra: &[&str]) {
    for capability in extra {
        if !into.iter().any(|held| held == capability) {
            into.push((*capability).to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthands_expand_as_nomads_do() {
        let mut rules = PolicyRules {
            namespaces: vec![NamespaceRule {
                name: "default".into(),
                policy: Some("read".into()),
                capabilities: vec!["csi-mount-volume".into()],
                variables: Vec::new(),
            }],
            plugin: Some("read".into()),
            ..PolicyRules::default()
        };
        rules.validate().unwrap();
        let caps = &rules.namespaces[0].capabilities;
        assert_eq!(caps[0], "csi-mount-volume");
        for expected in ["list-jobs", "read-job", "csi-read-volume", "csi-list-volume"] {
            assert!(caps.iter().any(|cap| cap == expected), "{expected}");
        }
        assert!(!caps.iter().any(|cap| cap == "submit-job"));
        assert!(expand_namespace_policy("write").contains(&"submit-job"));
    }

    #[test]
    fn bad_names_and_values_are_refused_by_name() {
        let with = |edit: &dyn Fn(&mut PolicyRules)| {
            let mut rules = PolicyRules {
                namespaces: vec![NamespaceRule {
                    name: "default".into(),
                    ..NamespaceRule::default()
                }],
                ..PolicyRules::default()
            };
            edit(&mut rules);
            rules.validate().unwrap_err()
        };
        assert_eq!(
            with(&|rules| rules.namespaces[0].policy = Some("admin".into())),
            "Invalid namespace policy: \"admin\""
        );
        assert_eq!(
            with(&|rules| rules.namespaces[0].capabilities = vec!["root".into()]),
            "Invalid namespace capability 'root' in namespace \"default\""
        );
        assert_eq!(
            with(&|rules| rules.namespaces[0].name = "a/b".into()),
            "Invalid namespace name: \"a/b\""
        );
        assert_eq!(
            with(&|rules| rules.node = Some("list".into())),
            "Invalid node policy: \"list\""
        );
        assert_eq!(
            PolicyRules::default().validate(),
            Ok(()),
            "no rules: valid, grants nothing"
        );
    }
}
