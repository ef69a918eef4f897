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

/// A `spread` block (Nomad's `structs.Spread`): the scheduler spreads a group's allocations
/// over the values `attribute` takes on nodes — evenly, or by the `targets`' percentages (what
/// they leave over goes to the other values).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spread {
    pub attribute: String,
    /// How much this spread counts against the job's others (1..=100; Nomad's default 50).
    pub weight: u32,
    #[serde(default)]
    pub targets: Vec<SpreadTarget>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpreadTarget {
    pub value: String,
    pub percent: u32,
}

/// Nomad's default spread weight.
pub const SPREAD_WEIGHT_DEFAULT: u32 = 50;

impl Spread {
    /// Nomad's `Spread.Validate`, in its words.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.attribute.is_empty() {
            problems.push("Missing spread attribute".to_string());
        }
        if self.weight == 0 || self.weight > 100 {
            problems.push("Spread stanza must have a positive weight from 0 to 100".to_string());
        }
        let mut seen = alloc::collections::BTreeSet::new();
        let mut sum = 0u32;
        for target in &self.targets {
            if !seen.insert(target.value.as_str()) {
                problems.push(format!("Spread target value {:?} already defined", target.value));
            }
            if target.percent > 100 {
                problems.push(format!(
                    "Spread target percentage for value {:?} must be between 0 and 100",
                    target.value
                ));
            }
            sum = sum.saturating_add(target.percent);
        }
        if sum > 100 {
            problems.push(format!(
                "Sum of spread target percentages must not be greater than 100%; got {sum}%"
            ));
        }
        problems
    }
}
