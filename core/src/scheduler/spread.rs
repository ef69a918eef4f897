//! `spread` scoring (Nomad's `SpreadIterator`): a node scores by how much placing one more of
//! the group's allocations there moves the counts per attribute value toward what the spread
//! asks — the targets' percentages of the group's count (the rest shared by the other
//! values), or, without targets, an even spread.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use super::constraints::resolve_target;
use crate::structs::{Node, Spread, TaskGroup};

/// The value every target not named takes (Nomad's implicit target).
const IMPLICIT: &str = "*";

/// The spread score of placing one of `group`'s allocations on `node`, in -1..=1 per spread
/// (summed), given the nodes the group's live allocations (and the plan's) already sit on.
pub fn score(spreads: &[&Spread], group: &TaskGroup, node: &Node, placed: &[&Node]) -> f64 {
    let total_weight: u32 = spreads.iter().map(|spread| spread.weight).sum();
    if spreads.is_empty() || total_weight == 0 {
        return 0.0;
    }
    let mut total = 0.0;
    for spread in spreads {
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        for other in placed {
            if let Some(value) = resolve_target(&spread.attribute, other) {
                *used.entry(value).or_default() += 1;
            }
        }
        let value = resolve_target(&spread.attribute, node);
        if spread.targets.is_empty() {
            total += even_boost(&used, value.as_deref());
            continue;
        }
        let count = f64::from(group.count);
        let mut desired: BTreeMap<&str, f64> = spread
            .targets
            .iter()
            .map(|target| (target.value.as_str(), f64::from(target.percent) / 100.0 * count))
            .collect();
        let named: u32 = spread.targets.iter().map(|target| target.percent).sum();
        if named < 100 {
            desired.insert(IMPLICIT, f64::from(100 - named) / 100.0 * count);
        }
        let Some(value) = value else {
            total -= 1.0;
            continue;
        };
        let wanted = desired
            .get(value.as_str())
            .or_else(|| desired.get(IMPLICIT))
            .copied()
            .unwrap_or(0.0);
        if wanted <= 0.0 {
            // Nothing is wanted there: the greatest penalty.
            total -= 1.0;
            continue;
        }
        // This placement included.
        let used_here = used.get(&value).copied().unwrap_or(0) as f64 + 1.0;
        let weight = f64::from(spread.weight) / f64::from(total_weight);
        total += (wanted - used_here) / wanted * weight;
    }
    total
}

/// Nomad's `evenSpreadScoreBoost`: toward the values with the fewest allocations.
fn even_boost(used: &BTreeMap<String, u64>, value: Option<&str>) -> f64 {
    if used.is_empty() {
        return 0.0;
    }
    let Some(value) = value else {
        return -1.0;
    };
    let current = used.get(value).copied().unwrap_or(0);
    let min = used.values().copied().min().unwrap_or(0);
    let max = used.values().copied().max().unwrap_or(0);
    if current != min {
        // Fewer than the least-used value (a value none is on yet) gains; more loses.
        return (min as f64 - current as f64) / min as f64;
    }
    if min == max {
        return -1.0;
    }
    (max - min) as f64 / min as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::SpreadTarget;

    fn node(id: &str, dc: &str) -> Node {
        Node {
            id: id.into(),
            datacenter: dc.into(),
            ..Node::default()
        }
    }

    #[test]
    fn an_even_spread_prefers_the_value_with_the_fewest() {
        let spread = Spread {
            attribute: "${node.datacenter}".into(),
            weight: 50,
            targets: Vec::new(),
        };
        let group = TaskGroup {
            count: 4,
            ..TaskGroup::default()
        };
        let (a, b, c) = (node("a", "dc1"), node("b", "dc2"), node("c", "dc3"));
        // Nothing placed: no preference.
        assert_eq!(score(&[&spread], &group, &a, &[]), 0.0);
        // dc1 holds two, dc2 one: dc2 and dc3 (none yet) gain alike (as Nomad's do), dc1 loses.
        let placed = [&a, &a, &b];
        let (on_a, on_b, on_c) = (
            score(&[&spread], &group, &a, &placed),
            score(&[&spread], &group, &b, &placed),
            score(&[&spread], &group, &c, &placed),
        );
        assert!(on_c == on_b && on_b > 0.0 && on_a < 0.0, "{on_a} {on_b} {on_c}");
        // Spread evenly already: every value that holds some loses; a new value gains.
        let even = [&a, &b, &c];
        assert_eq!(score(&[&spread], &group, &a, &even), -1.0);
        assert_eq!(score(&[&spread], &group, &node("d", "dc4"), &even), 1.0);
    }

    #[test]
    fn targets_pull_toward_their_percentages() {
        let spread = Spread {
            attribute: "${node.datacenter}".into(),
            weight: 100,
            targets: vec![SpreadTarget {
                value: "dc1".into(),
                percent: 75,
            }],
        };
        let group = TaskGroup {
            count: 4,
            ..TaskGroup::default()
        };
        let (a, b) = (node("a", "dc1"), node("b", "dc2"));
        // Wanted: 3 in dc1, 1 elsewhere. With one in dc2 already, dc1 is preferred.
        assert!(score(&[&spread], &group, &a, &[&b]) > score(&[&spread], &group, &b, &[&b]));
        // With three in dc1, dc2 is.
        assert!(score(&[&spread], &group, &b, &[&a, &a, &a]) > score(&[&spread], &group, &a, &[&a, &a, &a]));
    }
}
