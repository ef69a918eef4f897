//! The ACL a token holds: its policies merged into one object that answers capability checks
//! (Nomad's `acl.ACL`). Capabilities are the union of the policies'; `deny` anywhere wins.
//! Namespace, variable path and host volume rules are globs (`*` matches any run of
//! characters): an exact rule wins, else the matching glob closest in length to the name.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use super::policy::{POLICY_DENY, POLICY_LIST, POLICY_READ, POLICY_WRITE, PolicyRules, var_cap};

/// A coarse rule's level (`agent`, `node`, `operator`, `quota`, `plugin`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    #[default]
    None,
    List,
    Read,
    Write,
    Deny,
}

impl Level {
    fn parse(policy: Option<&String>) -> Level {
        match policy.map(String::as_str) {
            Some(POLICY_DENY) => Level::Deny,
            Some(POLICY_WRITE) => Level::Write,
            Some(POLICY_READ) => Level::Read,
            Some(POLICY_LIST) => Level::List,
            _ => Level::None,
        }
    }

    /// Two policies' levels together: `deny` wins, else the higher.
    fn merge(self, other: Level) -> Level {
        if self == Level::Deny || other == Level::Deny {
            Level::Deny
        } else {
            self.max(other)
        }
    }

    /// Whether this level grants `wanted` (never when denied).
    fn grants(self, wanted: Level) -> bool {
        self != Level::Deny && self >= wanted
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    management: bool,
    namespaces: BTreeMap<String, BTreeSet<String>>,
    variables: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    host_volumes: BTreeMap<String, BTreeSet<String>>,
    agent: Level,
    node: Level,
    operator: Level,
    quota: Level,
    plugin: Level,
}

impl Acl {
    /// A management token's ACL: everything is allowed.
    pub fn management() -> Acl {
        Acl {
            management: true,
            ..Acl::default()
        }
    }

    /// The ACL of a client token holding `policies` (already validated and expanded).
    pub fn from_policies<'a>(policies: impl IntoIterator<Item = &'a PolicyRules>) -> Acl {
        let mut acl = Acl::default();
        for rules in policies {
            for namespace in &rules.namespaces {
                acl.namespaces
                    .entry(namespace.name.clone())
                    .or_default()
                    .extend(namespace.capabilities.iter().cloned());
                let paths = acl.variables.entry(namespace.name.clone()).or_default();
                for variable in &namespace.variables {
                    let caps = paths.entry(variable.path.clone()).or_default();
                    caps.extend(variable.capabilities.iter().cloned());
                    // Nomad: read implies list.
                    if caps.contains(var_cap::READ) {
                        caps.insert(var_cap::LIST.to_string());
                    }
                }
            }
            for volume in &rules.host_volumes {
                acl.host_volumes
                    .entry(volume.name.clone())
                    .or_default()
                    .extend(volume.capabilities.iter().cloned());
            }
            acl.agent = acl.agent.merge(Level::parse(rules.agent.as_ref()));
            acl.node = acl.node.merge(Level::parse(rules.node.as_ref()));
            acl.operator = acl.operator.merge(Level::parse(rules.operator.as_ref()));
            acl.quota = acl.quota.merge(Level::parse(rules.quota.as_ref()));
            acl.plugin = acl.plugin.merge(Level::parse(rules.plugin.as_ref()));
        }
        acl
    }

    pub fn is_management(&self) -> bool {
        self.management
    }

    /// Whether `capability` is granted in `namespace`.
    pub fn allows_namespace(&self, namespace: &str, capability: &str) -> bool {
        if self.management {
            return true;
        }
        closest(&self.namespaces, namespace)
            .is_some_and(|caps| !caps.contains(super::policy::cap::DENY) && caps.contains(capability))
    }

    /// Whether `capability` is granted in some namespace (Nomad's `AllowNsOp` on `*`: a list
    /// of every namespace is refused outright when none would show anything).
    pub fn allows_some_namespace(&self, capability: &str) -> bool {
        self.management
            || self
                .namespaces
                .values()
                .any(|caps| !caps.contains(super::policy::cap::DENY) && caps.contains(capability))
    }

    /// Whether any capability at all is granted in `namespace` (Nomad's `AllowNamespace`: what
    /// lets a token see the namespace itself).
    pub fn allows_namespace_at_all(&self, namespace: &str) -> bool {
        self.management
            || closest(&self.namespaces, namespace)
                .is_some_and(|caps| !caps.contains(super::policy::cap::DENY) && !caps.is_empty())
    }

    /// Whether any of `capabilities` is granted in `namespace`.
    pub fn allows_namespace_any(&self, namespace: &str, capabilities: &[&str]) -> bool {
        capabilities
            .iter()
            .any(|capability| self.allows_namespace(namespace, capability))
    }

    /// Whether `capability` (`read`, `write`, `list`, `destroy`) is granted on the variable
    /// at `path` in `namespace`.
    pub fn allows_variable(&self, namespace: &str, path: &str, capability: &str) -> bool {
        if self.management {
            return true;
        }
        closest(&self.variables, namespace)
            .and_then(|paths| closest(paths, path))
            .is_some_and(|caps| !caps.contains(var_cap::DENY) && caps.contains(capability))
    }

    /// Whether `capability` is granted on the variable at `path` in some namespace. Variables
    /// are stored by path alone, so a write the HTTP gate let through in the request's
    /// namespace is re-checked this way where the namespace no longer travels with it.
    pub fn allows_variable_somewhere(&self, path: &str, capability: &str) -> bool {
        self.management
            || self
                .variables
                .values()
                .filter_map(|paths| closest(paths, path))
                .any(|caps| !caps.contains(var_cap::DENY) && caps.contains(capability))
    }

