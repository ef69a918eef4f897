//! Reserved cores (`resources { cores = N }`, Nomad 1.1): a task that asks for whole cores
//! gets that many of its node's cores to itself. The scheduler picks which (the lowest free
//! ids, task by task in the group's order), never gives one core to two live allocations, and
//! counts each reserved core as its share of the node's MHz against the node's CPU.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::structs::{Node, TaskGroup};

/// The cores the tasks of `group` ask for, in all.
pub fn asked(group: &TaskGroup) -> u32 {
    group.tasks.iter().map(|task| task.resources.cores).sum()
}

/// How many of `node`'s cores no live allocation holds (`used`).
pub fn free(node: &Node, used: &BTreeSet<u32>) -> u32 {
    (0..node.cores()).filter(|core| !used.contains(core)).count() as u32
}

/// Which cores each task of `group` asking for cores gets on `node`, given the cores `used`
/// there: the lowest free ids, in the group's task order. `None` when too few are free.
pub fn assign(node: &Node, used: &BTreeSet<u32>, group: &TaskGroup) -> Option<BTreeMap<String, Vec<u32>>> {
    let mut free = (0..node.cores()).filter(|core| !used.contains(core));
    let mut assigned = BTreeMap::new();
    for task in group.tasks.iter().filter(|task| task.resources.cores > 0) {
        let cores: Vec<u32> = free.by_ref().take(task.resources.cores as usize).collect();
        if cores.len() < task.resources.cores as usize {
            return None;
        }
        assigned.insert(task.name.clone(), cores);
    }
    Some(assigned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(cores: &[u32]) -> TaskGroup {
        let mut group = crate::testkit::job("j", crate::structs::JobType::Service).task_groups[0].clone();
        let template = group.tasks[0].clone();
        group.tasks = cores
            .iter()
            .enumerate()
            .map(|(index, cores)| {
                let mut task = template.clone();
                task.name = format!("t{index}");
                task.resources.cores = *cores;
                task
            })
            .collect();
        group
    }

    fn node(cores: u32) -> Node {
        let mut node = crate::testkit::node("n1").with_cpu(8_000);
        node.attributes.insert("cpu.numcores".into(), cores.to_string());
        node
    }

    #[test]
    fn tasks_get_the_lowest_free_cores_in_their_order() {
        let used = BTreeSet::from([1, 4]);
        let assigned = assign(&node(8), &used, &group(&[2, 0, 3])).unwrap();
        assert_eq!(assigned["t0"], [0, 2]);
        assert!(!assigned.contains_key("t1"));
        assert_eq!(assigned["t2"], [3, 5, 6]);
        assert_eq!(free(&node(8), &used), 6);
        assert_eq!(assign(&node(8), &used, &group(&[4, 3])), None);
        assert_eq!(node(8).mhz_per_core(), 1_000);
    }
}
