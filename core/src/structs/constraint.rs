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
