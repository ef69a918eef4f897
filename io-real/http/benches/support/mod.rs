//! What the state-size benches (`state_scale`, `acked_writes`) build their states from: the
//! same jobs, allocations and nodes, so their figures describe the same state.

use std::collections::BTreeMap;

use drover_core::structs::{Allocation, ClientStatus, ConfigValue, Job, Node, NodeStatus, Task, TaskGroup};

/// The 50th and 99th percentiles of `samples` (sorted in place).
pub fn percentiles(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

/// The id of job `n`.
pub fn job_id(n: usize) -> String {
    format!("job-{n:06}")
}

/// A service job `id` with one group of `count` `raw_exec` tasks.
pub fn job(id: &str, count: usize) -> Job {
    Job {
        id: id.into(),
        name: id.into(),
        namespace: "default".into(),
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: count as u32,
            tasks: vec![Task {
                name: "app".into(),
                driver: "raw_exec".into(),
                config: BTreeMap::from([("command".into(), ConfigValue::String("/bin/sleep".into()))]),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// Allocation `n` of job `job`, running on node `node`.
pub fn alloc(job: &str, n: usize, node: usize) -> Allocation {
    Allocation {
        id: format!("{job}-alloc-{n:02}"),
        name: format!("{job}.web[{n}]"),
        namespace: "default".into(),
        job_id: job.into(),
        task_group: "web".into(),
        node_id: format!("node-{node:05}"),
        client_status: ClientStatus::Running,
        ..Allocation::default()
    }
}

/// Node `n`, ready.
pub fn node(n: usize) -> Node {
    Node {
        id: format!("node-{n:05}"),
        name: format!("client-{n}"),
        datacenter: "dc1".into(),
        status: NodeStatus::Ready,
        ..Node::default()
    }
}
