//! Constraints and affinities against a node (Nomad's `feasible.go` `checkConstraint` and the
//! affinity scorer): targets resolved from the node (`${attr.*}`, `${meta.*}`, `${node.*}`),
//! operators compared as Nomad compares them, and the two constraints about placements
//! (`distinct_hosts`, `distinct_property`).

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::cmp::Ordering;

use crate::structs::{Affinity, CONSTRAINT_OPERATORS, Constraint, DISTINCT_HOSTS, DISTINCT_PROPERTY, Node};
use crate::taskenv::node_variable;

/// The value `target` names on `node` (`${attr.X}`, `${meta.X}`, `${node.*}`: the task
/// environment's [`node_variable`] table); anything not in `${}` is itself. `None`: the node
/// has no such value.
pub fn resolve_target(target: &str, node: &Node) -> Option<String> {
    match target.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) {
        Some(name) => node_variable(node, name).map(String::from),
        None => Some(target.to_string()),
    }
}

// Validation lives beside the checks whose parsers it uses (regexp, version terms).
impl Constraint {
    /// Nomad's `Constraint.Validate` texts.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.operand.is_empty() {
            errors.push("Missing constraint operand".to_string());
            return errors;
        }
        let requires_ltarget = !matches!(self.operand.as_str(), DISTINCT_HOSTS);
        if requires_ltarget && self.ltarget.is_empty() {
            errors.push("No LTarget provided but is required by constraint".to_string());
        }
        match self.operand.as_str() {
            DISTINCT_HOSTS | DISTINCT_PROPERTY => {
                if self.operand == DISTINCT_PROPERTY
                    && !self.rtarget.is_empty()
                    && self.rtarget.parse::<u64>().map_or(true, |limit| limit == 0)
                {
                    errors.push(format!(
                        "Failed to convert RTarget {:?} to uint64: must be a positive count",
                        self.rtarget
                    ));
                }
            }
            "is_set" | "is_not_set" => {
                if !self.rtarget.is_empty() {
                    errors.push(format!("Operator {:?} does not support an RTarget", self.operand));
                }
            }
            "regexp" => {
                if let Err(error) = compile_regexp(&self.rtarget) {
                    errors.push(format!("Regular expression failed to compile: {error}"));
                }
            }
            "version" | "semver" => {
                if parse_version_constraint(&self.rtarget).is_none() {
                    errors.push(format!("Version constraint is invalid: {:?}", self.rtarget));
                }
            }
            operand if CONSTRAINT_OPERATORS.contains(&operand) => {
                if self.rtarget.is_empty() && !matches!(operand, "!=" | "not") {
                    errors.push("No RTarget provided but is required by constraint".to_string());
                }
            }
            other => errors.push(format!("Unknown constraint type {other:?}")),
        }
        errors
    }
}

impl Affinity {
    /// Nomad's `Affinity.Validate` texts.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.operand.is_empty() {
            errors.push("Missing affinity operand".to_string());
        } else if matches!(self.operand.as_str(), DISTINCT_HOSTS | DISTINCT_PROPERTY)
            || !CONSTRAINT_OPERATORS.contains(&self.operand.as_str())
        {
            errors.push(format!("Unknown affinity operator {:?}", self.operand));
        } else {
            let as_constraint = Constraint {
                ltarget: self.ltarget.clone(),
                rtarget: self.rtarget.clone(),
                operand: self.operand.clone(),
            };
            errors.extend(as_constraint.validate());
        }
        if self.weight == 0 {
            errors.push("Affinity weight cannot be zero".to_string());
        }
        if !(-100..=100).contains(&self.weight) {
            errors.push("Affinity weight must be within the range [-100,100]".to_string());
        }
        errors
    }
}

/// Whether `node` satisfies `constraint` (the node-only operators; the placement ones,
/// `distinct_hosts` and `distinct_property`, are [`distinct_ok`]'s).
pub fn node_satisfies(constraint: &Constraint, node: &Node) -> bool {
    if matches!(constraint.operand.as_str(), DISTINCT_HOSTS | DISTINCT_PROPERTY) {
        return true;
    }
    let left = resolve_target(&constraint.ltarget, node);
    let right = resolve_target(&constraint.rtarget, node);
    check(&constraint.operand, left.as_deref(), right.as_deref())
}

