//! Builders for the structs tests and benches make over and over: a ready node, a job of one
//! group and one task, a lone server's agent config. Compiled for this crate's tests and, with the `testkit` feature, for
//! other crates' tests and benches (a dev-dependency feature: never in a release build).
//!
//! Each builder gives the plain case; chained `with_*` methods change one thing, so a test
//! says only what matters to it.

use alloc::collections::BTreeMap;
use core::net::{IpAddr, Ipv4Addr};

use crate::config::{Advertise, AgentConfig, Ports};
use crate::prelude::*;
use crate::structs::{DriverInfo, Job, JobType, Node, NodeResources, NodeStatus, Task, TaskGroup, TaskResources};

/// A ready, eligible node `id` (also its name) in `dc1` with a healthy `exec` driver, 4,000
/// MHz and 4,096 MB.
pub fn node(id: &str) -> Node {
    Node {
        id: id.into(),
        name: id.into(),
        datacenter: "dc1".into(),
        status: NodeStatus::Ready,
        drivers: BTreeMap::from([("exec".to_string(), healthy_driver())]),
        resources: NodeResources {
            cpu: 4_000,
            memory_mb: 4_096,
            ..NodeResources::default()
        },
        ..Node::default()
    }
}

/// A detected, healthy driver.
pub fn healthy_driver() -> DriverInfo {
    DriverInfo {
        detected: true,
        healthy: true,
        ..DriverInfo::default()
    }
}

impl Node {
    /// This node with `cpu` MHz.
    pub fn with_cpu(mut self, cpu: u64) -> Node {
        self.resources.cpu = cpu;
        self
    }

    /// This node with `memory_mb` MB.
    pub fn with_memory(mut self, memory_mb: u64) -> Node {
        self.resources.memory_mb = memory_mb;
        self
    }

    /// This node in datacenter `dc`.
    pub fn in_datacenter(mut self, dc: &str) -> Node {
        self.datacenter = dc.into();
        self
    }
}

/// Job `id` (also its name) of `job_type` in `default`, priority 50, any datacenter: one group
/// `g` of one allocation, one task `t` on `exec` asking 100 MHz and 100 MB.
pub fn job(id: &str, job_type: JobType) -> Job {
    Job {
        id: id.into(),
        name: id.into(),
        namespace: "default".into(),
        job_type,
        priority: 50,
        datacenters: vec!["*".into()],
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count: 1,
            tasks: vec![Task {
                name: "t".into(),
                driver: "exec".into(),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 100,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

impl Job {
    /// This job with `count` allocations of each group.
    pub fn with_count(mut self, count: u32) -> Job {
        for group in &mut self.task_groups {
            group.count = count;
        }
        self
    }

    /// This job with every task asking `cpu` MHz.
    pub fn with_cpu(mut self, cpu: u32) -> Job {
        self.tasks_mut().for_each(|task| task.resources.cpu = cpu);
        self
    }

    /// This job with every task asking `memory_mb` MB.
    pub fn with_memory(mut self, memory_mb: u32) -> Job {
        self.tasks_mut().for_each(|task| task.resources.memory_mb = memory_mb);
        self
    }

    /// This job with every task on `driver`.
    pub fn with_driver(mut self, driver: &str) -> Job {
        self.tasks_mut().for_each(|task| task.driver = driver.into());
        self
    }

    fn tasks_mut(&mut self) -> impl Iterator<Item = &mut Task> {
        self.task_groups.iter_mut().flat_map(|group| group.tasks.iter_mut())
    }
}

/// A lone server's agent config: `name`, on loopback at `ports`, its data in `data_dir`,
/// leading a cluster of one (`bootstrap_expect = 1`).
pub fn lone_server_config(name: &str, data_dir: &str, ports: Ports) -> AgentConfig {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut config = AgentConfig {
        name: name.into(),
        data_dir: Some(data_dir.into()),
        bind_addr: ip,
        ports,
        advertise: Advertise::on(ip, ports),
        ..AgentConfig::default()
    };
    config.server.enabled = true;
    config.server.bootstrap_expect = 1;
    config
}
