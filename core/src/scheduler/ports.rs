//! Port assignment on one node (Nomad's `NetworkIndex.AssignPorts`, host mode): static ports
//! must be free, dynamic ones come from the node's dynamic range, and no port is handed out
//! twice on a node — not to two allocations, not to two labels of one, and never one the
//! node reserves.
//!
//! Nomad picks dynamic ports at random so that schedulers working in parallel rarely collide.
//! Here one worker plans at a time from the applied state, so collisions cannot happen; the
//! starting point of the search is still spread (a hash of the allocation id and the label),
//! so allocations do not all crowd the bottom of the range and a port freed by a stopped
//! allocation is not handed straight to its replacement while the old task may still hold it.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::structs::{AllocatedPort, Node, Port, TaskGroup};

/// The ports of one placement: the group network's, and each task network's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assigned {
    pub shared: Vec<AllocatedPort>,
    pub tasks: BTreeMap<String, Vec<AllocatedPort>>,
}

impl Assigned {
    pub fn host_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.shared
            .iter()
            .chain(self.tasks.values().flatten())
            .map(|port| port.value)
    }
}

/// Assigns every port `group` asks for on `node`, where `used` holds the ports live
/// allocations have and `releasing` those of allocations told to stop whose tasks may still
/// be running: a dynamic pick takes one of those only when nothing else is free (Nomad takes
/// them at once, and the new task can find its port still bound). `spread` seeds where each
/// dynamic search starts (the allocation id). Errors are Nomad's exhausted-dimension texts.
pub fn assign(
    node: &Node,
    used: &BTreeSet<u16>,
    releasing: &BTreeSet<u16>,
    group: &TaskGroup,
    spread: &str,
) -> Result<Assigned, String> {
    let mut taken: BTreeSet<u16> = used.iter().chain(&node.resources.reserved_ports).copied().collect();
    let asks = group
        .networks
        .iter()
        .map(|network| (None, network))
        .chain(group.tasks.iter().flat_map(|task| {
            task.resources
                .networks
                .iter()
                .map(move |network| (Some(task.name.as_str()), network))
        }));
    let host_ip = node.resources.host_ip();
    let mut assigned = Assigned::default();
    // Static ports first, all of them, so a dynamic pick never takes one asked for statically.
    let mut dynamic: Vec<(Option<&str>, &Port)> = Vec::new();
    let mut statics: Vec<(Option<&str>, &Port)> = Vec::new();
    for (task, network) in asks {
        statics.extend(network.reserved_ports.iter().map(|port| (task, port)));
        dynamic.extend(network.dynamic_ports.iter().map(|port| (task, port)));
    }
    for (task, port) in statics {
        if !taken.insert(port.value) {
            return Err(format!(
                "network: reserved port collision {}={}",
                port.label, port.value
            ));
        }
        push(&mut assigned, task, mapping(port, port.value, host_ip));
    }
    let range = node.resources.dynamic_range();
    let (low, high) = (u32::from(*range.start()), u32::from(*range.end()));
    let span = (high + 1).saturating_sub(low);
    for (task, port) in dynamic {
        let start = if span == 0 {
            0
        } else {
            (fnv1a(spread, &port.label) % u64::from(span)) as u32
        };
        let search = |avoid: &BTreeSet<u16>| {
            (0..span)
                .map(|step| (low + (start + step) % span) as u16)
                .find(|candidate| !taken.contains(candidate) && !avoid.contains(candidate))
        };
        let free = search(releasing).or_else(|| search(&BTreeSet::new()));
        let Some(value) = free else {
            return Err("network: dynamic port selection failed".into());
        };
        taken.insert(value);
        push(&mut assigned, task, mapping(port, value, host_ip));
    }
    Ok(assigned)
}