/// Nomad's `checkConstraint` for one operator and the two resolved values.
pub fn check(operand: &str, left: Option<&str>, right: Option<&str>) -> bool {
    match operand {
        "is_set" => return left.is_some(),
        "is_not_set" => return left.is_none(),
        "!=" | "not" => return left != right,
        _ => {}
    }
    let (Some(left), Some(right)) = (left, right) else {
        return false;
    };
    match operand {
        "=" | "==" | "is" => left == right,
        "<" => order(left, right) == Ordering::Less,
        "<=" => order(left, right) != Ordering::Greater,
        ">" => order(left, right) == Ordering::Greater,
        ">=" => order(left, right) != Ordering::Less,
        "regexp" => compile_regexp(right).is_ok_and(|regex| regex.is_match(left)),
        "version" | "semver" => {
            parse_version_constraint(right).is_some_and(|constraints| version_matches(left, &constraints))
        }
        "set_contains" | "set_contains_all" => {
            let have = set(left);
            set(right).iter().all(|item| have.contains(item))
        }
        "set_contains_any" => {
            let have = set(left);
            set(right).iter().any(|item| have.contains(item))
        }
        _ => false,
    }
}

/// Numbers compare as numbers, everything else lexically (Nomad's `checkOrder`).
fn order(left: &str, right: &str) -> Ordering {
    if let (Ok(left), Ok(right)) = (left.trim().parse::<i64>(), right.trim().parse::<i64>()) {
        return left.cmp(&right);
    }
    if let (Ok(left), Ok(right)) = (left.trim().parse::<f64>(), right.trim().parse::<f64>()) {
        return left.partial_cmp(&right).unwrap_or(Ordering::Equal);
    }
    left.cmp(right)
}

fn set(text: &str) -> Vec<&str> {
    text.split(',').map(str::trim).filter(|item| !item.is_empty()).collect()
}

/// A regular expression (RE2-like syntax, as Go's `regexp`), unanchored as Go matches.
pub fn compile_regexp(pattern: &str) -> Result<regex_automata::meta::Regex, String> {
    regex_automata::meta::Regex::new(pattern).map_err(|error| error.to_string())
}

/// A parsed version: numeric segments and whether it has a pre-release part (which orders
/// before the release with the same segments).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    segments: Vec<u64>,
    prerelease: String,
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let text = text.trim().trim_start_matches('v');
        let text = text.split('+').next()?;
        let (core, prerelease) = match text.split_once('-') {
            Some((core, pre)) => (core, pre.to_string()),
            None => (text, String::new()),
        };
        let segments: Option<Vec<u64>> = core.split('.').map(|part| part.parse().ok()).collect();
        let segments = segments.filter(|segments| !segments.is_empty())?;
        Some(Version { segments, prerelease })
    }

    fn cmp(&self, other: &Version) -> Ordering {
        let len = self.segments.len().max(other.segments.len());
        for index in 0..len {
            let (a, b) = (
                self.segments.get(index).copied().unwrap_or(0),
                other.segments.get(index).copied().unwrap_or(0),
            );
            if a != b {
                return a.cmp(&b);
            }
        }
        match (self.prerelease.is_empty(), other.prerelease.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => self.prerelease.cmp(&other.prerelease),
        }
    }
}

/// One term of a version constraint (`>= 1.2.0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionTerm {
    operator: String,
    version: Version,
}

/// go-version's constraint syntax: comma-separated terms, each an operator (`=`, `!=`, `>`,
/// `<`, `>=`, `<=`, `~>`, or none for `=`) and a version.
pub fn parse_version_constraint(text: &str) -> Option<Vec<VersionTerm>> {
    let mut terms = Vec::new();
    for term in text.split(',') {
        let term = term.trim();
        let split = term
            .find(|c: char| c.is_ascii_digit() || c == 'v')
            .filter(|at| *at < term.len())?;
        let (operator, version) = term.split_at(split);
        let operator = match operator.trim() {
            "" => "=",
            op @ ("=" | "!=" | ">" | "<" | ">=" | "<=" | "~>") => op,
            _ => return None,
        };
        terms.push(VersionTerm {
            operator: operator.to_string(),
            version: Version::parse(version)?,
        });
    }
    (!terms.is_empty()).then_some(terms)
}