    pub fn allows_host_volume(&self, volume: &str, capability: &str) -> bool {
        if self.management {
            return true;
        }
        closest(&self.host_volumes, volume)
            .is_some_and(|caps| !caps.contains(super::policy::volume_cap::DENY) && caps.contains(capability))
    }

    pub fn allows_agent(&self, write: bool) -> bool {
        self.management || self.agent.grants(if write { Level::Write } else { Level::Read })
    }

    pub fn allows_node(&self, write: bool) -> bool {
        self.management || self.node.grants(if write { Level::Write } else { Level::Read })
    }

    pub fn allows_operator(&self, write: bool) -> bool {
        self.management || self.operator.grants(if write { Level::Write } else { Level::Read })
    }

    pub fn allows_quota(&self, write: bool) -> bool {
        self.management || self.quota.grants(if write { Level::Write } else { Level::Read })
    }

    /// `plugin { policy = "list" }` lists plugins; `read` also reads them.
    pub fn allows_plugin(&self, read: bool) -> bool {
        self.management || self.plugin.grants(if read { Level::Read } else { Level::List })
    }
}

/// `*` matches any run of characters (none included).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The rule for `name`: an exact one, else the matching glob whose literal part is longest
/// (ties: the first in order), as Nomad's `findClosestMatchingGlob`.
fn closest<'a, T>(rules: &'a BTreeMap<String, T>, name: &str) -> Option<&'a T> {
    if let Some(exact) = rules.get(name) {
        return Some(exact);
    }
    let mut best: Option<(usize, &T)> = None;
    for (pattern, rule) in rules.iter().filter(|(pattern, _)| pattern.contains('*')) {
        if !glob_matches(pattern, name) {
            continue;
        }
        let distance = name.len() - pattern.replace('*', "").len();
        if best.is_none_or(|(held, _)| distance < held) {
            best = Some((distance, rule));
        }
    }
    best.map(|(_, rule)| rule)
}

#[cfg(test)]
mod tests {
    use super::super::policy::{NamespaceRule, VariableRule};
    use super::*;

    fn rules(namespace: &str, policy: &str, capabilities: &[&str]) -> PolicyRules {
        let mut rules = PolicyRules {
            namespaces: vec![NamespaceRule {
                name: namespace.into(),
                policy: (!policy.is_empty()).then(|| policy.into()),
                capabilities: capabilities.iter().map(|cap| (*cap).to_string()).collect(),
                variables: Vec::new(),
            }],
            ..PolicyRules::default()
        };
        rules.validate().unwrap();
        rules
    }

    #[test]
    fn globs_match_and_the_closest_wins() {
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("prod-*", "prod-web"));
        assert!(!glob_matches("prod-*", "dev-web"));
        assert!(glob_matches("a*b*c", "a-b-c"));
        assert!(!glob_matches("a*b*c", "a-c"));
        let acl = Acl::from_policies([&rules("*", "read", &[]), &rules("prod-*", "deny", &[])]);
        assert!(acl.allows_namespace("default", "read-job"));
        assert!(!acl.allows_namespace("prod-web", "read-job"), "the closer glob denies");
    }

    #[test]
    fn deny_wins_over_any_grant_and_unions_otherwise() {
        let read = rules("default", "read", &[]);
        let submit = rules("default", "", &["submit-job"]);
        let acl = Acl::from_policies([&read, &submit]);
        assert!(acl.allows_namespace("default", "submit-job"));
        assert!(acl.allows_namespace("default", "read-job"));
        assert!(!acl.allows_namespace("default", "alloc-exec"));
        assert!(!acl.allows_namespace("other", "read-job"));
        let denied = Acl::from_policies([&read, &submit, &rules("default", "deny", &[])]);
        assert!(!denied.allows_namespace("default", "read-job"));
        assert!(Acl::management().allows_namespace("any", "anything"));
    }

    #[test]
    fn coarse_levels_merge_with_deny_winning() {
        let node_read = PolicyRules {
            node: Some("read".into()),
            plugin: Some("list".into()),
            ..PolicyRules::default()
        };
        let node_write = PolicyRules {
            node: Some("write".into()),
            ..PolicyRules::default()
        };
        let acl = Acl::from_policies([&node_read, &node_write]);
        assert!(acl.allows_node(true) && acl.allows_node(false));
        assert!(acl.allows_plugin(false) && !acl.allows_plugin(true));
        assert!(!acl.allows_agent(false) && !acl.allows_operator(false));
        let node_deny = PolicyRules {
            node: Some("deny".into()),
            ..PolicyRules::default()
        };
        assert!(!Acl::from_policies([&node_write, &node_deny]).allows_node(false));
    }

    #[test]
    fn variable_paths_use_the_closest_glob_and_read_implies_list() {
        let mut policy = rules("default", "", &[]);
        policy.namespaces[0].variables = vec![
            VariableRule {
                path: "nomad/jobs/*".into(),
                capabilities: vec!["read".into()],
            },
            VariableRule {
                path: "nomad/jobs/secret*".into(),
                capabilities: vec!["deny".into()],
            },
        ];
        let acl = Acl::from_policies([&policy]);
        assert!(acl.allows_variable("default", "nomad/jobs/web", "read"));
        assert!(acl.allows_variable("default", "nomad/jobs/web", "list"));
        assert!(!acl.allows_variable("default", "nomad/jobs/web", "write"));
        assert!(!acl.allows_variable("default", "nomad/jobs/secret-db", "read"));
        assert!(!acl.allows_variable("default", "other", "read"));
    }
}