/// Whether [`assign`] would succeed, without assigning (the feasibility check run for every
/// candidate node): statics free and distinct, and enough free ports in the dynamic range
/// for the dynamic ones. Same errors as `assign`; no allocation.
pub fn fit(node: &Node, used: &BTreeSet<u16>, group: &TaskGroup) -> Result<(), String> {
    let networks = || {
        group
            .networks
            .iter()
            .chain(group.tasks.iter().flat_map(|task| &task.resources.networks))
    };
    let reserved = &node.resources.reserved_ports;
    let statics = || networks().flat_map(|network| &network.reserved_ports);
    for (position, port) in statics().enumerate() {
        let repeated = statics().take(position).any(|earlier| earlier.value == port.value);
        if repeated || used.contains(&port.value) || reserved.contains(&port.value) {
            return Err(format!(
                "network: reserved port collision {}={}",
                port.label, port.value
            ));
        }
    }
    let wanted = networks().map(|network| network.dynamic_ports.len()).sum::<usize>();
    if wanted == 0 {
        return Ok(());
    }
    let range = node.resources.dynamic_range();
    let span = (usize::from(*range.end()) + 1).saturating_sub(usize::from(*range.start()));
    let taken = used.range(range.clone()).count()
        + reserved
            .range(range.clone())
            .filter(|port| !used.contains(port))
            .count()
        + statics().filter(|port| range.contains(&port.value)).count();
    if span.saturating_sub(taken) < wanted {
        return Err("network: dynamic port selection failed".into());
    }
    Ok(())
}

fn mapping(port: &Port, value: u16, host_ip: &str) -> AllocatedPort {
    AllocatedPort {
        label: port.label.clone(),
        value,
        // `to = -1`: the task binds the port it was given.
        to: if port.to == -1 { i32::from(value) } else { port.to },
        host_ip: host_ip.to_string(),
    }
}

fn push(assigned: &mut Assigned, task: Option<&str>, port: AllocatedPort) {
    match task {
        None => assigned.shared.push(port),
        Some(task) => assigned.tasks.entry(task.to_string()).or_default().push(port),
    }
}