fn version_matches(text: &str, terms: &[VersionTerm]) -> bool {
    let Some(version) = Version::parse(text) else {
        return false;
    };
    terms.iter().all(|term| {
        let ordering = version.cmp(&term.version);
        match term.operator.as_str() {
            "=" => ordering == Ordering::Equal,
            "!=" => ordering != Ordering::Equal,
            ">" => ordering == Ordering::Greater,
            "<" => ordering == Ordering::Less,
            ">=" => ordering != Ordering::Less,
            "<=" => ordering != Ordering::Greater,
            // Pessimistic: at least the version, below the next release of its second-last
            // segment (`~> 1.2` allows 1.x from 1.2; `~> 1.2.3` allows 1.2.x from 1.2.3).
            "~>" => {
                if ordering == Ordering::Less {
                    return false;
                }
                let segments = &term.version.segments;
                let keep = segments.len().saturating_sub(1).max(1);
                let mut ceiling = segments[..keep].to_vec();
                ceiling[keep - 1] += 1;
                let ceiling = Version {
                    segments: ceiling,
                    prerelease: String::new(),
                };
                version.cmp(&ceiling) == Ordering::Less
            }
            _ => false,
        }
    })
}

/// `distinct_hosts`/`distinct_property` against what is already on (or planned for) the
/// nodes: `placed` lists, for every live allocation of the same job (or group, for a group-
/// level constraint), the node it is on. `Err` carries the filter reason.
pub fn distinct_ok(constraint: &Constraint, node: &Node, placed: &[&Node]) -> Result<(), String> {
    match constraint.operand.as_str() {
        DISTINCT_HOSTS => {
            if placed.iter().any(|other| other.id == node.id) {
                Err(DISTINCT_HOSTS.to_string())
            } else {
                Ok(())
            }
        }
        DISTINCT_PROPERTY => {
            let limit: usize = constraint.rtarget.parse().unwrap_or(1).max(1);
            let Some(value) = resolve_target(&constraint.ltarget, node) else {
                return Err(format!("missing property {:?}", constraint.ltarget));
            };
            let used = placed
                .iter()
                .filter(|other| resolve_target(&constraint.ltarget, other).as_deref() == Some(value.as_str()))
                .count();
            if used >= limit {
                Err(format!("{DISTINCT_PROPERTY}: {}", constraint.ltarget))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// The affinity score of `node` in [-1, 1]: the weights of the matching affinities over the
/// sum of all weights' magnitudes (Nomad's normalised affinity score).
pub fn affinity_score(affinities: &[&Affinity], node: &Node) -> f64 {
    let total: i64 = affinities.iter().map(|affinity| i64::from(affinity.weight).abs()).sum();
    if total == 0 {
        return 0.0;
    }
    let matched: i64 = affinities
        .iter()
        .filter(|affinity| {
            let left = resolve_target(&affinity.ltarget, node);
            let right = resolve_target(&affinity.rtarget, node);
            check(&affinity.operand, left.as_deref(), right.as_deref())
        })
        .map(|affinity| i64::from(affinity.weight))
        .sum();
    matched as f64 / total as f64
}

/// Nodes by id, for looking placed allocations' nodes up.
pub type NodesById<'a> = BTreeMap<&'a str, &'a Node>;

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        Node {
            id: "n1".into(),
            name: "c1".into(),
            datacenter: "dc1".into(),
            node_class: "gpu".into(),
            attributes: [
                ("kernel.name".to_string(), "linux".to_string()),
                ("cpu.numcores".to_string(), "8".to_string()),
                ("nomad.version".to_string(), "1.1.2".to_string()),
                ("tags".to_string(), "ssd, fast,big".to_string()),
            ]
            .into(),
            meta: [("rack".to_string(), "r1".to_string())].into(),
            ..Node::default()
        }
    }

    fn constraint(ltarget: &str, operand: &str, rtarget: &str) -> Constraint {
        Constraint {
            ltarget: ltarget.into(),
            rtarget: rtarget.into(),
            operand: operand.into(),
        }
    }

    #[test]
    fn operators_compare_as_nomads_do() {
        let node = node();
        let cases = [
            ("${attr.kernel.name}", "=", "linux", true),
            ("${attr.kernel.name}", "==", "windows", false),
            ("${attr.kernel.name}", "is", "linux", true),
            ("${attr.kernel.name}", "!=", "windows", true),
            ("${attr.no.such}", "!=", "windows", true),
            ("${attr.no.such}", "=", "windows", false),
            ("${attr.cpu.numcores}", ">=", "4", true),
            ("${attr.cpu.numcores}", ">", "10", false),
            ("${attr.cpu.numcores}", "<", "10", true),
            ("${node.datacenter}", "<=", "dc1", true),
            ("${node.class}", "regexp", "^g.u$", true),
            ("${node.unique.name}", "regexp", "^d", false),
            ("${attr.nomad.version}", "version", ">= 1.0, < 2", true),
            ("${attr.nomad.version}", "version", "~> 1.1.0", true),
            ("${attr.nomad.version}", "version", "~> 1.0.3", false),
            ("${attr.nomad.version}", "semver", "< 1.1.2", false),
            ("${attr.tags}", "set_contains", "fast,ssd", true),
            ("${attr.tags}", "set_contains_all", "fast,slow", false),
            ("${attr.tags}", "set_contains_any", "fast,slow", true),
            ("${meta.rack}", "is_set", "", true),
            ("${meta.row}", "is_not_set", "", true),
            ("${meta.rack}", "=", "r1", true),
            ("${node.unique.id}", "=", "n1", true),
        ];
        for (left, operand, right, want) in cases {
            assert_eq!(
                node_satisfies(&constraint(left, operand, right), &node),
                want,
                "{left} {operand} {right}"
            );
        }
    }

    #[test]
    fn invalid_constraints_are_named() {
        assert_eq!(constraint("${attr.x}", "regexp", "(").validate().len(), 1);
        assert!(
            constraint("${attr.x}", "regexp", "(").validate()[0].starts_with("Regular expression failed to compile")
        );
        assert_eq!(
            constraint("${attr.x}", "version", ">> 1").validate(),
            ["Version constraint is invalid: \">> 1\""]
        );
        assert_eq!(
            constraint("${attr.x}", "bogus", "1").validate(),
            ["Unknown constraint type \"bogus\""]
        );
        assert!(constraint("", DISTINCT_HOSTS, "").validate().is_empty());
        assert!(constraint("${meta.rack}", DISTINCT_PROPERTY, "2").validate().is_empty());
        assert!(!constraint("${meta.rack}", DISTINCT_PROPERTY, "0").validate().is_empty());
        let affinity = Affinity {
            ltarget: "${meta.rack}".into(),
            rtarget: "r1".into(),
            operand: "=".into(),
            weight: 0,
        };
        assert_eq!(affinity.validate(), ["Affinity weight cannot be zero"]);
    }

    #[test]
    fn distinct_hosts_and_property_count_placements() {
        let here = node();
        let mut other = node();
        other.id = "n2".into();
        let hosts = constraint("", DISTINCT_HOSTS, "");
        assert_eq!(distinct_ok(&hosts, &here, &[&other]), Ok(()));
        assert_eq!(distinct_ok(&hosts, &here, &[&here]), Err("distinct_hosts".into()));
        let rack = constraint("${meta.rack}", DISTINCT_PROPERTY, "2");
        assert_eq!(distinct_ok(&rack, &here, &[&other]), Ok(()));
        assert_eq!(
            distinct_ok(&rack, &here, &[&other, &here]),
            Err("distinct_property: ${meta.rack}".into())
        );
    }

    #[test]
    fn affinity_scores_are_normalised_weights() {
        let node = node();
        let want = Affinity {
            ltarget: "${meta.rack}".into(),
            rtarget: "r1".into(),
            operand: "=".into(),
            weight: 50,
        };
        let avoid = Affinity {
            ltarget: "${node.class}".into(),
            rtarget: "gpu".into(),
            operand: "=".into(),
            weight: -50,
        };
        assert_eq!(affinity_score(&[&want], &node), 1.0);
        assert_eq!(affinity_score(&[&want, &avoid], &node), 0.0);
        assert_eq!(affinity_score(&[&avoid], &node), -1.0);
        assert_eq!(affinity_score(&[], &node), 0.0);
    }
}
