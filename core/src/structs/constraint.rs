//! `constraint` and `affinity` blocks (Nomad's `structs.Constraint` / `structs.Affinity`):
//! where a job, group or task may (or would rather) run, in terms of node values.

use super::*;

/// Operators Nomad accepts in a `constraint` or `affinity`.
pub const CONSTRAINT_OPERATORS: [&str; 18] = [
    "=",
    "==",
    "is",
    "!=",
    "not",
    "<",
    "<=",
    ">",
    ">=",
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "is_set",
    "is_not_set",
    "distinct_hosts",
];
/// Operators only a `constraint` takes: they are about the placements, not a node.
pub const DISTINCT_PROPERTY: &str = "distinct_property";
pub const DISTINCT_HOSTS: &str = "distinct_hosts";

/// A `constraint` block: `attribute` (LTarget) `operator` (Operand) `value` (RTarget).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Constraint {
    pub ltarget: String,
    pub rtarget: String,
    pub operand: String,
}

impl fmt::Display for Constraint {
    /// Nomad's `Constraint.String()`, the filter reason scheduling metrics count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.ltarget, self.operand, self.rtarget)
    }
}

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
                if let Err(error) = crate::scheduler::constraints::compile_regexp(&self.rtarget) {
                    errors.push(format!("Regular expression failed to compile: {error}"));
                }
            }
            "version" | "semver" => {
                if crate::scheduler::constraints::parse_version_constraint(&self.rtarget).is_none() {
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

/// An `affinity` block: a preference, `weight` from -100 to 100 (not 0).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Affinity {
    pub ltarget: String,
    pub rtarget: String,
    pub operand: String,
    pub weight: i32,
}

impl fmt::Display for Affinity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} {}", self.ltarget, self.operand, self.rtarget, self.weight)
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