/// FNV-1a over `a`, a separator and `b`: stable across builds and platforms.
fn fnv1a(a: &str, b: &str) -> u64 {
    crate::hash::Fnv1a::default()
        .bytes(a.as_bytes())
        .bytes(&[0])
        .bytes(b.as_bytes())
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{NetworkResource, NodeNetwork, NodeResources, Task, TaskResources};

    fn node(min: u16, max: u16, reserved: &[u16]) -> Node {
        Node {
            id: "n1".into(),
            resources: NodeResources {
                networks: vec![NodeNetwork {
                    device: "eth0".into(),
                    ip: "10.0.0.5".into(),
                    cidr: "10.0.0.5/32".into(),
                }],
                reserved_ports: reserved.iter().copied().collect(),
                min_dynamic_port: min,
                max_dynamic_port: max,
                ..NodeResources::default()
            },
            ..Node::default()
        }
    }

    fn port(label: &str, value: u16, to: i32) -> Port {
        Port {
            label: label.into(),
            value,
            to,
            host_network: String::new(),
        }
    }

    fn group(statics: Vec<Port>, dynamics: Vec<Port>) -> TaskGroup {
        TaskGroup {
            name: "g".into(),
            networks: vec![NetworkResource {
                reserved_ports: statics,
                dynamic_ports: dynamics,
                ..NetworkResource::default()
            }],
            ..TaskGroup::default()
        }
    }

    #[test]
    fn static_and_dynamic_ports_are_assigned_on_the_nodes_address() {
        let node = node(20000, 20010, &[]);
        let group = group(
            vec![port("http", 8080, 0)],
            vec![port("admin", 0, -1), port("db", 0, 5432)],
        );
        let assigned = assign(&node, &BTreeSet::new(), &BTreeSet::new(), &group, "alloc-1").unwrap();
        assert_eq!(assigned.shared[0].value, 8080);
        assert_eq!(assigned.shared[0].host_ip, "10.0.0.5");
        let admin = &assigned.shared[1];
        assert!((20000..=20010).contains(&admin.value));
        assert_eq!(admin.to, i32::from(admin.value), "to = -1 maps to the allocated port");
        assert_eq!(assigned.shared[2].to, 5432);
        assert_ne!(assigned.shared[1].value, assigned.shared[2].value);
    }

    #[test]
    fn collisions_and_exhaustion_use_nomads_texts() {
        let node = node(20000, 20001, &[22]);
        let used: BTreeSet<u16> = [8080].into();
        let taken = group(vec![port("http", 8080, 0)], vec![]);
        assert_eq!(
            assign(&node, &used, &BTreeSet::new(), &taken, "a").unwrap_err(),
            "network: reserved port collision http=8080"
        );
        let reserved = group(vec![port("ssh", 22, 0)], vec![]);
        assert_eq!(
            assign(&node, &used, &BTreeSet::new(), &reserved, "a").unwrap_err(),
            "network: reserved port collision ssh=22"
        );
        let three = group(vec![], vec![port("a", 0, 0), port("b", 0, 0), port("c", 0, 0)]);
        assert_eq!(
            assign(&node, &used, &BTreeSet::new(), &three, "a").unwrap_err(),
            "network: dynamic port selection failed"
        );
        let two = group(vec![], vec![port("a", 0, 0), port("b", 0, 0)]);
        let assigned = assign(&node, &used, &BTreeSet::new(), &two, "a").unwrap();
        let ports: BTreeSet<u16> = assigned.host_ports().collect();
        assert_eq!(ports, [20000, 20001].into());
    }

    #[test]
    fn fit_agrees_with_assign() {
        let cases = [
            (node(20000, 20001, &[22]), vec![port("http", 8080, 0)], vec![]),
            (node(20000, 20001, &[22]), vec![port("ssh", 22, 0)], vec![]),
            (
                node(20000, 20001, &[20001]),
                vec![],
                vec![port("a", 0, 0), port("b", 0, 0)],
            ),
            (
                node(20000, 20002, &[20001]),
                vec![],
                vec![port("a", 0, 0), port("b", 0, 0)],
            ),
            (
                node(20000, 20001, &[]),
                vec![port("s", 20000, 0)],
                vec![port("a", 0, 0)],
            ),
            (
                node(20000, 20001, &[]),
                vec![port("s", 20000, 0)],
                vec![port("a", 0, 0), port("b", 0, 0)],
            ),
            (
                node(20000, 20001, &[]),
                vec![port("s", 9000, 0), port("t", 9000, 0)],
                vec![],
            ),
        ];
        let used: BTreeSet<u16> = [8080, 20000].into();
        for (node, statics, dynamics) in cases {
            let group = group(statics, dynamics);
            for used in [BTreeSet::new(), used.clone()] {
                assert_eq!(
                    fit(&node, &used, &group),
                    assign(&node, &used, &BTreeSet::new(), &group, "x").map(|_| ()),
                    "{group:?} on {:?} with {used:?}",
                    node.resources
                );
            }
        }
    }

    #[test]
    fn a_dynamic_pick_never_takes_a_port_asked_for_statically() {
        let node = node(20000, 20001, &[]);
        let group = group(vec![port("fixed", 20000, 0)], vec![port("any", 0, 0)]);
        for spread in ["a", "b", "c", "d"] {
            let assigned = assign(&node, &BTreeSet::new(), &BTreeSet::new(), &group, spread).unwrap();
            assert_eq!(assigned.shared[1].value, 20001);
        }
    }

    #[test]
    fn ports_still_being_released_are_taken_only_when_nothing_else_is_free() {
        let node = node(20000, 20001, &[]);
        let group = group(vec![], vec![port("any", 0, 0)]);
        let releasing: BTreeSet<u16> = [20000].into();
        for spread in ["a", "b", "c", "d"] {
            let assigned = assign(&node, &BTreeSet::new(), &releasing, &group, spread).unwrap();
            assert_eq!(assigned.shared[0].value, 20001);
        }
        let used: BTreeSet<u16> = [20001].into();
        let assigned = assign(&node, &used, &releasing, &group, "a").unwrap();
        assert_eq!(
            assigned.shared[0].value, 20000,
            "better a port being released than none"
        );
    }

    #[test]
    fn task_networks_are_assigned_per_task_and_share_the_nodes_ports() {
        let node = node(20000, 20000, &[]);
        let mut group = group(vec![], vec![port("http", 0, 0)]);
        group.tasks.push(Task {
            name: "web".into(),
            resources: TaskResources {
                networks: vec![NetworkResource {
                    dynamic_ports: vec![port("metrics", 0, 0)],
                    ..NetworkResource::default()
                }],
                ..TaskResources::default()
            },
            ..Task::default()
        });
        assert_eq!(
            assign(&node, &BTreeSet::new(), &BTreeSet::new(), &group, "a").unwrap_err(),
            "network: dynamic port selection failed"
        );
        let node = self::node(20000, 20001, &[]);
        let assigned = assign(&node, &BTreeSet::new(), &BTreeSet::new(), &group, "a").unwrap();
        assert_eq!(assigned.tasks["web"][0].label, "metrics");
        assert_ne!(assigned.tasks["web"][0].value, assigned.shared[0].value);
    }
}
